//! The quantized tiers at build time: which tensors go to which quantized file in which ggml
//! format, GGUF passthrough, and the writers with their manifests.
//!
//! Matrices are stored in HF Linear layout `[out, in]` (rows = output features), so ggml blocks
//! run along a row's input dimension. A row length that is not a multiple of 256 cannot hold
//! K-quant blocks: like llama.cpp's `llama_tensor_get_type` fallback, Q4_K becomes Q5_0 and Q6_K
//! becomes Q8_0 for that tensor, and a row that is not a multiple of 32 either is stored in F16
//! (so any model the float tier runs also gets its quantized tiers); the manifest records the
//! format actually stored. Only the Q8 tier (int8 + a scale per 32 values) has no fallback.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use infer_models::gguf::GgufTensors;
use infer_models::{EncodedRows, ModelSource};
use infer_quant::{q8_0, QuantFormat};
use rayon::prelude::*;

use crate::build::BuildOptions;
use crate::classify::Role;
use crate::files;
use crate::index::{FileHash, Passthrough};
use crate::manifest::{I8Entry, TensorEntry, I8_TAG};
use crate::tier::{QuantTiers, Tier};
use crate::writer::{write_text, BinWriter};
use crate::VindexError;

/// The format a `[rows, row_len]` matrix is stored in when `desired` is asked for: the first
/// of a fallback chain whose block divides `row_len` (llama.cpp's rule, per tensor): Q4_K →
/// Q5_0 → F16, Q6_K → Q8_0 → F16, any other block format → F16.
/// Errors (as a message): rows of 0 values.
pub fn storage_format(desired: QuantFormat, row_len: usize) -> Result<QuantFormat, String> {
    if row_len == 0 {
        return Err("rows of 0 values cannot be stored".into());
    }
    let chain: &[QuantFormat] = match desired {
        QuantFormat::Q4_K => &[QuantFormat::Q4_K, QuantFormat::Q5_0],
        QuantFormat::Q6_K => &[QuantFormat::Q6_K, QuantFormat::Q8_0],
        _ => &[desired],
    };
    Ok(chain
        .iter()
        .copied()
        .find(|f| row_len % f.block_elems() == 0)
        .unwrap_or(QuantFormat::F16))
}

/// The formats the q4k tier's files hold (llama.cpp's Q4_K_M mix and its fallbacks): a GGUF
/// tensor already in one of them keeps its blocks there, whichever of them the tier would have
/// picked (Q4_K_M stores `attn_v` / `ffn_down` in Q6_K on some layers and Q4_K on the rest).
pub const Q4K_TIER_FORMATS: [QuantFormat; 4] = [
    QuantFormat::Q4_K,
    QuantFormat::Q6_K,
    QuantFormat::Q5_0,
    QuantFormat::Q8_0,
];

/// The values of a tensor to quantize: already decoded to `f32`, or still encoded in the source
/// (decoded here in row chunks, never whole).
#[derive(Clone, Copy)]
pub enum Values<'a> {
    /// Row-major `f32` values.
    F32(&'a [f32]),
    /// The source's rows in HF order ([`infer_models::TensorSource::encoded_rows`]).
    Encoded(&'a EncodedRows<'a>),
}

/// Values per rayon task when a tensor is quantized in row chunks: enough work per task,
/// enough tasks to balance, and a decode buffer that stays in L2.
const CHUNK_VALUES: usize = 65536;

/// Quantize `values` (rows of `n_per_row`) to `format` with ggml's reference quantizer
/// ([`infer_quant::quantize_into`], no imatrix), in parallel over row chunks on the current
/// rayon pool, into one output buffer; encoded values are decoded chunk by chunk
/// ([`infer_quant::dequantize`]). The bytes equal a serial [`infer_quant::quantize`] of the
/// decoded values: every row is quantized independently.
/// Errors: a shape that is not whole rows, a row length the format cannot hold, an encoding
/// that does not decode.
pub fn quantize_rows_par(
    format: QuantFormat,
    values: Values<'_>,
    n_per_row: usize,
) -> Result<Vec<u8>, infer_quant::QuantError> {
    let numel = match values {
        Values::F32(d) => d.len(),
        Values::Encoded(e) => encoded_numel(e, n_per_row)?,
    };
    if n_per_row == 0 || numel % n_per_row != 0 {
        return Err(infer_quant::QuantError::BadShape(format!(
            "{numel} values are not a whole number of rows of {n_per_row}"
        )));
    }
    let row_bytes = format.bytes_for(n_per_row)?;
    let rows_per_chunk = (CHUNK_VALUES / n_per_row).max(1);
    let mut out = vec![0u8; numel / n_per_row * row_bytes];
    out.par_chunks_mut(rows_per_chunk * row_bytes)
        .enumerate()
        .try_for_each_init(Vec::new, |buf, (i, dst)| {
            let rows = dst.len() / row_bytes;
            let first = i * rows_per_chunk * n_per_row;
            let src = match values {
                Values::F32(d) => &d[first..first + rows * n_per_row],
                Values::Encoded(e) => decode_chunk(e, n_per_row, i * rows_per_chunk, rows, buf)?,
            };
            infer_quant::quantize_into(format, src, n_per_row, None, dst)
        })?;
    Ok(out)
}

/// Values held by encoded rows of `n_per_row`. Errors: bytes that are not whole rows.
fn encoded_numel(e: &EncodedRows<'_>, n_per_row: usize) -> Result<usize, infer_quant::QuantError> {
    let row_bytes = e.format.bytes_for(n_per_row)?;
    if e.bytes.len() % row_bytes != 0 {
        return Err(infer_quant::QuantError::WrongByteCount {
            format: e.format,
            expected: (e.bytes.len() / row_bytes + 1) * row_bytes,
            got: e.bytes.len(),
        });
    }
    Ok(e.bytes.len() / row_bytes * n_per_row)
}

/// Decode `rows` rows starting at row `first` into `buf` (resized) and return them.
fn decode_chunk<'b>(
    e: &EncodedRows<'_>,
    n_per_row: usize,
    first: usize,
    rows: usize,
    buf: &'b mut Vec<f32>,
) -> Result<&'b [f32], infer_quant::QuantError> {
    let row_bytes = e.format.bytes_for(n_per_row)?;
    buf.resize(rows * n_per_row, 0.0);
    let bytes = &e.bytes[first * row_bytes..(first + rows) * row_bytes];
    infer_quant::dequantize(e.format, bytes, buf)?;
    Ok(buf)
}

/// Non-finite values of a tensor: how many, the first one's flat index and value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NonFinite {
    pub count: usize,
    pub first: usize,
    pub value: f32,
}

/// The non-finite values (NaN, ±inf) of `values`, if any; encoded rows are decoded in parallel
/// row chunks. Errors: an encoding that does not decode.
pub(crate) fn find_non_finite(
    values: Values<'_>,
    n_per_row: usize,
) -> Result<Option<NonFinite>, infer_quant::QuantError> {
    let scan = |offset: usize, d: &[f32]| {
        let count = d.iter().filter(|v| !v.is_finite()).count();
        (count > 0).then(|| {
            let i = d.iter().position(|v| !v.is_finite()).unwrap_or(0);
            NonFinite {
                count,
                first: offset + i,
                value: d[i],
            }
        })
    };
    let merge = |a: Option<NonFinite>, b: Option<NonFinite>| match (a, b) {
        (Some(a), Some(b)) => Some(NonFinite {
            count: a.count + b.count,
            ..if a.first <= b.first { a } else { b }
        }),
        (a, b) => a.or(b),
    };
    let e = match values {
        Values::F32(d) => return Ok(scan(0, d)),
        Values::Encoded(e) => e,
    };
    let rows = encoded_numel(e, n_per_row)? / n_per_row.max(1);
    let rows_per_chunk = (CHUNK_VALUES / n_per_row.max(1)).max(1);
    (0..rows.div_ceil(rows_per_chunk))
        .into_par_iter()
        .map_init(Vec::new, |buf, c| {
            let first = c * rows_per_chunk;
            let n = rows_per_chunk.min(rows - first);
            let d = decode_chunk(e, n_per_row, first, n, buf)?;
            Ok(scan(first * n_per_row, d))
        })
        .try_reduce(|| None, |a, b| Ok(merge(a, b)))
}

/// Split Q8_0 blocks into the int8 value plane and the f32 scale plane (one `d` per 32 values,
/// widened exactly from f16), the Q8 tier's layout. `bytes.len()` must be a multiple of 34.
pub fn split_q8_0(bytes: &[u8]) -> (Vec<u8>, Vec<f32>) {
    let n = bytes.len() / q8_0::BLOCK_BYTES;
    let mut values = Vec::with_capacity(n * 32);
    let mut scales = Vec::with_capacity(n);
    for b in bytes.chunks_exact(q8_0::BLOCK_BYTES) {
        scales.push(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
        values.extend_from_slice(&b[2..]);
    }
    (values, scales)
}

/// Encoded blocks, with `(GGUF tensor name, rows un-permuted)` when passed through.
type Encoded = (Vec<u8>, Option<(String, bool)>);

/// The source tensor a stored matrix is, when its blocks may pass through from a GGUF: the
/// whole tensor `name` (a 1:1 mapping, no split or transpose), or expert `index` of the
/// `count` stacked in `name` (llama.cpp's `ffn_{gate,up,down}_exps`, `[count, rows, cols]`:
/// each expert a contiguous run of whole rows).
#[derive(Clone, Copy, Debug)]
pub struct SourceRef<'a> {
    /// The source tensor's (HF) name.
    pub name: &'a str,
    /// `(index, count)` of one expert of a stacked tensor.
    pub expert: Option<(usize, usize)>,
}

impl<'a> SourceRef<'a> {
    /// The whole tensor `name`.
    pub fn whole(name: &'a str) -> Self {
        SourceRef { name, expert: None }
    }

    /// The source tensor's shape when it holds a stored matrix of `shape`.
    fn source_shape(&self, shape: &[usize]) -> Vec<usize> {
        match self.expert {
            None => shape.to_vec(),
            Some((_, count)) => std::iter::once(count)
                .chain(shape.iter().copied())
                .collect(),
        }
    }
}

/// Position of an attention projection in a layer's Q, K, V, O order.
pub(crate) fn attn_rank(key: &str) -> Option<usize> {
    ["q_proj", "k_proj", "v_proj", "o_proj"]
        .iter()
        .position(|p| key.ends_with(&format!("self_attn.{p}.weight")))
}

/// `(rank, which)` of an MoE expert matrix in its layer's interleaved FFN order: expert `e`'s
/// gate, up, down (`which` 0, 1, 2) after the dense FFN's three, the shared expert after
/// every routed one. Keys: `….mlp.experts.{e}.{gate,up,down}_proj.weight` and
/// `….mlp.shared_expert.{gate,up,down}_proj.weight` (canonical names).
pub(crate) fn expert_rank(key: &str) -> Option<(usize, usize)> {
    let (_, rest) = crate::classify::split_layer(key)?;
    let proj = |p: &str| {
        ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
            .iter()
            .position(|n| *n == p)
    };
    if let Some(p) = rest.strip_prefix("mlp.shared_expert.") {
        return proj(p).map(|w| (usize::MAX / 2 + w, w));
    }
    let (e, p) = rest.strip_prefix("mlp.experts.")?.split_once('.')?;
    let w = proj(p)?;
    Some((3 + 3 * e.parse::<usize>().ok()? + w, w))
}

/// One quantized tensor waiting for its layer to complete (so each layer's tensors are written
/// in Q, K, V, O / gate, up, down order whatever the source order).
struct Pending {
    file: &'static str,
    rank: usize,
    key: String,
    shape: Vec<usize>,
    format: QuantFormat,
    bytes: Vec<u8>,
}

/// Writes the selected quantized tiers while the float builder streams tensors.
pub(crate) struct QuantBuilder {
    tiers: QuantTiers,
    down_q4k: bool,
    /// The q4 tier's FFN and lm_head in Q4_0x16 ([`BuildOptions::q4_x16`]).
    q4_x16: bool,
    requantize: bool,
    tied: bool,
    /// A float tier is written too (else the tied lm_head and the gate copy are not copied).
    float_tier: bool,
    gguf: Option<GgufTensors>,
    source_path: PathBuf,
    writers: HashMap<&'static str, BinWriter>,
    q8_values: Vec<I8Entry>,
    pending: Vec<Pending>,
    passthrough: Vec<Passthrough>,
}

/// The files of each quantized tier.
fn tier_files(t: Tier) -> &'static [&'static str] {
    t.files()
}

impl QuantBuilder {
    /// Create the writers of the tiers `opts.quant` selects. `tied`: the model has no lm_head
    /// tensor (the Q4_0 lm_head is then quantized from the embeddings).
    pub fn new(
        source: &ModelSource,
        dir: &Path,
        opts: &BuildOptions,
        tied: bool,
    ) -> Result<Self, VindexError> {
        let mut writers = HashMap::new();
        for t in opts.quant.tiers() {
            for &f in tier_files(t) {
                writers.insert(f, BinWriter::create(dir, f)?);
            }
        }
        let gguf = match (&source.gguf, opts.quant.is_none()) {
            (Some(g), false) => Some(GgufTensors::new(g.clone(), &source.config)?),
            _ => None,
        };
        Ok(QuantBuilder {
            tiers: opts.quant,
            down_q4k: opts.down_q4k,
            q4_x16: opts.q4_x16,
            requantize: opts.requantize,
            tied,
            float_tier: opts.float_tier,
            gguf,
            source_path: source.path.clone(),
            writers,
            q8_values: Vec::new(),
            pending: Vec::new(),
            passthrough: Vec::new(),
        })
    }

    /// `(file, rank, desired format, stored key)` of every quantized copy of a tensor.
    fn targets(&self, role: Role, key: &str) -> Vec<(&'static str, usize, QuantFormat, String)> {
        let t = self.tiers;
        let mut v = Vec::new();
        let k = key.to_string();
        // The q4 tier's matrices that the products read (not the walk's gate copy).
        let q4 = if self.q4_x16 {
            QuantFormat::Q4_0x16
        } else {
            QuantFormat::Q4_0
        };
        match role {
            Role::Attention => {
                if let Some(r) = attn_rank(key) {
                    if t.q4k {
                        let f = if r == 2 {
                            QuantFormat::Q6_K
                        } else {
                            QuantFormat::Q4_K
                        };
                        v.push((files::ATTN_Q4K_BIN, r, f, k.clone()));
                    }
                    if t.q8 {
                        v.push((files::ATTN_Q8_BIN, r, QuantFormat::Q8_0, k));
                    }
                }
            }
            Role::FfnGate | Role::FfnUp | Role::FfnDown | Role::Other => {
                let (rank, r) = match (role, expert_rank(key)) {
                    (Role::FfnGate, _) => (0, 0),
                    (Role::FfnUp, _) => (1, 1),
                    (Role::FfnDown, _) => (2, 2),
                    // MoE experts are stored per expert in the interleaved FFN files.
                    (_, Some(rw)) => rw,
                    (_, None) => return v,
                };
                let dense = role != Role::Other;
                if t.q4k {
                    let f = if r == 2 && !self.down_q4k {
                        QuantFormat::Q6_K
                    } else {
                        QuantFormat::Q4_K
                    };
                    v.push((files::INTERLEAVED_Q4K_BIN, rank, f, k.clone()));
                }
                if t.q4 {
                    v.push((files::INTERLEAVED_Q4_BIN, rank, q4, k.clone()));
                    if r == 0 && dense && self.float_tier {
                        v.push((files::GATE_Q4_BIN, 0, QuantFormat::Q4_0, k));
                    }
                }
            }
            Role::LmHead => {
                if t.q4k {
                    v.push((files::LM_HEAD_Q6K_BIN, 0, QuantFormat::Q6_K, k.clone()));
                }
                if t.q4 {
                    v.push((files::LM_HEAD_Q4_BIN, 0, q4, k));
                }
            }
            // Without a float tier the output projection is the stored (quantized) embedding
            // table itself, never a copy.
            Role::Embedding if self.tied && self.float_tier => {
                let head = "lm_head.weight".to_string();
                if t.q4k {
                    v.push((files::LM_HEAD_Q6K_BIN, 0, QuantFormat::Q6_K, head.clone()));
                }
                if t.q4 {
                    v.push((files::LM_HEAD_Q4_BIN, 0, q4, head));
                }
            }
            _ => {}
        }
        v
    }

    /// Quantize one stored tensor (`data`: its values in HF layout `shape = [out, in]`) into
    /// every selected tier it belongs to. `src`: the source tensor (or stacked expert) it is
    /// unchanged, which allows GGUF passthrough.
    /// Errors: [`VindexError::BadSource`] for a row length no target format can hold.
    pub fn add(
        &mut self,
        role: Role,
        layer: Option<usize>,
        key: &str,
        shape: &[usize],
        data: Values<'_>,
        src: Option<SourceRef<'_>>,
    ) -> Result<(), VindexError> {
        let targets = self.targets(role, key);
        if targets.is_empty() {
            return Ok(());
        }
        let source_path = self.source_path.clone();
        let bad = |msg: String| VindexError::BadSource {
            path: source_path.clone(),
            msg: format!("tensor '{key}' {shape:?}: {msg}"),
        };
        if shape.len() != 2 {
            return Err(bad("a quantized tier needs a 2-D matrix".into()));
        }
        let row = shape[1];
        let mut stored = Vec::with_capacity(targets.len());
        for (file, rank, desired, out_key) in targets {
            let mut format =
                storage_format(desired, row).map_err(|m| bad(format!("{file}: {m}")))?;
            let q4k_file = matches!(
                file,
                files::ATTN_Q4K_BIN | files::INTERLEAVED_Q4K_BIN | files::LM_HEAD_Q6K_BIN
            );
            if let (true, Some(f)) = (q4k_file, self.source_format(src, shape)) {
                if Q4K_TIER_FORMATS.contains(&f) {
                    format = f;
                }
            }
            if file == files::ATTN_Q8_BIN && format != QuantFormat::Q8_0 {
                return Err(bad(format!(
                    "{file}: the q8 tier stores blocks of 32 values, and rows of {row} values are \
                     not a multiple of 32 (build without the q8 tier: --quant q4k or none)"
                )));
            }
            stored.push((file, rank, format, out_key));
        }
        // Each format is encoded once, and its bytes moved to the last target that stores it.
        let mut cache: HashMap<QuantFormat, Encoded> = HashMap::new();
        for (i, (file, rank, format, out_key)) in stored.iter().cloned().enumerate() {
            if let std::collections::hash_map::Entry::Vacant(slot) = cache.entry(format) {
                slot.insert(self.encode(key, shape, data, format, src)?);
            }
            let (bytes, pass) = if stored[i + 1..].iter().any(|t| t.2 == format) {
                cache[&format].clone()
            } else {
                cache.remove(&format).unwrap_or_default()
            };
            if let Some((source_tensor, rows_unpermuted)) = pass {
                self.passthrough.push(Passthrough {
                    file: file.to_string(),
                    key: out_key.clone(),
                    format,
                    source_tensor,
                    rows_unpermuted,
                });
            }
            let p = Pending {
                file,
                rank,
                key: out_key,
                shape: shape.to_vec(),
                format,
                bytes,
            };
            if layer.is_some() {
                self.pending.push(p);
            } else {
                self.write(p)?;
            }
        }
        Ok(())
    }

    /// The ggml type of GGUF source tensor `src` when it may pass through (not `requantize`,
    /// the shape stored: the same, or `[count, shape…]` for a stacked expert).
    fn source_format(&self, src: Option<SourceRef<'_>>, shape: &[usize]) -> Option<QuantFormat> {
        use infer_models::TensorSource;
        let (false, Some(g), Some(src)) = (self.requantize, &self.gguf, src) else {
            return None;
        };
        g.info(src.name)
            .filter(|i| i.shape == src.source_shape(shape))
            .map(|i| i.dtype)
    }

    /// The tensor's blocks in `format`: the GGUF's own blocks when the source tensor already has
    /// that format and shape (unless `requantize`; a stacked expert: its slice of the stacked
    /// tensor's blocks), else ggml's reference quantizer. An interleaved layout is its row
    /// format's blocks so made, re-laid (passed through when those were).
    fn encode(
        &self,
        key: &str,
        shape: &[usize],
        data: Values<'_>,
        format: QuantFormat,
        src: Option<SourceRef<'_>>,
    ) -> Result<Encoded, VindexError> {
        if format.interleaved().is_some() {
            let (rows, pass) = self.encode(key, shape, data, format.row_format(), src)?;
            let relaid = infer_quant::interleave::from_rows(format, &rows, shape[0], shape[1])
                .map_err(|e| VindexError::BadSource {
                    path: self.source_path.clone(),
                    msg: format!("tensor '{key}': re-lay as {format}: {e}"),
                })?;
            return Ok((relaid, pass));
        }
        if let (false, Some(g), Some(src)) = (self.requantize, &self.gguf, src) {
            if let Some((bytes, info)) = g.raw_blocks_hf_order(src.name)? {
                if info.dtype == format && info.shape == src.source_shape(shape) {
                    let unpermuted = matches!(bytes, Cow::Owned(_));
                    let name = g.gguf_name(src.name).unwrap_or(src.name).to_string();
                    let bytes = match src.expert {
                        None => bytes.into_owned(),
                        // Whole rows of whole blocks, `count` equal runs (the shape checked).
                        Some((index, count)) => {
                            let n = bytes.len() / count;
                            bytes[index * n..(index + 1) * n].to_vec()
                        }
                    };
                    return Ok((bytes, Some((name, unpermuted))));
                }
            }
        }
        let bytes =
            quantize_rows_par(format, data, shape[1]).map_err(|e| VindexError::BadSource {
                path: self.source_path.clone(),
                msg: format!("tensor '{key}': quantize to {format}: {e}"),
            })?;
        Ok((bytes, None))
    }

    /// True when a selected quantized tier stores this tensor (so a vindex without a float
    /// tier needs no float copy of it).
    pub fn covers(&self, role: Role, key: &str) -> bool {
        role != Role::Embedding && !self.targets(role, key).is_empty()
    }

    /// The embedding table `[vocab, hidden]` of a vindex without a float tier, as stored in
    /// `embeddings.bin`: a GGUF's own blocks when its `token_embd` is in a ggml block format
    /// (byte-exact, recorded as passthrough; not with `requantize`), else ggml's reference
    /// quantizer to the format llama.cpp's presets give it — the output type Q6_K when tied
    /// (the table is the output projection), Q4_K when not (q4k tier), Q8_0 (q8), Q4_0 (q4) —
    /// with the per-tensor fallbacks of [`storage_format`].
    /// Errors: [`VindexError::BadSource`] for a row length no format can hold; source reads.
    pub fn embedding(
        &mut self,
        key: &str,
        shape: &[usize],
        data: Values<'_>,
        src: Option<SourceRef<'_>>,
    ) -> Result<(QuantFormat, Vec<u8>), VindexError> {
        let whole = src.filter(|s| s.expert.is_none()).map(|s| s.name);
        if let (false, Some(g), Some(src)) = (self.requantize, &self.gguf, whole) {
            if let Some((bytes, info)) = g.raw_blocks_hf_order(src)? {
                let f = info.dtype;
                if f.is_quantized() && f != QuantFormat::Q8_1 && info.shape == shape {
                    let name = g.gguf_name(src).unwrap_or(src).to_string();
                    self.passthrough.push(Passthrough {
                        file: files::EMBEDDINGS_BIN.to_string(),
                        key: key.to_string(),
                        format: f,
                        source_tensor: name,
                        rows_unpermuted: false,
                    });
                    return Ok((f, bytes.into_owned()));
                }
            }
        }
        let t = self.tiers;
        let desired = match (t.q4k, t.q8, self.tied) {
            (true, _, true) => QuantFormat::Q6_K,
            (true, _, false) => QuantFormat::Q4_K,
            (false, true, _) => QuantFormat::Q8_0,
            _ => QuantFormat::Q4_0,
        };
        let bad = |msg: String| VindexError::BadSource {
            path: self.source_path.clone(),
            msg: format!("tensor '{key}' {shape:?}: {msg}"),
        };
        let row = *shape.last().unwrap_or(&0);
        let format = storage_format(desired, row).map_err(|m| bad(format!("embeddings: {m}")))?;
        let bytes = quantize_rows_par(format, data, row)
            .map_err(|e| bad(format!("quantize to {format}: {e}")))?;
        Ok((format, bytes))
    }

    fn writer(&mut self, file: &'static str) -> Result<&mut BinWriter, VindexError> {
        let dir_hint = self.source_path.clone();
        self.writers.get_mut(file).ok_or(VindexError::BadSource {
            path: dir_hint,
            msg: format!("internal: no writer for {file}"),
        })
    }

    fn write(&mut self, p: Pending) -> Result<(), VindexError> {
        if p.file == files::ATTN_Q8_BIN {
            let (values, scales) = split_q8_0(&p.bytes);
            let length = values.len();
            let offset = self.writer(files::ATTN_Q8_BIN)?.append_aligned(values)?;
            self.q8_values.push(I8Entry {
                key: p.key.clone(),
                shape: p.shape.clone(),
                format: I8_TAG.to_string(),
                offset,
                length,
            });
            let sshape = [p.shape[0], p.shape[1] / q8_0::BLOCK_ELEMS];
            self.writer(files::ATTN_Q8_SCALES_BIN)?.write_tensor(
                &p.key,
                &sshape,
                QuantFormat::F32,
                &scales,
            )?;
        } else {
            self.writer(p.file)?
                .write_raw(&p.key, &p.shape, p.format, p.bytes)?;
        }
        Ok(())
    }

    /// Write the pending tensors of the layer just finished, per file in rank order.
    pub fn flush(&mut self) -> Result<(), VindexError> {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|p| p.rank);
        for p in pending {
            self.write(p)?;
        }
        Ok(())
    }

    /// Finish every file, write the manifests, and push their hashes to `hashes`. Returns the
    /// tiers whose files are all present, and the passthrough record.
    pub fn finish(
        mut self,
        dir: &Path,
        hashes: &mut Vec<FileHash>,
    ) -> Result<(Vec<Tier>, Vec<Passthrough>), VindexError> {
        self.flush()?;
        let mut written: Vec<&'static str> = Vec::new();
        let json = |path: PathBuf, r: serde_json::Result<String>| {
            r.map_err(|e| VindexError::BadJson {
                path,
                msg: e.to_string(),
            })
        };
        // The I8 plane: entries are kept here, not in the writer.
        if let Some(w) = self.writers.remove(files::ATTN_Q8_BIN) {
            if self.q8_values.is_empty() {
                w.discard()?;
            } else {
                let (h, _) = w.finish()?;
                hashes.push(h);
                let m = files::ATTN_Q8_MANIFEST;
                let text = json(dir.join(m), serde_json::to_string_pretty(&self.q8_values))?;
                hashes.push(write_text(dir, m, &text)?);
                written.push(files::ATTN_Q8_BIN);
            }
        }
        for &(bin, manifest) in files::QUANT_BINS {
            let Some(w) = self.writers.remove(bin) else {
                continue;
            };
            if w.is_empty() {
                w.discard()?;
                continue;
            }
            let (h, entries): (FileHash, Vec<TensorEntry>) = w.finish()?;
            hashes.push(h);
            let text = json(dir.join(manifest), serde_json::to_string_pretty(&entries))?;
            hashes.push(write_text(dir, manifest, &text)?);
            written.push(bin);
        }
        let tiers = self
            .tiers
            .tiers()
            .into_iter()
            .filter(|t| t.required_files().iter().all(|f| written.contains(f)))
            .collect();
        Ok((tiers, self.passthrough))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_quants_fall_back_like_llama_cpp() {
        assert_eq!(
            storage_format(QuantFormat::Q4_K, 1536).unwrap(),
            QuantFormat::Q4_K
        );
        assert_eq!(
            storage_format(QuantFormat::Q4_K, 576).unwrap(),
            QuantFormat::Q5_0
        );
        assert_eq!(
            storage_format(QuantFormat::Q6_K, 640).unwrap(),
            QuantFormat::Q8_0
        );
        assert_eq!(
            storage_format(QuantFormat::Q4_0, 640).unwrap(),
            QuantFormat::Q4_0
        );
        // Rows that are not whole blocks of 32 either are stored in F16 (issue 15 bug 3).
        for desired in [QuantFormat::Q4_0, QuantFormat::Q4_K, QuantFormat::Q6_K] {
            assert_eq!(storage_format(desired, 144).unwrap(), QuantFormat::F16);
        }
        assert_eq!(
            storage_format(QuantFormat::Q6_K, 160).unwrap(),
            QuantFormat::Q8_0
        );
        assert!(storage_format(QuantFormat::Q4_K, 0).is_err());
    }

    #[test]
    fn parallel_quantize_equals_serial() {
        let data: Vec<f32> = (0..300 * 512)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
            .collect();
        for f in [QuantFormat::Q4_K, QuantFormat::Q6_K, QuantFormat::Q4_0] {
            let a = quantize_rows_par(f, Values::F32(&data), 512).unwrap();
            let b = infer_quant::quantize(f, &data, 512, None).unwrap();
            assert_eq!(a, b, "{f}");
        }
    }

    #[test]
    fn q8_split_matches_q8_0_dequant() {
        let data: Vec<f32> = (0..4 * 64).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let q = infer_quant::quantize(QuantFormat::Q8_0, &data, 64, None).unwrap();
        let (values, scales) = split_q8_0(&q);
        assert_eq!(values.len(), data.len());
        assert_eq!(scales.len(), data.len() / 32);
        let want = infer_quant::dequantize_to_vec(QuantFormat::Q8_0, &q, data.len()).unwrap();
        for (i, w) in want.iter().enumerate() {
            let got = values[i] as i8 as f32 * scales[i / 32];
            assert_eq!(got.to_bits(), w.to_bits(), "{i}");
        }
        assert_eq!(attn_rank("model.layers.3.self_attn.v_proj.weight"), Some(2));
        assert_eq!(attn_rank("model.layers.3.self_attn.v_proj.bias"), None);
    }
}
