//! llama.cpp's Q/K row permutation for interleaved RoPE, and its inverse.
//!
//! `convert_hf_to_gguf.py` `LlamaModel.permute` stores Q (and K, with the KV-head count) as
//! `w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2)`: within each head, HF row `s·hd/2 + j`
//! (s ∈ {0, 1}, j < hd/2; rotate_half pairs) becomes GGUF row `2j + s` (adjacent pairs).

/// Check the shape and return `(head_dim, half)`.
fn geometry(len: usize, rows: usize, n_head: usize) -> Result<(usize, usize), String> {
    if rows == 0 || n_head == 0 || len % rows != 0 {
        return Err(format!(
            "{len} values cannot be {rows} rows split into {n_head} heads"
        ));
    }
    if rows % n_head != 0 || (rows / n_head) % 2 != 0 {
        return Err(format!(
            "{rows} rows do not split into {n_head} heads of even size"
        ));
    }
    let hd = rows / n_head;
    Ok((hd, hd / 2))
}

/// Which way [`move_rows`] moves rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    GgufToHf,
    HfToGguf,
}

/// Reorder `rows` equal-length rows of `data` between GGUF and HF row order, per head:
/// HF row `h·hd + s·hd/2 + j` ↔ GGUF row `h·hd + 2j + s`.
fn move_rows<T: Copy + Default>(
    data: &[T],
    rows: usize,
    n_head: usize,
    dir: Direction,
) -> Result<Vec<T>, String> {
    let (hd, half) = geometry(data.len(), rows, n_head)?;
    let cols = data.len() / rows;
    let mut out = vec![T::default(); data.len()];
    for h in 0..n_head {
        for s in 0..2 {
            for j in 0..half {
                let hf = h * hd + s * half + j;
                let gg = h * hd + 2 * j + s;
                let (to, from) = match dir {
                    Direction::GgufToHf => (hf, gg),
                    Direction::HfToGguf => (gg, hf),
                };
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// Undo llama.cpp's permutation: `data` is `rows × (len/rows)` row-major in GGUF row order
/// (a weight `[n_head·head_dim, in]`, or a bias with one value per row); returns HF row order.
/// Errors (as a message) when `rows` is not `n_head` heads of even size.
pub fn unpermute_qk_rows(data: &[f32], rows: usize, n_head: usize) -> Result<Vec<f32>, String> {
    move_rows(data, rows, n_head, Direction::GgufToHf)
}

/// [`unpermute_qk_rows`] on raw bytes: `data` is `rows` equal-length rows of any encoding (e.g.
/// whole ggml blocks of a quantized row), moved as units from GGUF to HF row order.
/// Errors (as a message) as [`unpermute_qk_rows`].
pub fn unpermute_qk_byte_rows(data: &[u8], rows: usize, n_head: usize) -> Result<Vec<u8>, String> {
    move_rows(data, rows, n_head, Direction::GgufToHf)
}

/// llama.cpp's forward permutation (HF row order → GGUF row order); the inverse of
/// [`unpermute_qk_rows`]. Used to write GGUF files (`infer export`) and GGUF-ordered test data.
/// Works on any element type (f32, f16).
pub fn permute_qk_rows<T: Copy + Default>(
    data: &[T],
    rows: usize,
    n_head: usize,
) -> Result<Vec<T>, String> {
    move_rows(data, rows, n_head, Direction::HfToGguf)
}

/// [`permute_qk_rows`] on raw bytes: `data` is `rows` equal-length rows of any encoding (whole
/// ggml blocks of a quantized row), moved as units from HF to GGUF row order, so the blocks are
/// unchanged byte for byte; the inverse of [`unpermute_qk_byte_rows`].
/// Errors (as a message) as [`unpermute_qk_rows`].
pub fn permute_qk_byte_rows(data: &[u8], rows: usize, n_head: usize) -> Result<Vec<u8>, String> {
    move_rows(data, rows, n_head, Direction::HfToGguf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_numpy_reshape_swapaxes() {
        // 1 head, hd = 4, 1 column: HF rows [a0 a1 | b0 b1] → GGUF [a0 b0 a1 b1].
        let hf = [10.0, 11.0, 20.0, 21.0];
        let gg = permute_qk_rows(&hf, 4, 1).unwrap();
        assert_eq!(gg, vec![10.0, 20.0, 11.0, 21.0]);
        assert_eq!(unpermute_qk_rows(&gg, 4, 1).unwrap(), hf.to_vec());
    }

    #[test]
    fn round_trips_multi_head_multi_column() {
        let (rows, cols, n_head) = (3 * 8, 5, 3);
        let hf: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let gg = permute_qk_rows(&hf, rows, n_head).unwrap();
        assert_ne!(gg, hf);
        assert_eq!(unpermute_qk_rows(&gg, rows, n_head).unwrap(), hf);
        assert!(unpermute_qk_rows(&hf, rows, 5).is_err());
        assert!(unpermute_qk_rows(&hf[..7], 3, 1).is_err());
        // Byte rows move exactly like f32 rows.
        let bytes: Vec<u8> = gg.iter().flat_map(|v| v.to_le_bytes()).collect();
        let back = unpermute_qk_byte_rows(&bytes, rows, n_head).unwrap();
        let want: Vec<u8> = hf.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(back, want);
        assert_eq!(permute_qk_byte_rows(&want, rows, n_head).unwrap(), bytes);
    }
}
