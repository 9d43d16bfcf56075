// The forward pass's tensor operations on the device (tensor_ops.rs), appended after decode.cu
// (they use its block reductions). Every kernel works on rows of several sequences at once.
// Numerics follow the CPU ops (src/ops/norm.rs: sums of squares, means and variances in double;
// src/rope.rs: angles pos * inv_freq in double, cos/sin rounded to f32; src/attention.rs: scores
// scale * q.k, soft-capped, softmax); sums run in another order than the CPU's, and attention
// uses an online softmax (running maximum), so results differ from the CPU's by rounding only.
// Every kernel starts with pdl_trigger + pdl_wait (kernels.cu): the step recorder (step.rs)
// launches them with programmatic dependent launch, so a kernel's launch overlaps the end of the
// one before, and it reads nothing before that one has finished.

#define OPS_THREADS 256
#define ATTN_WARPS 4

// RMSNorm (layer = 0: x * (float)(1 / sqrt(mean(x^2) + eps)) * (w + off)) or LayerNorm
// (layer = 1: (float)((x - mean) / sqrt(var + eps)) * w + b) of row blockIdx.x of width
// values; out may be x (each thread reads its values before writing them).
extern "C" __global__ void t_norm(const float* x, const float* w, const float* b, float* out,
                                  int width, int layer, float eps, float off) {
    pdl_trigger();
    pdl_wait();
    __shared__ double sh[32];
    long long r = blockIdx.x;
    const float* xr = x + r * width;
    float* o = out + r * width;
    if (!layer) {
        double ss = 0.0;
        for (int i = threadIdx.x; i < width; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
        float sc = rms_scale(block_sum_d(ss, sh), width, eps);
        for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = (xr[i] * sc) * (w[i] + off);
        return;
    }
    double s1 = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) s1 += (double)xr[i];
    double mean = block_sum_d(s1, sh) / (double)width;
    double s2 = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        double d = (double)xr[i] - mean;
        s2 += d * d;
    }
    double inv = 1.0 / sqrt(block_sum_d(s2, sh) / (double)width + (double)eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float n = (float)(((double)xr[i] - mean) * inv);
        o[i] = n * w[i] + (b ? b[i] : 0.0f);
    }
}

// RoPE in place on x [rows, n_heads * hd]: block blockIdx.x = row * n_heads + head rotates the
// first rot dims of its head for position pos[row] (pairs (i, i + rot/2), or (2i, 2i + 1) when
// interleaved) by the angles pos * inv_freq[i], cos and sin times mscale (YaRN's attention
// factor, else 1).
extern "C" __global__ void t_rope(float* x, const int* pos, const double* inv_freq, int n_heads,
                                  int hd, int rot, int interleaved, double mscale) {
    pdl_trigger();
    pdl_wait();
    long long row = blockIdx.x / n_heads;
    float* h = x + (long long)blockIdx.x * hd;
    int half = rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double ang = (double)pos[row] * inv_freq[i], sn, cs;
        sincos(ang, &sn, &cs);
        float c = (float)(cs * mscale), s = (float)(sn * mscale);
        int ia = interleaved ? 2 * i : i;
        int ib = interleaved ? 2 * i + 1 : i + half;
        float a = h[ia], b = h[ib];
        h[ia] = a * c - b * s;
        h[ib] = b * c + a * s;
    }
}

// The KV store of a batch: row blockIdx.x of k and v ([rows, kvd]) goes to position pos of
// its sequence's caches (of type kt). info[3 r .. 3 r + 2] = {k cache, v cache, position} of
// row r.
extern "C" __global__ void t_kv_store(const float* k, const float* v, const long long* info,
                                      int kvd, int kt) {
    pdl_trigger();
    pdl_wait();
    long long r = blockIdx.x;
    void* kc = (void*)info[3 * r];
    void* vc = (void*)info[3 * r + 1];
    long long p = info[3 * r + 2];
    kv_put_row(kc, p * kvd, k + r * kvd, kvd, kt);
    kv_put_row(vc, p * kvd, v + r * kvd, kvd, kt);
}

// out[0 .. n) = values i0 .. i0 + n - 1 of cache c of type kt, as f32 (for the cuBLAS
// attention of long chunks; i0 % 32 == 0 for Q8_0).
extern "C" __global__ void t_kv_widen(const void* c, float* out, long long i0, long long n,
                                      int kt) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = kv_get(c, i0 + i, kt);
}

// The online softmax of one query head (qh[0..hd)) over keys 0..pos of its sequence's cache
// (pos - window + 1..pos when window > 0, none when window < 0; kc / vc: caches of type kt, the
// head's kv column starting at value gb, row stride kvd; key and value pos read from kcur /
// vcur instead when given): ATTN_WARPS warps take every ATTN_WARPS-th key, each keeping
// a running maximum m, sum l and S register values per lane (dims lane, lane + 32, ...;
// S * 32 >= hd); the warps' partial results meet in shared memory at the end. sink (null: none)
// is one logit that joins the softmax denominator (gpt-oss attention sinks). The head's output
// goes to o[0..hd), and to o2 too when given (o2 may be qh: it is read before the merge).
template <int S>
__device__ void attend_head(const float* qh, const void* kc, const void* vc, long long gb,
                            const float* kcur, const float* vcur, int kvd, int hd, int window,
                            int pos, float scale, float cap, const float* sink, float* o,
                            float* o2, int kt) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][S * 32];
    int lo = first_key(window, pos);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float qv[S], acc[S];
#pragma unroll
    for (int i = 0; i < S; i++) {
        int d = i * 32 + lane;
        qv[i] = d < hd ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = lo + w; j <= pos; j += ATTN_WARPS) {
        bool own = j == pos && kcur;
        long long r = gb + (long long)j * kvd;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < S; i++) {
            int d = i * 32 + lane;
            if (d < hd) dot += qv[i] * (own ? kcur[d] : kv_get(kc, r + d, kt));
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(FULL, dot, o);
        float s = dot * scale;
        if (cap > 0.0f) s = cap * tanhf(s / cap);
        float mn = fmaxf(m, s);
        float corr = expf(m - mn);  // 0 on the first key (m = -inf)
        float p = expf(s - mn);
        l = l * corr + p;
        bool ownv = j == pos && vcur;
#pragma unroll
        for (int i = 0; i < S; i++) {
            int d = i * 32 + lane;
            acc[i] = acc[i] * corr + (d < hd ? p * (ownv ? vcur[d] : kv_get(vc, r + d, kt)) : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[w] = m;
        sm_l[w] = l;
    }
#pragma unroll
    for (int i = 0; i < S; i++) sm_acc[w][i * 32 + lane] = acc[i];
    __syncthreads();
    float mx = NEG_INF;
    for (int t = 0; t < ATTN_WARPS; t++) mx = fmaxf(mx, sm_m[t]);
    if (sink) mx = fmaxf(mx, *sink);
    float total = sink ? expf(*sink - mx) : 0.0f;
    float f[ATTN_WARPS];
    for (int t = 0; t < ATTN_WARPS; t++) {
        f[t] = sm_m[t] == NEG_INF ? 0.0f : expf(sm_m[t] - mx);
        total += sm_l[t] * f[t];
    }
    float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int t = 0; t < ATTN_WARPS; t++) a += sm_acc[t][d] * f[t];
        o[d] = a * inv;
        if (o2) o2[d] = a * inv;
    }
}

// Causal attention of query row r = blockIdx.y, head h = blockIdx.x, over its sequence's cache
// (info as t_kv_store), by attend_head. sinks (null: none) holds one logit per query head.
template <int S>
__device__ void attn_row(const float* q, const long long* info, float* out, int nq, int nkv,
                         int hd, float scale, int window, float cap, const float* sinks, int kt) {
    int h = blockIdx.x;
    long long r = blockIdx.y;
    int g = h / (nq / nkv);
    int kvd = nkv * hd;
    const void* kc = (const void*)info[3 * r];
    const void* vc = (const void*)info[3 * r + 1];
    int pos = (int)info[3 * r + 2];
    long long head = (r * nq + h) * hd;
    attend_head<S>(q + head, kc, vc, (long long)g * hd, 0, 0, kvd, hd, window, pos, scale, cap,
                   sinks ? sinks + h : 0, out + head, 0, kt);
}

extern "C" __global__ void t_attention(const float* q, const long long* info, float* out, int nq,
                                       int nkv, int hd, float scale, int window, float cap,
                                       const float* sinks, int kt) {
    pdl_trigger();
    pdl_wait();
#define AR_ARGS q, info, out, nq, nkv, hd, scale, window, cap, sinks, kt
    if (hd <= 64) attn_row<2>(AR_ARGS);
    else if (hd <= 128) attn_row<4>(AR_ARGS);
    else if (hd <= 256) attn_row<8>(AR_ARGS);
    else attn_row<16>(AR_ARGS);
#undef AR_ARGS
}

// Causal attention of prompt chunks, a tile of up to ATT_BQ consecutive query rows of one
// sequence per block (blockIdx.y: tile, blockIdx.x: query head h, kv head g = h / (nq / nkv)):
// the tile's rows read each key and value once from the cache, 32 keys at a time through
// shared memory, instead of once per row as t_attention does. tiles[5 t .. 5 t + 4] = {k cache,
// v cache, first row, position of the first row, rows} (rows at consecutive positions). Warp w
// takes rows 4w .. 4w + 3; per 32-key tile each lane scores one key (j = kt + lane) against
// each of its warp's rows, the online softmax (running maximum m, sum l) is updated per row,
// and lane L accumulates output dims L, L + 32, ... Masks as attend_head: keys lo .. pos of
// each row (lo = pos - window + 1 when window > 0; none when window < 0); cap > 0: soft-cap;
// sinks as t_attention. Dynamic shared memory: (ATT_BQ hd + ATT_BK (hd + 1) + ATT_BK hd +
// ATT_WARPS * 4 * ATT_BK) floats (att_tile_smem in tensor_ops.rs). hd % 4 == 0 (the
// caches, of type kt, are read four values at a time).
#define ATT_BQ 32
#define ATT_BK 32
#define ATT_WARPS 8
template <int S>
__device__ void attn_tile(const float* q, const long long* tiles, float* out, int nq, int nkv,
                          int hd, float scale, int window, float cap, const float* sinks,
                          int kvt) {
    extern __shared__ __align__(16) float att_sm[];
    float* sq = att_sm;                     // [ATT_BQ][hd]
    float* sk = sq + ATT_BQ * hd;           // [ATT_BK][hd + 1]
    float* sv = sk + ATT_BK * (hd + 1);     // [ATT_BK][hd]
    float* sp = sv + ATT_BK * hd;           // [ATT_WARPS][4][ATT_BK]
    int h = blockIdx.x, g = h / (nq / nkv), kvd = nkv * hd;
    const long long* t = tiles + 5 * (long long)blockIdx.y;
    const void* kc = (const void*)t[0];
    const void* vc = (const void*)t[1];
    long long gb = (long long)g * hd;
    long long r0 = t[2];
    int p0 = (int)t[3], nr = (int)t[4];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < ATT_BQ * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd;
        sq[i] = r < nr ? q[((r0 + r) * nq + h) * hd + d] : 0.0f;
    }
    float m[4], l[4], acc[4][S];
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        m[ii] = NEG_INF;
        l[ii] = 0.0f;
#pragma unroll
        for (int e = 0; e < S; e++) acc[ii][e] = 0.0f;
    }
    int klo = window > 0 ? max(0, p0 - window + 1) : 0;
    int khi = window < 0 ? -1 : p0 + nr - 1;
    // The next key tile is loaded into registers (float4: hd % 4 == 0) while this one computes.
    const int NL = ATT_BK * S * 32 / 4 / (ATT_WARPS * 32);
    int hq = hd / 4;
    float4 kreg[NL], vreg[NL];
    auto fetch = [&](int kt) {
#pragma unroll
        for (int k = 0; k < NL; k++) {
            int i = threadIdx.x + ATT_WARPS * 32 * k, j = i / hq, c = i % hq;
            bool ok = i < ATT_BK * hq && kt + j <= khi;
            long long off = gb + (long long)(kt + j) * kvd + 4 * c;
            kreg[k] = ok ? kv_get4(kc, off, kvt) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            vreg[k] = ok ? kv_get4(vc, off, kvt) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    if (klo <= khi) fetch(klo);
    for (int kt = klo; kt <= khi; kt += ATT_BK) {
        __syncthreads();
#pragma unroll
        for (int k = 0; k < NL; k++) {
            int i = threadIdx.x + ATT_WARPS * 32 * k, j = i / hq, c = i % hq;
            if (i < ATT_BK * hq) {
                float* kd = sk + j * (hd + 1) + 4 * c;
                kd[0] = kreg[k].x;
                kd[1] = kreg[k].y;
                kd[2] = kreg[k].z;
                kd[3] = kreg[k].w;
                *(float4*)(sv + j * hd + 4 * c) = vreg[k];
            }
        }
        __syncthreads();
        if (kt + ATT_BK <= khi) fetch(kt + ATT_BK);
#pragma unroll
        for (int ii = 0; ii < 4; ii++) {
            int i = 4 * w + ii, pos = p0 + i;
            int lo = window > 0 ? max(0, pos - window + 1) : 0;
            // Warp-uniform: rows past the tile and key tiles outside the row's range.
            if (i >= nr || kt > pos || kt + ATT_BK - 1 < lo) continue;
            int j = kt + lane;
            const float* qr = sq + i * hd;
            const float* kr = sk + lane * (hd + 1);
            float dot = 0.0f;
#pragma unroll 8
            for (int d = 0; d < hd; d++) dot += qr[d] * kr[d];
            bool ok = j <= pos && j >= lo;
            float sc = dot * scale;
            if (cap > 0.0f) sc = cap * tanhf(sc / cap);
            sc = ok ? sc : NEG_INF;
            float mx = sc;
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
            float mn = fmaxf(m[ii], mx);  // finite: the tile holds a key of the row
            float corr = expf(m[ii] - mn);
            float p = ok ? expf(sc - mn) : 0.0f;
            float ps = p;
            for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(FULL, ps, o);
            l[ii] = l[ii] * corr + ps;
            m[ii] = mn;
            sp[(w * 4 + ii) * ATT_BK + lane] = p;
            __syncwarp();
#pragma unroll
            for (int e = 0; e < S; e++) {
                int d = e * 32 + lane;
                float a = acc[ii][e] * corr;
                if (d < hd)
                    for (int jj = 0; jj < ATT_BK; jj++)
                        a += sp[(w * 4 + ii) * ATT_BK + jj] * sv[jj * hd + d];
                acc[ii][e] = a;
            }
            __syncwarp();
        }
    }
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        int i = 4 * w + ii;
        if (i >= nr) continue;
        float mx = m[ii], total = l[ii], f = 1.0f;
        if (sinks) {
            float sk0 = sinks[h];
            float mm = fmaxf(mx, sk0);
            f = mx == NEG_INF ? 0.0f : expf(mx - mm);
            total = total * f + expf(sk0 - mm);
        }
        float inv = total > 0.0f ? f / total : 0.0f;
        float* o = out + ((r0 + i) * nq + h) * hd;
#pragma unroll
        for (int e = 0; e < S; e++) {
            int d = e * 32 + lane;
            if (d < hd) o[d] = acc[ii][e] * inv;
        }
    }
}

// One kernel per register width (head_dim up to 64, 128, 256): the widest one's registers
// would limit the occupancy of the others.
#define ATT_TILES_KERNEL(NAME, S)                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)                               \
        NAME(const float* q, const long long* tiles, float* out, int nq, int nkv, int hd,      \
             float scale, int window, float cap, const float* sinks, int kvt) {                \
        pdl_trigger();                                                                         \
        pdl_wait();                                                                            \
        attn_tile<S>(q, tiles, out, nq, nkv, hd, scale, window, cap, sinks, kvt);              \
    }
ATT_TILES_KERNEL(t_attention_tiles64, 2)
ATT_TILES_KERNEL(t_attention_tiles128, 4)
ATT_TILES_KERNEL(t_attention_tiles256, 8)

// The masked softmax of long prompt chunks whose scores are a cuBLAS GEMM (tensor_ops.rs
// attend_gemm): row t = blockIdx.x of query head h = blockIdx.y in S ([nq][rows][n]: scale q.k
// of the keys at positions k0 .. k0 + n - 1), at position pos = p0 + t. Keys lo .. pos are kept
// (lo as attend_head: pos - window + 1 when window > 0, else 0), soft-capped when cap > 0, with
// the sink logit of head h in the denominator when sinks is given; the row becomes the
// probabilities, 0 outside the mask (the value GEMM then sums over all n keys).
extern "C" __global__ void __launch_bounds__(OPS_THREADS)
    t_attn_softmax(float* S, int rows, int n, int p0, int k0, int window, float cap,
                   const float* sinks) {
    __shared__ float shm[32];
    __shared__ double shd[32];
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, h = blockIdx.y;
    float* s = S + ((long long)h * rows + t) * n;
    int pos = p0 + t;
    int lo = max((window > 0 ? pos - window + 1 : 0) - k0, 0);
    int hi = min(pos - k0, n - 1);
    float mx = NEG_INF;
    for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) {
        float v = s[j];
        if (cap > 0.0f) v = cap * tanhf(v / cap);
        s[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max_f(mx, shm);
    if (sinks) mx = fmaxf(mx, sinks[h]);
    double sum = 0.0;
    for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) {
        float e = expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    sum = block_sum_d(sum, shd);
    if (sinks) sum += expf(sinks[h] - mx);
    float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s[j] = j >= lo && j <= hi ? s[j] * inv : 0.0f;
}

// up[i] = act(gate[i]) * up[i] (gate given) or x[i] = act(x[i]) (gate null); act_fn of
// decode.cu (0 SiLU, 1 tanh-GELU, 2 erf-GELU).
extern "C" __global__ void t_act(const float* gate, float* up, long long n, int act) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    up[i] = gate ? act_fn(gate[i], act) * up[i] : act_fn(up[i], act);
}

// x[i] += alpha * y[i].
extern "C" __global__ void t_add_scaled(float* x, const float* y, long long n, float alpha) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = alpha == 1.0f ? x[i] + y[i] : x[i] + y[i] * alpha;
}

// x[i] += sigmoid(gate[i / width]) * y[i] over n values (host_ops::add_gated).
extern "C" __global__ void t_add_gated(float* x, const float* y, const float* gate, long long n,
                                       long long width) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float w = 1.0f / (1.0f + expf(-gate[i / width]));
    x[i] += w * y[i];
}

// y[i] += b[i % width].
extern "C" __global__ void t_add_bias(float* y, const float* b, long long n, int width) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] += b[i % width];
}

// x[i] = cap * tanh((x[i] / div) / cap) (no cap when cap <= 0).
extern "C" __global__ void t_scale_softcap(float* x, long long n, float div, float cap) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    if (div != 1.0f) v /= div;
    if (cap > 0.0f) v = cap * tanhf(v / cap);
    x[i] = v;
}

// Row blockIdx.x of dst = row rows[blockIdx.x] of src (width values each).
extern "C" __global__ void t_copy_rows(const float* src, float* dst, const int* rows, int width) {
    pdl_trigger();
    pdl_wait();
    const float* s = src + (long long)rows[blockIdx.x] * width;
    float* d = dst + (long long)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

// Row rows[blockIdx.x] of dst += w[blockIdx.x] * row blockIdx.x of src (indices distinct:
// no two blocks write one row).
extern "C" __global__ void t_add_rows_scaled(const float* src, float* dst, const int* rows,
                                             const float* w, int width) {
    pdl_trigger();
    pdl_wait();
    const float* s = src + (long long)blockIdx.x * width;
    float* d = dst + (long long)rows[blockIdx.x] * width;
    const float a = w[blockIdx.x];
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] += a * s[i];
}

// The top-k experts of router row blockIdx.x, as ops::moe_route: p = softmax(logits + bias)
// (sum in double), then k times the most probable expert not yet chosen (ties to the lower
// index): sel[j] = its index (as float), sel[k + j] = its probability, divided by the sum of
// the chosen when norm (the row's 2k values of sel). One warp per row; n <= 1024 (the host
// checks).
extern "C" __global__ void t_moe_route(const float* logits, const float* bias, int n, int k,
                                       int norm, float* sel) {
    __shared__ float p[1024];
    pdl_trigger();
    pdl_wait();
    logits += (long long)blockIdx.x * n;
    sel += (long long)blockIdx.x * 2 * k;
    const int lane = threadIdx.x;
    float mx = __int_as_float(0xff800000);  // -inf
    for (int i = lane; i < n; i += 32) {
        float v = logits[i] + (bias ? bias[i] : 0.0f);
        p[i] = v;
        mx = fmaxf(mx, v);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
    double sum = 0.0;
    for (int i = lane; i < n; i += 32) {
        p[i] = expf(p[i] - mx);
        sum += p[i];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL, sum, o);
    const float inv = (float)(1.0 / sum);
    for (int i = lane; i < n; i += 32) p[i] *= inv;
    __syncwarp();
    // Not yet chosen: p >= 0, or -1 for NaN (a broken router); chosen: -2. Every pick is an
    // index below n while k <= n (the host checks).
    float chosen = 0.0f;
    for (int j = 0; j < k; j++) {
        float best = -3.0f;
        int bi = n;
        for (int i = lane; i < n; i += 32) {
            float v = p[i];
            if (v != v) v = -1.0f;
            if (v > best || (v == best && i < bi)) {
                best = v;
                bi = i;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(FULL, best, o);
            int oi = __shfl_xor_sync(FULL, bi, o);
            if (ob > best || (ob == best && oi < bi)) {
                best = ob;
                bi = oi;
            }
        }
        chosen += best;
        if (lane == 0) {
            sel[j] = (float)bi;
            sel[k + j] = best;
            p[bi] = -2.0f;
        }
        __syncwarp();
    }
    if (norm)
        for (int j = lane; j < k; j += 32) sel[k + j] = sel[k + j] / chosen;
}

// out[i] = sum over slots s < k of sel[k + s] * y[s * n + i] (the chosen experts' outputs, each
// with the weight its router chose).
extern "C" __global__ void t_moe_combine(const float* y, const float* sel, int k, long long n,
                                         float* out) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = 0.0f;
    for (int s = 0; s < k; s++) acc += sel[k + s] * y[s * n + i];
    out[i] = acc;
}

// Token blockIdx.x of an MoE chunk: out row = sum over its slots j < k, in order, of
// w[j] * row slots[j] of y (the experts' outputs, grouped by expert).
extern "C" __global__ void t_moe_combine_rows(const float* y, const int* slots, const float* w,
                                              int k, int width, float* out) {
    pdl_trigger();
    pdl_wait();
    const int* s = slots + (long long)blockIdx.x * k;
    const float* ws = w + (long long)blockIdx.x * k;
    float* o = out + (long long)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += ws[j] * y[(long long)s[j] * width + i];
        o[i] = acc;
    }
}

extern "C" __global__ void t_fill(float* x, long long n, float v) {
    pdl_trigger();
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

// Row blockIdx.x of out = scale * row embed_id(r) (dequant.cu: ids[r] or the last greedy
// choice of row r) of the f32 (f16 = 0) or f16 (f16 = 1) table E.
extern "C" __global__ void t_embed(const void* E, const int* ids,
                                   const unsigned long long* best, int table_rows, float* out,
                                   int width, float scale, int f16) {
    pdl_trigger();
    pdl_wait();
    long long id = embed_id(ids, best, blockIdx.x, table_rows);
    float* o = out + (long long)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = f16 ? f16_to_f32(((const u16*)E)[id * width + i]) : ((const float*)E)[id * width + i];
        o[i] = v * scale;
    }
}

// ---------------------------------------------------------------------------------------------
// Fused operations of the forward pass (tensor_ops.rs: add_norm, rope_attend, the activation
// with quantization, argmax_rows). A fused kernel may also quantize its output for the next
// product (q32/d32: 32-value blocks with f16-rounded scales, ggml quantize_row_q8_0_ref; qk/dk/
// bsk: Q8_K), so the product reads it without a quantize launch; null pointers: not wanted.
// ---------------------------------------------------------------------------------------------

// Row blockIdx.x of width n (one block of RN_THREADS threads per row): residual_norm_row of
// decode.cu, x += mult * post(branch) (post_w null: the branch as it is),
// out = rmsnorm(x) * (norm_w + off2), and out quantized per row (block indices continue across
// rows, as the quantizers' flat layout of [rows, n]).
extern "C" __global__ void __launch_bounds__(RN_THREADS)
    t_add_norm(float* x, const float* branch, const float* post_w, float mult,
               const float* norm_w, float* out, int n, float eps, float off, float eps2,
               float off2, i8* q32, float* d32, i8* qk, float* dk, int* bsk) {
    pdl_trigger();
    long long r = blockIdx.x;
    long long o = r * n;
    residual_norm_row(x + o, branch ? branch + o : 0, post_w, mult, norm_w, out + o, n, eps, off,
                      eps2, off2, q32 ? q32 + o : 0, q32 ? d32 + r * (n / 32) : 0,
                      qk ? qk + o : 0, qk ? dk + r * (n / 256) : 0,
                      qk ? bsk + r * (n / 256) * 16 : 0);
}

// Decode attention of row r = blockIdx.y (one new row of its sequence), query head h =
// blockIdx.x, kv head g = h / (nq / nkv), ATTN_WARPS warps: the q head and k head g of the row
// are normalised per head (q_norm / k_norm, null: none) and rotated (inv_freq, null: no RoPE;
// cos/sin times mscale) in shared memory; the first query head of each group stores K and V of
// position pos in the caches (info as t_kv_store, type kt); then attend_head's online softmax,
// reading this row's own key and value (j = pos), as the cache holds them, from shared memory,
// so no block waits for another's store. sinks as t_attention. The head's output is quantized for the o
// product when given (the host passes q32 / qk only when hd is a multiple of 32 / 256).
template <int S>
__device__ void rope_attn_row(const float* q, const float* k, const float* v,
                              const long long* info, const float* q_norm, const float* k_norm,
                              const double* inv_freq, float* out, int nq, int nkv, int hd,
                              int rot, int interleaved, float eps, float off, double mscale,
                              float scale, int window, float cap, const float* sinks, i8* q32,
                              float* d32, i8* qk, float* dk, int* bsk, int kt) {
    __shared__ double shd[32];
    __shared__ __align__(16) float qs[S * 32];
    __shared__ __align__(16) float ks[S * 32];
    __shared__ __align__(16) float vs[S * 32];
    int h = blockIdx.x;
    long long r = blockIdx.y;
    int grp = nq / nkv;
    int g = h / grp;
    int kvd = nkv * hd;
    void* kc = (void*)info[3 * r];
    void* vc = (void*)info[3 * r + 1];
    int pos = (int)info[3 * r + 2];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        qs[d] = q[(r * nq + h) * hd + d];
        ks[d] = k[r * kvd + (long long)g * hd + d];
        vs[d] = v[r * kvd + (long long)g * hd + d];
    }
    __syncthreads();
    head_norm_rope(qs, q_norm, inv_freq, pos, hd, rot, interleaved, eps, off, mscale, shd);
    head_norm_rope(ks, k_norm, inv_freq, pos, hd, rot, interleaved, eps, off, mscale, shd);
    if (h % grp == 0) store_kv_row(kc, vc, ks, vs, pos, kvd, g, hd, kt);
    kv_round_row(ks, hd, kt);
    kv_round_row(vs, hd, kt);
    attend_head<S>(qs, kc, vc, (long long)g * hd, ks, vs, kvd, hd, window, pos, scale, cap,
                   sinks ? sinks + h : 0, out + (r * nq + h) * hd, qs, kt);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (!q32 && !qk) return;
    __syncthreads();
    long long head = r * nq + h;
    if (q32)
        for (int b = w; b < hd / 32; b += ATTN_WARPS)
            quant_block_32(qs + b * 32, q32, d32, (int)(head * (hd / 32) + b), lane, 1);
    if (qk)
        for (int b = w; b < hd / 256; b += ATTN_WARPS)
            quant_block_k(qs + b * 256, qk, dk, bsk, (int)(head * (hd / 256) + b), lane);
}

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
    t_rope_attend(const float* q, const float* k, const float* v, const long long* info,
                  const float* q_norm, const float* k_norm, const double* inv_freq, float* out,
                  int nq, int nkv, int hd, int rot, int interleaved, float eps, float off,
                  double mscale, float scale, int window, float cap, const float* sinks, i8* q32,
                  float* d32, i8* qk, float* dk, int* bsk, int kt) {
    pdl_trigger();
    pdl_wait();
#define RA_ARGS q, k, v, info, q_norm, k_norm, inv_freq, out, nq, nkv, hd, rot, interleaved, eps, \
                off, mscale, scale, window, cap, sinks, q32, d32, qk, dk, bsk, kt
    if (hd <= 64) rope_attn_row<2>(RA_ARGS);
    else if (hd <= 128) rope_attn_row<4>(RA_ARGS);
    else if (hd <= 256) rope_attn_row<8>(RA_ARGS);
    else rope_attn_row<16>(RA_ARGS);
#undef RA_ARGS
}

// up[i] = act(gate[i]) * up[i] (gate null: act(up[i])) over n values, one warp per chunk, and
// the result quantized for the next product: with qk (n % 256 == 0) 256-value chunks, Q8_K
// from registers, then (q32 given) the chunk's eight 32-value blocks re-read after the warp's
// writes; without qk 32-value chunks quantized to q32 (when given).
extern "C" __global__ void t_act_quant(const float* gate, float* up, long long n, int act,
                                       i8* q32, float* d32, i8* qk, float* dk, int* bsk) {
    pdl_trigger();
    pdl_wait();
    long long c = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (qk) {
        if (c * 256 >= n) return;
        act_chunk(gate, up, (int)n, act, qk, dk, bsk, 1, (int)c, lane);
        if (!q32) return;
        __syncwarp();
        for (int b = 0; b < 8; b++)
            quant_reg_32(up[c * 256 + b * 32 + lane], q32, d32, (int)(c * 8 + b), lane, 1);
        return;
    }
    if (c * 32 >= n) return;
    act_chunk(gate, up, (int)n, act, q32, d32, 0, 0, (int)c, lane);
}

// best[2 r], best[2 r + 1] = 0 for r < rows (before t_argmax_rows).
extern "C" __global__ void t_argmax_clear(unsigned long long* best, int rows) {
    pdl_trigger();
    pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 2 * rows) best[i] = 0;
}

// argmax_into (decode.cu) of row blockIdx.y of logits [rows, n] into best[2 r .. 2 r + 1]
// (cleared by t_argmax_clear): the packed (value, id) key of the largest finite logit, ties to
// the smaller id, and the non-finite flag.
extern "C" __global__ void t_argmax_rows(const float* logits, int n, unsigned long long* best) {
    pdl_trigger();
    pdl_wait();
    argmax_into(logits + (long long)blockIdx.y * n, n, best + 2 * blockIdx.y);
}
