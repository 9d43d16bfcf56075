// ---------------------------------------------------------------------------------------------
// Dequantization to bf16 for the many-row products on cuBLAS (blas.rs): the weights of one
// product dequantized into a scratch matrix, the activations converted, then one GEMM with f32
// accumulation. The blocks of a row-major quantized matrix, concatenated, are its values in
// order, so every kernel works on the flat array: thread g writes values 8g .. 8g+7 (one
// 16-byte store). Values follow ggml's dequantize_row_* (f32), then round to nearest-even bf16.
// ---------------------------------------------------------------------------------------------

// f32 -> bf16 bits, nearest even (finite inputs).
__device__ __forceinline__ u32 bf16_bits(float f) {
    u32 u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ void store_bf16x8(u16* __restrict__ out, long long g,
                                             const float (&v)[8]) {
    uint4 o;
    o.x = bf16_bits(v[0]) | (bf16_bits(v[1]) << 16);
    o.y = bf16_bits(v[2]) | (bf16_bits(v[3]) << 16);
    o.z = bf16_bits(v[4]) | (bf16_bits(v[5]) << 16);
    o.w = bf16_bits(v[6]) | (bf16_bits(v[7]) << 16);
    *(uint4*)(out + g * 8) = o;
}

__device__ __forceinline__ long long dq_group() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// ggml dequantize_row_q4_K: 32 groups per 144-byte super-block; group t is sub-block t/4.
__device__ __forceinline__ void dq8_q4_k(const u8* __restrict__ W, long long g,
                                        float (&v)[8]) {
    const u8* b = W + (g >> 5) * 144;
    int t = (int)(g & 31), s = t >> 2;
    int sc, mn;
    scale_min_k4(s, b + 4, &sc, &mn);
    float d1 = ld_f16(b) * sc, m1 = ld_f16(b + 2) * mn;
    const u8* q = b + 16 + 32 * (s >> 1) + (t & 3) * 8;
    int sh = 4 * (s & 1);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = d1 * ((q[j] >> sh) & 0xF) - m1;
}

// ggml dequantize_row_q6_K: 32 groups per 210-byte super-block; value o = 128·half + 32·quadrant
// + l takes the low (quadrants 0, 1) or high (2, 3) nibble of ql[64·half + 32·(quadrant & 1) + l]
// and bits 2·quadrant of qh[32·half + l], scale sc[8·half + 2·quadrant + l / 16].
__device__ __forceinline__ void dq8_q6_k(const u8* __restrict__ W, long long g,
                                        float (&v)[8]) {
    const u8* b = W + (g >> 5) * 210;
    int o = (int)(g & 31) * 8, half = o >> 7, qd = (o & 127) >> 5, l0 = o & 31;
    const u8* ql = b + half * 64 + (qd & 1) * 32 + l0;
    const u8* qh = b + 128 + half * 32 + l0;
    const i8* sc = (const i8*)(b + 192) + half * 8 + 2 * qd;
    float d = ld_f16(b + 208);
    int shl = (qd >> 1) * 4, shh = 2 * qd;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int q = ((ql[j] >> shl) & 0xF) | (((qh[j] >> shh) & 3) << 4);
        v[j] = d * sc[(l0 + j) >> 4] * (q - 32);
    }
}

// ggml dequantize_row_q4_0: 4 groups per 18-byte block; values 0..15 are the low nibbles,
// 16..31 the high ones.
__device__ __forceinline__ void dq8_q4_0(const u8* __restrict__ W, long long g,
                                        float (&v)[8]) {
    const u8* b = W + (g >> 2) * 18;
    int p = (int)(g & 3);
    float d = ld_f16(b);
    const u8* q = b + 2 + (p & 1) * 8;
    int sh = (p >> 1) * 4;
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = d * (((q[j] >> sh) & 0xF) - 8);
}

// ggml dequantize_row_q5_0: 4 groups per 22-byte block; bit e of qh is the fifth bit of value e.
__device__ __forceinline__ void dq8_q5_0(const u8* __restrict__ W, long long g,
                                        float (&v)[8]) {
    const u8* b = W + (g >> 2) * 22;
    int p = (int)(g & 3);
    float d = ld_f16(b);
    u32 qh = (u32)ld_u16(b + 2) | ((u32)ld_u16(b + 4) << 16);
    const u8* q = b + 6 + (p & 1) * 8;
    int hi = p >> 1;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int e = p * 8 + j;
        int x = ((q[j] >> (4 * hi)) & 0xF) | (((qh >> e) & 1) << 4);
        v[j] = d * (x - 16);
    }
}

// ggml dequantize_row_q8_0: 4 groups per 34-byte block.
__device__ __forceinline__ void dq8_q8_0(const u8* __restrict__ W, long long g,
                                        float (&v)[8]) {
    const u8* b = W + (g >> 2) * 34;
    const i8* q = (const i8*)(b + 2) + (g & 3) * 8;
    float d = ld_f16(b);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = d * q[j];
}

// The token id of embedding row r: ids[r], or with `best` the greedy choice of row r of the
// last t_argmax_rows (its packed key's low 32 bits hold 0xffffffff - id); a row without a
// finite logit (no key) reads row 0, and the host discards that step (Argmax::all_finite).
__device__ __forceinline__ long long embed_id(const int* ids, const unsigned long long* best,
                                              int r, int table_rows) {
    if (!best) return ids[r];
    u32 id = 0xffffffffu - (u32)(best[2 * r] & 0xffffffffull);
    return id < (u32)table_rows ? id : 0;
}

// Per format: dq_FMT, the whole matrix to bf16 (thread g: values 8g .. 8g+7), and t_embed_FMT,
// the embedding lookup of a quantized table: row blockIdx.x of out [rows, width] = row
// embed_id(r) of E [table_rows, width] dequantized (f32) times scale.
#define DQ_KERNELS(FMT)                                                                        \
    extern "C" __global__ void dq_##FMT(const u8* __restrict__ W, u16* __restrict__ out,      \
                                        long long groups) {                                   \
        long long g = dq_group();                                                             \
        if (g >= groups) return;                                                              \
        float v[8];                                                                           \
        dq8_##FMT(W, g, v);                                                                   \
        store_bf16x8(out, g, v);                                                              \
    }                                                                                         \
    extern "C" __global__ void t_embed_##FMT(const u8* __restrict__ E, const int* ids,        \
                                             const unsigned long long* best, int table_rows,  \
                                             float* out, int width, float scale) {            \
        pdl_trigger();                                                                        \
        pdl_wait();                                                                           \
        long long id = embed_id(ids, best, blockIdx.x, table_rows);                           \
        long long per = width / 8;                                                            \
        float* o = out + (long long)blockIdx.x * width;                                       \
        for (long long j = threadIdx.x; j < per; j += blockDim.x) {                           \
            float v[8];                                                                       \
            dq8_##FMT(E, id * per + j, v);                                                    \
            _Pragma("unroll") for (int k = 0; k < 8; k++) o[8 * j + k] = v[k] * scale;        \
        }                                                                                     \
    }
DQ_KERNELS(q4_k)
DQ_KERNELS(q6_k)
DQ_KERNELS(q4_0)
DQ_KERNELS(q5_0)
DQ_KERNELS(q8_0)

// f32 activations -> bf16 (8 values per thread).
extern "C" __global__ void to_bf16(const float* __restrict__ x, u16* __restrict__ out,
                                   long long groups) {
    long long g = dq_group();
    if (g >= groups) return;
    float4 a = *(const float4*)(x + g * 8), c = *(const float4*)(x + g * 8 + 4);
    float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    store_bf16x8(out, g, v);
}
