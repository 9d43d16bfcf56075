// Decode kernels and the device helpers of the forward pass's fused operations (ops.cu, launched
// from tensor_ops.rs), appended to kernels.cu in one NVRTC program: residual + RMSNorm with
// quantization (residual_norm_row), per-head q/k norm and RoPE, KV cache rows of every
// KvType, the key-split decode attention (dec_attn_split*, dec_attn_merge; attn_split.rs), the
// activation with quantization (act_chunk), the one-row mat-vecs of several matrices in one
// launch (dec_mv_multi*) and the greedy token (argmax_into).
//
// Numerics follow the CPU ops: RMSNorm x * (float)(1 / sqrt(mean(x^2) + eps)) * (w + offset)
// with the sum of squares in double (src/ops/norm.rs); RoPE angles pos * inv_freq in double,
// cos/sin rounded to f32 (src/rope.rs); attention scores scale * q.k, soft-capped, softmax with
// the maximum subtracted (src/attention.rs). Sums run in a different order than the CPU's.

#define DEC_THREADS 256  // threads of dec_attn_merge (attn_split.rs DEC_THREADS)
#define RN_THREADS 1024  // threads of residual_norm_row's block (tensor_ops.rs RN_THREADS)
#define MAX_HD 1024      // largest group of heads × head_dim (attn_split.rs MAX_HEAD_DIM)
#define NEG_INF __int_as_float(0xff800000)

// Block-wide sum of one double per thread (blockDim.x a multiple of 32, at most 1024): warp
// sums by shuffles, then every warp adds the warps' sums by shuffles too (no serial loop over
// the warps, no third barrier); every thread gets the same value.
__device__ double block_sum_d(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL, t, o);
    return t;
}

// Block-wide maximum, as block_sum_d.
__device__ float block_max_f(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : NEG_INF;
    for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(FULL, t, o));
    return t;
}

__device__ __forceinline__ float rms_scale(double ss, int n, float eps) {
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}

// Residual + RMSNorm + quantization by one whole block (any size, a multiple of 32), n values:
//   if branch: b = post_w ? rmsnorm(branch) * (post_w + off) : branch;  x += b * mult
//   out = rmsnorm(x) * (norm_w + off)  (norm eps/offset: eps2/off2)
//   then, when given, out quantized for the next products: q32/d32 (32-value blocks, ggml
//   quantize_row_q8_0_ref) and qk/dk/bsk (Q8_K), each by one warp per block from registers.
__device__ void residual_norm_block(float* x, const float* branch, const float* post_w,
                                    float mult, const float* norm_w, float* out, int n,
                                    float eps, float off, float eps2, float off2, i8* q32,
                                    float* d32, i8* qk, float* dk, int* bsk, double* sh) {
    double ss2 = 0.0;
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
            ss2 += (double)v * (double)v;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss2 += (double)x[i] * (double)x[i];
    }
    // block_sum_d synchronises the block: every x[i] written above is visible after it.
    float sc = rms_scale(block_sum_d(ss2, sh), n, eps2);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = (x[i] * sc) * (norm_w[i] + off2);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (q32)
        for (int b = w; b < n / 32; b += nw) {
            int i = b * 32 + lane;
            quant_reg_32((x[i] * sc) * (norm_w[i] + off2), q32, d32, b, lane, 1);
        }
    if (qk)
        for (int b = w; b < n / 256; b += nw) {
            float v[8];
#pragma unroll
            for (int t = 0; t < 8; t++) {
                int i = b * 256 + lane * 8 + t;
                v[t] = (x[i] * sc) * (norm_w[i] + off2);
            }
            quant_regs_k(v, qk, dk, bsk, b, lane);
        }
}

// Eight floats at p (16-byte aligned) into v.
__device__ __forceinline__ void ld8(const float* p, float (&v)[8]) {
    float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void st8(float* p, const float (&v)[8]) {
    *(float4*)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4*)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// residual_norm_block of one row by a block of RN_THREADS threads, which calls pdl_wait. Rows of
// up to 8 RN_THREADS values (a multiple of 8; of 32 when 32-value blocks are wanted) take a
// shorter path: thread t holds values 8 t .. 8 t + 7 in registers from load to quantization
// (warp w then holds Q8_K block w, as quant_regs_k wants, and 4 lanes each 32-value block), and
// the weights are loaded before pdl_wait (they are never written). Same operations per value
// and the same block sums as residual_norm_block.
__device__ void residual_norm_row(float* x, const float* branch, const float* post_w, float mult,
                                  const float* norm_w, float* out, int n, float eps, float off,
                                  float eps2, float off2, i8* q32, float* d32, i8* qk, float* dk,
                                  int* bsk) {
    __shared__ double sh[32];
    if (n % (q32 ? 32 : 8) != 0 || n > 8 * RN_THREADS) {
        pdl_wait();
        residual_norm_block(x, branch, post_w, mult, norm_w, out, n, eps, off, eps2, off2, q32,
                            d32, qk, dk, bsk, sh);
        return;
    }
    int i0 = 8 * threadIdx.x;
    bool mine = i0 < n;
    float nw[8], pw[8], xv[8], bv[8];
#pragma unroll
    for (int t = 0; t < 8; t++) nw[t] = pw[t] = xv[t] = bv[t] = 0.0f;
    if (mine) {
        ld8(norm_w + i0, nw);
        if (post_w) ld8(post_w + i0, pw);
    }
    pdl_wait();
    if (mine) {
        ld8(x + i0, xv);
        if (branch) ld8(branch + i0, bv);
    }
    if (branch) {
        float sc = 1.0f;
        if (post_w) {
            double ss = 0.0;
#pragma unroll
            for (int t = 0; t < 8; t++) ss += (double)bv[t] * (double)bv[t];
            sc = rms_scale(block_sum_d(ss, sh), n, eps);
        }
#pragma unroll
        for (int t = 0; t < 8; t++) {
            float b = bv[t];
            if (post_w) b = (b * sc) * (pw[t] + off);
            xv[t] = xv[t] + (mult == 1.0f ? b : b * mult);
        }
        if (mine) st8(x + i0, xv);
    }
    double ss2 = 0.0;
#pragma unroll
    for (int t = 0; t < 8; t++) ss2 += (double)xv[t] * (double)xv[t];
    float sc = rms_scale(block_sum_d(ss2, sh), n, eps2);
    float o[8];
#pragma unroll
    for (int t = 0; t < 8; t++) o[t] = (xv[t] * sc) * (nw[t] + off2);
    if (mine) st8(out + i0, o);
    if (q32) quant_regs_32(o, q32, d32, i0, mine);
    int w = threadIdx.x >> 5;
    if (qk && w < n / 256) quant_regs_k(o, qk, dk, bsk, w, threadIdx.x & 31);
}

// RMSNorm of one head held in shared memory row[0:hd] by weights nw (nothing when nw is null),
// by the whole block; ends synchronised.
__device__ void head_norm(float* row, const float* nw, int hd, float eps, float off, double* sh) {
    if (!nw) return;
    double ss = 0.0;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) ss += (double)row[d] * (double)row[d];
    float sc = rms_scale(block_sum_d(ss, sh), hd, eps);
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) row[d] = (row[d] * sc) * (nw[d] + off);
    __syncthreads();
}

// head_norm by one warp (no block synchronisation), so a block's warps normalise several heads
// at once; the same double sum of squares in another order.
__device__ void warp_head_norm(float* row, const float* nw, int hd, float eps, float off) {
    if (!nw) return;
    int lane = threadIdx.x & 31;
    double ss = 0.0;
    for (int d = lane; d < hd; d += 32) ss += (double)row[d] * (double)row[d];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL, ss, o);
    float sc = rms_scale(ss, hd, eps);
    for (int d = lane; d < hd; d += 32) row[d] = (row[d] * sc) * (nw[d] + off);
}

// RoPE of n heads held in shared memory rows[0 : n * hd] (when inv_freq), on the first rot dims
// of each, at position pos, by the whole block: one cos/sin per pair for all heads. cos and sin
// are multiplied by mscale (YaRN's attention factor; 1 otherwise), as t_rope. Starts and ends
// synchronised.
__device__ void heads_rope(float* rows, int n, const double* inv_freq, int pos, int hd, int rot,
                           int interleaved, double mscale) {
    if (!inv_freq) return;
    __syncthreads();
    for (int i = threadIdx.x; i < rot / 2; i += blockDim.x) {
        double ang = (double)pos * inv_freq[i], sn, cs;
        sincos(ang, &sn, &cs);
        float c = (float)(cs * mscale), s = (float)(sn * mscale);
        int ia = interleaved ? 2 * i : i;
        int ib = interleaved ? 2 * i + 1 : i + rot / 2;
        for (int h = 0; h < n; h++) {
            float* row = rows + h * hd;
            float a = row[ia], b = row[ib];
            row[ia] = a * c - b * s;
            row[ib] = b * c + a * s;
        }
    }
    __syncthreads();
}

// RMSNorm (when nw) and RoPE (when inv_freq) of one head held in shared memory row[0:hd], by the
// whole block; ends synchronised.
__device__ void head_norm_rope(float* row, const float* nw, const double* inv_freq, int pos,
                               int hd, int rot, int interleaved, float eps, float off,
                               double mscale, double* sh) {
    head_norm(row, nw, hd, eps, off, sh);
    heads_rope(row, 1, inv_freq, pos, hd, rot, interleaved, mscale);
}

// ---------------------------------------------------------------------------------------------
// KV cache rows (crate::KvType): kt = KV_F32 (float), KV_F16 (IEEE half) or KV_Q8_0 (ggml
// block_q8_0: f16 d, then 32 int8 q; value = d * q; 34 bytes per 32 values, 2-byte aligned).
// Value index i counts from the cache's start; a Q8_0 block never straddles two heads (head_dim
// % 32 == 0, checked on the host), so a head's values i0 .. i0 + hd - 1 start a block.
// ---------------------------------------------------------------------------------------------
#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2

__device__ __forceinline__ float kv_get(const void* c, long long i, int kt) {
    if (kt == KV_F16) return f16_to_f32(((const u16*)c)[i]);
    if (kt == KV_Q8_0) {
        const u8* b = (const u8*)c + (i >> 5) * 34;
        return ld_f16(b) * (float)(i8)b[2 + (i & 31)];
    }
    return ((const float*)c)[i];
}

// Values i, i + 1 (i even).
__device__ __forceinline__ float2 kv_get2(const void* c, long long i, int kt) {
    if (kt == KV_F16) {
        u32 w = ((const u32*)c)[i >> 1];
        return make_float2(f16_to_f32((u16)(w & 0xffff)), f16_to_f32((u16)(w >> 16)));
    }
    if (kt == KV_Q8_0) {
        const u8* b = (const u8*)c + (i >> 5) * 34;
        float d = ld_f16(b);
        u16 q = ld_u16(b + 2 + (i & 31));
        return make_float2(d * (float)(i8)(q & 0xff), d * (float)(i8)(q >> 8));
    }
    return ((const float2*)c)[i >> 1];
}

// Values i .. i + 3 (i % 4 == 0).
__device__ __forceinline__ float4 kv_get4(const void* c, long long i, int kt) {
    if (kt == KV_F32) return ((const float4*)c)[i >> 2];
    float2 a = kv_get2(c, i, kt), b = kv_get2(c, i + 2, kt);
    return make_float4(a.x, a.y, b.x, b.y);
}

// The Q8_0 block of the 32 values of this warp's lanes (v: lane's value), ggml
// quantize_row_q8_0_ref: d = amax / 127, q = roundf(v / d) (by the f32 1 / d; 0 when d = 0),
// d stored as f16. Returns the value the block holds for this lane, d16 * q.
__device__ __forceinline__ float q8_0_block(float v, u8* blk, int lane) {
    float a = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL, a, o));
    float d = a / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = (int)roundf(v * id);
    u16 d16 = f32_to_f16(d);
    if (blk) {
        blk[2 + lane] = (u8)(i8)q;
        if (lane == 0) *(u16*)blk = d16;
    }
    return f16_to_f32(d16) * (float)q;
}

// Values i0 .. i0 + n - 1 of cache c set to src[0 .. n) (n % 32 == 0 and i0 % 32 == 0 for
// Q8_0), by the block's threads (all of them call it).
__device__ void kv_put_row(void* c, long long i0, const float* src, int n, int kt) {
    if (kt == KV_Q8_0) {
        int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int b = w; b < n / 32; b += nw)
            q8_0_block(src[b * 32 + lane], (u8*)c + ((i0 >> 5) + b) * 34, lane);
        return;
    }
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        if (kt == KV_F16) ((u16*)c)[i0 + d] = f32_to_f16(src[d]);
        else ((float*)c)[i0 + d] = src[d];
    }
}

// x[0 .. n) (shared memory) replaced by the values a cache of type kt stores for it, so a
// token attends to its own key and value as later tokens will read them. By the block's
// threads; starts and ends with __syncthreads (the caller's store may still read x).
__device__ void kv_round_row(float* x, int n, int kt) {
    if (kt == KV_F32) return;
    __syncthreads();
    if (kt == KV_Q8_0) {
        int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int b = w; b < n / 32; b += nw) x[b * 32 + lane] = q8_0_block(x[b * 32 + lane], 0, lane);
    } else {
        for (int d = threadIdx.x; d < n; d += blockDim.x) x[d] = round_to_f16(x[d]);
    }
    __syncthreads();
}

// Row pos of kv head g in the caches kc / vc ([ctx][kvd] of type kt) set to k / v (hd values
// each), by the block's threads (all of them call it).
__device__ __forceinline__ void store_kv_row(void* kc, void* vc, const float* k, const float* v,
                                             int pos, int kvd, int g, int hd, int kt) {
    long long o = (long long)pos * kvd + (long long)g * hd;
    kv_put_row(kc, o, k, hd, kt);
    kv_put_row(vc, o, v, hd, kt);
}

// The head's output res[0..hd) (shared memory, written by this block) quantized for the o
// projection when q32 / qk are given, by the block's warps.
__device__ void head_quant(float* res, int h, int hd, i8* q32, float* d32, i8* qk, float* dk,
                           int* bsk) {
    if (!q32 && !qk) return;
    __syncthreads();
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (q32)
        for (int b = w; b < hd / 32; b += nw)
            quant_block_32(res + b * 32, q32, d32, h * (hd / 32) + b, lane, 1);
    if (qk)
        for (int b = w; b < hd / 256; b += nw)
            quant_block_k(res + b * 256, qk, dk, bsk, h * (hd / 256) + b, lane);
}

// The first key position a query at position pos attends to: pos - window + 1 for a sliding
// window (window > 0), 0 without one (window == 0), pos + 1, no key at all, when window < 0.
__device__ __forceinline__ int first_key(int window, int pos) {
    if (window > 0) return max(0, pos - window + 1);
    return window < 0 ? pos + 1 : 0;
}

// Eight consecutive values i .. i + 7 (i % 8 == 0) of a KV cache of type KT, loaded by `load`
// and widened to f32 by `get`, so a lane can put many rows' loads in flight before it needs
// any of them: an f16 cache's eight values in one 16-byte load (they start 16 bytes apart), an
// f32 cache's in two, a q8_0 cache's as four value pairs (kv_get2: 2-byte aligned blocks).
template <int KT> struct Kv8;
template <> struct Kv8<KV_F16> {
    uint4 w;
    __device__ __forceinline__ void load(const void* c, long long i) {
        w = *(const uint4*)((const u16*)c + i);
    }
    __device__ __forceinline__ void get(float (&v)[8]) const {
        u32 u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int t = 0; t < 4; t++) {
            v[2 * t] = f16_to_f32((u16)(u[t] & 0xffff));
            v[2 * t + 1] = f16_to_f32((u16)(u[t] >> 16));
        }
    }
};
template <> struct Kv8<KV_F32> {
    float4 a, b;
    __device__ __forceinline__ void load(const void* c, long long i) {
        a = ((const float4*)c)[i >> 2];
        b = ((const float4*)c)[(i >> 2) + 1];
    }
    __device__ __forceinline__ void get(float (&v)[8]) const {
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
};
template <> struct Kv8<KV_Q8_0> {
    float2 p[4];
    __device__ __forceinline__ void load(const void* c, long long i) {
#pragma unroll
        for (int t = 0; t < 4; t++) p[t] = kv_get2(c, i + 2 * t, KV_Q8_0);
    }
    __device__ __forceinline__ void get(float (&v)[8]) const {
#pragma unroll
        for (int t = 0; t < 4; t++) v[2 * t] = p[t].x, v[2 * t + 1] = p[t].y;
    }
};

// Long contexts (flash decoding): the keys of each kv head split over blocks. Block (g =
// blockIdx.x, s = blockIdx.y) takes the grp = nq / nkv query heads of kv head g (GQA: each
// key and value row is read once for all of them) and the s-th of nsplit equal parts of keys
// first_key(window, pos)..pos. It normalises and rotates the heads (q_norm, k_norm, inv_freq;
// one cos/sin per pair for all of them); the part holding position pos stores K and V of pos
// (caches of type KT) and reads them back like every other key. Row r = blockIdx.z of the
// forward pass's batch takes its caches and position from info[3 r ..] = {k cache, v cache,
// position} (as t_kv_store), its q/k/v rows and splits after those of the rows before it.
// Warp w takes the
// part's tiles of TK = 8 keys w, w + SPLIT_WARPS, ..., one rolled loop step each (the code of
// an unrolled part overflowed the instruction cache: see BENCHMARKS.md):
// - the tile's key and value loads are issued together;
// - scores: lanes 4 k .. 4 k + 3 hold key k's 8-value chunks c, c + 4, ... (c = lane % 4), q
//   broadcast from shared memory, the score summed over the 4 lanes;
// - the online softmax (maximum m, sum l) moves once per tile and head;
// - values: NC = 4 S lanes per row and 32 / NC rows per warp load, lane L holding dims
//   8 (L % NC) .. + 7 of rows L / NC, L / NC + 32 / NC, ..., weighted by the probabilities of
//   their keys; the lanes of the same dims add their sums at the end.
// The warps then meet in shared memory and the block writes, per query head h, its
// unnormalised values sum_j e_j v_j (e_j = exp(s_j - m)), m and l to splits[(h * nsplit + s) *
// (hd + 2) ..] (m = -inf, l = 0 for an empty part); dec_attn_merge combines the parts. With
// one split (nsplit == 1) the block writes the normalised heads to out instead, quantized for
// the o projection into q32/d32 or qk/dk/bsk when given (head_quant), and no merge runs.
// grp <= SPLIT_GRP, grp * hd <= MAX_HD, hd % 8 == 0 and hd <= 32 S (checked on the host).
#define SPLIT_WARPS 4
#define SPLIT_GRP 8
#define TK 8  // keys per warp tile of dec_attn_split*: 4 lanes per key
// Shared memory of dec_attn_split* (head-size class S), declared once per kernel whatever
// instantiation of attn_split runs.
template <int S> struct SplitShared {
    // The group's query heads [grp][hd], then the kv head's key (rotated together); rows past
    // them are read (and their results dropped) by the tile loop's heads grp .. G - 1.
    __align__(16) float qs[(SPLIT_GRP + 1) * S * 32];
    __align__(16) float vs[S * 32];
    float wm[SPLIT_WARPS][SPLIT_GRP], wl[SPLIT_WARPS][SPLIT_GRP];
    __align__(16) float wacc[SPLIT_WARPS][S * 32];
};
// G: the most query heads per kv head this instantiation holds (grp <= G); the tile loop
// computes all G (heads past grp read the rows after them in qs, their results dropped), so
// the loop has no branch on grp.
template <int S, int KT, int G>
__device__ void attn_split(SplitShared<S>& sh, const float* q, const float* k, const float* v,
                           const float* q_norm, const float* k_norm, const double* inv_freq,
                           float* splits, const long long* info, int nq, int nkv, int hd, int rot,
                           int interleaved, float eps, float off, float scale, int window,
                           float cap, int nsplit, float* out, i8* q32, float* d32, i8* qk,
                           float* dk, int* bsk) {
    constexpr int NC = S * 4;   // 8-value chunks of a row (hd <= 8 NC)
    constexpr int KC = S;       // key chunks per lane: 4 lanes per key
    constexpr int RPL = 32 / NC;  // value rows per warp load
    constexpr int VR = TK / RPL;  // value rows per lane and tile
    float* qs = sh.qs;
    float* vs = sh.vs;
    int g = blockIdx.x, grp = nq / nkv, kvd = nkv * hd;
    // Row blockIdx.z of the batch: its caches and position from info.
    long long r = blockIdx.z;
    void* kc = (void*)info[3 * r];
    void* vc = (void*)info[3 * r + 1];
    int pos = (int)info[3 * r + 2];
    q += r * nq * hd;
    k += r * kvd;
    v += r * kvd;
    splits += r * nq * nsplit * (hd + 2);
    float* ks = qs + grp * hd;
    for (int i = threadIdx.x; i < grp * hd; i += blockDim.x) qs[i] = q[(long long)g * grp * hd + i];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        ks[d] = k[(long long)g * hd + d];
        vs[d] = v[(long long)g * hd + d];
    }
    __syncthreads();
    // The grp query heads and the key head (row grp), a warp per head.
    if (q_norm || k_norm) {
        for (int i = threadIdx.x >> 5; i <= grp; i += SPLIT_WARPS)
            warp_head_norm(qs + i * hd, i < grp ? q_norm : k_norm, hd, eps, off);
        __syncthreads();
    }
    heads_rope(qs, grp + 1, inv_freq, pos, hd, rot, interleaved, 1.0);
    long long gb = (long long)g * hd;
    int lo = first_key(window, pos);
    bool none = lo > pos;  // no key at all (window < 0): part 0 still stores the row
    int part_len = (pos - lo + 1 + nsplit - 1) / nsplit;
    lo += blockIdx.y * part_len;
    int hi = min(pos, lo + part_len - 1);
    // The part holding this token stores its K and V row and reads it back from the cache like
    // every other key (a block sees its own global writes after __syncthreads).
    if ((lo <= pos && pos <= hi) || (none && blockIdx.y == 0))
        store_kv_row(kc, vc, ks, vs, pos, kvd, g, hd, KT);
    __syncthreads();
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int vc8 = 8 * (lane % NC), vsub = lane / NC;  // the value phase's dims and first row
    int kk = lane >> 2, kc4 = lane & 3;           // the score phase's key and quarter
    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int i = 0; i < G; i++) {
        m[i] = NEG_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[i][e] = 0.0f;
    }
    // One tile of TK keys per warp and step, its key and value loads issued together; a rolled
    // loop without branches (every head up to G, the rows of keys past hi are those of hi, their probability 0;
    // chunks past hd are read at hd - 8 and weighted 0), so its few hundred instructions stay in
    // the instruction cache.
    int vcl = min(vc8, hd - 8);
#pragma unroll 1
    for (int base = lo + TK * w; base <= hi; base += TK * SPLIT_WARPS) {
        int j = base + kk;
        bool live = j <= hi;
        long long r = gb + (long long)min(j, hi) * kvd;
        Kv8<KT> kr[KC];
#pragma unroll
        for (int t = 0; t < KC; t++) kr[t].load(kc, r + min((kc4 + 4 * t) * 8, hd - 8));
        Kv8<KT> vr[VR];
#pragma unroll
        for (int u = 0; u < VR; u++)
            vr[u].load(vc, gb + (long long)min(base + u * RPL + vsub, hi) * kvd + vcl);
        // Scores: lanes 4 kk .. 4 kk + 3 hold key kk's chunks kc4, kc4 + 4, ...
        float dot[G];
#pragma unroll
        for (int i = 0; i < G; i++) dot[i] = 0.0f;
#pragma unroll
        for (int t = 0; t < KC; t++) {
            int d = (kc4 + 4 * t) * 8;
            float on = d < hd ? 1.0f : 0.0f;
            int dc = min(d, hd - 8);
            float k8[8];
            kr[t].get(k8);
#pragma unroll
            for (int e = 0; e < 8; e++) k8[e] *= on;
#pragma unroll
            for (int i = 0; i < G; i++) {
                float4 q0 = *(const float4*)(qs + i * hd + dc);
                float4 q1 = *(const float4*)(qs + i * hd + dc + 4);
                dot[i] += q0.x * k8[0] + q0.y * k8[1] + q0.z * k8[2] + q0.w * k8[3] +
                          q1.x * k8[4] + q1.y * k8[5] + q1.z * k8[6] + q1.w * k8[7];
            }
        }
        // The online softmax, once per tile and head (the tile's keys: lanes xor 4, 8, 16);
        // pj: the probability term of this lane's key.
        float pj[G];
#pragma unroll
        for (int i = 0; i < G; i++) {
            float dt = dot[i] + __shfl_xor_sync(FULL, dot[i], 1);
            dt += __shfl_xor_sync(FULL, dt, 2);
            float sc = dt * scale;
            if (cap > 0.0f) sc = cap * tanhf(sc / cap);
            sc = live ? sc : NEG_INF;
            float mt = sc;
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(FULL, mt, o));
            float mn = fmaxf(m[i], mt);    // finite: the tile's first key is live
            float corr = expf(m[i] - mn);  // 0 on the first tile (m = -inf)
            float e_ = live ? expf(sc - mn) : 0.0f;
            float sum = e_;
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(FULL, sum, o);
            l[i] = l[i] * corr + sum;
            m[i] = mn;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[i][e] *= corr;
            pj[i] = e_;
        }
        // Values: this lane's rows t = vsub + RPL u of the tile, dims vc8 .. vc8 + 7, weighted
        // by the probability term of key t (lane 4 t; 0 past hi).
#pragma unroll
        for (int u = 0; u < VR; u++) {
            int t = u * RPL + vsub;
            float vv[8];
            vr[u].get(vv);
#pragma unroll
            for (int i = 0; i < G; i++) {
                float pt = __shfl_sync(FULL, pj[i], 4 * t);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[i][e] += pt * vv[e];
            }
        }
    }
    // The lanes of the same dims (vsub = 0 .. RPL - 1) add their rows' sums.
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= grp) break;
#pragma unroll
        for (int o = NC; o < 32; o <<= 1)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[i][e] += __shfl_xor_sync(FULL, acc[i][e], o);
    }
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < G; i++)
            if (i < grp) {
                sh.wm[w][i] = m[i];
                sh.wl[w][i] = l[i];
            }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= grp) break;
        if (vsub == 0 && vc8 < hd)
#pragma unroll
            for (int e = 0; e < 8; e++) sh.wacc[w][vc8 + e] = acc[i][e];
        __syncthreads();
        float mx = NEG_INF;
        for (int t = 0; t < SPLIT_WARPS; t++) mx = fmaxf(mx, sh.wm[t][i]);
        float* sp = splits + ((long long)(g * grp + i) * nsplit + blockIdx.y) * (hd + 2);
        float total = 0.0f;
        for (int t = 0; t < SPLIT_WARPS; t++)
            if (sh.wm[t][i] != NEG_INF) total += sh.wl[t][i] * expf(sh.wm[t][i] - mx);
        // One split: the head's output itself, normalised as dec_attn_merge would (same
        // operations, same bits), and quantized for the o projection; no merge launch.
        int h = (int)r * nq + g * grp + i;
        float inv = total > 0.0f ? (float)(1.0 / (double)total) : 0.0f;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float a = 0.0f;
            for (int t = 0; t < SPLIT_WARPS; t++)
                if (sh.wm[t][i] != NEG_INF) a += sh.wacc[t][d] * expf(sh.wm[t][i] - mx);
            if (nsplit == 1) {
                vs[d] = a * inv;
                out[(long long)h * hd + d] = a * inv;
            } else {
                sp[d] = a;
            }
        }
        if (nsplit == 1) head_quant(vs, h, hd, q32, d32, qk, dk, bsk);
        else if (threadIdx.x == 0) {
            sp[hd] = mx;
            sp[hd + 1] = total;
        }
        __syncthreads();
    }
}

// One kernel per head-size class S (hd <= 32 S) and group size bound G (4, or SPLIT_GRP for
// 5 .. 8 query heads per kv head, whose sums take twice the registers: fewer blocks per
// multiprocessor, MINB); the cache type kt picks the instantiation.
#define SPLIT_ARGS                                                                             \
    sh, q, k, v, q_norm, k_norm, inv_freq, splits, info, nq, nkv, hd, rot, interleaved, eps,  \
        off, scale, window, cap, nsplit, out, q32, d32, qk, dk, bsk
#define ATTN_SPLIT_KERNEL(NAME, S, G, MINB)                                                    \
    extern "C" __global__ void __launch_bounds__(SPLIT_WARPS * 32, MINB)                       \
        NAME(const float* q, const float* k, const float* v, const float* q_norm,              \
             const float* k_norm, const double* inv_freq, float* splits,                       \
             const long long* info, int nq, int nkv, int hd, int rot, int interleaved,          \
             float eps, float off, float scale, int window, float cap, int nsplit, int kt,      \
             float* out, i8* q32, float* d32, i8* qk, float* dk, int* bsk) {                    \
        __shared__ SplitShared<S> sh;                                                          \
        pdl_trigger();                                                                         \
        pdl_wait();                                                                            \
        if (kt == KV_F16) attn_split<S, KV_F16, G>(SPLIT_ARGS);                                \
        else if (kt == KV_Q8_0) attn_split<S, KV_Q8_0, G>(SPLIT_ARGS);                         \
        else attn_split<S, KV_F32, G>(SPLIT_ARGS);                                             \
    }
ATTN_SPLIT_KERNEL(dec_attn_split64, 2, 4, 4)
ATTN_SPLIT_KERNEL(dec_attn_split128, 4, 4, 4)
ATTN_SPLIT_KERNEL(dec_attn_split256, 8, 4, 3)
ATTN_SPLIT_KERNEL(dec_attn_split64_g8, 2, SPLIT_GRP, 3)
ATTN_SPLIT_KERNEL(dec_attn_split128_g8, 4, SPLIT_GRP, 2)
ATTN_SPLIT_KERNEL(dec_attn_split256_g8, 8, SPLIT_GRP, 2)

// The key splits of query head h = blockIdx.x (of row blockIdx.y) combined (dec_attn_split*):
// with M the largest split maximum and w_s = exp(m_s - M) (0 for an empty split), out[h] =
// sum_s w_s o_s / sum_s w_s l_s; then quantized for the o projection when q32 / qk are given
// (head_quant). One block of DEC_THREADS (>= nsplit, >= hd) threads per head: thread t sums dim t % hd over the splits
// t / hd, t / hd + parts, ... (parts = DEC_THREADS / hd groups of loads in flight), then the
// groups' sums meet in shared memory.
extern "C" __global__ void dec_attn_merge(const float* splits, float* out, int hd, int nsplit,
                                          i8* q32, float* d32, i8* qk, float* dk, int* bsk) {
    pdl_trigger();
    pdl_wait();
    __shared__ __align__(16) float res[MAX_HD];
    __shared__ float wt[64];  // w_s (nsplit <= 64, attn_split.rs ATT_MAX_SPLITS)
    __shared__ double shd[32];
    __shared__ float shf[32];
    // Head h of all rows' heads (row blockIdx.y of a forward-pass batch).
    int h = blockIdx.y * gridDim.x + blockIdx.x;
    const float* sp = splits + (long long)h * nsplit * (hd + 2);
    int s = threadIdx.x;
    float m = s < nsplit ? sp[s * (hd + 2) + hd] : NEG_INF;
    float mx = block_max_f(m, shf);
    float w = m == NEG_INF ? 0.0f : expf(m - mx);
    if (s < nsplit) wt[s] = w;
    double total = block_sum_d(s < nsplit ? (double)sp[s * (hd + 2) + hd + 1] * (double)w : 0.0, shd);
    float inv = total > 0.0 ? (float)(1.0 / total) : 0.0f;
    __shared__ float part[DEC_THREADS];
    int parts = blockDim.x / hd, d = threadIdx.x % hd, g = threadIdx.x / hd;
    float acc = 0.0f;
    if (g < parts)
#pragma unroll 8
        for (int t = g; t < nsplit; t += parts) acc += sp[t * (hd + 2) + d] * wt[t];
    part[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < hd) {
        float sum = 0.0f;
        for (int u = 0; u < parts; u++) sum += part[u * hd + d];
        res[d] = sum * inv;
        out[(long long)h * hd + d] = sum * inv;
    }
    head_quant(res, h, hd, q32, d32, qk, dk, bsk);
}

__device__ __forceinline__ float act_fn(float x, int act) {
    if (act == 0) return x / (1.0f + expf(-x));
    if (act == 1) {
        float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

// Activation of the 32-value (kq = 0, one per lane) or 256-value (kq = 1, eight per lane) chunk
// c of n values by one warp: up[i] = act(gate[i]) * up[i], or act(up[i]) without a gate (act:
// 0 SiLU, 1 tanh-GELU, 2 erf-GELU), then quantized for the down projection when q is given
// (Q8_K when kq, else 32-value blocks; the host gives q only when n is a multiple of the chunk).
__device__ void act_chunk(const float* gate, float* up, int n, int act, i8* q, float* d,
                          int* bsums, int kq, int c, int lane) {
    int per = kq ? 8 : 1;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = 0.0f;
        long long k = (long long)c * 32 * per + lane * per + i;
        if (i < per && k < n) {
            float u = up[k];
            v[i] = gate ? act_fn(gate[k], act) * u : act_fn(u, act);
            up[k] = v[i];
        }
    }
    if (!q) return;
    if (kq) quant_regs_k(v, q, d, bsums, c, lane);
    else quant_reg_32(v[0], q, d, c, lane, 1);
}

// Several quantized mat-vecs in one launch (fused QKV, gate+up, one matrix, or the experts an
// MoE router chose): jobs[7 j .. 7 j + 6] = {W, y, rows, format | activation row << 8 | slot
// << 32, first block, rows per warp, bias (0: none)}; block b runs the job whose first block is
// the largest <= b. format: 0 Q4_0, 1 Q5_0, 2 Q8_0 (32-value activations aq32/ad32), 4 Q4_K,
// 5 Q6_K (Q8_K activations aqk/adk/bsk; mvk_stream). ROUTED (dec_mv_multi_rows, the experts of
// ggml's mul_mat_id): W is the product's table of nexp expert weights, the job's expert is
// sel[slot] (the router's choice, t_moe_route: read after pdl_wait, clamped into the table),
// and the job reads row `activation row` of the quantized activations (each slot its own
// input, or row 0). Otherwise those fields are 0 and not read (dec_mv_multi, every other
// product: the offsets cost the dense decode ~1%). At most 64 registers (4 blocks of 8 warps
// per SM; ptxas sm_90: no spills, 93 registers unbounded).
template <bool ROUTED>
__device__ __forceinline__ void mv_multi(const long long* __restrict__ jobs, int njobs,
                                         const i8* aq32, const float* ad32, const i8* aqk,
                                         const float* adk, const int* bsk, int cols,
                                         const float* sel, int nexp) {
    __shared__ __align__(16) u8 sm[ROWS_PER_BLOCK][STAGE_BYTES];
    pdl_trigger();
    int b = blockIdx.x;
    int j = njobs - 1;
    while (j > 0 && b < (int)jobs[7 * j + 4]) j--;
    const long long* jb = jobs + 7 * j;
    const u8* W = (const u8*)jb[0];
    float* y = (float*)jb[1];
    int rows = (int)jb[2];
    int bx = b - (int)jb[4];
    int rpw = (int)jb[5];
    const float* bias = (const float*)jb[6];
    u8* smw = sm[threadIdx.x >> 5];
    if (ROUTED) {
        pdl_wait();
        int e = (int)sel[jb[3] >> 32];  // a NaN choice converts to 0
        W = (const u8*)((const long long*)jb[0])[e < 0 ? 0 : e >= nexp ? nexp - 1 : e];
        const long long xr = (jb[3] >> 8) & 0xffffff;
        aq32 += xr * cols;
        ad32 += xr * (cols / 32);
        aqk += xr * cols;
        adk += xr * (cols / 256);
        bsk += xr * (cols / 16);
    }
    switch ((int)(jb[3] & 0xff)) {
        case 0: mv32<F_Q4_0, 1>(W, 0, aq32, ad32, y, rows, cols, 1, bx, smw, rpw, bias); break;
        case 1: mv32<F_Q5_0, 1>(W, 0, aq32, ad32, y, rows, cols, 1, bx, smw, rpw, bias); break;
        case 2: mv32<F_Q8_0, 1>(W, 0, aq32, ad32, y, rows, cols, 1, bx, smw, rpw, bias); break;
        case 4: mvk_stream<Q4kLane>(W, aqk, adk, bsk, y, rows, cols, bx, rpw, 144, bias); break;
        default: mvk_stream<Q6kLane>(W, aqk, adk, bsk, y, rows, cols, bx, rpw, 210, bias); break;
    }
}

extern "C" __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK, 4)
    dec_mv_multi(const long long* __restrict__ jobs, int njobs, const i8* aq32,
                 const float* ad32, const i8* aqk, const float* adk, const int* bsk, int cols) {
    mv_multi<false>(jobs, njobs, aq32, ad32, aqk, adk, bsk, cols, 0, 0);
}

extern "C" __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK, 4)
    dec_mv_multi_rows(const long long* __restrict__ jobs, int njobs, const i8* aq32,
                      const float* ad32, const i8* aqk, const float* adk, const int* bsk,
                      int cols, const float* sel, int nexp) {
    mv_multi<true>(jobs, njobs, aq32, ad32, aqk, adk, bsk, cols, sel, nexp);
}

// The greedy token over logits[0:n], by the block's threads (any grid of whole warps): best[0]
// = max over finite logits of (the value's bits mapped to an unsigned order, -0 as +0) << 32 |
// (0xffffffff - i), so the largest value wins and ties go to the smaller id (sampling::argmax);
// best[1] = 1 when some logit is NaN or infinite. best[] must be cleared before.
__device__ void argmax_into(const float* logits, int n, unsigned long long* best) {
    __shared__ unsigned long long sk[32];
    unsigned long long key = 0;
    int bad = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = logits[i] + 0.0f;
        if (!isfinite(v)) {
            bad = 1;
            continue;
        }
        u32 b = __float_as_uint(v);
        b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
        unsigned long long k = ((unsigned long long)b << 32) | (0xffffffffu - (u32)i);
        key = k > key ? k : key;
    }
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long k = __shfl_xor_sync(FULL, key, o);
        key = k > key ? k : key;
    }
    bad = __any_sync(FULL, bad);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) sk[w] = key;
    if (lane == 0 && bad) atomicOr(best + 1, 1ull);
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; i++) key = sk[i] > key ? sk[i] : key;
        if (key) atomicMax(best, key);
    }
}
