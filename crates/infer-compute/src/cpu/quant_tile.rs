//! The tiled path of [`super::quant`]: activations quantized once, then each weight row is
//! multiplied with all activation rows by a tile kernel (weight blocks unpacked once per tile
//! of activation rows) — Q4_0, Q5_0 and Q8_0 weights with [`Q8Rows`] activations
//! (`vec_dot::avx2_tile`, AVX2 or AVX-512 VNNI), Q4_K and Q6_K weights with Q8_K activations
//! (`vec_dot::avx512_q4k`, `vec_dot::avx512_q6k`: AVX2, with AVX-512VL/BW's registers when
//! present; four or more activation rows: `vec_dot::avx2_gemm_k`). Mat-vec (one row) and
//! mat-mat give the same bits per output.

use super::quant::Split;
use crate::vec_dot::{self, Isa, OutMat, Q8Rows};
use crate::ComputeError;
use infer_quant::QuantFormat;
use rayon::prelude::*;

/// A weight format with a tile kernel in the chosen instruction set.
#[derive(Clone, Copy, Debug)]
pub(super) enum Tiled {
    /// Q4_0 / Q5_0 / Q8_0 × Q8_0 split rows.
    #[cfg(target_arch = "x86_64")]
    Q0(crate::vec_dot::avx2_tile::Q0),
    /// Q4_K × Q8_K.
    Q4K,
    /// Q6_K × Q8_K.
    Q6K,
}

/// Quantized activations of a tiled product, borrowed.
#[derive(Clone, Copy, Debug)]
pub(super) enum TileActs<'a> {
    /// For [`Tiled::Q0`].
    Q8(&'a Q8Rows),
    /// `m` rows of Q8_K blocks, for [`Tiled::Q4K`] and [`Tiled::Q6K`].
    Q8K(&'a [u8]),
}

/// Whole rows of a quantized weight matrix: `bytes` holds `bytes.len() / row_bytes` rows of
/// `row_bytes` bytes each (one row = `cols` values as ggml blocks of the weight format).
#[derive(Clone, Copy, Debug)]
pub(super) struct WeightRows<'a> {
    pub(super) bytes: &'a [u8],
    /// Bytes per row (validated by the caller).
    pub(super) row_bytes: usize,
}

impl Tiled {
    /// The activation format this kernel reads (Q8_0 or Q8_K).
    pub fn act_format(self) -> QuantFormat {
        match self {
            Tiled::Q4K | Tiled::Q6K => QuantFormat::Q8_K,
            #[cfg(target_arch = "x86_64")]
            Tiled::Q0(_) => QuantFormat::Q8_0,
        }
    }
}

/// The tile kernel for `format` under `isa`: Q4_0, Q5_0, Q8_0, Q4_K and Q6_K with [`Isa::Avx2`].
pub(super) fn tiled(format: QuantFormat, isa: Isa) -> Option<Tiled> {
    #[cfg(target_arch = "x86_64")]
    {
        if isa != Isa::Avx2 || !isa.is_available() {
            return None;
        }
        if format == QuantFormat::Q6_K {
            return vec_dot::avx512_q6k::available().then_some(Tiled::Q6K);
        }
        if format == QuantFormat::Q4_K {
            return vec_dot::avx512_q4k::available().then_some(Tiled::Q4K);
        }
        crate::vec_dot::avx2_tile::q0_of(format).map(Tiled::Q0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (format, isa);
        None
    }
}

/// `y = x · Wᵀ` (`y` `[m, rows]`) through the tile kernel `t`: quantizes `x` (`[m, cols]`)
/// once (into per-thread buffers), then [`matmul`].
pub(super) fn quantize_and_matmul(
    t: Tiled,
    w: WeightRows<'_>,
    x: &[f32],
    m: usize,
    cols: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    if t.act_format() == QuantFormat::Q8_K {
        super::quant::with_acts(QuantFormat::Q8_K, x, m, cols, |a, _| {
            matmul(t, w, TileActs::Q8K(a), m, cols, y)
        })
    } else {
        Q8Rows::with_thread_buffer(x, m, cols, |a| matmul(t, w, TileActs::Q8(a), m, cols, y))
    }
}

/// `y[i*rows + r] = W[r] · A[i]` for the `rows × cols` weight matrix `w` and the `m` activation
/// rows `acts`; `y` is `[m, rows]`. Weight rows are split across rayon's pool ([`Split`]); each
/// task writes its own columns of `y` directly.
pub(super) fn matmul(
    t: Tiled,
    w: WeightRows<'_>,
    acts: TileActs<'_>,
    m: usize,
    cols: usize,
    y: &mut [f32],
) {
    let WeightRows { bytes, row_bytes } = w;
    if m == 0 || row_bytes == 0 {
        return;
    }
    let n_rows = bytes.len() / row_bytes;
    let out = OutMat::rows_last(y, m, n_rows);
    let split = Split::new(n_rows, row_bytes * m);
    let rpt = split.rows_per_task;
    // SAFETY: task k owns weight rows k·rpt.. of `bytes` and exactly those columns of `y`
    // (in bounds: `out` covers m × n_rows); `y` outlives the parallel region.
    let task = |k: usize, ws: &[u8]| unsafe {
        let w = WeightRows {
            bytes: ws,
            row_bytes,
        };
        rows(t, w, acts, m, cols, out.at_row(k * rpt))
    };
    if split.serial {
        task(0, bytes);
    } else {
        bytes
            .par_chunks(rpt * row_bytes)
            .enumerate()
            .for_each(|(k, ws)| task(k, ws));
    }
}

/// Element (r, i) of `out` = `W_r · A_i` for the whole weight rows `w` and the `m` rows of
/// `acts` (`cols` values each). Panics if `acts` is not the activation kind of `t`.
///
/// # Safety
/// `out` must own elements (r, i) for r < `w.bytes.len() / w.row_bytes`, i < `m`
/// ([`OutMat::put`]).
#[inline]
pub(super) unsafe fn rows(
    t: Tiled,
    w: WeightRows<'_>,
    acts: TileActs<'_>,
    m: usize,
    cols: usize,
    out: OutMat,
) {
    let WeightRows {
        bytes: ws,
        row_bytes,
    } = w;
    match (t, acts) {
        #[cfg(target_arch = "x86_64")]
        (Tiled::Q0(f), TileActs::Q8(a)) => {
            crate::vec_dot::avx2_tile::rows_times_acts(f, ws, row_bytes, a, out)
        }
        #[cfg(target_arch = "x86_64")]
        (Tiled::Q4K, TileActs::Q8K(a)) => {
            crate::vec_dot::avx512_q4k::rows_times_acts(ws, row_bytes, cols, a, m, out)
        }
        #[cfg(target_arch = "x86_64")]
        (Tiled::Q6K, TileActs::Q8K(a)) => {
            crate::vec_dot::avx512_q6k::rows_times_acts(ws, row_bytes, cols, a, m, out)
        }
        _ => {
            let _ = (ws, row_bytes, m, cols, out);
            unreachable!("tile kernel {t:?} given other activations")
        }
    }
}
