// Whole-token decode kernels (decode.rs), appended to kernels.cu in one NVRTC program. Every
// kernel reads the token id and position from the device array p = {token, pos}, so one
// captured CUDA graph replays every step; only p changes between replays.
//
// Numerics follow the CPU ops: RMSNorm x * (float)(1 / sqrt(mean(x^2) + eps)) * (w + offset)
// with the sum of squares in double (src/ops/norm.rs); RoPE angles pos * inv_freq in double,
// cos/sin rounded to f32 (src/rope.rs); attention scores scale * q.k, soft-capped, softmax with
// the maximum subtracted (src/attention.rs). Sums run in a different order than the CPU's.

#define DEC_THREADS 256
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

// One block (DEC_THREADS threads), n <= DEC_THREADS * 16:
//   if branch: b = post_w ? rmsnorm(branch) * (post_w + off) : branch;  x += b * mult
//   out = rmsnorm(x) * (norm_w + off)  (norm eps/offset: eps2/off2)
extern "C" __global__ void dec_residual_norm(float* x, const float* branch, const float* post_w,
                                             float mult, const float* norm_w, float* out, int n,
                                             float eps, float off, float eps2, float off2) {
    __shared__ double sh[32];
    float xv[16];
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
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = (xv[cnt++] * sc) * (norm_w[i] + off2);
}

// Per head (block = head, blockDim.x >= head_dim/2 ... uses a stride loop): optional RMSNorm
// of q and k heads, RoPE on the first rotary_dim dims, then K and V of this position into the
// cache rows p[1]. Blocks 0..nq-1: q heads (in place); nq..nq+nkv-1: k heads; the v heads are
// copied by the k blocks.
extern "C" __global__ void dec_qk_rope_store(float* q, const float* k, const float* v,
                                             const float* q_norm, const float* k_norm,
                                             const double* inv_freq, float* kc, float* vc,
                                             const int* p, int nq, int nkv, int hd, int rot,
                                             int interleaved, float eps, float off) {
    __shared__ double sh[32];
    __shared__ float row[1024];
    int b = blockIdx.x;
    int pos = p[1];
    bool is_q = b < nq;
    int head = is_q ? b : b - nq;
    const float* src = is_q ? q + (long long)head * hd : k + (long long)head * hd;
    const float* nw = is_q ? q_norm : k_norm;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) row[d] = src[d];
    __syncthreads();
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
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            double ang = (double)pos * inv_freq[i];
            float c = (float)cos(ang), s = (float)sin(ang);
            int ia = interleaved ? 2 * i : i;
            int ib = interleaved ? 2 * i + 1 : i + half;
            float a = row[ia], bb = row[ib];
            r[cnt] = a * c - bb * s;
            ids[cnt] = ia;
            cnt++;
            r[cnt] = bb * c + a * s;
            ids[cnt] = ib;
            cnt++;
            if (cnt == 4) break;  // half <= 2 * blockDim.x (checked on the host)
        }
        __syncthreads();
        for (int c = 0; c < cnt; c++) row[ids[c]] = r[c];
        __syncthreads();
    }
    if (is_q) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) q[(long long)head * hd + d] = row[d];
    } else {
        long long o = (long long)pos * nkv * hd + (long long)head * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            kc[o + d] = row[d];
            vc[o + d] = v[(long long)head * hd + d];
        }
    }
}

// Decode attention, one block (DEC_THREADS) per query head h over cached keys lo..pos of kv head
// h / (nq / nkv): s_j = scale * q.k_j (soft-capped when cap > 0), softmax, out = sum p_j v_j.
// window > 0: keys with pos - j < window; window == 0: no limit; window < 0: no key (zeros).
// scores: [nq, ctx] scratch.
extern "C" __global__ void dec_attention(const float* q, const float* kc, const float* vc,
                                         float* out, float* scores, const int* p, int nq, int nkv,
                                         int hd, int ctx, float scale, int window, float cap) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    __shared__ float qs[1024];
    int h = blockIdx.x;
    int g = h / (nq / nkv);
    int pos = p[1];
    int kvd = nkv * hd;
    int lo = 0;
    if (window > 0) lo = max(0, pos - window + 1);
    if (window < 0) lo = pos + 1;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[(long long)h * hd + d];
    __syncthreads();
    float* sc = scores + (long long)h * ctx;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    float mx = NEG_INF;
    for (int j = lo + w; j <= pos; j += nw) {
        const float* kr = kc + (long long)j * kvd + (long long)g * hd;
        float acc = 0.0f;
        for (int d = lane; d < hd; d += 32) acc += qs[d] * kr[d];
        acc = warp_sum(acc);
        float s = acc * scale;
        if (cap > 0.0f) s = cap * tanhf(s / cap);
        if (lane == 0) sc[j] = s;
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
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float* vr = vc + (long long)g * hd + d;
        float acc = 0.0f;
        for (int j = lo; j <= pos; j++) acc += sc[j] * vr[(long long)j * kvd];
        out[(long long)h * hd + d] = acc * inv;
    }
}

__device__ __forceinline__ float act_fn(float x, int act) {
    if (act == 0) return x / (1.0f + expf(-x));
    if (act == 1) {
        float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

// up[i] = act(gate[i]) * up[i], or up[i] = act(up[i]) without a gate.
// act: 0 SiLU, 1 tanh-GELU, 2 erf-GELU.
extern "C" __global__ void dec_act(const float* gate, float* up, int n, int act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    up[i] = gate ? act_fn(gate[i], act) * up[i] : act_fn(up[i], act);
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
