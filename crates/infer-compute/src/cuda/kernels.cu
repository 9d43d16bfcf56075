// infer-compute CUDA kernels, compiled at run time with NVRTC (no headers: NVRTC has no host
// C library). Numerics mirror the CPU scalar references in src/vec_dot/generic.rs and
// src/q8_split.rs: activations are quantized exactly as the CPU does (same f32 operations), every
// per-block integer sum is exact, so the results differ from the CPU only in the order in which
// the f32 block terms are added.
//
// Layouts (ggml, little-endian): Q4_0 18 B [f16 d | 16 B nibbles], Q5_0 22 B [f16 d | u32 qh |
// 16 B nibbles], Q8_0 34 B [f16 d | 32 i8], Q4_K 144 B [f16 d | f16 dmin | 12 B scales | 128 B
// nibbles], Q6_K 210 B [128 B ql | 64 B qh | 16 i8 scales | f16 d].
//
// Mat-vec kernels: one warp per weight row, ROWS_PER_BLOCK warps per block (blockIdx.x), MT
// activation rows per warp (blockIdx.y), so each weight row is read once per MT activations.
// Weights are staged per warp through shared memory in chunks of at most STAGE bytes, with
// 16-byte loads from 16-byte aligned addresses (up to 5 loads in flight per lane, 2 KiB per
// warp), whatever the block size (Q5_0's 22 B and Q6_K's 210 B blocks are only 2-byte aligned);
// the blocks are then decoded from shared memory. The device buffers carry 16 bytes of padding
// (cache.rs WEIGHT_PAD), so the last aligned load of a row stays inside the allocation.
// The one-row K-quant products (mvk_stream, below) read their weights straight into registers
// instead, without shared memory.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

#define FULL 0xffffffffu
#define ROWS_PER_BLOCK 8
#define STAGE 2048
#define STAGE_WORDS 5  // 16-byte loads per lane: ceil((15 + STAGE + 15) / 16 / 32)
#define STAGE_BYTES (STAGE_WORDS * 32 * 16)
#define MT 4

// Programmatic dependent launch (sm_90+; no-ops elsewhere and when the kernel was launched
// without the attribute, as the host-slice products are): pdl_wait blocks until the kernels
// this one depends on have finished and their writes are visible; pdl_trigger lets the next
// kernel of the stream start launching (it still waits before reading our outputs).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> nearest-even f16 bits.
__device__ __forceinline__ u16 f32_to_f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// f32 -> nearest-even f16 -> f32 (the value ggml stores in a Q8_0 block).
__device__ __forceinline__ float round_to_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

__device__ __forceinline__ u16 ld_u16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ float ld_f16(const u8* p) { return f16_to_f32(ld_u16(p)); }
// Four bytes from a 2-byte aligned address.
__device__ __forceinline__ int ld_i32_a2(const u8* p) {
    return (int)((u32)ld_u16(p) | ((u32)ld_u16(p + 2) << 16));
}

// Copy the len bytes at gsrc (len <= STAGE) into this warp's shared buffer smw (16-byte
// aligned, STAGE_BYTES long) with aligned 16-byte loads; returns the address of gsrc's copy.
// Ends with __syncwarp(); the caller must __syncwarp() before staging again.
__device__ __forceinline__ const u8* stage(const u8* __restrict__ gsrc, int len, u8* smw,
                                           int lane) {
    unsigned long long a = (unsigned long long)gsrc;
    const uint4* g = (const uint4*)(a & ~15ull);
    int off = (int)(a & 15);
    int nw = (off + len + 15) >> 4;
    uint4* sw = (uint4*)smw;
    uint4 v[STAGE_WORDS];
#pragma unroll
    for (int k = 0; k < STAGE_WORDS; k++) {
        int i = lane + 32 * k;
        if (i < nw) v[k] = __ldg(g + i);
    }
#pragma unroll
    for (int k = 0; k < STAGE_WORDS; k++) {
        int i = lane + 32 * k;
        if (i < nw) sw[i] = v[k];
    }
    __syncwarp();
    return smw + off;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

// ---------------------------------------------------------------------------------------------
// Activation quantization
// ---------------------------------------------------------------------------------------------

// One warp per 32-value block: d = amax/127, id = 1/d (0 if d == 0), q = roundf(x*id).
// f16_scale != 0: ggml quantize_row_q8_0_ref (d stored as f16; the quants use the f32 d);
// f16_scale == 0: the seed's Q8 activation format (f32 d), src/q8_split.rs quantize_row.
// One 32-value block by one warp (lane = value, v its value): output block `blk` of q, d.
__device__ __forceinline__ void quant_reg_32(float v, i8* __restrict__ q, float* __restrict__ d,
                                             int blk, int lane, int f16_scale) {
    float a = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL, a, o));
    float dd = a / 127.0f;
    float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    q[(long long)blk * 32 + lane] = (i8)(int)roundf(v * id);
    if (lane == 0) d[blk] = f16_scale ? round_to_f16(dd) : dd;
}

// quant_reg_32 (f16 scale) with 8 consecutive values per lane, v = values i0 .. i0 + 7 (i0 a
// multiple of 8): the 4 lanes 4j .. 4j + 3 of a warp hold one 32-value block. Every lane
// takes part (shuffles); only lanes with `mine` write.
__device__ __forceinline__ void quant_regs_32(const float (&v)[8], i8* __restrict__ q,
                                              float* __restrict__ d, int i0, bool mine) {
    float a = 0.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) a = fmaxf(a, fabsf(v[t]));
    a = fmaxf(a, __shfl_xor_sync(FULL, a, 1));
    a = fmaxf(a, __shfl_xor_sync(FULL, a, 2));
    float dd = a / 127.0f;
    float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    if (!mine) return;
#pragma unroll
    for (int t = 0; t < 8; t++) q[i0 + t] = (i8)(int)roundf(v[t] * id);
    if ((i0 & 31) == 0) d[i0 / 32] = round_to_f16(dd);
}

// The same with the block's values at xb.
__device__ __forceinline__ void quant_block_32(const float* __restrict__ xb, i8* __restrict__ q,
                                               float* __restrict__ d, int blk, int lane,
                                               int f16_scale) {
    quant_reg_32(xb[lane], q, d, blk, lane, f16_scale);
}

extern "C" __global__ void quantize_q8_32(const float* __restrict__ x, i8* __restrict__ q,
                                          float* __restrict__ d, int nblocks, int f16_scale) {
    pdl_wait();
    int blk = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (blk >= nblocks) return;
    quant_block_32(x + (long long)blk * 32, q, d, blk, lane, f16_scale);
}

// One warp per 256-value block, 8 consecutive values per lane: ggml quantize_row_q8_K_ref.
// max = the first value of largest |x| (sequential strict '>'), iscale = -127/max,
// q = min(nearest_int(iscale*x), 127), d = 1/iscale, bsums[g] = sum of q over 16-value group g.
// An all-zero block gives d = 0, q = 0, bsums = 0.
// One 256-value block by one warp, v = values 8 lane .. 8 lane + 7: output block `blk` of q,
// d, bsums.
__device__ __forceinline__ void quant_regs_k(const float (&v)[8], i8* __restrict__ q,
                                             float* __restrict__ d, int* __restrict__ bsums,
                                             int blk, int lane) {
    float amax = 0.0f, mx = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float ax = fabsf(v[i]);
        if (ax > amax) {
            amax = ax;
            mx = v[i];
            idx = lane * 8 + i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float oa = __shfl_xor_sync(FULL, amax, o);
        float om = __shfl_xor_sync(FULL, mx, o);
        int oi = __shfl_xor_sync(FULL, idx, o);
        if (oa > amax || (oa == amax && oi < idx)) {
            amax = oa;
            mx = om;
            idx = oi;
        }
    }
    i8* qb = q + (long long)blk * 256 + lane * 8;
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) qb[i] = 0;
        if ((lane & 1) == 0) bsums[blk * 16 + lane / 2] = 0;
        if (lane == 0) d[blk] = 0.0f;
        return;
    }
    float iscale = -127.0f / mx;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int qi = min(__float2int_rn(iscale * v[i]), 127);
        qb[i] = (i8)qi;
        s += qi;
    }
    s += __shfl_xor_sync(FULL, s, 1);
    if ((lane & 1) == 0) bsums[blk * 16 + lane / 2] = s;
    if (lane == 0) d[blk] = 1.0f / iscale;
}

// The same with the block's values at x256.
__device__ __forceinline__ void quant_block_k(const float* __restrict__ x256, i8* __restrict__ q,
                                              float* __restrict__ d, int* __restrict__ bsums,
                                              int blk, int lane) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = x256[lane * 8 + i];
    quant_regs_k(v, q, d, bsums, blk, lane);
}

extern "C" __global__ void quantize_q8_k(const float* __restrict__ x, i8* __restrict__ q,
                                         float* __restrict__ d, int* __restrict__ bsums,
                                         int nblocks) {
    pdl_wait();
    int blk = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (blk >= nblocks) return;
    quant_block_k(x + (long long)blk * 256, q, d, bsums, blk, lane);
}

// ---------------------------------------------------------------------------------------------
// 32-value block formats x int8 activations (Q8_0 or the seed's Q8): four lanes per block, eight
// values per lane, the block's integer sum reduced over the four lanes, then one f32 term per
// block combined in the CPU reference's operation order.
// ---------------------------------------------------------------------------------------------

#define F_Q4_0 0
#define F_Q5_0 1
#define F_Q8_0 2
#define F_Q8S 3  // seed Q8: int8 values [rows, cols] + f32 scales [rows, cols/32]

__device__ __forceinline__ int expand_bits4(u32 h) {
    return (int)(((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25));
}

// Blocks c0 .. c0 + cb of weight row `row` (staged at wr) against activation rows
// t0 .. t0 + nt: this lane's share of the partial sums, added to acc (reduced by the caller).
template <int FMT, int M>
__device__ __forceinline__ void mv32_blocks(const u8* wr, int c0, int cb, int row, int nb,
                                            int cols, int t0, int nt, int lane,
                                            const float* __restrict__ wscale,
                                            const i8* __restrict__ aq,
                                            const float* __restrict__ ad, float (&acc)[M]) {
    const int bb = FMT == F_Q4_0 ? 18 : FMT == F_Q5_0 ? 22 : FMT == F_Q8_0 ? 34 : 32;
    int sub = lane & 3;
#pragma unroll 2
    for (int j0 = 0; j0 < cb; j0 += 8) {
        int ib = c0 + j0 + (lane >> 2);
        bool ok = j0 + (lane >> 2) < cb;
        int w0 = 0, w1 = 0, aoff0 = 0, aoff1 = 0;
        float dw = 0.0f;
        if (ok) {
            const u8* b = wr + (j0 + (lane >> 2)) * bb;
            if (FMT == F_Q4_0) {
                dw = ld_f16(b);
                int qs = ld_i32_a2(b + 2 + 4 * sub);
                w0 = __vsub4(qs & 0x0F0F0F0F, 0x08080808);
                w1 = __vsub4((qs >> 4) & 0x0F0F0F0F, 0x08080808);
                aoff0 = 4 * sub;
                aoff1 = 16 + 4 * sub;
            } else if (FMT == F_Q5_0) {
                dw = ld_f16(b);
                u32 qh = (u32)ld_i32_a2(b + 2);
                int qs = ld_i32_a2(b + 6 + 4 * sub);
                int lo = (qs & 0x0F0F0F0F) | expand_bits4((qh >> (4 * sub)) & 0xF);
                int hi = ((qs >> 4) & 0x0F0F0F0F) | expand_bits4((qh >> (16 + 4 * sub)) & 0xF);
                w0 = __vsub4(lo, 0x10101010);
                w1 = __vsub4(hi, 0x10101010);
                aoff0 = 4 * sub;
                aoff1 = 16 + 4 * sub;
            } else if (FMT == F_Q8_0) {
                dw = ld_f16(b);
                w0 = ld_i32_a2(b + 2 + 8 * sub);
                w1 = ld_i32_a2(b + 6 + 8 * sub);
                aoff0 = 8 * sub;
                aoff1 = 8 * sub + 4;
            } else {
                dw = wscale[(long long)row * nb + ib];
                w0 = ld_i32_a2(b + 8 * sub);
                w1 = ld_i32_a2(b + 8 * sub + 4);
                aoff0 = 8 * sub;
                aoff1 = 8 * sub + 4;
            }
        }
#pragma unroll
        for (int t = 0; t < M; t++) {
            if (t < nt) {
                int s = 0;
                float dx = 0.0f;
                if (ok) {
                    const i8* a = aq + (long long)(t0 + t) * cols + ib * 32;
                    s = __dp4a(w0, *(const int*)(a + aoff0), 0);
                    s = __dp4a(w1, *(const int*)(a + aoff1), s);
                    dx = ad[(long long)(t0 + t) * nb + ib];
                }
                s += __shfl_xor_sync(FULL, s, 1);
                s += __shfl_xor_sync(FULL, s, 2);
                if (ok && sub == 0) {
                    // Operation order of ggml_vec_dot_*_generic / q8_split::dot_row.
                    if (FMT == F_Q4_0) acc[t] += (float)s * dw * dx;
                    else if (FMT == F_Q5_0) acc[t] += (dw * dx) * (float)s;
                    else if (FMT == F_Q8_0) acc[t] += (float)s * (dw * dx);
                    else acc[t] += (float)s * dw * dx;
                }
            }
        }
    }
}

// Warp-sum acc and write the row's outputs, plus bias[row] when a bias is given (a Linear
// bias, added after the whole sum as the CPU's forward pass does).
template <int M>
__device__ __forceinline__ void mv_store(float (&acc)[M], float* __restrict__ y, int rows,
                                         int row, int t0, int nt, int lane,
                                         const float* __restrict__ bias) {
#pragma unroll
    for (int t = 0; t < M; t++) {
        if (t < nt) {
            float v = warp_sum(acc[t]);
            if (lane == 0) y[(long long)(t0 + t) * rows + row] = bias ? v + bias[row] : v;
        }
    }
}

// The warp loop of the quantized mat-vecs: warp w of block bx takes rows (bx * ROWS_PER_BLOCK +
// w) * rpw .., staging each row's weights (nb blocks of bb bytes) through smw in chunks, and
// dot(wr, c0, cb, row, t0, nt, acc) adds blocks c0 .. c0 + cb of `row` (staged at wr) against
// activation rows t0 .. t0 + nt to acc. rpw > 1: the warp's rows are contiguous and staged at
// once (the host picks rpw so that rpw * nb * bb <= STAGE): more bytes in flight per warp for
// tall matrices (the lm_head), whose one-row warps are too short to hide the load latency.
// The weights (never written) are staged before pdl_wait. bias: as mv_store (may be null).
template <int M, typename Dot>
__device__ __forceinline__ void mv_rows(const u8* __restrict__ W, float* __restrict__ y,
                                        int rows, int nb, int bb, int m, int bx, u8* smw,
                                        int rpw, const float* __restrict__ bias, Dot dot) {
    int warp = threadIdx.x >> 5;
    int row = (bx * ROWS_PER_BLOCK + warp) * rpw;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;  // whole warps only: the kernel synchronises warps, not blocks
    int t0 = blockIdx.y * M;
    int nt = min(M, m - t0);
    const u8* wrow = W + (long long)row * nb * bb;
    float acc[M];
    if (rpw > 1) {
        int nr = min(rpw, rows - row);
        const u8* wr = stage(wrow, nr * nb * bb, smw, lane);
        pdl_wait();
        for (int r = 0; r < nr; r++) {
#pragma unroll
            for (int t = 0; t < M; t++) acc[t] = 0.0f;
            dot(wr + r * nb * bb, 0, nb, row + r, t0, nt, acc);
            mv_store(acc, y, rows, row + r, t0, nt, lane, bias);
        }
        return;
    }
    const int CB = STAGE / bb;  // blocks per staged chunk
#pragma unroll
    for (int t = 0; t < M; t++) acc[t] = 0.0f;
    for (int c0 = 0; c0 < nb; c0 += CB) {
        int cb = min(CB, nb - c0);
        const u8* wr = stage(wrow + (long long)c0 * bb, cb * bb, smw, lane);
        if (c0 == 0) pdl_wait();
        dot(wr, c0, cb, row, t0, nt, acc);
        __syncwarp();
    }
    mv_store(acc, y, rows, row, t0, nt, lane, bias);
}

// 32-value block formats: mv_rows over mv32_blocks.
template <int FMT, int M>
__device__ __forceinline__ void mv32(const u8* __restrict__ W, const float* __restrict__ wscale,
                                     const i8* __restrict__ aq, const float* __restrict__ ad,
                                     float* __restrict__ y, int rows, int cols, int m, int bx,
                                     u8* smw, int rpw = 1, const float* bias = nullptr) {
    const int bb = FMT == F_Q4_0 ? 18 : FMT == F_Q5_0 ? 22 : FMT == F_Q8_0 ? 34 : 32;
    int nb = cols / 32, lane = threadIdx.x & 31;
    mv_rows<M>(W, y, rows, nb, bb, m, bx, smw, rpw, bias,
               [&](const u8* wr, int c0, int cb, int row, int t0, int nt, float (&acc)[M]) {
                   mv32_blocks<FMT, M>(wr, c0, cb, row, nb, cols, t0, nt, lane, wscale, aq, ad,
                                       acc);
               });
}

extern "C" __global__ void mv_q4_0(const u8* W, const i8* aq, const float* ad, float* y, int rows,
                                   int cols, int m) {
    __shared__ __align__(16) u8 sm[ROWS_PER_BLOCK][STAGE_BYTES];
    mv32<F_Q4_0, MT>(W, 0, aq, ad, y, rows, cols, m, blockIdx.x, sm[threadIdx.x >> 5]);
}
extern "C" __global__ void mv_q5_0(const u8* W, const i8* aq, const float* ad, float* y, int rows,
                                   int cols, int m) {
    __shared__ __align__(16) u8 sm[ROWS_PER_BLOCK][STAGE_BYTES];
    mv32<F_Q5_0, MT>(W, 0, aq, ad, y, rows, cols, m, blockIdx.x, sm[threadIdx.x >> 5]);
}
extern "C" __global__ void mv_q8_0(const u8* W, const i8* aq, const float* ad, float* y, int rows,
                                   int cols, int m) {
    __shared__ __align__(16) u8 sm[ROWS_PER_BLOCK][STAGE_BYTES];
    mv32<F_Q8_0, MT>(W, 0, aq, ad, y, rows, cols, m, blockIdx.x, sm[threadIdx.x >> 5]);
}
extern "C" __global__ void mv_q8s(const u8* W, const float* ws, const i8* aq, const float* ad,
                                  float* y, int rows, int cols, int m) {
    __shared__ __align__(16) u8 sm[ROWS_PER_BLOCK][STAGE_BYTES];
    mv32<F_Q8S, MT>(W, ws, aq, ad, y, rows, cols, m, blockIdx.x, sm[threadIdx.x >> 5]);
}

// ---------------------------------------------------------------------------------------------
// K-quants x Q8_K activations
// ---------------------------------------------------------------------------------------------

// ggml get_scale_min_k4.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// ---------------------------------------------------------------------------------------------
// Decode mat-vecs of the K-quants for one activation row (dec_mv_multi), reading the weights
// straight into registers: four lanes per super-block (a warp step covers eight), each lane
// 64 of its 256 values, the next step's weights loaded before this step's are used. One
// 16-byte load per 16 quant bytes (Q4_K blocks are 16-byte aligned; Q6_K's 210-byte blocks are
// read as aligned words funnel-shifted into place). Integer sums are exact.
// ---------------------------------------------------------------------------------------------

// A lane's share of one Q4_K super-block: quant bytes 32p .. 32p + 31 (q0, q1: sub-block 2p in
// the low nibbles, 2p + 1 in the high) and the block's header h (d, dmin, 12 bytes of scales).
struct Q4kLane {
    uint4 h, q0, q1;
};

__device__ __forceinline__ void kq_load(const u8* __restrict__ b, int p, Q4kLane& r) {
    const uint4* v = (const uint4*)b;
    r.h = __ldg(v);
    r.q0 = __ldg(v + 1 + 2 * p);
    r.q1 = __ldg(v + 2 + 2 * p);
}

// s + the dot of the 16 nibbles at bit `shift` of q's bytes with the 16 int8 values a.
__device__ __forceinline__ int dp4a_nibbles(uint4 q, int4 a, int shift, int s) {
    s = __dp4a((int)((q.x >> shift) & 0x0F0F0F0F), a.x, s);
    s = __dp4a((int)((q.y >> shift) & 0x0F0F0F0F), a.y, s);
    s = __dp4a((int)((q.z >> shift) & 0x0F0F0F0F), a.z, s);
    return __dp4a((int)((q.w >> shift) & 0x0F0F0F0F), a.w, s);
}

// Lane p's term of one super-block: activation values 64p .. 64p + 63 of a (the block's Q8_K
// quants, 16-byte aligned), its scale yd and bsums bs[0..16). Scales and mins of sub-blocks
// 2p and 2p + 1 as ggml get_scale_min_k4.
__device__ __forceinline__ float kq_term(const Q4kLane& r, int p, const i8* __restrict__ a,
                                         float yd, const int* __restrict__ bs) {
    const int4* av = (const int4*)(a + 64 * p);
    int4 b = *(const int4*)(bs + 4 * p);
    // q0 holds values 64p + 0..15 (low nibbles) and 64p + 32..47 (high), q1 16..31 and 48..63.
    int lo = dp4a_nibbles(r.q1, av[1], 0, dp4a_nibbles(r.q0, av[0], 0, 0));
    int hi = dp4a_nibbles(r.q1, av[3], 4, dp4a_nibbles(r.q0, av[2], 4, 0));
    int sc0, sc1, mn0, mn1;
    u32 s03 = r.h.y, m03 = r.h.z, x = r.h.w;  // scale bytes 0..3, 4..7, 8..11
    if (p < 2) {
        int sh = 16 * p;
        sc0 = (s03 >> sh) & 63;
        sc1 = (s03 >> (sh + 8)) & 63;
        mn0 = (m03 >> sh) & 63;
        mn1 = (m03 >> (sh + 8)) & 63;
    } else {
        int sh = 16 * (p - 2);
        sc0 = ((x >> sh) & 0xF) | (((s03 >> (sh + 6)) & 3) << 4);
        sc1 = ((x >> (sh + 8)) & 0xF) | (((s03 >> (sh + 14)) & 3) << 4);
        mn0 = ((x >> (sh + 4)) & 0xF) | (((m03 >> (sh + 6)) & 3) << 4);
        mn1 = ((x >> (sh + 12)) & 0xF) | (((m03 >> (sh + 14)) & 3) << 4);
    }
    float d = f16_to_f32((u16)(r.h.x & 0xFFFF)), dmin = f16_to_f32((u16)(r.h.x >> 16));
    return (d * yd) * (float)(sc0 * lo + sc1 * hi) -
           (dmin * yd) * (float)(mn0 * (b.x + b.y) + mn1 * (b.z + b.w));
}

// 16 bytes from the 2-byte aligned address 4 * w + sh / 8 (sh: 0 or 16): five aligned words,
// funnel-shifted.
__device__ __forceinline__ uint4 ld16_a2(const u32* __restrict__ w, u32 sh) {
    u32 w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3),
        w4 = __ldg(w + 4);
    return make_uint4(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh),
                      __funnelshift_r(w2, w3, sh), __funnelshift_r(w3, w4, sh));
}

// A lane's share of one Q6_K super-block, lane s4 = 2 half + part: of half `half` (128 values,
// ggml dequantize_row_q6_K's outer loop), ql bytes l = 16 part .. + 15 (la) and l + 32 (lb),
// qh bytes l (qh), its eight scales (sc0: scales 8 half + 0..3, sc1: + 4..7) and d.
struct Q6kLane {
    uint4 la, lb, qh;
    u32 sc0, sc1, d;
};

__device__ __forceinline__ void kq_load(const u8* __restrict__ b, int s4, Q6kLane& r) {
    unsigned long long a = (unsigned long long)b;  // 210-byte blocks: 2-byte aligned
    const u32* w = (const u32*)(a & ~3ull);
    u32 sh = (u32)(a & 2) * 8;
    int half = s4 >> 1, l = 16 * (s4 & 1);
    r.la = ld16_a2(w + (64 * half + l) / 4, sh);
    r.lb = ld16_a2(w + (64 * half + 32 + l) / 4, sh);
    r.qh = ld16_a2(w + (128 + 32 * half + l) / 4, sh);
    const u32* ws = w + 48 + 2 * half;  // scales at byte 192 + 8 half
    u32 s0 = __ldg(ws), s1 = __ldg(ws + 1), s2 = __ldg(ws + 2);
    r.sc0 = __funnelshift_r(s0, s1, sh);
    r.sc1 = __funnelshift_r(s1, s2, sh);
    r.d = (__ldg(w + 52) >> sh) & 0xFFFF;  // d at byte 208
}

// Signed byte k of x.
__device__ __forceinline__ int sbyte(u32 x, int k) { return (int)(x << (24 - 8 * k)) >> 24; }

// Lane s4's term of one Q6_K super-block: its four groups of 16 values 128 half + 32 k + l ..
// (k = 0..3, l = 16 part), each with scale 8 half + 2 k + part, against the activations a (the
// block's Q8_K quants, 16-byte aligned), scale yd and bsums bs (sums of 16 values). The quants
// are stored plus 32: dot(q - 32, a) = dot(q, a) - 32 sum(a).
__device__ __forceinline__ float kq_term(const Q6kLane& r, int s4, const i8* __restrict__ a,
                                         float yd, const int* __restrict__ bs) {
    int half = s4 >> 1, part = s4 & 1;
    const int4* av = (const int4*)(a + 128 * half + 16 * part);
    int4 a0 = av[0], a1 = av[2], a2 = av[4], a3 = av[6];
    const u32 la[4] = {r.la.x, r.la.y, r.la.z, r.la.w};
    const u32 lb[4] = {r.lb.x, r.lb.y, r.lb.z, r.lb.w};
    const u32 qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
    const int x0[4] = {a0.x, a0.y, a0.z, a0.w}, x1[4] = {a1.x, a1.y, a1.z, a1.w};
    const int x2[4] = {a2.x, a2.y, a2.z, a2.w}, x3[4] = {a3.x, a3.y, a3.z, a3.w};
    int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 h = qh[j];
        s0 = __dp4a((int)((la[j] & 0x0F0F0F0F) | ((h << 4) & 0x30303030)), x0[j], s0);
        s1 = __dp4a((int)((lb[j] & 0x0F0F0F0F) | ((h << 2) & 0x30303030)), x1[j], s1);
        s2 = __dp4a((int)(((la[j] >> 4) & 0x0F0F0F0F) | (h & 0x30303030)), x2[j], s2);
        s3 = __dp4a((int)(((lb[j] >> 4) & 0x0F0F0F0F) | ((h >> 2) & 0x30303030)), x3[j], s3);
    }
    int4 b0 = *(const int4*)(bs + 8 * half), b1 = *(const int4*)(bs + 8 * half + 4);
    int g0 = part ? b0.y : b0.x, g1 = part ? b0.w : b0.z;
    int g2 = part ? b1.y : b1.x, g3 = part ? b1.w : b1.z;
    int isum = sbyte(r.sc0, part) * (s0 - 32 * g0) + sbyte(r.sc0, 2 + part) * (s1 - 32 * g1) +
               sbyte(r.sc1, part) * (s2 - 32 * g2) + sbyte(r.sc1, 2 + part) * (s3 - 32 * g3);
    return (f16_to_f32((u16)r.d) * yd) * (float)isum;
}

// The K-quant mat-vec of one activation row straight from device memory (see above): warp w of
// block bx takes rows (bx * ROWS_PER_BLOCK + w) * rpw .. + rpw, software-pipelined: its work is
// a sequence of chunks (row r, step t: super-block g + 8 t for lane group g = lane / 4) and
// the weights of the next chunk are loaded before this one is used, across row ends too, so
// every lane keeps a load in flight for the warp's whole run. The first weights are loaded
// before pdl_wait (they are never written).
template <typename L>
__device__ __forceinline__ void mvk_stream(const u8* __restrict__ W, const i8* __restrict__ aq,
                                           const float* __restrict__ ad,
                                           const int* __restrict__ bsums,
                                           float* __restrict__ y, int rows, int cols, int bx,
                                           int rpw, int bb, const float* __restrict__ bias) {
    int row0 = (bx * ROWS_PER_BLOCK + (threadIdx.x >> 5)) * rpw, lane = threadIdx.x & 31;
    if (row0 >= rows) return;
    int nb = cols / 256, g = lane >> 2, s4 = lane & 3;
    int nr = min(rpw, rows - row0), steps = (nb + 7) / 8;
    const u8* w0 = W + (long long)row0 * nb * bb;
    L cur, nxt;
    int lr = 0, lt = 0;  // the chunk to load next: row, step
    auto load = [&](L& w) {
        int ib = g + 8 * lt;
        if (ib < nb) kq_load(w0 + ((long long)lr * nb + ib) * bb, s4, w);
        if (++lt == steps) {
            lt = 0;
            lr++;
        }
    };
    load(cur);
    pdl_wait();
    float acc = 0.0f;
    for (int r = 0; r < nr; r++) {
        for (int t = 0; t < steps; t++) {
            if (lr < nr) load(nxt);
            int ib = g + 8 * t;
            if (ib < nb) acc += kq_term(cur, s4, aq + ib * 256, ad[ib], bsums + ib * 16);
            cur = nxt;
        }
        acc = warp_sum(acc);
        if (lane == 0) y[row0 + r] = bias ? acc + bias[row0 + r] : acc;
        acc = 0.0f;
    }
}

// mvk_stream for one activation row (m must be 1), one row per warp: the products of one
// sequence's decode step outside dec_mv_multi. The same arguments as mv_q4_k / mv_q6_k.
extern "C" __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK, 4)
    mv1_q4_k(const u8* W, const i8* aq, const float* ad, const int* bsums, float* y, int rows,
             int cols, int) {
    mvk_stream<Q4kLane>(W, aq, ad, bsums, y, rows, cols, blockIdx.x, 1, 144, nullptr);
}
extern "C" __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK, 4)
    mv1_q6_k(const u8* W, const i8* aq, const float* ad, const int* bsums, float* y, int rows,
             int cols, int) {
    mvk_stream<Q6kLane>(W, aq, ad, bsums, y, rows, cols, blockIdx.x, 1, 210, nullptr);
}

// The K-quant mat-vec of MT activation rows (rows blockIdx.y * MT ..): each lane's share of
// a weight super-block is loaded once (the next one before this one is used, as mvk_stream) and
// dotted with every activation row, as ggml's mul_mat_vec_q for a few columns. One weight row
// per warp; y is [m, rows].
template <typename L>
__device__ __forceinline__ void mvk_stream_rows(const u8* __restrict__ W,
                                                const i8* __restrict__ aq,
                                                const float* __restrict__ ad,
                                                const int* __restrict__ bsums,
                                                float* __restrict__ y, int rows, int cols, int m,
                                                int bb) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int nb = cols / 256, g = lane >> 2, s4 = lane & 3, steps = (nb + 7) / 8;
    int t0 = blockIdx.y * MT, nt = min(MT, m - t0);
    const u8* w0 = W + (long long)row * nb * bb;
    L cur, nxt;
    if (g < nb) kq_load(w0 + (long long)g * bb, s4, cur);
    pdl_wait();
    float acc[MT];
#pragma unroll
    for (int t = 0; t < MT; t++) acc[t] = 0.0f;
    for (int s = 0; s < steps; s++) {
        int ib = g + 8 * s;
        if (ib + 8 < nb) kq_load(w0 + (long long)(ib + 8) * bb, s4, nxt);
        if (ib < nb) {
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (t < nt) {
                    long long b = (long long)(t0 + t) * nb + ib;
                    acc[t] += kq_term(cur, s4, aq + b * 256, ad[b], bsums + b * 16);
                }
            }
        }
        cur = nxt;
    }
    mv_store(acc, y, rows, row, t0, nt, lane, nullptr);
}

extern "C" __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK, 3)
    mv_q4_k(const u8* W, const i8* aq, const float* ad, const int* bsums, float* y, int rows,
            int cols, int m) {
    mvk_stream_rows<Q4kLane>(W, aq, ad, bsums, y, rows, cols, m, 144);
}
extern "C" __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK, 3)
    mv_q6_k(const u8* W, const i8* aq, const float* ad, const int* bsums, float* y, int rows,
            int cols, int m) {
    mvk_stream_rows<Q6kLane>(W, aq, ad, bsums, y, rows, cols, m, 210);
}

// ---------------------------------------------------------------------------------------------
// f32 / f16 products
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(u16 v) { return f16_to_f32(v); }

// C[m, n] = A[m, k] . B[n, k]^T for small m: one block of ROWDOT_THREADS threads per row of B
// (blockIdx.x), MT rows of A per block (blockIdx.y), so a short product (an MoE router: 128
// rows) still spreads over the multiprocessors and each thread keeps several 4-value loads in
// flight (k % 4 == 0; else one value at a time). The threads' sums meet in shared memory.
#define ROWDOT_THREADS 128
__device__ __forceinline__ float4 ld4w(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float4 ld4w(const u16* p) {
    uint2 w = *(const uint2*)p;
    return make_float4(f16_to_f32((u16)(w.x & 0xffff)), f16_to_f32((u16)(w.x >> 16)),
                       f16_to_f32((u16)(w.y & 0xffff)), f16_to_f32((u16)(w.y >> 16)));
}
template <typename TB>
__device__ __forceinline__ void rowdot(const float* __restrict__ A, const TB* __restrict__ B,
                                       float* __restrict__ C, int m, int n, int k) {
    __shared__ float part[ROWDOT_THREADS / 32][MT];
    const int row = blockIdx.x;
    const int t0 = blockIdx.y * MT;
    const int nt = min(MT, m - t0);
    const TB* br = B + (long long)row * k;
    const float* a0 = A + (long long)t0 * k;
    float acc[MT];
#pragma unroll
    for (int t = 0; t < MT; t++) acc[t] = 0.0f;
    if (k % 4 == 0) {
#pragma unroll 4
        for (int i = 4 * threadIdx.x; i < k; i += 4 * ROWDOT_THREADS) {
            float4 w = ld4w(br + i);
#pragma unroll
            for (int t = 0; t < MT; t++)
                if (t < nt) {
                    float4 a = *(const float4*)(a0 + (long long)t * k + i);
                    acc[t] += w.x * a.x + w.y * a.y + w.z * a.z + w.w * a.w;
                }
        }
    } else {
        for (int i = threadIdx.x; i < k; i += ROWDOT_THREADS) {
            float w = to_f32(br[i]);
#pragma unroll
            for (int t = 0; t < MT; t++)
                if (t < nt) acc[t] += w * a0[(long long)t * k + i];
        }
    }
    const int wp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < MT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0) part[wp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < nt) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < ROWDOT_THREADS / 32; w++) v += part[w][threadIdx.x];
        C[(long long)(t0 + threadIdx.x) * n + row] = v;
    }
}

extern "C" __global__ void rowdot_f32(const float* A, const float* B, float* C, int m, int n,
                                      int k) {
    pdl_wait();
    rowdot<float>(A, B, C, m, n, k);
}
extern "C" __global__ void rowdot_f16(const float* A, const u16* B, float* C, int m, int n, int k) {
    pdl_wait();
    rowdot<u16>(A, B, C, m, n, k);
}

// Tiled C[m, n] = A[m, k] . op(B): 64 x 64 tile per 256-thread block, 4 x 4 outputs per thread
// (rows ty + 16i, columns tx + 16j), k in steps of 16 through shared memory.
// TRANS: B is [n, k] (a Linear weight), else B is [k, n] (a feature-major table).
#define GT 64
#define GK 16
template <typename TB, bool TRANS>
__device__ __forceinline__ void gemm(const float* __restrict__ A, const TB* __restrict__ B,
                                     float* __restrict__ C, int m, int n, int k) {
    __shared__ float As[GK][GT + 1];
    __shared__ float Bs[GK][GT + 1];
    int tid = threadIdx.x;
    int tx = tid & 15, ty = tid >> 4;
    int row0 = blockIdx.y * GT, col0 = blockIdx.x * GT;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += GK) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int idx = tid + 256 * i;
            int r = idx >> 4, kk = idx & 15;
            int gr = row0 + r, gk = k0 + kk;
            As[kk][r] = (gr < m && gk < k) ? A[(long long)gr * k + gk] : 0.0f;
            if (TRANS) {
                int gc = col0 + r;
                Bs[kk][r] = (gc < n && gk < k) ? to_f32(B[(long long)gc * k + gk]) : 0.0f;
            } else {
                int kb = idx >> 6, c = idx & 63;
                int gkb = k0 + kb, gc = col0 + c;
                Bs[kb][c] = (gc < n && gkb < k) ? to_f32(B[(long long)gkb * n + gc]) : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GK; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int gr = row0 + ty + 16 * i;
        if (gr >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int gc = col0 + tx + 16 * j;
            if (gc < n) C[(long long)gr * n + gc] = acc[i][j];
        }
    }
}

extern "C" __global__ void gemm_nt_f32(const float* A, const float* B, float* C, int m, int n,
                                       int k) {
    gemm<float, true>(A, B, C, m, n, k);
}
extern "C" __global__ void gemm_nn_f32(const float* A, const float* B, float* C, int m, int n,
                                       int k) {
    gemm<float, false>(A, B, C, m, n, k);
}
extern "C" __global__ void gemm_nt_f16(const float* A, const u16* B, float* C, int m, int n,
                                       int k) {
    gemm<u16, true>(A, B, C, m, n, k);
}
extern "C" __global__ void gemm_nn_f16(const float* A, const u16* B, float* C, int m, int n,
                                       int k) {
    gemm<u16, false>(A, B, C, m, n, k);
}

// An empty kernel: times the launch overhead.
extern "C" __global__ void noop() {}
