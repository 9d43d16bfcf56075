//! `infer synth --like MODEL.gguf`: the model's header (metadata, tensor table) with random
//! tensor data quantized to each tensor's own ggml type (or, `--random-blocks`, quantized
//! matrices drawn block by block, [`super::blocks`]), streamed tensor by tensor.

use std::io::{BufWriter, Write};
use std::path::Path;

use super::blocks::{stream_blocks, BlockMode};
use super::random::{stream_tensor, Fill, RandomTensor, CHUNK_VALUES};
use anyhow::{bail, Context};
use infer_models::gguf::{encode_header, GgufHeader, GgufTensorInfo, GgufWriter};

/// What was written.
pub struct Written {
    pub tensors: usize,
    pub bytes: u64,
}

/// Read only the header of `like` (the data need not be present).
pub fn read_header(like: &Path) -> anyhow::Result<GgufHeader> {
    GgufHeader::read(like).with_context(|| format!("reading the GGUF header of {}", like.display()))
}

/// Check what synth needs of `h` before anything is written: at least one tensor and every
/// ggml type quantizable (one block of zeros through `infer_quant::quantize`; a zero
/// dimension is refused by the header reader). `like` names the file in errors.
fn check_tensors(like: &Path, h: &GgufHeader) -> anyhow::Result<()> {
    if h.tensors.is_empty() {
        bail!("{}: has no tensors (nothing to synthesise)", like.display());
    }
    for t in &h.tensors {
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

/// Stream the random data of tensor number `index` into `sink` ([`stream_tensor`] in the
/// tensor's own ggml type; ggml's `dims[0]` is the row length). With [`BlockMode::Draw`] a
/// quantized matrix is drawn block by block ([`stream_blocks`]); 1-D and float tensors are
/// made as by default.
fn tensor_data(
    t: &GgufTensorInfo,
    index: usize,
    seed: u64,
    mode: BlockMode,
    chunk: usize,
    sink: &mut dyn FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let row_len = t.dims[0];
    let tensor = RandomTensor {
        name: &t.name,
        index,
        format: t.format,
        fill: Fill::for_tensor(&t.name, t.dims.len(), 1.0),
        rows: t.n_elements().checked_div(row_len).unwrap_or(0),
        row_len,
    };
    if mode == BlockMode::Draw && t.format.is_quantized() && tensor.fill == Fill::Matrix {
        stream_blocks(&tensor, seed, chunk, sink)
    } else {
        stream_tensor(&tensor, seed, chunk, sink)
    }
}

/// Write `h` with random data for every tensor to `out` (`shown` names it in errors).
/// Matrices (≥ 2-D) get N(0, 0.02), 1-D tensors named `*norm*` 1.0 ± 0.05, other 1-D tensors
/// ± 0.02; each is quantized with infer-quant's ggml reference quantizer of its type — or,
/// with [`BlockMode::Draw`], quantized matrices get drawn blocks of standard deviation 0.02
/// ([`super::blocks`]). Memory stays bounded ([`CHUNK_VALUES`] values at a time) whatever the
/// shapes.
pub fn write_random(
    like: &Path,
    h: &GgufHeader,
    out: &Path,
    shown: &Path,
    seed: u64,
    mode: BlockMode,
) -> anyhow::Result<Written> {
    check_tensors(like, h)?;
    let mut w = create_gguf(h, out, shown)?;
    for (i, t) in h.tensors.iter().enumerate() {
        tensor_data(
            t,
            i,
            seed,
            mode,
            CHUNK_VALUES,
            &mut |b| Ok(w.write_data(b)?),
        )?;
    }
    let bytes = finish_gguf(w, out)?;
    Ok(Written {
        tensors: h.tensors.len(),
        bytes,
    })
}

/// A [`GgufWriter`] of header `h` into a new file `out` (`shown` names it in errors), buffered.
/// Errors: the file cannot be created, or the header does not encode.
pub fn create_gguf(
    h: &GgufHeader,
    out: &Path,
    shown: &Path,
) -> anyhow::Result<GgufWriter<BufWriter<std::fs::File>>> {
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    Ok(GgufWriter::new(
        BufWriter::with_capacity(1 << 22, file),
        h,
        shown,
    )?)
}

/// End `w` (its data complete), flush and sync the file `out`; its size in bytes. Errors: the
/// data is short of the header's tensors, or a write or sync fails (naming `out`).
pub fn finish_gguf(w: GgufWriter<BufWriter<std::fs::File>>, out: &Path) -> anyhow::Result<u64> {
    let mut buf = w.finish()?;
    buf.flush()
        .with_context(|| format!("writing {}", out.display()))?;
    let file = buf
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {}", out.display(), e.error()))?;
    file.sync_all()
        .with_context(|| format!("syncing {}", out.display()))?;
    Ok(file.metadata().map(|m| m.len()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_quant::QuantFormat;

    fn bytes_of(t: &GgufTensorInfo, mode: BlockMode, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        tensor_data(t, 3, 11, mode, chunk, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        out
    }

    fn info(name: &str, format: QuantFormat, dims: Vec<usize>) -> GgufTensorInfo {
        let n: usize = dims.iter().product();
        GgufTensorInfo {
            name: name.into(),
            dims,
            format,
            offset: 0,
            n_bytes: format.bytes_for(n).unwrap(),
        }
    }

    /// Rows longer than the chunk are generated piece by piece with the same bytes as whole
    /// rows (Q4_K: per-block scales; F32: the raw values), in either mode, and the byte count
    /// is the tensor's.
    #[test]
    fn long_rows_in_pieces_give_the_whole_row_bytes() {
        for mode in [BlockMode::Quantize, BlockMode::Draw] {
            for (format, dims) in [
                (QuantFormat::Q4_K, vec![1024, 3]),
                (QuantFormat::F32, vec![1536]),
                (QuantFormat::Q8_0, vec![768, 2]),
                (QuantFormat::Q6_K, vec![768, 2]),
            ] {
                let t = info("blk.0.ffn_up.weight", format, dims);
                let whole = bytes_of(&t, mode, 1 << 16);
                assert_eq!(whole.len(), t.n_bytes, "{format} {mode:?}");
                assert_eq!(bytes_of(&t, mode, 256), whole, "{format} {mode:?}");
            }
        }
    }

    /// Drawing blocks changes quantized matrices only: float matrices, 1-D tensors (even a
    /// quantized norm, which must stay near 1) keep the default bytes.
    #[test]
    fn draw_mode_changes_quantized_matrices_only() {
        let bytes = |t: &GgufTensorInfo, mode| bytes_of(t, mode, 1 << 16);
        let matrix = info("blk.0.ffn_up.weight", QuantFormat::Q4_K, vec![512, 4]);
        assert_ne!(
            bytes(&matrix, BlockMode::Draw),
            bytes(&matrix, BlockMode::Quantize)
        );
        for t in [
            info("blk.0.ffn_up.weight", QuantFormat::F16, vec![512, 4]),
            info("blk.0.attn_norm.weight", QuantFormat::F32, vec![512]),
            info("blk.0.attn_norm.weight", QuantFormat::Q8_0, vec![512]),
        ] {
            assert_eq!(
                bytes(&t, BlockMode::Draw),
                bytes(&t, BlockMode::Quantize),
                "{} {}",
                t.name,
                t.format
            );
        }
    }
}
