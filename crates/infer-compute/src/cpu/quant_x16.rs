//! Products with Q4_0x16 weights (Q4_0 re-laid sixteen rows per group, stored so by `infer
//! extract`; layout in `infer_quant::interleave`): the whole groups through
//! `vec_dot::x16` (AVX-512 VNNI or AVX2), the `rows % 16` plain rows after them through the
//! Q4_0 tile kernel, activations quantized once (Q8_0). Every output equals the plain Q4_0
//! product's on the same CPU bit for bit. Without AVX2 the matrix is un-laid and multiplied
//! as plain Q4_0 (the scalar kernels).

use super::quant::{self, Split};
use crate::vec_dot::Isa;
use crate::{ComputeError, Matrix};
use infer_quant::QuantFormat;

/// `y[m×rows] = x[m×cols] · Wᵀ` for an interleaved `format` (`bytes` already checked to hold
/// `rows` rows of `cols` values); see [`crate::ComputeBackend::linear`].
/// Errors: a format other than Q4_0x16 ([`ComputeError::UnsupportedFormat`]); activation
/// quantization.
pub(super) fn matmul(
    isa: Isa,
    w: &Matrix<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<(), ComputeError> {
    let (format, bytes) = w.blocks_data()?;
    if format != QuantFormat::Q4_0x16 {
        return Err(ComputeError::UnsupportedFormat {
            backend: "cpu".to_string(),
            format,
        });
    }
    if m == 0 || w.rows == 0 || w.cols == 0 {
        // Nothing is read: the plain path's handling of empty products.
        return quant::quant_matmul(
            isa,
            &Matrix::blocks(QuantFormat::Q4_0, bytes, w.rows, w.cols),
            x,
            m,
            y,
        );
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && isa.is_available() {
        return groups(bytes, x, m, (w.rows, w.cols), y);
    }
    let plain = infer_quant::interleave::to_rows(format, bytes, w.rows, w.cols)?;
    let m_plain = Matrix::blocks(QuantFormat::Q4_0, &plain, w.rows, w.cols);
    quant::quant_matmul(isa, &m_plain, x, m, y)
}

/// The AVX2/VNNI path of [`matmul`]: tasks of whole groups, then the plain tail rows.
#[cfg(target_arch = "x86_64")]
fn groups(
    bytes: &[u8],
    x: &[f32],
    m: usize,
    (rows, cols): (usize, usize),
    y: &mut [f32],
) -> Result<(), ComputeError> {
    use super::quant_tile::{self, TileActs, Tiled, WeightRows};
    use crate::vec_dot::avx2_tile::Q0;
    use crate::vec_dot::{x16, OutMat, Q8Rows};
    use rayon::prelude::*;

    let row_bytes = QuantFormat::Q4_0.bytes_for(cols)?;
    let whole = rows / x16::ROWS * x16::ROWS;
    let (grouped, tail) = bytes.split_at(whole * row_bytes);
    Q8Rows::with_thread_buffer(x, m, cols, |a| {
        let out = OutMat::rows_last(y, m, rows);
        let split = Split::new(whole, row_bytes * m);
        let group_rows = split.rows_per_task.next_multiple_of(x16::ROWS);
        // SAFETY: AVX2 checked by the caller; task k owns rows k·group_rows.. of `grouped` and
        // exactly those columns of `y`, the tail its own rows after `whole`; `y` outlives the
        // parallel region.
        let task = |k: usize, ws: &[u8]| unsafe {
            x16::groups_times_acts(ws, a, out.at_row(k * group_rows))
        };
        if split.serial {
            task(0, grouped);
        } else {
            grouped
                .par_chunks(group_rows * row_bytes)
                .enumerate()
                .for_each(|(k, ws)| task(k, ws));
        }
        if !tail.is_empty() {
            // SAFETY: as above; rows whole.. are the tail's.
            unsafe {
                quant_tile::rows(
                    Tiled::Q0(Q0::Q4_0),
                    WeightRows {
                        bytes: tail,
                        row_bytes,
                    },
                    TileActs::Q8(a),
                    m,
                    cols,
                    out.at_row(whole),
                )
            }
        }
    })
}
