//! `infer synth --like MODEL.gguf`: the model's header (metadata, tensor table) with random
//! tensor data quantized to each tensor's own ggml type, streamed tensor by tensor.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};
use infer_models::gguf::{encode_header, GgufHeader, GgufTensorInfo, GgufWriter};
use rayon::prelude::*;

use super::random::{fill_row, Fill};

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

/// Check every tensor's ggml type can be quantized (one block of zeros through
/// `infer_quant::quantize`), before anything is written.
fn check_formats(like: &Path, h: &GgufHeader) -> anyhow::Result<()> {
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

/// Write just `h`'s header bytes (no padding, no data) to `out`.
pub fn write_header_only(h: &GgufHeader, out: &Path, shown: &Path) -> anyhow::Result<Written> {
    let bytes = encode_header(h, shown)?;
    std::fs::write(out, &bytes).with_context(|| format!("writing {}", out.display()))?;
    Ok(Written {
        tensors: h.tensors.len(),
        bytes: bytes.len() as u64,
    })
}

/// Random blocks for rows `rows` of tensor number `index`, in order.
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

/// Write `h` with random data for every tensor to `out` (`shown` names it in errors).
/// Matrices (≥ 2-D) get N(0, 0.02), 1-D tensors named `*norm*` 1.0 ± 0.05, other 1-D tensors
/// ± 0.02; each is quantized with infer-quant's ggml reference quantizer of its type.
pub fn write_random(
    like: &Path,
    h: &GgufHeader,
    out: &Path,
    shown: &Path,
    seed: u64,
) -> anyhow::Result<Written> {
    check_formats(like, h)?;
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut w = GgufWriter::new(BufWriter::with_capacity(1 << 22, file), h, shown)?;
    for (i, t) in h.tensors.iter().enumerate() {
        let row_len = t.dims[0];
        let rows = t.n_elements().checked_div(row_len).unwrap_or(0);
        let step = (CHUNK_VALUES / row_len.max(1)).max(1);
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + step).min(rows);
            for block in synth_rows(t, i, seed, r0..r1)? {
                w.write_data(&block)?;
            }
            r0 = r1;
        }
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
