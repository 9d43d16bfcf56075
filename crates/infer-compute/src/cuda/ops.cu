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
        double ang = (double)pos[row] * inv_freq[i];
        float c = (float)(cos(ang) * mscale), s = (float)(sin(ang) * mscale);
        int ia = interleaved ? 2 * i : i;
        int ib = interleaved ? 2 * i + 1 : i + half;
        float a = h[ia], b = h[ib];
        h[ia] = a * c - b * s;
        h[ib] = b * c + a * s;
    }
}

// The KV store of a batch: row blockIdx.x of k and v ([rows, kvd]) goes to position pos of
// its sequence's caches. info[3 r .. 3 r + 2] = {k cache, v cache, position} of row r.
extern "C" __global__ void t_kv_store(const float* k, const float* v, const long long* info,
                                      int kvd) {
    pdl_trigger();
    pdl_wait();
    long long r = blockIdx.x;
    float* kc = (float*)info[3 * r];
    float* vc = (float*)info[3 * r + 1];
    long long p = info[3 * r + 2];
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        kc[p * kvd + i] = k[r * kvd + i];
        vc[p * kvd + i] = v[r * kvd + i];
    }
}

// Causal attention of query row r = blockIdx.y, head h = blockIdx.x, over its sequence's cache
// (info as t_kv_store; keys 0..pos, or pos - window + 1..pos when window > 0, none when
// window < 0): ATTN_WARPS warps take every ATTN_WARPS-th key, each keeping a running maximum m,
// sum l and S register values per lane (dims lane, lane + 32, ...; S * 32 >= hd); the warps'
// partial results meet in shared memory at the end. sinks (null: none) holds one logit per
// query head that joins the softmax denominator (gpt-oss attention sinks).
template <int S>
__device__ void attn_row(const float* q, const long long* info, float* out, int nq, int nkv,
                         int hd, float scale, int window, float cap, const float* sinks) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][S * 32];
    int h = blockIdx.x;
    long long r = blockIdx.y;
    int g = h / (nq / nkv);
    int kvd = nkv * hd;
    const float* kc = (const float*)info[3 * r] + (long long)g * hd;
    const float* vc = (const float*)info[3 * r + 1] + (long long)g * hd;
    int pos = (int)info[3 * r + 2];
    int lo = 0;
    if (window > 0) lo = max(0, pos - window + 1);
    if (window < 0) lo = pos + 1;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* qr = q + (r * nq + h) * hd;
    float qv[S], acc[S];
#pragma unroll
    for (int i = 0; i < S; i++) {
        int d = i * 32 + lane;
        qv[i] = d < hd ? qr[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = lo + w; j <= pos; j += ATTN_WARPS) {
        const float* kr = kc + (long long)j * kvd;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < S; i++) {
            int d = i * 32 + lane;
            if (d < hd) dot += qv[i] * kr[d];
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(FULL, dot, o);
        float s = dot * scale;
        if (cap > 0.0f) s = cap * tanhf(s / cap);
        float mn = fmaxf(m, s);
        float corr = expf(m - mn);  // 0 on the first key (m = -inf)
        float p = expf(s - mn);
        l = l * corr + p;
        const float* vr = vc + (long long)j * kvd;
#pragma unroll
        for (int i = 0; i < S; i++) {
            int d = i * 32 + lane;
            acc[i] = acc[i] * corr + (d < hd ? p * vr[d] : 0.0f);
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
    if (sinks) mx = fmaxf(mx, sinks[h]);
    float total = sinks ? expf(sinks[h] - mx) : 0.0f;
    float f[ATTN_WARPS];
    for (int t = 0; t < ATTN_WARPS; t++) {
        f[t] = sm_m[t] == NEG_INF ? 0.0f : expf(sm_m[t] - mx);
        total += sm_l[t] * f[t];
    }
    float inv = total > 0.0f ? 1.0f / total : 0.0f;
    float* o = out + (r * nq + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int t = 0; t < ATTN_WARPS; t++) a += sm_acc[t][d] * f[t];
        o[d] = a * inv;
    }
}

extern "C" __global__ void t_attention(const float* q, const long long* info, float* out, int nq,
                                       int nkv, int hd, float scale, int window, float cap,
                                       const float* sinks) {
    pdl_trigger();
    pdl_wait();
    if (hd <= 64) attn_row<2>(q, info, out, nq, nkv, hd, scale, window, cap, sinks);
    else if (hd <= 128) attn_row<4>(q, info, out, nq, nkv, hd, scale, window, cap, sinks);
    else if (hd <= 256) attn_row<8>(q, info, out, nq, nkv, hd, scale, window, cap, sinks);
    else attn_row<16>(q, info, out, nq, nkv, hd, scale, window, cap, sinks);
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

// Row blockIdx.x of out = scale * row ids[blockIdx.x] of the f32 (f16 = 0) or f16 (f16 = 1)
// table E.
extern "C" __global__ void t_embed(const void* E, const int* ids, float* out, int width,
                                   float scale, int f16) {
    pdl_trigger();
    pdl_wait();
    long long id = ids[blockIdx.x];
    float* o = out + (long long)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = f16 ? f16_to_f32(((const u16*)E)[id * width + i]) : ((const float*)E)[id * width + i];
        o[i] = v * scale;
    }
}
