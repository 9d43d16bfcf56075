//! The case for a stored interleaved Q4_0 layout (issue 18), measured: one activation row
//! against a Q4_0 matrix through the backend's decode path (eight rows straight from the
//! ggml blocks, each block dot reduced across lanes) and through a kernel that reads sixteen
//! rows' blocks interleaved as they would be stored (rows in dword lanes: no transpose and no
//! reduction), same integers and same f32 sequence, so the outputs must be equal bit for bit.
//! AVX-512 VNNI hosts only; one thread, matrices rotated past the caches:
//! `RAYON_NUM_THREADS=1 cargo run --release -p infer-compute --example interleaved_q4_0`.

mod common;

use common::fill;
use infer_compute::{ComputeBackend, CpuBackend, Matrix, QuantFormat};
use std::arch::x86_64::*;
use std::time::Instant;

/// Q4_0: 18-byte blocks of 32 values (f16 scale, 16 bytes of nibbles).
const BLOCK: usize = 18;
/// Rows per interleaved group: one dword lane each of a 512-bit register.
const ROWS: usize = 16;
/// Bytes of one block of a group: 16 f16 scales, then 4 chunks of 64 bytes.
const GROUP_BLOCK: usize = ROWS * BLOCK;
/// Blocks of a group prefetched ahead of the one being read.
const AHEAD: usize = 16;

/// Q4_0 rows (ggml blocks) → groups of 16 rows; per block: the rows' 16 f16 scales, then chunk
/// k (k < 4) = every row's quant bytes 4k..4k+4 (low nibbles: values 4k..4k+4, high nibbles:
/// values 16+4k..16+4k+4, ggml's order), row r at bytes 4r..4r+4 of the chunk.
fn interleave(q: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let nb = cols / 32;
    let row_bytes = nb * BLOCK;
    let mut out = Vec::with_capacity(q.len());
    for g in 0..rows / ROWS {
        let block = |r: usize, b: usize| &q[(g * ROWS + r) * row_bytes + b * BLOCK..][..BLOCK];
        for b in 0..nb {
            for r in 0..ROWS {
                out.extend_from_slice(&block(r, b)[..2]);
            }
            for k in 0..4 {
                for r in 0..ROWS {
                    out.extend_from_slice(&block(r, b)[2 + 4 * k..][..4]);
                }
            }
        }
    }
    out
}

/// An activation row as Q8_0 (ggml `quantize_row_q8_0`): quants, f32 scales, per-block sums.
struct Acts {
    qs: Vec<i8>,
    d: Vec<f32>,
    sums: Vec<i32>,
}

fn quantize_acts(x: &[f32]) -> Acts {
    let blocks = infer_quant::quantize(QuantFormat::Q8_0, x, x.len(), None).expect("q8_0");
    let mut a = Acts {
        qs: Vec::new(),
        d: Vec::new(),
        sums: Vec::new(),
    };
    for blk in blocks.chunks_exact(34) {
        a.d.push(half::f16::from_le_bytes([blk[0], blk[1]]).to_f32());
        let qs = blk[2..].iter().map(|&b| b as i8);
        a.sums.push(qs.clone().map(i32::from).sum());
        a.qs.extend(qs);
    }
    a
}

/// `y = W x` from the interleaved layout: per group and block, the integer dots of the 16 rows
/// start at `-8 · Σ q_a` (Q4_0's offset), four `vpdpbusd` chains over the low and high
/// nibbles with an activation dword broadcast, then `acc = fma(d_w · d_a, dot, acc)` in block
/// order — the backend's f32 sequence.
///
/// # Safety
/// AVX-512F/BW/VNNI and F16C must be available; `w` holds `rows / 16` groups of `cols / 32`
/// blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
unsafe fn gemv_interleaved(w: &[u8], rows: usize, cols: usize, a: &Acts, y: &mut [f32]) {
    let nb = cols / 32;
    let nibble = _mm512_set1_epi8(0x0f);
    for g in 0..rows / ROWS {
        let group = w.as_ptr().add(g * nb * GROUP_BLOCK);
        let mut acc = _mm512_setzero_ps();
        for b in 0..nb {
            let p = group.add(b * GROUP_BLOCK);
            let ahead = p.wrapping_add(AHEAD * GROUP_BLOCK);
            for line in 0..GROUP_BLOCK.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
            let aq = a.qs.as_ptr().add(b * 32) as *const i32;
            let act = |k: usize| _mm512_set1_epi32(aq.add(k).read_unaligned());
            let mut s = [
                _mm512_set1_epi32(-8 * a.sums[b]),
                _mm512_setzero_si512(),
                _mm512_setzero_si512(),
                _mm512_setzero_si512(),
            ];
            for k in 0..4 {
                let x = _mm512_loadu_si512(p.add(32 + 64 * k) as *const _);
                let lo = _mm512_and_si512(x, nibble);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), nibble);
                let c = 2 * (k & 1);
                s[c] = _mm512_dpbusd_epi32(s[c], lo, act(k));
                s[c + 1] = _mm512_dpbusd_epi32(s[c + 1], hi, act(4 + k));
            }
            let dot = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[b]));
            acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc);
        }
        _mm512_storeu_ps(y.as_mut_ptr().add(g * ROWS), acc);
    }
}

/// Best time per call over 5 rounds of `4 n` calls (call `i` gets `i`), seconds.
fn best_time(mut f: impl FnMut(usize), n: usize) -> f64 {
    (0..n).for_each(&mut f);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        (0..4 * n).for_each(&mut f);
        best = best.min(t.elapsed().as_secs_f64() / (4 * n) as f64);
    }
    best
}

fn main() {
    use std::arch::is_x86_feature_detected as has;
    let vnni = has!("avx512f") && has!("avx512bw") && has!("avx512vnni") && has!("f16c");
    if !(vnni && has!("fma")) {
        eprintln!("this host has no AVX-512 VNNI: nothing to compare");
        return;
    }
    let be = CpuBackend::new();
    // (rows, cols, copies): Llama-3.2-1B-like, SmolLM2's output matrix, its FFN gate and down.
    for (rows, cols, copies) in [
        (4096usize, 4096usize, 8usize),
        (49152, 576, 6),
        (1536, 576, 64),
        (576, 1536, 64),
    ] {
        let q = infer_quant::quantize(QuantFormat::Q4_0, &fill(rows * cols, 1), cols, None)
            .expect("q4_0");
        let plain: Vec<Vec<u8>> = vec![q.clone(); copies];
        let packed: Vec<Vec<u8>> = vec![interleave(&q, rows, cols); copies];
        let x = fill(cols, 2);
        let (mut y_plain, mut y_packed) = (vec![0f32; rows], vec![0f32; rows]);
        let t_plain = best_time(
            |i| {
                let m = Matrix::blocks(QuantFormat::Q4_0, &plain[i % copies], rows, cols);
                be.linear(&m, &x, 1, &mut y_plain).expect("linear");
            },
            copies,
        );
        let t_packed = best_time(
            |i| {
                let a = quantize_acts(&x);
                // SAFETY: the features were detected above; `packed` holds rows/16 groups.
                unsafe { gemv_interleaved(&packed[i % copies], rows, cols, &a, &mut y_packed) }
            },
            copies,
        );
        let equal = y_plain
            .iter()
            .zip(&y_packed)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        let gbs = |t: f64| q.len() as f64 / t / 1e9;
        println!(
            "Q4_0 {rows:>5} x {cols:<5} direct {:>7.1} us {:>5.1} GB/s | interleaved {:>7.1} us {:>5.1} GB/s ({:.2}x) | bit-equal {equal}/{rows}",
            t_plain * 1e6,
            gbs(t_plain),
            t_packed * 1e6,
            gbs(t_packed),
            t_plain / t_packed,
        );
    }
}
