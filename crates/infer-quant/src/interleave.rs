//! Interleaved layouts: a block format's bytes re-laid several rows at a time, so that a SIMD
//! kernel reads one dword of every row of a group in one load (llama.cpp's `repack.cpp` builds
//! such layouts at load time, `block_q4_0x8`; infer stores them, tagged, in the vindex).
//!
//! **Q4_0x16** ([`QuantFormat::Q4_0x16`], infer's own; no ggml type id): a `[rows, cols]` Q4_0
//! matrix (`nb = cols / 32` blocks per row, 18 bytes each: f16 `d`, 16 bytes `qs`) as
//! - `rows / 16` groups of sixteen consecutive rows, each `nb` group blocks of 288 bytes in
//!   block order; group block `b` = the sixteen rows' `d` of block `b` (32 bytes, row 0 first),
//!   then four 64-byte chunks, chunk `k` = every row's `qs[4k..4k+4]` (row `r` at bytes
//!   `4r..4r+4` of the chunk: dword lane `r` of a 512-bit load is row `r`; low nibbles hold
//!   values `4k..4k+4`, high nibbles `16+4k..16+4k+4`, ggml's order);
//! - then the last `rows % 16` rows as plain Q4_0 rows (a matrix of fewer than 16 rows is
//!   plain Q4_0 bytes).
//!
//! So the bytes per row are Q4_0's and a matrix is exactly as long as its Q4_0 original
//! ([`QuantFormat::expected_bytes`] is unchanged), and re-laying moves bytes only: it is
//! lossless both ways ([`from_rows`], [`to_rows`]). The layout generalises to any format whose
//! block is an f16 scale followed by whole dwords of quants; Q4_0 is the one in the table.
//!
//! Every reader that slices a matrix into rows goes through this module ([`row_bytes_of`],
//! [`dequantize_matrix`]); [`crate::dequantize`] alone refuses an interleaved format (it has no
//! row length to find the rows with).

use std::borrow::Cow;

use crate::{QuantError, QuantFormat};

/// Bytes of a block's scale (f16 `d`, the first field of every layout re-laid here).
const SCALE_BYTES: usize = 2;
/// Bytes of one row's share of a chunk: one dword lane.
const LANE_BYTES: usize = 4;

/// The geometry of an interleaved matrix.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Rows per group.
    g: usize,
    /// Bytes per block of the row format.
    bb: usize,
    /// Blocks per row.
    nb: usize,
    /// Whole groups (the rows after them are plain).
    groups: usize,
}

impl Geometry {
    /// Errors: not an interleaved format; `cols` not whole blocks; `bytes` of another length
    /// than `rows` rows ([`QuantError::WrongByteCount`]).
    fn of(format: QuantFormat, len: usize, rows: usize, cols: usize) -> Result<Self, QuantError> {
        let Some((row_format, g)) = format.interleaved() else {
            return Err(QuantError::BadShape(format!(
                "{format} is not an interleaved layout"
            )));
        };
        let expected = format.expected_bytes(&[rows, cols])?;
        if len != expected {
            return Err(QuantError::WrongByteCount {
                format,
                expected,
                got: len,
            });
        }
        let bb = row_format.block_bytes();
        debug_assert_eq!((bb - SCALE_BYTES) % LANE_BYTES, 0);
        Ok(Geometry {
            g,
            bb,
            nb: cols / row_format.block_elems(),
            groups: rows / g,
        })
    }

    /// Bytes of one row.
    fn row(&self) -> usize {
        self.nb * self.bb
    }

    /// Where byte `i` of block `b` of row `r` (of a whole group) sits in the interleaved bytes.
    #[inline]
    fn at(&self, r: usize, b: usize, i: usize) -> usize {
        let (group, lane) = (r / self.g, r % self.g);
        let block = (group * self.nb + b) * self.g * self.bb;
        if i < SCALE_BYTES {
            block + lane * SCALE_BYTES + i
        } else {
            let q = i - SCALE_BYTES;
            let chunk = q / LANE_BYTES;
            block
                + self.g * SCALE_BYTES
                + chunk * self.g * LANE_BYTES
                + lane * LANE_BYTES
                + q % LANE_BYTES
        }
    }
}

/// Re-lay a `[rows, cols]` matrix of `format`'s row format (`plain`: ggml rows, e.g. Q4_0
/// blocks) as `format` (e.g. Q4_0x16). Lossless: [`to_rows`] gives `plain` back.
/// Errors: `format` not interleaved; `cols` not whole blocks; `plain` of another length than
/// `rows` rows.
pub fn from_rows(
    format: QuantFormat,
    plain: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Vec<u8>, QuantError> {
    let geo = Geometry::of(format, plain.len(), rows, cols)?;
    let mut out = vec![0u8; plain.len()];
    let whole = geo.groups * geo.g;
    for (r, row) in plain.chunks_exact(geo.row().max(1)).take(whole).enumerate() {
        for (b, blk) in row.chunks_exact(geo.bb).enumerate() {
            out[geo.at(r, b, 0)..][..SCALE_BYTES].copy_from_slice(&blk[..SCALE_BYTES]);
            for (c, lane) in blk[SCALE_BYTES..].chunks_exact(LANE_BYTES).enumerate() {
                let at = geo.at(r, b, SCALE_BYTES + c * LANE_BYTES);
                out[at..at + LANE_BYTES].copy_from_slice(lane);
            }
        }
    }
    let tail = whole * geo.row();
    out[tail..].copy_from_slice(&plain[tail..]);
    Ok(out)
}

/// The ggml rows of an interleaved `[rows, cols]` matrix of `format` (the inverse of
/// [`from_rows`]); a format that is not interleaved is returned as it is (borrowed).
/// Errors: `bytes` of another length than `rows` rows; `cols` not whole blocks.
pub fn to_rows(
    format: QuantFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Cow<'_, [u8]>, QuantError> {
    if format.interleaved().is_none() {
        return Ok(Cow::Borrowed(bytes));
    }
    let geo = Geometry::of(format, bytes.len(), rows, cols)?;
    let mut out = vec![0u8; bytes.len()];
    for (r, row) in out.chunks_exact_mut(geo.row().max(1)).enumerate() {
        row_into(&geo, bytes, r, row);
    }
    Ok(Cow::Owned(out))
}

/// Row `r` of `bytes` (laid out as `geo`) in the row format, into `out` (one row's bytes).
fn row_into(geo: &Geometry, bytes: &[u8], r: usize, out: &mut [u8]) {
    if r >= geo.groups * geo.g {
        out.copy_from_slice(&bytes[r * geo.row()..][..geo.row()]);
        return;
    }
    for (b, blk) in out.chunks_exact_mut(geo.bb).enumerate() {
        blk[..SCALE_BYTES].copy_from_slice(&bytes[geo.at(r, b, 0)..][..SCALE_BYTES]);
        for (c, lane) in blk[SCALE_BYTES..].chunks_exact_mut(LANE_BYTES).enumerate() {
            let at = geo.at(r, b, SCALE_BYTES + c * LANE_BYTES);
            lane.copy_from_slice(&bytes[at..at + LANE_BYTES]);
        }
    }
}

/// Row `r` of a `[rows, cols]` matrix of `format` as ggml blocks of [`QuantFormat::row_format`]
/// (`format.bytes_for(cols)` bytes): borrowed for a plain format, gathered from its group for
/// an interleaved one. Errors: `r ≥ rows`; `bytes` not `rows` rows; `cols` not whole blocks.
pub fn row_bytes_of(
    format: QuantFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    r: usize,
) -> Result<Cow<'_, [u8]>, QuantError> {
    if r >= rows {
        return Err(QuantError::BadShape(format!(
            "row {r} of a matrix of {rows} rows"
        )));
    }
    let rb = format.bytes_for(cols)?;
    if format.interleaved().is_none() {
        let expected = format.expected_bytes(&[rows, cols])?;
        if bytes.len() != expected {
            return Err(QuantError::WrongByteCount {
                format,
                expected,
                got: bytes.len(),
            });
        }
        return Ok(Cow::Borrowed(&bytes[r * rb..(r + 1) * rb]));
    }
    let geo = Geometry::of(format, bytes.len(), rows, cols)?;
    let mut out = vec![0u8; rb];
    row_into(&geo, bytes, r, &mut out);
    Ok(Cow::Owned(out))
}

/// Dequantize a whole `[rows, cols]` matrix of any format into `out` (`rows · cols` values,
/// row-major): [`crate::dequantize`] of its ggml rows, un-laid first when `format` is
/// interleaved. Errors: as [`crate::dequantize`], and a byte length that is not `rows` rows.
pub fn dequantize_matrix(
    format: QuantFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if out.len() != rows.saturating_mul(cols) {
        return Err(QuantError::BadShape(format!(
            "{} values for a [{rows}, {cols}] matrix",
            out.len()
        )));
    }
    let plain = to_rows(format, bytes, rows, cols)?;
    crate::dequantize(format.row_format(), &plain, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Q4_0 matrix of random bytes (each block's f16 scale kept finite).
    fn random_q4_0(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..rows * cols / 32 * 18)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if i % 18 == 1 {
                    (s as u8) & 0x3b
                } else {
                    s as u8
                }
            })
            .collect()
    }

    /// Re-lay then un-lay gives the original bytes, every row reads back as the original row,
    /// and the interleaved bytes hold the documented layout, for rows that are and are not a
    /// multiple of 16 (incl. fewer than 16).
    #[test]
    fn q4_0x16_round_trips_and_holds_the_documented_layout() {
        let f = QuantFormat::Q4_0x16;
        for (rows, cols) in [(16, 32), (48, 96), (35, 64), (5, 32), (17, 576), (0, 32)] {
            let plain = random_q4_0(rows, cols, 0x9e37_79b9 + rows as u64);
            let x = from_rows(f, &plain, rows, cols).unwrap();
            assert_eq!(x.len(), plain.len());
            assert_eq!(to_rows(f, &x, rows, cols).unwrap().as_ref(), &plain[..]);
            let rb = cols / 32 * 18;
            for r in 0..rows {
                assert_eq!(
                    row_bytes_of(f, &x, rows, cols, r).unwrap().as_ref(),
                    &plain[r * rb..(r + 1) * rb],
                    "{rows}x{cols} row {r}"
                );
            }
            let (nb, groups) = (cols / 32, rows / 16);
            for g in 0..groups {
                for b in 0..nb {
                    let gb = &x[(g * nb + b) * 288..][..288];
                    for r in 0..16 {
                        let blk = &plain[(g * 16 + r) * rb + b * 18..][..18];
                        assert_eq!(&gb[2 * r..2 * r + 2], &blk[..2], "d of row {r}");
                        for k in 0..4 {
                            let at = 32 + 64 * k + 4 * r;
                            assert_eq!(&gb[at..at + 4], &blk[2 + 4 * k..6 + 4 * k]);
                        }
                    }
                }
            }
            // The tail rows are plain.
            assert_eq!(&x[groups * 16 * rb..], &plain[groups * 16 * rb..]);
            let mut a = vec![0f32; rows * cols];
            let mut b = vec![0f32; rows * cols];
            dequantize_matrix(f, &x, rows, cols, &mut a).unwrap();
            crate::dequantize(QuantFormat::Q4_0, &plain, &mut b).unwrap();
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    /// Wrong sizes and formats are errors naming what is wrong, never a panic.
    #[test]
    fn bad_inputs_are_errors() {
        let f = QuantFormat::Q4_0x16;
        let plain = random_q4_0(32, 64, 7);
        let x = from_rows(f, &plain, 32, 64).unwrap();
        let e = to_rows(f, &x[..x.len() - 1], 32, 64).unwrap_err();
        assert!(
            e.to_string().contains("expected 1152 bytes, got 1151"),
            "{e}"
        );
        assert!(from_rows(f, &plain, 33, 64).is_err());
        assert!(from_rows(f, &plain, 32, 48).is_err());
        assert!(from_rows(QuantFormat::Q4_0, &plain, 32, 64).is_err());
        assert!(row_bytes_of(f, &x, 32, 64, 32).is_err());
        let mut out = vec![0f32; 32 * 64];
        assert!(dequantize_matrix(f, &x[..100], 32, 64, &mut out).is_err());
        // The row-blind entry point refuses the layout by name.
        let e = crate::dequantize(f, &x, &mut out).unwrap_err();
        assert!(e.to_string().contains("Q4_0x16"), "{e}");
    }
}
