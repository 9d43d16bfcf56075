// ---------------------------------------------------------------------------------------------
// Quantized products of many activation rows on the tensor cores (sm_80+): `mmq_*`, the tile
// counterpart of the `mv_*` mat-vecs (same arguments, same quantized activations, same numerics:
// exact integer block sums, f32 block terms), the design of llama.cpp's MMQ.
//
// A block computes a tile of MMQ_BM weight rows x MMQ_BN activation rows (tokens), walking K in
// steps of MMQ_KS values. Per step the weight rows are decoded to int8 in shared memory (Q4_K
// nibbles, Q6_K 6-bit values - 32, Q4_0/Q5_0 offsets applied), with their scales, next to the
// step's int8 activations; then each warp (4 x 2 warps, 32 x 32 outputs each) runs
// `mma.sync.m16n8k32.s8` per 32-value sub-block (Q6_K: `m16n8k16` per 16-value group) and
// folds the exact int32 sums into its accumulators:
//   - Q4_K / Q6_K: isum += scale * sum per sub-block (integers, as the CPU's Σ sc·isum); at the
//     end of the step acc += (d·yd)·isum − (dmin·yd)·Σ mn·bsum (Q4_K's mins from the Q8_K
//     activation block sums), one f32 term per half super-block;
//   - 32-value formats: acc += (f32)sum · (dw·dx) per block.
// Shared rows are MMQ_LD bytes (KS + 16) so the fragment loads of a warp hit 32 distinct banks.
// ---------------------------------------------------------------------------------------------

#define MMQ_BM 128
#define MMQ_BN 64
#define MMQ_KS 128
#define MMQ_LD (MMQ_KS + 16)
#define MMQ_LDW (MMQ_LD / 4)
#define MMQ_THREADS 256
#define F_Q4_K 4
#define F_Q6_K 5

struct MmqSmem {
    int w[MMQ_BM * MMQ_LDW];  // weights, int8 [row][k]
    int a[MMQ_BN * MMQ_LDW];  // activations, int8 [token][k]
    float wd[MMQ_BM][4];      // 32-value formats: d per block; K-quants: d, dmin
    int wsc[MMQ_BM][8];       // Q4_K: scales[4], mins[4] of the step; Q6_K: 8 group scales
    float ad[MMQ_BN][4];      // 32-value formats: d per block; K-quants: the super-block's d
    int abs[MMQ_BN][4];       // Q4_K: activation sums per 32-value sub-block of the step
};

__device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// One thread's share of a K step's global data, fetched one step ahead: the loads of step
// ks + 1 are in flight while step ks computes. Fetching does no arithmetic on loaded values
// (a use would wait for the load): words of 2-byte aligned blocks stay two halves, the scales
// stay raw, and mmq_put combines them. Items: the thread's weight words, numbered so that the
// word within a row or block (u) is fixed per thread and the row advances with k.
struct MmqRegs {
    u32 wq[16];    // weight words, or their low halves (2-byte aligned formats)
    u32 wh[16];    // the high halves (2-byte aligned formats); Q5_0: [8, 16) the high bits
    u32 wx[5];     // threads < MMQ_BM, the row's scales: Q4_K d|dmin and 12 scale bytes (words);
                   // Q6_K 8 scale bytes (halves) and d; 32-value formats: the 4 blocks' d bits
    uint4 a[2];    // activation bytes
    float ad;      // 32-value formats: d of (token, block) tid; K-quants (threads < MMQ_BN):
                   // the token's super-block d
    int bs[8];     // Q4_K (threads < MMQ_BN): the step's 8 activation sums of 16 values
};

template <int FMT>
__device__ __forceinline__ void mmq_fetch(MmqRegs& g, const u8* __restrict__ W,
                                          const float* __restrict__ wscale,
                                          const i8* __restrict__ aq,
                                          const float* __restrict__ ad,
                                          const int* __restrict__ bsums, int row0, int rows,
                                          int tok0, int m, int cols, int nb, int ks, int tid) {
    if (FMT == F_Q4_K || FMT == F_Q6_K) {
        const int bb = FMT == F_Q4_K ? 144 : 210;
        int sb = ks >> 1, h = ks & 1;
        if (FMT == F_Q4_K) {
            // 16 words of nibbles per row and half (4-byte aligned: 144-byte blocks).
            int u = tid & 15;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int r = (tid >> 4) + 16 * k;
                const u8* b = W + ((long long)(row0 + r) * nb + sb) * bb;
                g.wq[k] = row0 + r < rows ? *(const u32*)(b + 16 + 64 * h + 4 * u) : 0;
            }
            if (tid < MMQ_BM) {
                bool ok = row0 + tid < rows;
                const u8* b = W + ((long long)(row0 + tid) * nb + sb) * bb;
#pragma unroll
                for (int j = 0; j < 4; j++) g.wx[j] = ok ? *(const u32*)(b + 4 * j) : 0;
            }
        } else {
            // Per row and half: ql 64 B, qh 32 B; word u of ql, ql + 32 and qh, as halves.
            int u = tid & 7;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int r = (tid >> 3) + 32 * k;
                bool ok = row0 + r < rows;
                const u8* b = W + ((long long)(row0 + r) * nb + sb) * bb;
                const int off[3] = {64 * h + 4 * u, 64 * h + 32 + 4 * u, 128 + 32 * h + 4 * u};
#pragma unroll
                for (int c = 0; c < 3; c++) {
                    g.wq[3 * k + c] = ok ? ld_u16(b + off[c]) : 0;
                    g.wh[3 * k + c] = ok ? ld_u16(b + off[c] + 2) : 0;
                }
            }
            if (tid < MMQ_BM) {
                bool ok = row0 + tid < rows;
                const u8* b = W + ((long long)(row0 + tid) * nb + sb) * bb;
#pragma unroll
                for (int j = 0; j < 4; j++) g.wx[j] = ok ? ld_u16(b + 192 + 8 * h + 2 * j) : 0;
                g.wx[4] = ok ? ld_u16(b + 208) : 0;
            }
        }
        if (tid < MMQ_BN) {
            bool ok = tok0 + tid < m;
            long long blk = (long long)(tok0 + tid) * nb + sb;
            g.ad = ok ? ad[blk] : 0.0f;
            if (FMT == F_Q4_K) {
#pragma unroll
                for (int j = 0; j < 8; j++) g.bs[j] = ok ? bsums[blk * 16 + 8 * h + j] : 0;
            }
        }
    } else {
        // 32-value blocks: MMQ_KS / 32 = 4 blocks per step, WPB words of quants per block.
        const int bb = FMT == F_Q4_0 ? 18 : FMT == F_Q5_0 ? 22 : FMT == F_Q8_0 ? 34 : 32;
        const int WPB = (FMT == F_Q4_0 || FMT == F_Q5_0) ? 4 : 8;
        const int ITEMS = MMQ_BM * 4 * WPB / MMQ_THREADS;
        const int qoff = FMT == F_Q5_0 ? 6 : FMT == F_Q8S ? 0 : 2;
        int u = tid % WPB, jb = (tid / WPB) & 3, ib = ks * 4 + jb;
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            int r = tid / (4 * WPB) + k * (MMQ_THREADS / (4 * WPB));
            bool ok = row0 + r < rows && ib < nb;
            const u8* b = W + ((long long)(row0 + r) * nb + ib) * bb + qoff + 4 * u;
            if (FMT == F_Q8S) {
                g.wq[k] = ok ? *(const u32*)b : 0;
            } else {
                g.wq[k] = ok ? ld_u16(b) : 0;
                g.wh[k] = ok ? ld_u16(b + 2) : 0;
            }
            if (FMT == F_Q5_0) {
                const u8* bh = W + ((long long)(row0 + r) * nb + ib) * bb + 2;
                g.wq[8 + k] = ok ? ld_u16(bh) : 0;
                g.wh[8 + k] = ok ? ld_u16(bh + 2) : 0;
            }
        }
        if (tid < MMQ_BM) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int jj = ks * 4 + j;
                bool ok = row0 + tid < rows && jj < nb;
                long long blk = (long long)(row0 + tid) * nb + jj;
                g.wx[j] = !ok ? 0 : FMT == F_Q8S ? __float_as_uint(wscale[blk]) : ld_u16(W + blk * bb);
            }
        }
        {
            int t = tid >> 2, j = ks * 4 + (tid & 3);
            g.ad = (tok0 + t < m && j < nb) ? ad[(long long)(tok0 + t) * nb + j] : 0.0f;
        }
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int i = tid + MMQ_THREADS * k;
        int t = i / (MMQ_KS / 16), c = i % (MMQ_KS / 16);
        int kk = ks * MMQ_KS + 16 * c;
        g.a[k] = (tok0 + t < m && kk < cols) ? *(const uint4*)(aq + (long long)(tok0 + t) * cols + kk)
                                             : make_uint4(0, 0, 0, 0);
    }
}

// Decode the fetched step into shared memory (int8 weights with their scales, activations).
template <int FMT>
__device__ __forceinline__ void mmq_put(MmqSmem& s, const MmqRegs& g, int ks, int tid) {
    if (FMT == F_Q4_K) {
        int u = tid & 15, p = u >> 3, l = u & 7;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int r = (tid >> 4) + 16 * k;
            s.w[r * MMQ_LDW + 16 * p + l] = g.wq[k] & 0x0F0F0F0F;
            s.w[r * MMQ_LDW + 16 * p + 8 + l] = (g.wq[k] >> 4) & 0x0F0F0F0F;
        }
        if (tid < MMQ_BM) {
            int h = ks & 1;
            s.wd[tid][0] = f16_to_f32((u16)(g.wx[0] & 0xFFFF));
            s.wd[tid][1] = f16_to_f32((u16)(g.wx[0] >> 16));
            // ggml get_scale_min_k4 on the 12 scale bytes held in wx[1..3] (byte i of the
            // scales is byte i % 4 of word 1 + i / 4).
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int jj = 4 * h + j, sc, mn;
                auto q = [&](int i) {
                    u32 w = i < 4 ? g.wx[1] : i < 8 ? g.wx[2] : g.wx[3];  // no local memory
                    return (int)((w >> (8 * (i & 3))) & 0xFF);
                };
                if (jj < 4) {
                    sc = q(jj) & 63;
                    mn = q(jj + 4) & 63;
                } else {
                    sc = (q(jj + 4) & 0xF) | ((q(jj - 4) >> 6) << 4);
                    mn = (q(jj + 4) >> 4) | ((q(jj) >> 6) << 4);
                }
                s.wsc[tid][j] = sc;
                s.wsc[tid][4 + j] = mn;
            }
        }
    } else if (FMT == F_Q6_K) {
        int u = tid & 7;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int r = (tid >> 3) + 32 * k;
            int qa = (int)(g.wq[3 * k] | (g.wh[3 * k] << 16));
            int qb = (int)(g.wq[3 * k + 1] | (g.wh[3 * k + 1] << 16));
            int qh = (int)(g.wq[3 * k + 2] | (g.wh[3 * k + 2] << 16));
            int o[4];
            o[0] = (qa & 0x0F0F0F0F) | ((qh & 0x03030303) << 4);
            o[1] = (qb & 0x0F0F0F0F) | (((qh >> 2) & 0x03030303) << 4);
            o[2] = ((qa >> 4) & 0x0F0F0F0F) | (((qh >> 4) & 0x03030303) << 4);
            o[3] = ((qb >> 4) & 0x0F0F0F0F) | (((qh >> 6) & 0x03030303) << 4);
#pragma unroll
            for (int t = 0; t < 4; t++) s.w[r * MMQ_LDW + 8 * t + u] = __vsub4(o[t], 0x20202020);
        }
        if (tid < MMQ_BM) {
            s.wd[tid][0] = f16_to_f32((u16)g.wx[4]);
#pragma unroll
            for (int j = 0; j < 8; j++) s.wsc[tid][j] = (int)(i8)(g.wx[j >> 1] >> (8 * (j & 1)));
        }
    } else {
        const int WPB = (FMT == F_Q4_0 || FMT == F_Q5_0) ? 4 : 8;
        const int ITEMS = MMQ_BM * 4 * WPB / MMQ_THREADS;
        int u = tid % WPB, jb = (tid / WPB) & 3;
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            int r = tid / (4 * WPB) + k * (MMQ_THREADS / (4 * WPB));
            int* dst = s.w + r * MMQ_LDW + 8 * jb;
            int q = FMT == F_Q8S ? (int)g.wq[k] : (int)(g.wq[k] | (g.wh[k] << 16));
            if (FMT == F_Q4_0) {
                dst[u] = __vsub4(q & 0x0F0F0F0F, 0x08080808);
                dst[4 + u] = __vsub4((q >> 4) & 0x0F0F0F0F, 0x08080808);
            } else if (FMT == F_Q5_0) {
                u32 qh = g.wq[8 + k] | (g.wh[8 + k] << 16);
                dst[u] = __vsub4((q & 0x0F0F0F0F) | expand_bits4((qh >> (4 * u)) & 0xF),
                                 0x10101010);
                dst[4 + u] = __vsub4(((q >> 4) & 0x0F0F0F0F) |
                                         expand_bits4((qh >> (16 + 4 * u)) & 0xF),
                                     0x10101010);
            } else {
                dst[u] = q;
            }
        }
        if (tid < MMQ_BM) {
#pragma unroll
            for (int j = 0; j < 4; j++)
                s.wd[tid][j] = FMT == F_Q8S ? __uint_as_float(g.wx[j]) : f16_to_f32((u16)g.wx[j]);
        }
    }
    if (FMT == F_Q4_K || FMT == F_Q6_K) {
        if (tid < MMQ_BN) {
            s.ad[tid][0] = g.ad;
            if (FMT == F_Q4_K) {
#pragma unroll
                for (int j = 0; j < 4; j++) s.abs[tid][j] = g.bs[2 * j] + g.bs[2 * j + 1];
            }
        }
    } else {
        s.ad[tid >> 2][tid & 3] = g.ad;
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int i = tid + MMQ_THREADS * k;
        int t = i / (MMQ_KS / 16), c = i % (MMQ_KS / 16);
        *(uint4*)(s.a + t * MMQ_LDW + 4 * c) = g.a[k];
    }
}

// y[m, rows] = x · Wᵀ for the tile of block (blockIdx.y: weight rows, blockIdx.x: tokens).
template <int FMT>
__device__ __forceinline__ void mmq(const u8* __restrict__ W, const float* __restrict__ wscale,
                                    const i8* __restrict__ aq, const float* __restrict__ ad,
                                    const int* __restrict__ bsums, float* __restrict__ y,
                                    int rows, int cols, int m) {
    __shared__ __align__(16) MmqSmem s;
    const bool KQ = FMT == F_Q4_K || FMT == F_Q6_K;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, tig = lane & 3;
    int wm = (warp & 3) * 32, wn = (warp >> 2) * 32;
    int row0 = blockIdx.y * MMQ_BM, tok0 = blockIdx.x * MMQ_BN;
    int nb = cols / (KQ ? 256 : 32);
    int nks = (cols + MMQ_KS - 1) / MMQ_KS;
    float acc[2][4][4];
    int isum[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[mt][nt][e] = 0.0f;
                isum[mt][nt][e] = 0;
            }
    MmqRegs next;
    pdl_wait();
    mmq_fetch<FMT>(next, W, wscale, aq, ad, bsums, row0, rows, tok0, m, cols, nb, 0, tid);
    for (int ks = 0; ks < nks; ks++) {
        __syncthreads();
        mmq_put<FMT>(s, next, ks, tid);
        __syncthreads();
        if (ks + 1 < nks)
            mmq_fetch<FMT>(next, W, wscale, aq, ad, bsums, row0, rows, tok0, m, cols, nb,
                           ks + 1, tid);
#pragma unroll
        for (int k = 0; k < MMQ_KS / 32; k++) {
            int a[2][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int* p = s.w + (wm + 16 * mt + g) * MMQ_LDW + 8 * k + tig;
                a[mt][0] = p[0];
                a[mt][1] = p[8 * MMQ_LDW];
                a[mt][2] = p[4];
                a[mt][3] = p[8 * MMQ_LDW + 4];
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int* p = s.a + (wn + 8 * nt + g) * MMQ_LDW + 8 * k + tig;
                b[nt][0] = p[0];
                b[nt][1] = p[4];
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                int r = wm + 16 * mt + g;
                if (FMT == F_Q6_K) {
                    int s0a = s.wsc[r][2 * k], s0b = s.wsc[r + 8][2 * k];
                    int s1a = s.wsc[r][2 * k + 1], s1b = s.wsc[r + 8][2 * k + 1];
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        int c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
                        mma_k16(c0, a[mt][0], a[mt][1], b[nt][0]);
                        mma_k16(c1, a[mt][2], a[mt][3], b[nt][1]);
                        isum[mt][nt][0] += s0a * c0[0] + s1a * c1[0];
                        isum[mt][nt][1] += s0a * c0[1] + s1a * c1[1];
                        isum[mt][nt][2] += s0b * c0[2] + s1b * c1[2];
                        isum[mt][nt][3] += s0b * c0[3] + s1b * c1[3];
                    }
                } else {
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        int c[4] = {0, 0, 0, 0};
                        mma_k32(c, a[mt], b[nt][0], b[nt][1]);
                        if (FMT == F_Q4_K) {
                            int sa = s.wsc[r][k], sb = s.wsc[r + 8][k];
                            isum[mt][nt][0] += sa * c[0];
                            isum[mt][nt][1] += sa * c[1];
                            isum[mt][nt][2] += sb * c[2];
                            isum[mt][nt][3] += sb * c[3];
                        } else {
                            float da = s.wd[r][k], db = s.wd[r + 8][k];
                            int t = wn + 8 * nt + 2 * tig;
                            float x0 = s.ad[t][k], x1 = s.ad[t + 1][k];
                            acc[mt][nt][0] += (float)c[0] * (da * x0);
                            acc[mt][nt][1] += (float)c[1] * (da * x1);
                            acc[mt][nt][2] += (float)c[2] * (db * x0);
                            acc[mt][nt][3] += (float)c[3] * (db * x1);
                        }
                    }
                }
            }
        }
        if (KQ) {
            // One f32 term per row, token and half super-block.
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    int r = wm + 16 * mt + g + 8 * hr;
                    float d = s.wd[r][0], dmin = s.wd[r][1];
#pragma unroll
                    for (int nt = 0; nt < 4; nt++)
#pragma unroll
                        for (int ec = 0; ec < 2; ec++) {
                            int t = wn + 8 * nt + 2 * tig + ec, e = 2 * hr + ec;
                            float yd = s.ad[t][0];
                            acc[mt][nt][e] += (d * yd) * (float)isum[mt][nt][e];
                            if (FMT == F_Q4_K) {
                                int msum = s.wsc[r][4] * s.abs[t][0] + s.wsc[r][5] * s.abs[t][1] +
                                           s.wsc[r][6] * s.abs[t][2] + s.wsc[r][7] * s.abs[t][3];
                                acc[mt][nt][e] -= (dmin * yd) * (float)msum;
                            }
                            isum[mt][nt][e] = 0;
                        }
                }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = row0 + wm + 16 * mt + g + 8 * (e >> 1);
                int t = tok0 + wn + 8 * nt + 2 * tig + (e & 1);
                if (r < rows && t < m) y[(long long)t * rows + r] = acc[mt][nt][e];
            }
}

extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_q4_0(const u8* W, const i8* aq, const float* ad, float* y, int rows, int cols, int m) {
    mmq<F_Q4_0>(W, 0, aq, ad, 0, y, rows, cols, m);
}
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_q5_0(const u8* W, const i8* aq, const float* ad, float* y, int rows, int cols, int m) {
    mmq<F_Q5_0>(W, 0, aq, ad, 0, y, rows, cols, m);
}
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_q8_0(const u8* W, const i8* aq, const float* ad, float* y, int rows, int cols, int m) {
    mmq<F_Q8_0>(W, 0, aq, ad, 0, y, rows, cols, m);
}
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_q8s(const u8* W, const float* ws, const i8* aq, const float* ad, float* y, int rows,
            int cols, int m) {
    mmq<F_Q8S>(W, ws, aq, ad, 0, y, rows, cols, m);
}
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_q4_k(const u8* W, const i8* aq, const float* ad, const int* bsums, float* y, int rows,
             int cols, int m) {
    mmq<F_Q4_K>(W, 0, aq, ad, bsums, y, rows, cols, m);
}
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_q6_k(const u8* W, const i8* aq, const float* ad, const int* bsums, float* y, int rows,
             int cols, int m) {
    mmq<F_Q6_K>(W, 0, aq, ad, bsums, y, rows, cols, m);
}
