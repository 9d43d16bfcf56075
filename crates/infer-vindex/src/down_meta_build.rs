//! Computing `down_meta.bin` (layout and score definition in [`crate::down_meta`]) for a
//! vindex directory.
//!
//! Per layer, the feature-major down matrix `D` `[features, hidden]` is taken in blocks of rows,
//! each row scaled by the final norm weight γ, and multiplied against the unembedding `W`
//! `[vocab, hidden]`: `S = (D_blk ⊙ γ) · Wᵀ` `[rows, vocab]` with
//! [`ComputeBackend::matmul_transb`] (sgemm on rayon's pool); each row's top-N and bottom-N are
//! selected in one pass each ([`top_n_into`], [`bottom_n_into`]) and streamed to the file. Peak
//! extra memory: one score block (≤ 64 MiB), plus an f32 copy of `W` when the float tier is f16
//! (vocab × hidden × 4 bytes).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use infer_compute::{ComputeBackend, CpuBackend};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::api::FloatSlice;
use crate::down_meta::{bottom_n_into, top_n_into, DownMetaHeader, TokenScore, Unembedding};
use crate::files;
use crate::hash::hex;
use crate::index::FileHash;
use crate::load::Vindex;
use crate::VindexError;

/// Scores per block: rows × vocab ≤ this many f32 (64 MiB).
const BLOCK_VALUES: usize = 16 << 20;

/// Streams bytes to a file while hashing them.
struct HashedFile {
    path: std::path::PathBuf,
    out: BufWriter<File>,
    hasher: Sha256,
    bytes: u64,
}

impl HashedFile {
    fn create(path: &Path) -> Result<Self, VindexError> {
        let f = File::create(path).map_err(|e| VindexError::io(path, e))?;
        Ok(HashedFile {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, f),
            hasher: Sha256::new(),
            bytes: 0,
        })
    }

    fn write(&mut self, b: &[u8]) -> Result<(), VindexError> {
        self.out
            .write_all(b)
            .map_err(|e| VindexError::io(&self.path, e))?;
        self.hasher.update(b);
        self.bytes += b.len() as u64;
        Ok(())
    }

    fn finish(self, name: &str) -> Result<FileHash, VindexError> {
        let f = self
            .out
            .into_inner()
            .map_err(|e| VindexError::io(&self.path, e.into_error()))?;
        f.sync_all().map_err(|e| VindexError::io(&self.path, e))?;
        Ok(FileHash {
            name: name.to_string(),
            bytes: self.bytes,
            sha256: hex(&self.hasher.finalize()),
        })
    }
}

fn progress_bar(show: bool, total: usize) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg:24} [{bar:40}] {pos}/{len} features {elapsed}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// γ = final norm weight + the architecture's `norm_weight_offset` (`[hidden]`), `None` when the
/// vindex stores no final norm. Errors: unknown architecture; a final norm of the wrong length.
fn final_norm_weight(v: &Vindex, hidden: usize) -> Result<Option<Vec<f32>>, VindexError> {
    let arch =
        infer_models::architecture_for(v.config()).map_err(|msg| VindexError::BadSource {
            path: v.path().to_path_buf(),
            msg,
        })?;
    let key = arch.final_norm_key();
    if !v.has_tensor(&key) {
        return Ok(None);
    }
    let (w, _) = v.tensor(&key)?;
    if w.len() != hidden {
        return Err(VindexError::BadEntry {
            path: v.path().join(files::NORMS_BIN),
            key,
            msg: format!("{} values, expected hidden_size {hidden}", w.len()),
        });
    }
    let offset = arch.norm_weight_offset();
    Ok(Some(
        w.to_f32_vec().into_iter().map(|x| x + offset).collect(),
    ))
}

/// Write `dir/down_meta.bin` for the (complete, openable) vindex in `dir`, keeping the `top_n`
/// highest and `top_n` lowest scoring tokens per feature (`top_n` clamped to the vocabulary
/// size), and return its hash entry (the caller adds it to `index.json`). `progress` draws a
/// bar on stderr.
///
/// Errors: [`VindexError::BadSource`] for `top_n == 0` or an unknown architecture; errors of
/// [`Vindex::open`]; I/O naming the file.
pub(crate) fn write_down_meta(
    dir: &Path,
    top_n: usize,
    progress: bool,
) -> Result<FileHash, VindexError> {
    if top_n == 0 {
        return Err(VindexError::BadSource {
            path: dir.to_path_buf(),
            msg: "--down-meta needs at least 1 token per feature".into(),
        });
    }
    let v = Vindex::open(dir)?;
    let (w, [vocab, hidden], unembedding) = match v.lm_head() {
        Some((s, shape)) => (s, shape, Unembedding::LmHead),
        None => {
            let (s, shape) = v.embeddings();
            (s, shape, Unembedding::Embeddings)
        }
    };
    let w_owned;
    let w: &[f32] = match w {
        FloatSlice::F32(s) => s,
        _ => {
            w_owned = w.to_f32_vec();
            &w_owned
        }
    };
    let gamma = final_norm_weight(&v, hidden)?;
    let features: Vec<usize> = v
        .index()
        .layers
        .iter()
        .map(|l| l.down.as_ref().map_or(0, |e| e.shape[0]))
        .collect();
    let header = DownMetaHeader {
        num_layers: v.num_layers(),
        top_n: top_n.min(vocab),
        vocab_size: vocab,
        unembedding,
        final_norm_weighted: gamma.is_some(),
        features,
    };
    let n = header.top_n;
    let mut out = HashedFile::create(&dir.join(files::DOWN_META_BIN))?;
    out.write(&header.to_bytes())?;

    let backend = CpuBackend::new();
    let block_rows = (BLOCK_VALUES / vocab.max(1)).clamp(1, 256);
    let pb = progress_bar(progress, header.features.iter().sum());
    let mut scores = Vec::new();
    let mut d = Vec::new();
    let zero = TokenScore {
        token: 0,
        score: 0.0,
    };
    let mut best = Vec::new();
    let mut bytes = Vec::new();
    for (l, &nf) in header.features.iter().enumerate() {
        if nf == 0 {
            continue;
        }
        pb.set_message(format!("down_meta layer {l}/{}", header.num_layers));
        let down = v.down_layer(l)?;
        for start in (0..nf).step_by(block_rows) {
            let rows = block_rows.min(nf - start);
            let range = start * hidden..(start + rows) * hidden;
            d.clear();
            match down {
                FloatSlice::F32(s) => d.extend_from_slice(&s[range]),
                FloatSlice::F16(s) => d.extend(s[range].iter().map(|x| x.to_f32())),
                // down_features.bin is a float-tier file (F32/F16 only, checked at open).
                FloatSlice::Blocks { .. } => d.extend(down.to_f32_vec()[range].iter()),
            }
            if let Some(g) = &gamma {
                for row in d.chunks_exact_mut(hidden) {
                    row.iter_mut().zip(g).for_each(|(a, b)| *a *= b);
                }
            }
            scores.resize(rows * vocab, 0.0);
            backend
                .matmul_transb(&d, w, rows, hidden, vocab, &mut scores)
                .map_err(|e| VindexError::BadSource {
                    path: dir.to_path_buf(),
                    msg: format!("down-meta token scores: {e}"),
                })?;
            best.resize(rows * 2 * n, zero);
            scores
                .par_chunks(vocab)
                .zip(best.par_chunks_mut(2 * n))
                .for_each_init(Vec::new, |tmp, (row, dst)| {
                    let (top, bottom) = dst.split_at_mut(n);
                    top_n_into(row, n, tmp);
                    top.copy_from_slice(tmp);
                    bottom_n_into(row, n, tmp);
                    bottom.copy_from_slice(tmp);
                });
            bytes.clear();
            for r in &best {
                bytes.extend_from_slice(&r.token.to_le_bytes());
                bytes.extend_from_slice(&r.score.to_le_bytes());
            }
            out.write(&bytes)?;
            pb.inc(rows as u64);
        }
    }
    pb.finish_and_clear();
    out.finish(files::DOWN_META_BIN)
}
