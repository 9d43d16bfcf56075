// Whole-token decode kernels (decode.rs), appended to kernels.cu in one NVRTC program. Every
// kernel reads the token id and position from the device array p = {token, pos}, so one
// captured CUDA graph replays every step; only p changes between replays.
//
// Numerics follow the CPU ops: RMSNorm x * (float)(1 / sqrt(mean(x^2) + eps)) * (w + offset)
// with the sum of squares in double (src/ops/norm.rs); RoPE angles pos * inv_freq in double,
// cos/sin rounded to f32 (src/rope.rs); attention scores scale * q.k, soft-capped, softmax with
// the maximum subtracted (src/attention.rs). Sums run in a different order than the CPU's.

#define DEC_THREADS 256
#define RN_THREADS 1024
#define RN_MAX 8192
#define NEG_INF __int_as_float(0xff800000)

// Block-wide sum of one double per thread (blockDim.x a multiple of 32, at most 1024).
__device__ double block_sum_d(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += sh[i];
    return t;
}

__device__ float block_max_f(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = NEG_INF;
    for (int i = 0; i < nw; i++) t = fmaxf(t, sh[i]);
    return t;
}

__device__ __forceinline__ float rms_scale(double ss, int n, float eps) {
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}

// x[0:h] = scale * E[token, 0:h] (f32 or f16 table). One block.
extern "C" __global__ void dec_embed_f32(const float* E, const int* p, float* x, int h,
                                         float scale) {
    const float* row = E + (long long)p[0] * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) x[i] = row[i] * scale;
}
extern "C" __global__ void dec_embed_f16(const u16* E, const int* p, float* x, int h,
                                         float scale) {
    const u16* row = E + (long long)p[0] * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) x[i] = f16_to_f32(row[i]) * scale;
}

// One block of RN_THREADS threads, n <= RN_MAX (decode.rs MAX_HIDDEN):
//   if branch: b = post_w ? rmsnorm(branch) * (post_w + off) : branch;  x += b * mult
//   out = rmsnorm(x) * (norm_w + off)  (norm eps/offset: eps2/off2)
//   then, when given, out quantized for the next products: q32/d32 (32-value blocks, ggml
//   quantize_row_q8_0_ref) and qk/dk/bsk (Q8_K), each by one warp per block.
extern "C" __global__ void __launch_bounds__(RN_THREADS)
    dec_residual_norm(float* x, const float* branch, const float* post_w, float mult,
                      const float* norm_w, float* out, int n, float eps, float off, float eps2,
                      float off2, i8* q32, float* d32, i8* qk, float* dk, int* bsk) {
    __shared__ double sh[32];
    __shared__ float sv[RN_MAX];  // out, for the quantizing warps
    float xv[RN_MAX / RN_THREADS];
    int cnt = 0;
    if (branch) {
        float sc = 1.0f;
        if (post_w) {
            double ss = 0.0;
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                double b = branch[i];
                ss += b * b;
            }
            sc = rms_scale(block_sum_d(ss, sh), n, eps);
        }
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float b = branch[i];
            if (post_w) b = (b * sc) * (post_w[i] + off);
            float v = x[i] + (mult == 1.0f ? b : b * mult);
            x[i] = v;
            xv[cnt++] = v;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) xv[cnt++] = x[i];
    }
    double ss = 0.0;
    for (int c = 0; c < cnt; c++) ss += (double)xv[c] * (double)xv[c];
    float sc = rms_scale(block_sum_d(ss, sh), n, eps2);
    cnt = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float o = (xv[cnt++] * sc) * (norm_w[i] + off2);
        out[i] = o;
        sv[i] = o;
    }
    if (!q32 && !qk) return;
    __syncthreads();
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (q32)
        for (int b = w; b < n / 32; b += nw) quant_block_32(sv + b * 32, q32, d32, b, lane, 1);
    if (qk)
        for (int b = w; b < n / 256; b += nw) quant_block_k(sv + b * 256, qk, dk, bsk, b, lane);
}

// RMSNorm (when nw) and RoPE (when inv_freq) of one head held in shared memory row[0:hd], by the
// whole block; ends synchronised. rot / 2 <= 2 * blockDim.x (checked on the host).
__device__ void head_norm_rope(float* row, const float* nw, const double* inv_freq, int pos,
                               int hd, int rot, int interleaved, float eps, float off,
                               double* sh) {
    if (nw) {
        double ss = 0.0;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) ss += (double)row[d] * (double)row[d];
        float sc = rms_scale(block_sum_d(ss, sh), hd, eps);
        __syncthreads();
        for (int d = threadIdx.x; d < hd; d += blockDim.x) row[d] = (row[d] * sc) * (nw[d] + off);
        __syncthreads();
    }
    if (inv_freq) {
        int half = rot / 2;
        float r[4];
        int ids[4];
        int cnt = 0;
        for (int i = threadIdx.x; i < half && cnt < 4; i += blockDim.x) {
            double ang = (double)pos * inv_freq[i];
            float c = (float)cos(ang), s = (float)sin(ang);
            int ia = interleaved ? 2 * i : i;
            int ib = interleaved ? 2 * i + 1 : i + half;
            float a = row[ia], b = row[ib];
            r[cnt] = a * c - b * s;
            ids[cnt++] = ia;
            r[cnt] = b * c + a * s;
            ids[cnt++] = ib;
        }
        __syncthreads();
        for (int c = 0; c < cnt; c++) row[ids[c]] = r[c];
        __syncthreads();
    }
}

// Decode attention of this token, one block (DEC_THREADS) per query head h, kv head
// g = h / (nq / nkv):
// 1. q head h and k head g of the projections: optional per-head RMSNorm (q_norm, k_norm), RoPE
//    on the first rot dims at position pos = p[1]; the first query head of each group writes
//    K and V of position pos into the cache (kc, vc: [ctx, nkv * hd]).
// 2. s_j = scale * q.k_j (soft-capped when cap > 0) over keys lo..pos (the cache for j < pos,
//    this token's k for j = pos), softmax, out[h] = sum_j p_j v_j.
//    window > 0: keys with pos - j < window; 0: no limit; < 0: no key (zeros).
// 3. When given, the head's output quantized for the o projection (q32/d32: 32-value blocks;
//    qk/dk/bsk: Q8_K; the host passes them only when hd is a multiple of the block).
// scores: [nq, ctx] scratch.
extern "C" __global__ void dec_attention(const float* q, const float* k, const float* v,
                                         const float* q_norm, const float* k_norm,
                                         const double* inv_freq, float* kc, float* vc,
                                         float* out, float* scores, const int* p, int nq,
                                         int nkv, int hd, int rot, int interleaved, float eps,
                                         float off, int ctx, float scale, int window, float cap,
                                         i8* q32, float* d32, i8* qk, float* dk, int* bsk) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    __shared__ float qs[1024];
    __shared__ float ks[1024];
    int h = blockIdx.x;
    int grp = nq / nkv;
    int g = h / grp;
    int pos = p[1];
    int kvd = nkv * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        qs[d] = q[(long long)h * hd + d];
        ks[d] = k[(long long)g * hd + d];
    }
    __syncthreads();
    head_norm_rope(qs, q_norm, inv_freq, pos, hd, rot, interleaved, eps, off, shd);
    head_norm_rope(ks, k_norm, inv_freq, pos, hd, rot, interleaved, eps, off, shd);
    const float* vcur = v + (long long)g * hd;
    if (h % grp == 0) {
        long long o = (long long)pos * kvd + (long long)g * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            kc[o + d] = ks[d];
            vc[o + d] = vcur[d];
        }
    }
    int lo = 0;
    if (window > 0) lo = max(0, pos - window + 1);
    if (window < 0) lo = pos + 1;
    float* sc = scores + (long long)h * ctx;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    // Scores: one key per thread (its row read with 16-byte loads when hd % 4 == 0; every
    // thread reads the same q value at a time, a shared-memory broadcast). Several threads per
    // key, each on a slice of the row, measured slower on the H200 (bank conflicts on q).
    float mx = NEG_INF;
    for (int j = lo + threadIdx.x; j <= pos; j += blockDim.x) {
        const float* kr = j == pos ? ks : kc + (long long)j * kvd + (long long)g * hd;
        float acc = 0.0f;
        if ((hd & 3) == 0 && j != pos) {
            const float4* k4 = (const float4*)kr;
#pragma unroll 8
            for (int d4 = 0; d4 < hd / 4; d4++) {
                float4 kv = k4[d4];
                acc += qs[4 * d4] * kv.x + qs[4 * d4 + 1] * kv.y + qs[4 * d4 + 2] * kv.z +
                       qs[4 * d4 + 3] * kv.w;
            }
        } else {
            for (int d = 0; d < hd; d++) acc += qs[d] * kr[d];
        }
        float s = acc * scale;
        if (cap > 0.0f) s = cap * tanhf(s / cap);
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max_f(mx, shf);
    __syncthreads();
    double sum = 0.0;
    for (int j = lo + threadIdx.x; j <= pos; j += blockDim.x) {
        float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    float total = (float)block_sum_d(sum, shd);
    __syncthreads();
    float inv = total > 0.0f ? 1.0f / total : 0.0f;
    // Values: ng = blockDim / hd groups of threads (at least 1) take every ng-th key, each thread
    // one output dim (or several when hd > blockDim); partial sums meet in shared memory (ks,
    // no longer needed, holds them).
    int ng = max(1, (int)blockDim.x / hd);
    int grp_id = threadIdx.x / hd;
    float* part = ks;
    __syncthreads();
    if (grp_id < ng) {
        for (int d = threadIdx.x % hd; d < hd; d += (ng == 1 ? blockDim.x : hd)) {
            const float* vr = vc + (long long)g * hd + d;
            float acc = 0.0f;
#pragma unroll 4
            for (int j = lo + grp_id; j < pos; j += ng) acc += sc[j] * vr[(long long)j * kvd];
            if (grp_id == 0 && lo <= pos) acc += sc[pos] * vcur[d];
            part[grp_id * hd + d] = acc;
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < ng; t++) acc += part[t * hd + d];
        out[(long long)h * hd + d] = acc * inv;
    }
    if (!q32 && !qk) return;
    __syncthreads();
    if (q32)
        for (int b = w; b < hd / 32; b += nw)
            quant_block_32(out + ((long long)h * hd + b * 32), q32, d32, h * (hd / 32) + b, lane, 1);
    if (qk)
        for (int b = w; b < hd / 256; b += nw)
            quant_block_k(out + ((long long)h * hd + b * 256), qk, dk, bsk, h * (hd / 256) + b,
                          lane);
}

__device__ __forceinline__ float act_fn(float x, int act) {
    if (act == 0) return x / (1.0f + expf(-x));
    if (act == 1) {
        float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

// up[i] = act(gate[i]) * up[i], or up[i] = act(up[i]) without a gate (act: 0 SiLU, 1 tanh-GELU,
// 2 erf-GELU); one warp per block of 256 values (kq: 8 per lane) or 32 (1 per lane), which it
// then quantizes for the down projection when q is given (Q8_K when kq, else 32-value blocks).
extern "C" __global__ void dec_act_quant(const float* gate, float* up, int n, int act, i8* q,
                                         float* d, int* bsums, int kq) {
    int blk = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    __shared__ float sv[4][256];  // this warp's block, for the quantizer
    int per = kq ? 8 : 1;
    long long first = (long long)blk * 32 * per;
    if (first >= n) return;
    float* wv = sv[(threadIdx.x >> 5) & 3];
    for (int i = 0; i < per; i++) {
        long long k = first + lane * per + i;
        float r = 0.0f;
        if (k < n) {
            r = gate ? act_fn(gate[k], act) * up[k] : act_fn(up[k], act);
            up[k] = r;
        }
        wv[lane * per + i] = r;
    }
    if (!q) return;
    __syncwarp();
    if (kq) quant_block_k(wv, q, d, bsums, blk, lane);
    else quant_block_32(wv, q, d, blk, lane, 1);
}

// Several quantized mat-vecs of one input in one launch (fused QKV, gate+up, or one matrix):
// jobs[5 j .. 5 j + 4] = {W, y, rows, format, first block}; block b runs the job whose first
// block is the largest <= b. format: 0 Q4_0, 1 Q5_0, 2 Q8_0 (32-value activations aq32/ad32),
// 4 Q4_K, 5 Q6_K (Q8_K activations aqk/adk/bsk).
extern "C" __global__ void dec_mv_multi(const long long* __restrict__ jobs, int njobs,
                                        const i8* aq32, const float* ad32, const i8* aqk,
                                        const float* adk, const int* bsk, int cols) {
    __shared__ __align__(16) u8 sm[ROWS_PER_BLOCK][STAGE_BYTES];
    int b = blockIdx.x;
    int j = njobs - 1;
    while (j > 0 && b < (int)jobs[5 * j + 4]) j--;
    const long long* jb = jobs + 5 * j;
    const u8* W = (const u8*)jb[0];
    float* y = (float*)jb[1];
    int rows = (int)jb[2];
    int bx = b - (int)jb[4];
    u8* smw = sm[threadIdx.x >> 5];
    switch ((int)jb[3]) {
        case 0: mv32<F_Q4_0>(W, 0, aq32, ad32, y, rows, cols, 1, bx, smw); break;
        case 1: mv32<F_Q5_0>(W, 0, aq32, ad32, y, rows, cols, 1, bx, smw); break;
        case 2: mv32<F_Q8_0>(W, 0, aq32, ad32, y, rows, cols, 1, bx, smw); break;
        case 4: mvk<true>(W, aqk, adk, bsk, y, rows, cols, 1, bx, smw); break;
        default: mvk<false>(W, aqk, adk, bsk, y, rows, cols, 1, bx, smw); break;
    }
}

// logits[i] = cap * tanh((logits[i] / div) / cap) (no cap when cap <= 0).
extern "C" __global__ void dec_logits_post(float* logits, int n, float div, float cap) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = logits[i];
    if (div != 1.0f) v /= div;
    if (cap > 0.0f) v = cap * tanhf(v / cap);
    logits[i] = v;
}
