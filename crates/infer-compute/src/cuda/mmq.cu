// ---------------------------------------------------------------------------------------------
// Quantized products of many activation rows on the tensor cores (sm_80+): `mmq_*`, the tile
// counterpart of the `mv_*` mat-vecs (same arguments, same quantized activations), the design
// of llama.cpp's MMQ.
//
// A block computes a tile of MMQ_BM weight rows x MMQ_BN activation rows (tokens), walking K in
// steps of MMQ_KS values. Per step the weight rows are decoded to int8 in shared memory (Q6_K
// 6-bit values - 32, Q4_0/Q5_0 offsets applied), with their scales, next to the step's int8
// activations; then each warp (4 x 2 warps, 32 x 32 outputs each) runs
// `mma.sync.m16n8k32.s8` per 32-value block (Q6_K: `m16n8k16` per 16-value group) and folds
// the exact int32 sums into its accumulators:
//   - Q6_K: isum += scale * sum per group (integers, as the CPU's Σ sc·isum); at the end of
//     each super-block acc += (d·yd)·isum;
//   - 32-value formats: acc += (f32)sum · (dw·dx) per block.
// Q4_K has a kernel of its own (below) that feeds the mma from its blocks as stored, with no
// decoding pass into shared memory. Shared rows are MMQ_LD bytes (KS + 16) so the fragment loads of a warp hit 32
// distinct banks.
// ---------------------------------------------------------------------------------------------

#define MMQ_BM 128
#define MMQ_BN 64
#define MMQ_KS 128
#define MMQ_LD (MMQ_KS + 16)
#define MMQ_LDW (MMQ_LD / 4)
#define MMQ_THREADS 256
#define F_Q6_K 5

// The warps of a block with a token tile of BN (16, 32 or 64) activation rows: WM x WN warps,
// each TM x TN mma tiles of 16 weight rows x 8 tokens. Narrow tiles serve decode batches (a
// 64-token tile would leave most of its columns idle at 16 sequences) with fewer accumulators
// per thread, so that two blocks fit a multiprocessor.
template <int BN>
struct MmqWarps {
    static constexpr int WN = BN >= 64 ? 2 : 1;
    static constexpr int WM = 8 / WN;
    static constexpr int TM = MMQ_BM / WM / 16;
    static constexpr int TN = BN / WN / 8;
    // 16-byte activation chunks of a K step, and per thread (rounded up).
    static constexpr int A_CHUNKS = BN * (MMQ_KS / 16);
    static constexpr int A_ITEMS = (A_CHUNKS + MMQ_THREADS - 1) / MMQ_THREADS;
};

template <int BN>
struct MmqSmem {
    int w[MMQ_BM * MMQ_LDW];  // weights, int8 [row][k]
    int a[BN * MMQ_LDW];      // activations, int8 [token][k]
    float wd[MMQ_BM][4];      // 32-value formats: d per block; Q6_K: d
    int wsc[MMQ_BM][8];       // Q6_K: the step's 8 group scales
    float ad[BN][4];          // 32-value formats: d per block; Q6_K: the super-block's d
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

// A warp's outputs (TM x TN mma tiles of 16 rows x 8 tokens, in the accumulator layout of
// mma.m16n8k*: rows g and g + 8, tokens 2·tig and 2·tig + 1) into y[token][row], from weight
// row r0 and token t0, within rows x m.
template <int TM, int TN>
__device__ __forceinline__ void mmq_store(const float (&acc)[TM][TN][4], float* __restrict__ y,
                                          int r0, int t0, int rows, int m, int lane) {
    int g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int mt = 0; mt < TM; mt++)
#pragma unroll
        for (int nt = 0; nt < TN; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + 16 * mt + g + 8 * (e >> 1);
                int t = t0 + 8 * nt + 2 * tig + (e & 1);
                if (r < rows && t < m) y[(long long)t * rows + r] = acc[mt][nt][e];
            }
}

// Where a block works: its first weight row and token, its share of K (split-K) and, with
// shares > 1, the tile's index among the launch's tiles (its split-K counter and partials).
struct MmqTile {
    int row0, tok0, share, shares, tile;
};

// The tile of a plain product's block: blockIdx.y weight rows, blockIdx.x tiles of BN tokens,
// blockIdx.z the share of K.
template <int BN>
__device__ __forceinline__ MmqTile mmq_grid_tile() {
    return {(int)blockIdx.y * MMQ_BM, (int)blockIdx.x * BN, (int)blockIdx.z, (int)gridDim.z,
            (int)(blockIdx.y * gridDim.x + blockIdx.x)};
}

// Split-K: `shares` shares of the K steps (gridDim.z of a plain product), whole super-blocks
// (2 steps) each, so that products with few tiles (decode batches) still fill the device.
// Share `share` is [ks0, ks1), empty when the shares outnumber the super-blocks.
__device__ __forceinline__ void mmq_share(int nks, int share, int shares, int& ks0, int& ks1) {
    int per = 2 * (((nks + 1) / 2 + shares - 1) / shares);
    ks0 = min(nks, per * share);
    ks1 = min(nks, ks0 + per);
}

// Store the block's tile; with split-K each share's accumulators go to `part` (slots of
// 32 values × MMQ_THREADS per share and tile, of which a thread uses TM·TN·4) and the share
// that finishes last sums them in the order z = 0, 1, ... (the same sum whichever block
// finishes last) and stores the tile, then resets the tile's counter for the next launch.
template <int TM, int TN>
__device__ __forceinline__ void mmq_finish(float (&acc)[TM][TN][4], float* __restrict__ y,
                                           float* __restrict__ part, int* __restrict__ counters,
                                           int r0, int t0, int rows, int m, MmqTile at) {
    int tid = threadIdx.x;
    if (at.shares > 1) {
        __shared__ int last;
        int tile = at.tile, S = at.shares;
        float* base = part + (long long)tile * S * (32 * MMQ_THREADS) + tid;
        float* mine = base + at.share * (32 * MMQ_THREADS);
        const int N = TM * TN * 4;
#pragma unroll
        for (int i = 0; i < N; i++)
            __stcg(mine + i * MMQ_THREADS, acc[i / (TN * 4)][(i >> 2) % TN][i & 3]);
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            last = atomicAdd(counters + tile, 1) == S - 1;
            if (last) counters[tile] = 0;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int i = 0; i < N; i++) {
            float sum = 0.0f;
            for (int z = 0; z < S; z++) sum += __ldcg(base + (z * 32 + i) * MMQ_THREADS);
            acc[i / (TN * 4)][(i >> 2) % TN][i & 3] = sum;
        }
    }
    mmq_store(acc, y, r0, t0, rows, m, tid & 31);
}

// One thread's share of a K step's global data, fetched one step ahead: the loads of step
// ks + 1 are in flight while step ks computes. Fetching does no arithmetic on loaded values
// (a use would wait for the load): words of 2-byte aligned blocks stay two halves, the scales
// stay raw, and mmq_put combines them. Items: the thread's weight words, numbered so that the
// word within a row or block (u) is fixed per thread and the row advances with k.
struct MmqRegs {
    u32 wq[16];    // weight words, or their low halves (2-byte aligned formats)
    u32 wh[16];    // the high halves (2-byte aligned formats); Q5_0: [8, 16) the high bits
    u32 wx[5];     // threads < MMQ_BM, the row's scales: Q6_K 8 scale bytes (halves) and d;
                   // 32-value formats: the 4 blocks' d bits
    uint4 a[2];    // activation bytes
    float ad;      // 32-value formats: d of (token, block) tid; Q6_K (threads < MMQ_BN): the
                   // token's super-block d
};

template <int FMT, int BN>
__device__ __forceinline__ void mmq_fetch(MmqRegs& g, const u8* __restrict__ W,
                                          const float* __restrict__ wscale,
                                          const i8* __restrict__ aq,
                                          const float* __restrict__ ad,
                                          int row0, int rows,
                                          int tok0, int m, int cols, int nb, int ks, int tid) {
    if (FMT == F_Q6_K) {
        const int bb = 210;
        int sb = ks >> 1, h = ks & 1;
        {
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
        if (tid < BN) {
            bool ok = tok0 + tid < m;
            long long blk = (long long)(tok0 + tid) * nb + sb;
            g.ad = ok ? ad[blk] : 0.0f;
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
        if (tid < 4 * BN) {
            int t = tid >> 2, j = ks * 4 + (tid & 3);
            g.ad = (tok0 + t < m && j < nb) ? ad[(long long)(tok0 + t) * nb + j] : 0.0f;
        }
    }
    using S = MmqWarps<BN>;
#pragma unroll
    for (int k = 0; k < S::A_ITEMS; k++) {
        int i = tid + MMQ_THREADS * k;
        int t = i / (MMQ_KS / 16), c = i % (MMQ_KS / 16);
        int kk = ks * MMQ_KS + 16 * c;
        g.a[k] = (i < S::A_CHUNKS && tok0 + t < m && kk < cols)
                     ? *(const uint4*)(aq + (long long)(tok0 + t) * cols + kk)
                     : make_uint4(0, 0, 0, 0);
    }
}

// Decode the fetched step into shared memory (int8 weights with their scales, activations).
template <int FMT, int BN>
__device__ __forceinline__ void mmq_put(MmqSmem<BN>& s, const MmqRegs& g, int ks, int tid) {
    if (FMT == F_Q6_K) {
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
    if (FMT == F_Q6_K) {
        if (tid < BN) {
            s.ad[tid][0] = g.ad;
        }
    } else if (tid < 4 * BN) {
        s.ad[tid >> 2][tid & 3] = g.ad;
    }
    using S = MmqWarps<BN>;
#pragma unroll
    for (int k = 0; k < S::A_ITEMS; k++) {
        int i = tid + MMQ_THREADS * k;
        int t = i / (MMQ_KS / 16), c = i % (MMQ_KS / 16);
        if (i < S::A_CHUNKS) *(uint4*)(s.a + t * MMQ_LDW + 4 * c) = g.a[k];
    }
}

// y[m, rows] = x · Wᵀ for the tile of block (blockIdx.y: weight rows, blockIdx.x: tokens).
template <int FMT, int BN>
__device__ __forceinline__ void mmq(const u8* __restrict__ W, const float* __restrict__ wscale,
                                    const i8* __restrict__ aq, const float* __restrict__ ad,
                                    float* __restrict__ y, float* __restrict__ part,
                                    int* __restrict__ counters, int rows, int cols, int m,
                                    MmqTile at) {
    __shared__ __align__(16) MmqSmem<BN> s;
    using S = MmqWarps<BN>;
    constexpr int TM = S::TM, TN = S::TN;
    const bool KQ = FMT == F_Q6_K;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, tig = lane & 3;
    int wm = (warp % S::WM) * (16 * TM), wn = (warp / S::WM) * (8 * TN);
    int row0 = at.row0, tok0 = at.tok0;
    int nb = cols / (KQ ? 256 : 32);
    int nks = (cols + MMQ_KS - 1) / MMQ_KS, ks0, ks1;
    mmq_share(nks, at.share, at.shares, ks0, ks1);
    float acc[TM][TN][4];
    int isum[TM][TN][4];
#pragma unroll
    for (int mt = 0; mt < TM; mt++)
#pragma unroll
        for (int nt = 0; nt < TN; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[mt][nt][e] = 0.0f;
                isum[mt][nt][e] = 0;
            }
    MmqRegs next;
    pdl_wait();
    if (ks0 < ks1)
        mmq_fetch<FMT, BN>(next, W, wscale, aq, ad, row0, rows, tok0, m, cols, nb, ks0, tid);
    for (int ks = ks0; ks < ks1; ks++) {
        __syncthreads();
        mmq_put<FMT, BN>(s, next, ks, tid);
        __syncthreads();
        if (ks + 1 < ks1)
            mmq_fetch<FMT, BN>(next, W, wscale, aq, ad, row0, rows, tok0, m, cols, nb,
                               ks + 1, tid);
#pragma unroll
        for (int k = 0; k < MMQ_KS / 32; k++) {
            int a[TM][4], b[TN][2];
#pragma unroll
            for (int mt = 0; mt < TM; mt++) {
                const int* p = s.w + (wm + 16 * mt + g) * MMQ_LDW + 8 * k + tig;
                a[mt][0] = p[0];
                a[mt][1] = p[8 * MMQ_LDW];
                a[mt][2] = p[4];
                a[mt][3] = p[8 * MMQ_LDW + 4];
            }
#pragma unroll
            for (int nt = 0; nt < TN; nt++) {
                const int* p = s.a + (wn + 8 * nt + g) * MMQ_LDW + 8 * k + tig;
                b[nt][0] = p[0];
                b[nt][1] = p[4];
            }
#pragma unroll
            for (int mt = 0; mt < TM; mt++) {
                int r = wm + 16 * mt + g;
                if (FMT == F_Q6_K) {
                    int s0a = s.wsc[r][2 * k], s0b = s.wsc[r + 8][2 * k];
                    int s1a = s.wsc[r][2 * k + 1], s1b = s.wsc[r + 8][2 * k + 1];
#pragma unroll
                    for (int nt = 0; nt < TN; nt++) {
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
                    for (int nt = 0; nt < TN; nt++) {
                        int c[4] = {0, 0, 0, 0};
                        mma_k32(c, a[mt], b[nt][0], b[nt][1]);
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
        if (KQ && (ks & 1)) {
            // One f32 term per row, token and super-block (both halves' isum: |sum| < 2^28).
#pragma unroll
            for (int mt = 0; mt < TM; mt++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    int r = wm + 16 * mt + g + 8 * hr;
                    float d = s.wd[r][0];
#pragma unroll
                    for (int nt = 0; nt < TN; nt++)
#pragma unroll
                        for (int ec = 0; ec < 2; ec++) {
                            int t = wn + 8 * nt + 2 * tig + ec, e = 2 * hr + ec;
                            float yd = s.ad[t][0];
                            acc[mt][nt][e] += (d * yd) * (float)isum[mt][nt][e];
                            isum[mt][nt][e] = 0;
                        }
                }
        }
    }
    mmq_finish(acc, y, part, counters, row0 + wm, tok0 + wn, rows, m, at);
}

// The plain products of each format at each token tile: `mmq_<format>` (64 tokens),
// `mmq_<format>_n32`, `mmq_<format>_n16`. The narrow tiles keep two blocks per multiprocessor
// (at most 128 registers); the wide one is left to the compiler (a minimum of one block made
// it take up to 250 registers where it took 134-209).
#define MMQ_BOUNDS_64 __launch_bounds__(MMQ_THREADS)
#define MMQ_BOUNDS_32 __launch_bounds__(MMQ_THREADS, 2)
#define MMQ_BOUNDS_16 __launch_bounds__(MMQ_THREADS, 2)
#define MMQ_PLAIN(NAME, SUFFIX, BN, FMT)                                                        \
    extern "C" __global__ void MMQ_BOUNDS_##BN                                                  \
        NAME##SUFFIX(const u8* W, const i8* aq, const float* ad, float* y, int rows, int cols,  \
                     int m, float* part, int* counters) {                                       \
        mmq<FMT, BN>(W, 0, aq, ad, y, part, counters, rows, cols, m, mmq_grid_tile<BN>());      \
    }
/* bsums unused: the argument list of every K-quant product (Q6_K folds no mins). */
#define MMQ_PLAIN_KQ(NAME, SUFFIX, BN, FMT)                                                     \
    extern "C" __global__ void MMQ_BOUNDS_##BN                                                  \
        NAME##SUFFIX(const u8* W, const i8* aq, const float* ad, const int* bsums, float* y,    \
                     int rows, int cols, int m, float* part, int* counters) {                   \
        mmq<FMT, BN>(W, 0, aq, ad, y, part, counters, rows, cols, m, mmq_grid_tile<BN>());      \
    }
#define MMQ_PLAIN_Q8S(NAME, SUFFIX, BN, FMT)                                                       \
    extern "C" __global__ void MMQ_BOUNDS_##BN                                                  \
        NAME##SUFFIX(const u8* W, const float* ws, const i8* aq, const float* ad, float* y,     \
                     int rows, int cols, int m, float* part, int* counters) {                   \
        mmq<FMT, BN>(W, ws, aq, ad, y, part, counters, rows, cols, m, mmq_grid_tile<BN>());     \
    }
#define MMQ_PLAIN_WIDTHS(M, NAME, FMT) M(NAME, , 64, FMT) M(NAME, _n32, 32, FMT) M(NAME, _n16, 16, FMT)
MMQ_PLAIN_WIDTHS(MMQ_PLAIN, mmq_q4_0, F_Q4_0)
MMQ_PLAIN_WIDTHS(MMQ_PLAIN, mmq_q5_0, F_Q5_0)
MMQ_PLAIN_WIDTHS(MMQ_PLAIN, mmq_q8_0, F_Q8_0)
MMQ_PLAIN_WIDTHS(MMQ_PLAIN_Q8S, mmq_q8s, F_Q8S)
MMQ_PLAIN_WIDTHS(MMQ_PLAIN_KQ, mmq_q6_k, F_Q6_K)

// ---------------------------------------------------------------------------------------------
// Q4_K products on the int8 tensor cores (`mmq_q4_k`), fed straight from the raw K steps that
// cp.async leaves in shared memory: no decoded copy of the tile. Per 32-value sub-block pair a
// warp loads the 16 rows' 32 quant bytes with one `ldmatrix` (they are the A fragment of
// `mma.m16n8k32.s8` as stored), masks the low nibbles (sub-block 2j) and shifts the high ones
// (2j + 1), and runs them against the tokens' int8 activations, also loaded as stored. The
// exact int32 sums get their sub-block's 6-bit scale per row (decoded per step from the block
// header: 4 bit operations), and per super-block
//   acc += d·yd · Σ sc·isum − dmin·yd · Σ_j mn_j · bsum_j          (ggml vec_dot_q4_K_q8_K)
// with the mins term one f16 mma per super-block: weights [mn_0..7, 64·mn_0..7] against
// activations [bsum_j mod 64, floor(bsum_j / 64)] (each piece exact in f16, the sum exact in
// f32). |isum| < 8·63·32·15·128 < 2^31. The f16 kernel this replaces stored sc·q and the
// activations as f16 in shared memory each step (two conversions per value, a barrier between
// them and the mma, half the int8 rate, and 62 KiB of tiles that left room for only two stages
// of raw steps at 64 tokens).
// ---------------------------------------------------------------------------------------------

#define HQ_MLD 24  // halves per row of the mins operands: 16 + 8

// Byte offsets of the parts of the kernel's dynamic shared memory before its stages, for a
// token tile of BN: the mins operands, (d, dmin) per weight row, d per token.
template <int BN>
struct IqSmem {
    static constexpr int OFF_MA = MMQ_BM * HQ_MLD * 2;
    static constexpr int OFF_DM = OFF_MA + BN * HQ_MLD * 2;
    static constexpr int OFF_YD = OFF_DM + MMQ_BM * 8;
    static constexpr int BYTES = OFF_YD + BN * 4;  // a multiple of 16 for BN = 16, 32, 64
};

// One K step's raw bytes in shared memory, as cp.async leaves them: per weight row the block
// header and the step's 64 quant bytes (80 bytes: 8 rows read together hit distinct banks),
// per token the 128 activation bytes (rows of 144, likewise), the tokens' Q8_K d and bsums
// (written on a super-block's first step). STAGES of them after IqSmem, so that the copies of
// the next STAGES - 1 steps are in flight while a step computes: 4 stages with two blocks per
// multiprocessor at 16 and 32 tokens, 6 with one at 64 (`IQ_BOUNDS_*`; `mmq_q4k_smem` in
// device.rs: the total).
template <int BN>
struct IqStage {
    static constexpr int W_LD = 80;
    static constexpr int A_LD = 144;
    static constexpr int OFF_A = MMQ_BM * W_LD;
    static constexpr int OFF_YD = OFF_A + BN * A_LD;
    static constexpr int OFF_BS = OFF_YD + BN * 4;
    static constexpr int BYTES = OFF_BS + BN * 64;
    static constexpr int STAGES = BN == 64 ? 6 : 4;
};

__device__ __forceinline__ void mma_f16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 matrices of 16-bit units (or 8 rows of 16 bytes) from shared memory, lane i giving
// the address of row i % 8 of matrix i / 8 (PTX ldmatrix; the fragments of mma.m16n8k16 f16
// and, read as bytes, of mma.m16n8k32 s8); `a` is a shared-space address. Volatile: it reads
// shared memory written by other threads, and must stay between the barriers that order it.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// (x, x) as f16x2, for integers exactly representable in f16 (|x| <= 2048).
__device__ __forceinline__ u32 int_h2(int x) {
    u16 h;
    asm("cvt.rn.f16.s32 %0, %1;" : "=h"(h) : "r"(x));
    return (u32)h * 0x10001u;
}

// (lo, hi) as f16x2, integers exactly representable in f16.
__device__ __forceinline__ u32 int2_h2(int lo, int hi) {
    return (int_h2(lo) & 0xFFFF) | (int_h2(hi) & 0xFFFF0000u);
}

// Byte i (0..11) of a Q4_K block's scales, held in words s1..s3 of its 16-byte header.
__device__ __forceinline__ int q4k_scale_byte(const uint4& hdr, int i) {
    u32 w = i < 4 ? hdr.y : i < 8 ? hdr.z : hdr.w;
    return (int)((w >> (8 * (i & 3))) & 0xFF);
}

// ggml get_scale_min_k4: scale (mins = false) or min (mins = true) of sub-block j.
__device__ __forceinline__ int q4k_scale(const uint4& hdr, int j, bool mins) {
    if (j < 4) return q4k_scale_byte(hdr, j + (mins ? 4 : 0)) & 63;
    int b = q4k_scale_byte(hdr, j + 4);
    return mins ? (b >> 4) | ((q4k_scale_byte(hdr, j) >> 6) << 4)
                : (b & 0xF) | ((q4k_scale_byte(hdr, j - 4) >> 6) << 4);
}

// The 6-bit scales of sub-blocks 4h .. 4h + 3 of a Q4_K block (get_scale_min_k4, four at
// once), one per byte, from header words s1 (scale bytes 0..3) and s3 (bytes 8..11).
__device__ __forceinline__ u32 q4k_scales4(u32 s1, u32 s3, int h) {
    return h == 0 ? s1 & 0x3F3F3F3Fu : (s3 & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
}

// 16 bytes global -> shared without passing through registers (sm_80 cp.async, L2 only);
// `ok` false writes 16 zero bytes and reads nothing (src-size 0; `src` must still be a valid
// address). Completed by cp_async_wait, in commit order.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(ok ? 16 : 0));
#else
    *(uint4*)dst = ok ? *(const uint4*)src : make_uint4(0, 0, 0, 0);
#endif
}

// 4 bytes, as cp_async16 (the .ca form: 4-byte copies may not bypass L1).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(ok ? 4 : 0));
#else
    *(u32*)dst = ok ? *(const u32*)src : 0u;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

// Wait until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

// The mins operands and scales of a super-block, from its first K step's stage `st`: per
// weight row (threads < MMQ_BM) (d, dmin) and [mn_0..7, 64·mn_0..7] as f16; per token
// (threads MMQ_BM .. MMQ_BM + BN) the Q8_K d and [bsum_j mod 64, floor(bsum_j / 64)] of the 8
// sub-blocks (a sub-block's sum is two of Q8_K's sums of 16).
template <int BN>
__device__ __forceinline__ void iq_put_mins(const u8* st, u16* smw, u16* sma, float2* sdm,
                                            float* syd, int tid) {
    using St = IqStage<BN>;
    if (tid < MMQ_BM) {
        uint4 hdr = *(const uint4*)(st + tid * St::W_LD);
        sdm[tid] = make_float2(f16_to_f32((u16)(hdr.x & 0xFFFF)), f16_to_f32((u16)(hdr.x >> 16)));
        u32 mw[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m0 = q4k_scale(hdr, 2 * i, true), m1 = q4k_scale(hdr, 2 * i + 1, true);
            mw[i] = int2_h2(m0, m1);
            mw[4 + i] = int2_h2(64 * m0, 64 * m1);
        }
        u16* d = smw + tid * HQ_MLD;
        *(uint4*)d = make_uint4(mw[0], mw[1], mw[2], mw[3]);
        *(uint4*)(d + 8) = make_uint4(mw[4], mw[5], mw[6], mw[7]);
    } else if (tid < MMQ_BM + BN) {
        int t = tid - MMQ_BM;
        syd[t] = *(const float*)(st + St::OFF_YD + 4 * t);
        const int4* bs = (const int4*)(st + St::OFF_BS + 64 * t);
        u32 bw[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int4 v = bs[i];
            int s0 = v.x + v.y, s1 = v.z + v.w;  // sub-blocks 2i, 2i + 1
            bw[i] = int2_h2(s0 & 63, s1 & 63);
            bw[4 + i] = int2_h2(s0 >> 6, s1 >> 6);
        }
        u16* d = sma + t * HQ_MLD;
        *(uint4*)d = make_uint4(bw[0], bw[1], bw[2], bw[3]);
        *(uint4*)(d + 8) = make_uint4(bw[4], bw[5], bw[6], bw[7]);
    }
}

template <int BN>
__device__ __forceinline__ void iq_q4_k(const u8* __restrict__ W, const i8* __restrict__ aq,
                                        const float* __restrict__ ad,
                                        const int* __restrict__ bsums, float* __restrict__ y,
                                        int rows, int cols, int m, float* __restrict__ part,
                                        int* __restrict__ counters, MmqTile at) {
    extern __shared__ __align__(16) u8 iq_sm[];
    using L = IqSmem<BN>;
    using St = IqStage<BN>;
    using S = MmqWarps<BN>;
    constexpr int TM = S::TM, TN = S::TN, NST = St::STAGES;
    u16* smw = (u16*)iq_sm;                       // [MMQ_BM][HQ_MLD] mins operand
    u16* sma = (u16*)(iq_sm + L::OFF_MA);         // [BN][HQ_MLD] bsum operand
    float2* sdm = (float2*)(iq_sm + L::OFF_DM);   // [MMQ_BM] (d, dmin)
    float* syd = (float*)(iq_sm + L::OFF_YD);     // [BN] activation d
    u8* stages = iq_sm + L::BYTES;                // NST x St::BYTES raw K steps
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, tig = lane & 3;
    int wm = (warp % S::WM) * (16 * TM), wn = (warp / S::WM) * (8 * TN);
    int row0 = at.row0, tok0 = at.tok0;
    int nb = cols / 256, nks = 2 * nb, ks0, ks1;
    mmq_share(nks, at.share, at.shares, ks0, ks1);
    // The weight row this thread copies, and its 32-byte half of each step's quants.
    int r = tid & (MMQ_BM - 1), p = tid >> 7;
    bool row_ok = row0 + r < rows;
    const u8* wrow = W + (long long)(row_ok ? row0 + r : 0) * nb * 144;
    float acc[TM][TN][4];
    int isum[TM][TN][4];
#pragma unroll
    for (int mt = 0; mt < TM; mt++)
#pragma unroll
        for (int nt = 0; nt < TN; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[mt][nt][e] = 0.0f;
                isum[mt][nt][e] = 0;
            }
    // Start the copies of step ks into its stage (none past the share: an empty group keeps
    // the count of groups per step fixed).
    auto fetch = [&](int ks, int fslot) {
        if (ks < ks1) {
            u8* st = stages + fslot * St::BYTES;
            int sb = ks >> 1, h = ks & 1;
            const u8* b = wrow + (long long)sb * 144;
            u8* wd = st + r * St::W_LD;
            if (p == 0) cp_async16(wd, b, row_ok);
            cp_async16(wd + 16 + 32 * p, b + 16 + 64 * h + 32 * p, row_ok);
            cp_async16(wd + 32 + 32 * p, b + 32 + 64 * h + 32 * p, row_ok);
#pragma unroll
            for (int k = 0; k < S::A_ITEMS; k++) {
                // 8 lanes per token: each warp copies 4 whole 128-byte lines.
                int i = tid + MMQ_THREADS * k, t = i >> 3, c = i & 7;
                bool ok = tok0 + t < m;
                if (i < S::A_CHUNKS)
                    cp_async16(st + St::OFF_A + t * St::A_LD + 16 * c,
                               ok ? aq + (long long)(tok0 + t) * cols + ks * MMQ_KS + 16 * c : aq,
                               ok);
            }
            if (h == 0 && tid < BN) {
                bool ok = tok0 + tid < m;
                long long blk = ok ? (long long)(tok0 + tid) * nb + sb : 0;
                cp_async4(st + St::OFF_YD + 4 * tid, ad + blk, ok);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    cp_async16(st + St::OFF_BS + 64 * tid + 16 * j, bsums + blk * 16 + 4 * j, ok);
            }
        }
        cp_async_commit();
    };
    // ldmatrix rows of this lane: weights (16 rows, the two 16-byte halves of a sub-block
    // pair's 32 bytes), tokens (two tiles of 8, the two halves of a sub-block's 32 bytes).
    int a_row = wm + (lane & 15), a_byte = 16 + 16 * (lane >> 4);
    int b_tok = wn + (lane & 7) + 8 * (lane >> 4), b_byte = 16 * ((lane >> 3) & 1);
    // The same for the f16 mins operands (8 halves per matrix row).
    int ma_k = 8 * (lane >> 4), mb_k = 8 * ((lane >> 3) & 1);
    const u32 st_sm = smem_addr(stages);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < NST - 1; i++) fetch(ks0 + i, i);
    // The stage of step ks, and of step ks + NST - 1 (the one before it, cyclically).
    int slot = 0, fslot = NST - 1;
    for (int ks = ks0; ks < ks1; ks++, fslot = slot, slot = slot == NST - 1 ? 0 : slot + 1) {
        cp_async_wait<NST - 2>();
        // Step ks has landed for every thread, and every warp is done with step ks - 1's
        // stage (refilled below) and the previous super-block's mins (rewritten below).
        __syncthreads();
        int h = ks & 1;
        const u8* st = stages + slot * St::BYTES;
        if (h == 0) iq_put_mins<BN>(st, smw, sma, sdm, syd, tid);
        fetch(ks + NST - 1, fslot);
        // The step's 4 sub-block scales of this lane's rows g and g + 8 of each mma tile.
        u32 sc4[TM][2];
#pragma unroll
        for (int mt = 0; mt < TM; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const u8* hd = st + (wm + 16 * mt + g + 8 * hr) * St::W_LD;
                sc4[mt][hr] = q4k_scales4(*(const u32*)(hd + 4), *(const u32*)(hd + 12), h);
            }
        const u32 w_sm = st_sm + slot * St::BYTES, a_sm = w_sm + St::OFF_A;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            u32 wq[TM][4];
#pragma unroll
            for (int mt = 0; mt < TM; mt++)
                ldmatrix_x4(wq[mt], w_sm + (a_row + 16 * mt) * St::W_LD + a_byte + 32 * j);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                // Sub-block 2j + hf of the step: the low (hf = 0) or high nibbles of the
                // pair's bytes, against activation bytes 64 j + 32 hf .. + 31.
                u32 bf[TN / 2][4];
#pragma unroll
                for (int np = 0; np < TN / 2; np++)
                    ldmatrix_x4(bf[np], a_sm + (b_tok + 16 * np) * St::A_LD + 64 * j + 32 * hf + b_byte);
#pragma unroll
                for (int mt = 0; mt < TM; mt++) {
                    int a[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) a[e] = (int)((wq[mt][e] >> (4 * hf)) & 0x0F0F0F0Fu);
                    int sa = (sc4[mt][0] >> (8 * (2 * j + hf))) & 0xFF;
                    int sb = (sc4[mt][1] >> (8 * (2 * j + hf))) & 0xFF;
#pragma unroll
                    for (int nt = 0; nt < TN; nt++) {
                        int c[4] = {0, 0, 0, 0};
                        mma_k32(c, a, (int)bf[nt >> 1][2 * (nt & 1)], (int)bf[nt >> 1][2 * (nt & 1) + 1]);
                        isum[mt][nt][0] += sa * c[0];
                        isum[mt][nt][1] += sa * c[1];
                        isum[mt][nt][2] += sb * c[2];
                        isum[mt][nt][3] += sb * c[3];
                    }
                }
            }
        }
        if (h == 1) {
            // End of a super-block: its f32 terms, mins included.
            u32 am[TM][4], bm[TN / 2][4];
#pragma unroll
            for (int mt = 0; mt < TM; mt++)
                ldmatrix_x4(am[mt], smem_addr(smw + (a_row + 16 * mt) * HQ_MLD + ma_k));
#pragma unroll
            for (int np = 0; np < TN / 2; np++)
                ldmatrix_x4(bm[np], smem_addr(sma + (b_tok + 16 * np) * HQ_MLD + mb_k));
#pragma unroll
            for (int mt = 0; mt < TM; mt++) {
                float2 dma = sdm[wm + 16 * mt + g], dmb = sdm[wm + 16 * mt + g + 8];
#pragma unroll
                for (int nt = 0; nt < TN; nt++) {
                    float mn[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_f16(mn, am[mt], bm[nt >> 1][2 * (nt & 1)], bm[nt >> 1][2 * (nt & 1) + 1]);
                    float2 yd = *(const float2*)(syd + wn + 8 * nt + 2 * tig);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        // yd·(d·isum − dmin·mins): four operations per output.
                        float2 dm = e < 2 ? dma : dmb;
                        float v = fmaf(-dm.y, mn[e], dm.x * (float)isum[mt][nt][e]);
                        acc[mt][nt][e] = fmaf((e & 1) ? yd.y : yd.x, v, acc[mt][nt][e]);
                        isum[mt][nt][e] = 0;
                    }
                }
            }
        }
    }
    mmq_finish(acc, y, part, counters, row0 + wm, tok0 + wn, rows, m, at);
}

// Q4_K: two blocks per multiprocessor at the 16- and 32-token tiles (at most 128 registers);
// one of up to 255 registers and 6 stages at 64 tokens, where the 128-register cap spilled
// inside the K loop.
#define IQ_BOUNDS_64 __launch_bounds__(MMQ_THREADS, 1)
#define IQ_BOUNDS_32 __launch_bounds__(MMQ_THREADS, 2)
#define IQ_BOUNDS_16 __launch_bounds__(MMQ_THREADS, 2)
#define MMQ_Q4K(NAME, SUFFIX, BN, FMT)                                                          \
    extern "C" __global__ void IQ_BOUNDS_##BN                                                   \
        NAME##SUFFIX(const u8* __restrict__ W, const i8* __restrict__ aq,                       \
                     const float* __restrict__ ad, const int* __restrict__ bsums,               \
                     float* __restrict__ y, int rows, int cols, int m, float* __restrict__ part, \
                     int* __restrict__ counters) {                                              \
        iq_q4_k<BN>(W, aq, ad, bsums, y, rows, cols, m, part, counters, mmq_grid_tile<BN>());   \
    }
MMQ_PLAIN_WIDTHS(MMQ_Q4K, mmq_q4_k, 0)

// ---------------------------------------------------------------------------------------------
// Grouped products (ggml's `mul_mat_id` over a prompt chunk: `mmq_ids_*`): the activation rows
// are grouped by the expert they chose, and a host-built table gives each blockIdx.x one tile
// of at most MMQ_BN rows of one group: int4 {expert, first row, rows, 0}. The block reads that
// expert's weights from the table of expert pointers `Wt` and runs the plain product's tile on
// the group's rows (no split-K: the tiles of every expert fill the device); blockIdx.y walks
// the weight rows. Activations as the plain products (quantized once for all groups), `y`
// [R, rows].
// ---------------------------------------------------------------------------------------------

// Block blockIdx.x's tile of a grouped product: its expert's weights, its first activation
// row and its row count. Read before pdl_wait: the tile table is host-staged (copied before the
// step's launches) and the expert table uploaded when made; no kernel writes either.
struct MmqGroupTile {
    const u8* W;
    long long r0;
    int m;
};
__device__ __forceinline__ MmqGroupTile mmq_group_tile(const u8* const* __restrict__ Wt,
                                                       const int4* __restrict__ tiles) {
    int4 t = tiles[blockIdx.x];
    return {Wt[t.x], (long long)t.y, t.z};
}

// A grouped block's place: weight rows blockIdx.y, its tile's rows from token 0, no split-K.
__device__ __forceinline__ MmqTile mmq_group_place() {
    return {(int)blockIdx.y * MMQ_BM, 0, 0, 1, 0};
}

template <int FMT>
__device__ __forceinline__ void mmq_ids(const u8* const* __restrict__ Wt,
                                        const int4* __restrict__ tiles,
                                        const i8* __restrict__ aq, const float* __restrict__ ad,
                                        float* __restrict__ y, int rows, int cols) {
    MmqGroupTile g = mmq_group_tile(Wt, tiles);
    int nb = cols / (FMT == F_Q6_K ? 256 : 32);
    mmq<FMT, MMQ_BN>(g.W, 0, aq + g.r0 * cols, ad + g.r0 * nb, y + g.r0 * rows, 0, 0, rows, cols, g.m,
             mmq_group_place());
}

extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_ids_q4_0(const u8* const* Wt, const int4* tiles, const i8* aq, const float* ad,
                 float* y, int rows, int cols) {
    mmq_ids<F_Q4_0>(Wt, tiles, aq, ad, y, rows, cols);
}
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_ids_q5_0(const u8* const* Wt, const int4* tiles, const i8* aq, const float* ad,
                 float* y, int rows, int cols) {
    mmq_ids<F_Q5_0>(Wt, tiles, aq, ad, y, rows, cols);
}
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_ids_q8_0(const u8* const* Wt, const int4* tiles, const i8* aq, const float* ad,
                 float* y, int rows, int cols) {
    mmq_ids<F_Q8_0>(Wt, tiles, aq, ad, y, rows, cols);
}
// bsums unused: the argument list of every K-quant product.
extern "C" __global__ void __launch_bounds__(MMQ_THREADS)
    mmq_ids_q6_k(const u8* const* Wt, const int4* tiles, const i8* aq, const float* ad,
                 const int* bsums, float* y, int rows, int cols) {
    mmq_ids<F_Q6_K>(Wt, tiles, aq, ad, y, rows, cols);
}
extern "C" __global__ void IQ_BOUNDS_64
    mmq_ids_q4_k(const u8* const* Wt, const int4* tiles, const i8* aq, const float* ad,
                 const int* bsums, float* y, int rows, int cols) {
    MmqGroupTile g = mmq_group_tile(Wt, tiles);
    long long nb = cols / 256;
    iq_q4_k<MMQ_BN>(g.W, aq + g.r0 * cols, ad + g.r0 * nb, bsums + g.r0 * nb * 16, y + g.r0 * rows, rows,
            cols, g.m, 0, 0, mmq_group_place());
}

// ---------------------------------------------------------------------------------------------
// Q4_K products of a few activation rows (2 .. 16: small decode batches) on the int8
// tensor cores straight from registers, the tile kernels' work without their shared-memory
// tiles: a block takes 16 weight rows and 8 or 16 tokens, its MVQ_WARPS warps split K by
// super-blocks (warp w: w, w + MVQ_WARPS, ...) and sum their partial tiles in shared memory at
// the end. Per 32-value sub-block one `mma.m16n8k32.s8` of the 16 rows' 4-bit quants (as
// loaded: lane tig holds bytes 8 tig .. 8 tig + 7 of each 32-byte pair of sub-blocks, the low
// nibbles sub-block 2j, the high 2j + 1) against the same bytes' activations of token g — the
// order of k inside a mma is free as long as both operands share it. The exact int32 sums get
// the sub-block's 6-bit scale per row, then per super-block
//   acc += d·yd · Σ sc·isum − dmin·yd · Σ mn·bsum     (ggml vec_dot_q4_K_q8_K)
// with the mins against the tokens' Q8_K bsums. Rows and tokens past the ends are clamped to
// the last ones (valid memory) and not stored. The 16-token tiles ran a 4-row product at a
// sixth of HBM speed converting every weight to f16 in shared memory; the mat-vecs re-derive
// each weight block for each token. `mvq_*` take 8 tokens, `mvq_*_n16` 16 (two mma per
// sub-block on the same weight registers).
// ---------------------------------------------------------------------------------------------

#define MVQ_WARPS 8

// The partial tiles of the block's warps summed in shared memory and stored: acc[q][e] is the
// output (row g + 8 (e >> 1), token 8 q + 2 tig + (e & 1)) of the tile at (r0, t0).
template <int NG>
__device__ __forceinline__ void mvq_store(float (&acc)[NG][4], float* __restrict__ y, int rows,
                                          int m, int r0, int t0) {
    __shared__ float red[MVQ_WARPS][4 * NG][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int q = 0; q < NG; q++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[warp][4 * q + e][lane] = acc[q][e];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < 4 * NG; i++) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < MVQ_WARPS; w++) s += red[w][i][lane];
            int e = i & 3, row = r0 + g + 8 * (e >> 1), tok = t0 + 8 * (i >> 2) + 2 * tig + (e & 1);
            if (row < rows && tok < m) y[(long long)tok * rows + row] = s;
        }
    }
}

// Where a lane of an mvq block reads: weight rows g and g + 8 of the tile (A operand, C rows;
// rows of `row_bytes`), tokens 8 q + g (B operand; from `lane_off` bytes into each row) and
// tokens 8 q + 2 tig and 8 q + 2 tig + 1 (C columns: their d and bsums). Rows and tokens past
// the ends are clamped to the last ones (their outputs are not stored).
template <int NG>
struct MvqPlace {
    const u8 *wa, *wb;
    const i8* xa[NG];
    long long tc[NG][2];
};

template <int NG>
__device__ __forceinline__ MvqPlace<NG> mvq_place(const u8* __restrict__ W,
                                                  const i8* __restrict__ aq, int rows, int cols,
                                                  int m, int row_bytes, int lane_off) {
    int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int r0 = blockIdx.x * 16, t0 = blockIdx.y * 8 * NG;
    MvqPlace<NG> p;
    p.wa = W + (long long)min(r0 + g, rows - 1) * row_bytes;
    p.wb = W + (long long)min(r0 + g + 8, rows - 1) * row_bytes;
#pragma unroll
    for (int q = 0; q < NG; q++) {
        p.xa[q] = aq + (long long)min(t0 + 8 * q + g, m - 1) * cols + lane_off;
        p.tc[q][0] = min(t0 + 8 * q + 2 * tig, m - 1);
        p.tc[q][1] = min(t0 + 8 * q + 2 * tig + 1, m - 1);
    }
    return p;
}

// mvq_q4_k over NG groups of 8 tokens (the weights' registers shared by all of them).
template <int NG>
__device__ __forceinline__ void mvq_q4_k_t(const u8* __restrict__ W, const i8* __restrict__ aq,
                                           const float* __restrict__ ad,
                                           const int* __restrict__ bsums, float* __restrict__ y,
                                           int rows, int cols, int m) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tig = lane & 3;
    int nb = cols / 256;
    MvqPlace<NG> at = mvq_place<NG>(W, aq, rows, cols, m, nb * 144, 8 * tig);
    const u8 *wa = at.wa, *wb = at.wb;
    auto& xa = at.xa;
    auto& tc = at.tc;
    float acc[NG][4];
#pragma unroll
    for (int q = 0; q < NG; q++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[q][e] = 0.0f;
    pdl_wait();
    for (int ib = warp; ib < nb; ib += MVQ_WARPS) {
        const u8* ba = wa + (long long)ib * 144;
        const u8* bb = wb + (long long)ib * 144;
        uint4 ha = *(const uint4*)ba, hb = *(const uint4*)bb;
        uint2 qa[4], qb[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            qa[j] = *(const uint2*)(ba + 16 + 32 * j + 8 * tig);
            qb[j] = *(const uint2*)(bb + 16 + 32 * j + 8 * tig);
        }
        int isum[NG][4];
#pragma unroll
        for (int q = 0; q < NG; q++)
#pragma unroll
            for (int e = 0; e < 4; e++) isum[q][e] = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int sh = 4 * half, sb = 2 * j + half;
                const int a[4] = {(int)((qa[j].x >> sh) & 0x0F0F0F0Fu),
                                  (int)((qb[j].x >> sh) & 0x0F0F0F0Fu),
                                  (int)((qa[j].y >> sh) & 0x0F0F0F0Fu),
                                  (int)((qb[j].y >> sh) & 0x0F0F0F0Fu)};
                int sa = q4k_scale(ha, sb, false), sc = q4k_scale(hb, sb, false);
#pragma unroll
                for (int q = 0; q < NG; q++) {
                    // Token 8 q + g's values of sub-block sb at the bytes this lane holds.
                    uint2 x = *(const uint2*)(xa[q] + (long long)ib * 256 + 64 * j + 32 * half);
                    int c[4] = {0, 0, 0, 0};
                    mma_k32(c, a, (int)x.x, (int)x.y);
                    isum[q][0] += sa * c[0];
                    isum[q][1] += sa * c[1];
                    isum[q][2] += sc * c[2];
                    isum[q][3] += sc * c[3];
                }
            }
        }
        float da = f16_to_f32((u16)(ha.x & 0xFFFF)), dma = f16_to_f32((u16)(ha.x >> 16));
        float db = f16_to_f32((u16)(hb.x & 0xFFFF)), dmb = f16_to_f32((u16)(hb.x >> 16));
#pragma unroll
        for (int q = 0; q < NG; q++) {
            // Σ mn·bsum per (row, token): sub-block sums are pairs of bsums (sums of 16).
            int mn[4] = {0, 0, 0, 0};
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int4* bs = (const int4*)(bsums + (tc[q][u] * nb + ib) * 16);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    int4 v = bs[k];
                    int s0 = v.x + v.y, s1 = v.z + v.w;
                    mn[u] += q4k_scale(ha, 2 * k, true) * s0 + q4k_scale(ha, 2 * k + 1, true) * s1;
                    mn[2 + u] += q4k_scale(hb, 2 * k, true) * s0 + q4k_scale(hb, 2 * k + 1, true) * s1;
                }
            }
            float y0 = ad[tc[q][0] * nb + ib], y1 = ad[tc[q][1] * nb + ib];
            acc[q][0] += (da * y0) * (float)isum[q][0] - (dma * y0) * (float)mn[0];
            acc[q][1] += (da * y1) * (float)isum[q][1] - (dma * y1) * (float)mn[1];
            acc[q][2] += (db * y0) * (float)isum[q][2] - (dmb * y0) * (float)mn[2];
            acc[q][3] += (db * y1) * (float)isum[q][3] - (dmb * y1) * (float)mn[3];
        }
    }
    mvq_store(acc, y, rows, m, blockIdx.x * 16, blockIdx.y * 8 * NG);
}

extern "C" __global__ void __launch_bounds__(32 * MVQ_WARPS)
    mvq_q4_k(const u8* __restrict__ W, const i8* __restrict__ aq, const float* __restrict__ ad,
             const int* __restrict__ bsums, float* __restrict__ y, int rows, int cols, int m) {
    mvq_q4_k_t<1>(W, aq, ad, bsums, y, rows, cols, m);
}
extern "C" __global__ void __launch_bounds__(32 * MVQ_WARPS)
    mvq_q4_k_n16(const u8* __restrict__ W, const i8* __restrict__ aq,
                 const float* __restrict__ ad, const int* __restrict__ bsums,
                 float* __restrict__ y, int rows, int cols, int m) {
    mvq_q4_k_t<2>(W, aq, ad, bsums, y, rows, cols, m);
}

// A word from a 2-byte aligned address (Q6_K's 210-byte blocks): the two aligned words around
// it, funnel-shifted (may read 2 bytes past the word: device buffers are padded).
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) {
    unsigned long long a = (unsigned long long)p;
    const u32* w = (const u32*)(a & ~3ull);
    return __funnelshift_r(__ldg(w), __ldg(w + 1), (u32)(a & 2) * 8);
}

// Q6_K as mvq_q4_k, per 16-value group one `mma.m16n8k16.s8` (the scale changes every 16
// values): lane tig holds quants l = 16 s + 4 tig .. + 3 of each group, assembled from ql and
// qh in registers as ggml dequantize_row_q6_K does and offset by -32, against the same values
// of token g; the exact sums get their group's scale per row, and per super-block
//   acc += d·yd · Σ sc·isum     (ggml vec_dot_q6_K_q8_K)
template <int NG>
__device__ __forceinline__ void mvq_q6_k_t(const u8* __restrict__ W, const i8* __restrict__ aq,
                                           const float* __restrict__ ad, float* __restrict__ y,
                                           int rows, int cols, int m) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tig = lane & 3;
    int nb = cols / 256;
    MvqPlace<NG> at = mvq_place<NG>(W, aq, rows, cols, m, nb * 210, 4 * tig);
    const u8 *wa = at.wa, *wb = at.wb;
    auto& xa = at.xa;
    auto& tc = at.tc;
    float acc[NG][4];
#pragma unroll
    for (int q = 0; q < NG; q++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[q][e] = 0.0f;
    pdl_wait();
    for (int ib = warp; ib < nb; ib += MVQ_WARPS) {
        const u8* ba = wa + (long long)ib * 210;
        const u8* bb = wb + (long long)ib * 210;
        int isum[NG][4];
#pragma unroll
        for (int q = 0; q < NG; q++)
#pragma unroll
            for (int e = 0; e < 4; e++) isum[q][e] = 0;
#pragma unroll
        for (int n = 0; n < 2; n++) {
            // Scales 8 n .. 8 n + 7 (int8) of both rows.
            const u32 sa[2] = {ld_u32_a2(ba + 192 + 8 * n), ld_u32_a2(ba + 196 + 8 * n)};
            const u32 sb[2] = {ld_u32_a2(bb + 192 + 8 * n), ld_u32_a2(bb + 196 + 8 * n)};
#pragma unroll
            for (int s = 0; s < 2; s++) {
                int o = 64 * n + 16 * s + 4 * tig, oh = 128 + 32 * n + 16 * s + 4 * tig;
                u32 la = ld_u32_a2(ba + o), lb = ld_u32_a2(ba + o + 32), ha = ld_u32_a2(ba + oh);
                u32 ma = ld_u32_a2(bb + o), mb = ld_u32_a2(bb + o + 32), hb = ld_u32_a2(bb + oh);
                const u32 qa[4] = {(la & 0x0F0F0F0Fu) | ((ha << 4) & 0x30303030u),
                                   (lb & 0x0F0F0F0Fu) | ((ha << 2) & 0x30303030u),
                                   ((la >> 4) & 0x0F0F0F0Fu) | (ha & 0x30303030u),
                                   ((lb >> 4) & 0x0F0F0F0Fu) | ((ha >> 2) & 0x30303030u)};
                const u32 qb[4] = {(ma & 0x0F0F0F0Fu) | ((hb << 4) & 0x30303030u),
                                   (mb & 0x0F0F0F0Fu) | ((hb << 2) & 0x30303030u),
                                   ((ma >> 4) & 0x0F0F0F0Fu) | (hb & 0x30303030u),
                                   ((mb >> 4) & 0x0F0F0F0Fu) | ((hb >> 2) & 0x30303030u)};
#pragma unroll
                for (int G = 0; G < 4; G++) {
                    int a0 = (int)__vsub4(qa[G], 0x20202020u), a1 = (int)__vsub4(qb[G], 0x20202020u);
                    int k = s + 2 * G;  // scale 8 n + k
                    int sca = sbyte(sa[k >> 2], k & 3), scb = sbyte(sb[k >> 2], k & 3);
#pragma unroll
                    for (int q = 0; q < NG; q++) {
                        int c[4] = {0, 0, 0, 0};
                        int bx = *(const int*)(xa[q] + (long long)ib * 256 + 128 * n + 32 * G + 16 * s);
                        mma_k16(c, a0, a1, bx);
                        isum[q][0] += sca * c[0];
                        isum[q][1] += sca * c[1];
                        isum[q][2] += scb * c[2];
                        isum[q][3] += scb * c[3];
                    }
                }
            }
        }
        float da = f16_to_f32(ld_u16(ba + 208)), db = f16_to_f32(ld_u16(bb + 208));
#pragma unroll
        for (int q = 0; q < NG; q++) {
            float y0 = ad[tc[q][0] * nb + ib], y1 = ad[tc[q][1] * nb + ib];
            acc[q][0] += (da * y0) * (float)isum[q][0];
            acc[q][1] += (da * y1) * (float)isum[q][1];
            acc[q][2] += (db * y0) * (float)isum[q][2];
            acc[q][3] += (db * y1) * (float)isum[q][3];
        }
    }
    mvq_store(acc, y, rows, m, blockIdx.x * 16, blockIdx.y * 8 * NG);
}

// bsums unused: the argument list of every K-quant product (Q6_K folds no mins).
extern "C" __global__ void __launch_bounds__(32 * MVQ_WARPS)
    mvq_q6_k(const u8* __restrict__ W, const i8* __restrict__ aq, const float* __restrict__ ad,
             const int* __restrict__ bsums, float* __restrict__ y, int rows, int cols, int m) {
    mvq_q6_k_t<1>(W, aq, ad, y, rows, cols, m);
}
extern "C" __global__ void __launch_bounds__(32 * MVQ_WARPS)
    mvq_q6_k_n16(const u8* __restrict__ W, const i8* __restrict__ aq,
                 const float* __restrict__ ad, const int* __restrict__ bsums,
                 float* __restrict__ y, int rows, int cols, int m) {
    mvq_q6_k_t<2>(W, aq, ad, y, rows, cols, m);
}
