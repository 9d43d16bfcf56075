//! `infer synth --like MODEL.gguf`: the model's header (metadata, tensor table) with random
//! tensor data quantized to each tensor's own ggml type, streamed tensor by tensor.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};
use infer_models::gguf::{encode_header, GgufHeader, GgufTensorInfo, GgufWriter};
use rayon::prelude::*;

use super::random::{fill_row, Fill, RowFill};

/// At most this many f32 values are generated per chunk of rows (16 MiB), so memory stays
/// bounded whatever the tensor size (Gemma-3's 262144 × 640 embedding included).
const CHUNK_VALUES: usize = 1 << 22;

/// What was written.
pub struct Written {
    pub tensors: usize,
    pub bytes: u64,
}

/// Read only the header of `like` (the data need not be present).
pub fn read_header(like: &Path) -> anyhow::Result<GgufHeader> {
    GgufHeader::read(like).with_context(|| format!("reading the GGUF header of {}", like.display()))
}

/// Check what synth needs of `h` before anything is written: at least one tensor, no
/// zero-sized dimension, and every ggml type quantizable (one block of zeros through
/// `infer_quant::quantize`). `like` names the file in errors.
fn check_tensors(like: &Path, h: &GgufHeader) -> anyhow::Result<()> {
    if h.tensors.is_empty() {
        bail!("{}: has no tensors (nothing to synthesise)", like.display());
    }
    for t in &h.tensors {
        if t.dims.contains(&0) {
            bail!(
                "{}: tensor '{}' has a zero-sized dimension (dims {:?})",
                like.display(),
                t.name,
                t.dims
            );
        }
        let n = t.format.block_elems();
        if let Err(e) = infer_quant::quantize(t.format, &vec![0.0; n], n, None) {
            bail!(
                "{}: tensor '{}' has ggml type {}, which synth cannot produce ({e})",
                like.display(),
                t.name,
                t.format
            );
        }
    }
    Ok(())
}

/// Validate `h` for writing (see [`check_tensors`] and `encode_header`, which requires
/// llama.cpp's tensor offsets) and return the bytes the output will take: the header alone for
/// `header_only`, else the header padded to the alignment plus the data section.
///
/// Errors name `like` and the tensor at fault.
pub fn planned_size(like: &Path, h: &GgufHeader, header_only: bool) -> anyhow::Result<u64> {
    check_tensors(like, h)?;
    let head = encode_header(h, like)?.len();
    if header_only {
        return Ok(head as u64);
    }
    let padded = head.div_ceil(h.alignment) * h.alignment;
    Ok((padded as u64).saturating_add(h.data_len() as u64))
}

/// Write just `h`'s header bytes (no padding, no data) to `out`.
pub fn write_header_only(h: &GgufHeader, out: &Path, shown: &Path) -> anyhow::Result<Written> {
    let bytes = encode_header(h, shown)?;
    std::fs::write(out, &bytes).with_context(|| format!("writing {}", out.display()))?;
    Ok(Written {
        tensors: h.tensors.len(),
        bytes: bytes.len() as u64,
    })
}

/// Random blocks for whole rows `rows` of tensor number `index` (rows of at most
/// [`CHUNK_VALUES`] values), in order.
fn synth_rows(
    t: &GgufTensorInfo,
    index: usize,
    seed: u64,
    rows: std::ops::Range<usize>,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let row_len = t.dims[0];
    let fill = Fill::for_tensor(&t.name, t.dims.len(), 1.0);
    rows.into_par_iter()
        .map(|r| {
            let mut v = vec![0.0f32; row_len];
            fill_row(seed, index as u64, r as u64, fill, &mut v);
            infer_quant::quantize(t.format, &v, row_len, None)
                .with_context(|| format!("quantizing tensor '{}' to {}", t.name, t.format))
        })
        .collect()
}

/// Stream the random data of tensor number `index` into `sink`, generating at most `chunk`
/// values at a time (`chunk`: an even multiple of the format's block size). Rows up to `chunk`
/// values are generated several at a time in parallel; a longer row is generated and quantized
/// piece by piece (ggml's reference quantizers work block by block, so the bytes are those of
/// the whole row).
fn tensor_data(
    t: &GgufTensorInfo,
    index: usize,
    seed: u64,
    chunk: usize,
    sink: &mut dyn FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let row_len = t.dims[0];
    let rows = t.n_elements().checked_div(row_len).unwrap_or(0);
    if row_len <= chunk {
        let step = (chunk / row_len.max(1)).max(1);
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + step).min(rows);
            for block in synth_rows(t, index, seed, r0..r1)? {
                sink(&block)?;
            }
            r0 = r1;
        }
        return Ok(());
    }
    let fill = Fill::for_tensor(&t.name, t.dims.len(), 1.0);
    let mut v = vec![0.0f32; chunk];
    for r in 0..rows {
        let mut g = RowFill::new(seed, index as u64, r as u64, fill);
        let mut left = row_len;
        while left > 0 {
            let piece = &mut v[..left.min(chunk)];
            g.next_values(piece);
            let q = infer_quant::quantize(t.format, piece, piece.len(), None)
                .with_context(|| format!("quantizing tensor '{}' to {}", t.name, t.format))?;
            sink(&q)?;
            left -= piece.len();
        }
    }
    Ok(())
}

/// Write `h` with random data for every tensor to `out` (`shown` names it in errors).
/// Matrices (≥ 2-D) get N(0, 0.02), 1-D tensors named `*norm*` 1.0 ± 0.05, other 1-D tensors
/// ± 0.02; each is quantized with infer-quant's ggml reference quantizer of its type. Memory
/// stays bounded ([`CHUNK_VALUES`] values at a time) whatever the shapes.
pub fn write_random(
    like: &Path,
    h: &GgufHeader,
    out: &Path,
    shown: &Path,
    seed: u64,
) -> anyhow::Result<Written> {
    check_tensors(like, h)?;
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut w = GgufWriter::new(BufWriter::with_capacity(1 << 22, file), h, shown)?;
    for (i, t) in h.tensors.iter().enumerate() {
        tensor_data(t, i, seed, CHUNK_VALUES, &mut |b| Ok(w.write_data(b)?))?;
    }
    let mut buf = w.finish()?;
    buf.flush()
        .with_context(|| format!("writing {}", out.display()))?;
    let file = buf
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {}", out.display(), e.error()))?;
    file.sync_all()
        .with_context(|| format!("syncing {}", out.display()))?;
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(Written {
        tensors: h.tensors.len(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_quant::QuantFormat;

    fn bytes_of(t: &GgufTensorInfo, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        tensor_data(t, 3, 11, chunk, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        out
    }

    /// Rows longer than the chunk are generated piece by piece with the same bytes as whole
    /// rows (Q4_K: per-block scales; F32: the raw values), and the byte count is the tensor's.
    #[test]
    fn long_rows_in_pieces_give_the_whole_row_bytes() {
        for (format, dims) in [
            (QuantFormat::Q4_K, vec![1024, 3]),
            (QuantFormat::F32, vec![1536]),
            (QuantFormat::Q8_0, vec![768, 2]),
        ] {
            let n: usize = dims.iter().product();
            let t = GgufTensorInfo {
                name: "blk.0.ffn_up.weight".into(),
                dims,
                format,
                offset: 0,
                n_bytes: format.bytes_for(n).unwrap(),
            };
            let whole = bytes_of(&t, 1 << 16);
            assert_eq!(whole.len(), t.n_bytes, "{format}");
            assert_eq!(bytes_of(&t, 256), whole, "{format}");
        }
    }
}
