//! The streaming builder: source checkpoint → vindex directory.
//!
//! Tensors are read one at a time with [`TensorSource::read_f32`] just before they are written and
//! dropped right after, in the order embeddings, layer 0 … layer L-1, global tensors; peak memory
//! is about the embedding matrix plus one tensor (two for the transposed down_proj). Output goes
//! to a temporary directory beside the target that is renamed into place only when complete.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use infer_models::arch::{ExpertsPart, TensorTransform};
use infer_models::{ModelSource, SourceKind, TensorInfo};
use infer_quant::QuantFormat;

use crate::atomic::{check_replaceable, TempBuildDir};
use crate::classify::{check_layer_count, classify, split_layer, Placement, Role};
use crate::files;
use crate::hash::sha256_file_until;
use crate::index::{
    Dtype, FileHash, LayerEntries, Provenance, Shapes, VindexIndex, FORMAT_VERSION,
};
use crate::quant_build::{find_non_finite, NonFinite, QuantBuilder, SourceRef, Values};
use crate::tier::QuantTiers;
use crate::tokenizer_src::resolve_tokenizer;
use crate::transform::{apply, plan_outputs, transpose};
use crate::writer::{write_text, BinWriter};
use crate::VindexError;

/// Options of [`build`] / [`extract`].
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Dtype of the float tier's matrices (1-D tensors are always f32).
    pub dtype: Dtype,
    /// Write the float tier (default). `false` (`infer extract --float none`): every matrix a
    /// selected quantized tier holds is stored only there, the embeddings are stored quantized
    /// (a GGUF's own blocks passed through), and what no quantized tier holds (norms, biases,
    /// routers, position embeddings, …) is stored in f32. Needs quantized tiers that cover
    /// attention (q4k or q8) and the FFN (q4k or q4).
    pub float_tier: bool,
    /// Replace an existing target (only after the new vindex is complete).
    pub force: bool,
    /// A `tokenizer.json` to store; wins over the source's own tokenizer.
    pub tokenizer: Option<PathBuf>,
    /// Build a weights-only vindex when no tokenizer is found instead of failing (a tokenizer
    /// that is found is still stored).
    pub allow_no_tokenizer: bool,
    /// Build a weights-only vindex even when the source has a tokenizer: store no
    /// `tokenizer.json`, `tokenizer_config.json` or `chat_template.jinja` (`has_tokenizer` is
    /// false). Wins over `tokenizer`. `infer extract --no-tokenizer` sets it.
    pub skip_tokenizer: bool,
    /// Draw a progress bar on stderr (indicatif hides it when stderr is not a terminal).
    pub progress: bool,
    /// Quantized tiers to write besides the float tier (default: none; the CLI defaults to
    /// [`QuantTiers::Q4K`]).
    pub quant: QuantTiers,
    /// Store FFN down in Q4_K instead of Q6_K in `interleaved_q4k.bin`.
    pub down_q4k: bool,
    /// Store the q4 tier's FFN and lm_head as Q4_0x16 (the Q4_0 blocks re-laid sixteen rows
    /// per group for the CPU's int8 kernels, `infer_quant::interleave`; a GGUF's Q4_0 blocks
    /// are passed through re-laid) instead of plain Q4_0. The gate copy stays Q4_0.
    pub q4_x16: bool,
    /// Always dequantize → requantize, never copy a GGUF tensor's blocks that already have the
    /// target format.
    pub requantize: bool,
    /// Also write `down_meta.bin` with this many top tokens per FFN feature (see
    /// [`crate::down_meta`]; `infer extract --down-meta [N]`). `None` (the default) skips it:
    /// it costs one `[features, hidden] × [hidden, vocab]` product per layer.
    pub down_meta: Option<usize>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            dtype: Dtype::F32,
            float_tier: true,
            force: false,
            tokenizer: None,
            allow_no_tokenizer: false,
            skip_tokenizer: false,
            progress: false,
            quant: QuantTiers::NONE,
            down_q4k: false,
            q4_x16: false,
            requantize: false,
            down_meta: None,
        }
    }
}

/// Open the checkpoint at `source_path` (HF folder or GGUF) and [`build`] a vindex at `target`.
pub fn extract(
    source_path: &Path,
    target: &Path,
    opts: &BuildOptions,
) -> Result<VindexIndex, VindexError> {
    // Refuse a target that may not be replaced before reading anything.
    check_replaceable(target, opts.force)?;
    if source_path.join(files::INDEX_JSON).is_file() {
        return Err(VindexError::BadSource {
            path: source_path.to_path_buf(),
            msg: "is a vindex (it holds index.json), not a checkpoint: extract reads a HF folder \
                  (config.json + *.safetensors) or a GGUF file; run the vindex directly"
                .into(),
        });
    }
    let source = infer_models::open_source(source_path)?;
    build(&source, target, opts)
}

/// One stored tensor produced from a source tensor.
struct Out {
    key: String,
    shape: Vec<usize>,
    place: Placement,
}

/// A source tensor with its transform and the canonical tensors it becomes.
struct Planned<'a> {
    info: &'a TensorInfo,
    transform: TensorTransform,
    outs: Vec<Out>,
}

impl Planned<'_> {
    /// Layer of the outputs (all outputs of one source tensor share it).
    fn layer(&self) -> Option<usize> {
        self.outs.first().and_then(|o| o.place.layer)
    }
    fn has_role(&self, role: Role) -> bool {
        self.outs.iter().any(|o| o.place.role == role)
    }
}

/// Build a vindex at `target` from an opened source; returns the written index.
///
/// Errors: [`VindexError::TargetExists`] (no `force`), [`VindexError::TargetNotDir`] /
/// [`VindexError::TargetNotVindex`] (with `force`, the target is a file or a non-empty directory
/// that is not a vindex: never replaced), [`VindexError::NoTokenizer`],
/// [`VindexError::BadSource`] (unknown architecture, no embedding, duplicate keys, shapes that
/// disagree with the config, per-layer tensors that do not cover exactly the declared layer
/// count — see [`crate::classify::check_layer_count`]; `down_meta == Some(0)`), source read errors, I/O errors. On any error the temp directory
/// is removed and `target` is untouched.
pub fn build(
    source: &ModelSource,
    target: &Path,
    opts: &BuildOptions,
) -> Result<VindexIndex, VindexError> {
    check_replaceable(target, opts.force)?;
    if opts.down_meta == Some(0) {
        return Err(bad_source(
            source,
            "down_meta needs at least 1 token per feature".into(),
        ));
    }
    if !opts.float_tier {
        check_quantized_only(source, opts)?;
    }
    let tokenizer_json = resolve_tokenizer(source, opts)?;
    let plan = plan(source)?;
    let tmp = TempBuildDir::create(target, opts.force)?;
    // The source's sha256 (a whole read of its weight files) runs beside the quantization; an
    // error of the build stops it at its next chunk.
    let stop = AtomicBool::new(false);
    let written = std::thread::scope(|s| {
        let hashing = s.spawn(|| provenance(source, &stop));
        let provenance = || {
            hashing.join().unwrap_or_else(|_| {
                Err(bad_source(
                    source,
                    "internal: the source hashing thread panicked".into(),
                ))
            })
        };
        let r = write_all(
            source,
            &plan,
            tmp.path(),
            opts,
            tokenizer_json.as_deref(),
            provenance,
        );
        stop.store(true, Ordering::Relaxed);
        r
    });
    let mut index = written?;
    if let Some(n) = opts.down_meta {
        // Computed from the finished float tier in the temp dir, then listed in index.json.
        let hash = crate::down_meta_build::write_down_meta(tmp.path(), n, opts.progress)?;
        index.files.push(hash);
        write_index(tmp.path(), &index)?;
    }
    tmp.commit(opts.force)?;
    Ok(index)
}

/// A vindex without a float tier needs quantized tiers for attention and the FFN, and has no
/// float FFN rows for `down_meta`.
fn check_quantized_only(source: &ModelSource, opts: &BuildOptions) -> Result<(), VindexError> {
    let q = opts.quant;
    let missing = match (q.q4k || q.q8, q.q4k || q.q4) {
        (true, true) => None,
        (false, true) => Some("attention (q4k or q8)"),
        (true, false) => Some("the FFN (q4k or q4)"),
        (false, false) => Some("attention and the FFN (q4k)"),
    };
    if let Some(what) = missing {
        return Err(bad_source(
            source,
            format!(
                "without a float tier (--float none) the quantized tiers must hold {what}: add them to --quant, or keep a float tier (--float f16|f32)"
            ),
        ));
    }
    if opts.down_meta.is_some() {
        return Err(bad_source(
            source,
            "down_meta is computed from the float tier: build with --float f16|f32".into(),
        ));
    }
    Ok(())
}

fn bad_source(source: &ModelSource, msg: String) -> VindexError {
    VindexError::BadSource {
        path: source.path.clone(),
        msg,
    }
}

/// Map every tensor to canonical names (`ModelArchitecture::canonical_name`, dropping what it
/// drops, e.g. rotary buffers), plan its transform, classify the outputs, and check the shapes
/// the loader relies on.
fn plan(source: &ModelSource) -> Result<Vec<Planned<'_>>, VindexError> {
    let cfg = &source.config;
    let arch = infer_models::architecture_for(cfg).map_err(|m| bad_source(source, m))?;
    let hidden = cfg.hidden_size;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut has_embedding = false;
    for info in source.tensors.tensors() {
        let Some(canonical) = arch.canonical_name(&info.name) else {
            continue;
        };
        let transform = arch.source_transform(&info.name);
        let specs = plan_outputs(cfg, &canonical, &info.shape, transform)
            .map_err(|m| bad_source(source, format!("tensor '{}': {m}", info.name)))?;
        let mut outs = Vec::new();
        for spec in specs {
            let key = spec.key;
            if !seen.insert(key.clone()) {
                return Err(bad_source(
                    source,
                    format!("two tensors map to the key '{key}'"),
                ));
            }
            let s = spec.shape;
            let place = classify(&key, &s);
            let shape_err = |want: String| {
                bad_source(
                    source,
                    format!(
                        "tensor '{key}' has shape {s:?}, expected {want} (hidden_size {hidden})"
                    ),
                )
            };
            match place.role {
                Role::Embedding | Role::LmHead => {
                    if s.len() != 2 || s[0] != cfg.vocab_size || s[1] != hidden {
                        return Err(shape_err(format!("[{}, {hidden}]", cfg.vocab_size)));
                    }
                    has_embedding |= place.role == Role::Embedding;
                }
                Role::FfnGate | Role::FfnUp if s.len() != 2 || s[1] != hidden => {
                    return Err(shape_err("[intermediate, hidden]".into()));
                }
                Role::FfnDown if s.len() != 2 || s[0] != hidden => {
                    return Err(shape_err("[hidden, intermediate]".into()));
                }
                _ => {}
            }
            outs.push(Out {
                key,
                shape: s,
                place,
            });
        }
        out.push(Planned {
            info,
            transform,
            outs,
        });
    }
    if !has_embedding {
        return Err(bad_source(
            source,
            "no 'model.embed_tokens.weight' tensor".into(),
        ));
    }
    // The declared layer count must match the layers the tensors cover (no layer may be
    // stored as passthrough or left without weights).
    let layer_keys: Vec<(usize, &str)> = out
        .iter()
        .flat_map(|p| p.outs.iter())
        .filter_map(|o| split_layer(&o.key))
        .collect();
    check_layer_count(
        cfg.num_hidden_layers,
        &layer_count_field(source),
        &layer_keys,
    )
    .map_err(|m| bad_source(source, m))?;
    // FFN matrices of one layer must agree on the intermediate size.
    for l in 0..cfg.num_hidden_layers {
        let sizes: Vec<(String, usize)> = out
            .iter()
            .flat_map(|p| p.outs.iter())
            .filter(|o| o.place.layer == Some(l))
            .filter_map(|o| match o.place.role {
                Role::FfnGate | Role::FfnUp => Some((o.key.clone(), o.shape[0])),
                Role::FfnDown => Some((o.key.clone(), o.shape[1])),
                _ => None,
            })
            .collect();
        if sizes.windows(2).any(|w| w[0].1 != w[1].1) {
            return Err(bad_source(
                source,
                format!("layer {l}: FFN intermediate sizes disagree: {sizes:?}"),
            ));
        }
    }
    check_expected_tensors(source, arch.as_ref(), &out)?;
    Ok(out)
}

/// Every tensor the architecture loads ([`infer_models::arch::expected_tensors`], the shapes
/// the config implies) is present when the loader needs it and has that shape: the checks the
/// loader applies, made before anything is written, so a config that disagrees with its
/// weights (a wrong `head_dim`, `num_key_value_heads`, `intermediate_size`, or `model_type`)
/// is refused by extract rather than by `run`.
fn check_expected_tensors(
    source: &ModelSource,
    arch: &dyn infer_models::ModelArchitecture,
    plan: &[Planned<'_>],
) -> Result<(), VindexError> {
    let shapes: std::collections::HashMap<&str, &[usize]> = plan
        .iter()
        .flat_map(|p| p.outs.iter())
        .map(|o| (o.key.as_str(), o.shape.as_slice()))
        .collect();
    let c = &source.config;
    let sizes = || {
        format!(
            "hidden_size {}, {} heads, {} KV heads, head_dim {}, intermediate_size {}",
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.intermediate_size
        )
    };
    for e in infer_models::arch::expected_tensors(arch) {
        match shapes.get(e.key.as_str()) {
            Some(&s) if s == e.shape.as_slice() => {}
            Some(&s) => {
                return Err(bad_source(
                    source,
                    format!(
                        "tensor '{}' has shape {s:?}, but the config ({}) implies {:?}: the config does not match the weights",
                        e.key,
                        sizes(),
                        e.shape
                    ),
                ))
            }
            None if e.required => {
                return Err(bad_source(
                    source,
                    format!(
                        "no tensor '{}', which model_type '{}' needs: the config does not match the weights",
                        e.key, c.model_type
                    ),
                ))
            }
            None => {}
        }
    }
    Ok(())
}

/// The source's name of the layer-count field: GGUF `{arch}.block_count`, HF
/// `num_hidden_layers` in `config.json`.
fn layer_count_field(source: &ModelSource) -> String {
    match (&source.kind, &source.gguf) {
        (SourceKind::Gguf, Some(g)) => match g.get_str("general.architecture") {
            Some(arch) => format!("{arch}.block_count"),
            None => "block_count".into(),
        },
        (SourceKind::Gguf, None) => "block_count".into(),
        (SourceKind::HfFolder, _) => "num_hidden_layers in config.json".into(),
    }
}

/// The output files of the float tier, in write order.
struct Writers {
    embeddings: BinWriter,
    norms: BinWriter,
    attn: BinWriter,
    gate: BinWriter,
    up: BinWriter,
    down: BinWriter,
    lm_head: BinWriter,
    other: BinWriter,
}

impl Writers {
    fn create(dir: &Path) -> Result<Self, VindexError> {
        Ok(Writers {
            embeddings: BinWriter::create(dir, files::EMBEDDINGS_BIN)?,
            norms: BinWriter::create(dir, files::NORMS_BIN)?,
            attn: BinWriter::create(dir, files::ATTN_WEIGHTS_BIN)?,
            gate: BinWriter::create(dir, files::GATE_VECTORS_BIN)?,
            up: BinWriter::create(dir, files::UP_FEATURES_BIN)?,
            down: BinWriter::create(dir, files::DOWN_FEATURES_BIN)?,
            lm_head: BinWriter::create(dir, files::LM_HEAD_BIN)?,
            other: BinWriter::create(dir, files::OTHER_BIN)?,
        })
    }

    fn for_role(&mut self, role: Role) -> &mut BinWriter {
        match role {
            Role::Embedding => &mut self.embeddings,
            Role::LmHead => &mut self.lm_head,
            Role::Norm => &mut self.norms,
            Role::Attention => &mut self.attn,
            Role::FfnGate => &mut self.gate,
            Role::FfnUp => &mut self.up,
            Role::FfnDown => &mut self.down,
            Role::Other => &mut self.other,
        }
    }
}

fn progress_bar(opts: &BuildOptions, total: usize) -> ProgressBar {
    if !opts.progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg:24} [{bar:40}] {pos}/{len} tensors {elapsed}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// Refuse a tensor holding NaN or infinity (`values`: rows of `row_len`), naming it and the
/// first such value. Errors: [`VindexError::BadSource`].
fn check_finite(
    source: &ModelSource,
    name: &str,
    values: Values<'_>,
    row_len: usize,
) -> Result<(), VindexError> {
    let found = find_non_finite(values, row_len)
        .map_err(|e| bad_source(source, format!("tensor '{name}': {e}")))?;
    match found {
        None => Ok(()),
        Some(NonFinite { count, first, value }) => Err(bad_source(
            source,
            format!(
                "tensor '{name}' holds {count} non-finite values (NaN or infinity; the first, {value}, at flat index {first}): the weights are corrupt"
            ),
        )),
    }
}

/// Store a source tensor that maps 1:1 to one output only in the quantized tiers, straight
/// from its encoded rows (decoded and quantized in parallel row chunks, never held in `f32`):
/// a vindex without a float tier, for the embeddings and every matrix a quantized tier covers.
/// Returns false, having done nothing, when the tensor needs the `f32` path (a float copy, a
/// 1-D tensor, a source that cannot hand out its rows).
fn stream_quantized(
    source: &ModelSource,
    p: &Planned<'_>,
    qb: &mut QuantBuilder,
    w: &mut Writers,
    opts: &BuildOptions,
) -> Result<bool, VindexError> {
    let [o] = p.outs.as_slice() else {
        return Ok(false);
    };
    let role = o.place.role;
    let quantized_only = !opts.float_tier && (role == Role::Embedding || qb.covers(role, &o.key));
    if !quantized_only || o.shape.len() != 2 || o.shape != p.info.shape {
        return Ok(false);
    }
    let Some(rows) = source.tensors.encoded_rows(&p.info.name)? else {
        return Ok(false);
    };
    let name = p.info.name.as_str();
    let values = Values::Encoded(&rows);
    check_finite(source, name, values, o.shape[1])?;
    let src = Some(SourceRef::whole(name));
    qb.add(role, o.place.layer, &o.key, &o.shape, values, src)?;
    if role == Role::Embedding {
        let (format, bytes) = qb.embedding(&o.key, &o.shape, values, src)?;
        w.embeddings.write_raw(&o.key, &o.shape, format, bytes)?;
    }
    Ok(true)
}

/// [`stream_quantized`] for a GGUF's stacked experts (`ffn_*_exps`, `[count, rows, cols]`, each
/// expert a contiguous run of whole rows): each expert's encoded rows go to the quantized tiers
/// in turn (its own blocks passed through when the tier stores the source's format), never the
/// stacked tensor in `f32`. Returns false, having done nothing, when a float tier or an output
/// no quantized tier covers needs the `f32` path, or the source cannot hand out its rows.
fn stream_stacked_experts(
    source: &ModelSource,
    p: &Planned<'_>,
    qb: &mut QuantBuilder,
    opts: &BuildOptions,
) -> Result<bool, VindexError> {
    let count = p.outs.len();
    let covered = p.outs.iter().all(|o| {
        o.shape.len() == 2 && o.place.role != Role::Embedding && qb.covers(o.place.role, &o.key)
    });
    if opts.float_tier || count == 0 || !covered {
        return Ok(false);
    }
    let Some(rows) = source.tensors.encoded_rows(&p.info.name)? else {
        return Ok(false);
    };
    let name = p.info.name.as_str();
    let per = rows.bytes.len() / count;
    for (i, o) in p.outs.iter().enumerate() {
        let want = rows
            .format
            .bytes_for(o.shape[1])
            .map_err(|e| bad_source(source, format!("tensor '{name}' expert {i}: {e}")))?
            * o.shape[0];
        if want != per || per * count != rows.bytes.len() {
            return Err(bad_source(
                source,
                format!(
                    "tensor '{name}' holds {} bytes of {}; {count} experts of {:?} need {}",
                    rows.bytes.len(),
                    rows.format,
                    o.shape,
                    want * count
                ),
            ));
        }
        let expert = infer_models::EncodedRows {
            format: rows.format,
            bytes: std::borrow::Cow::Borrowed(&rows.bytes[i * per..(i + 1) * per]),
        };
        let values = Values::Encoded(&expert);
        check_finite(source, &format!("{name} (expert {i})"), values, o.shape[1])?;
        let src = SourceRef {
            name,
            expert: Some((i, count)),
        };
        qb.add(
            o.place.role,
            o.place.layer,
            &o.key,
            &o.shape,
            values,
            Some(src),
        )?;
    }
    Ok(true)
}

/// Write every file into `dir` and return the index (also written as `index.json`).
fn write_all(
    source: &ModelSource,
    plan: &[Planned<'_>],
    dir: &Path,
    opts: &BuildOptions,
    tokenizer_json: Option<&str>,
    provenance: impl FnOnce() -> Result<Provenance, VindexError>,
) -> Result<VindexIndex, VindexError> {
    let cfg = &source.config;
    let num_layers = cfg.num_hidden_layers;
    let mut w = Writers::create(dir)?;
    let tied = !plan.iter().any(|p| p.has_role(Role::LmHead));
    let mut qb = QuantBuilder::new(source, dir, opts, tied)?;
    let mut cur_layer = None;
    let mut layers = vec![LayerEntries::default(); num_layers];
    let pb = progress_bar(opts, plan.len());

    // Embeddings first, then layer by layer, then the global tensors.
    let in_layer = |p: &Planned, l: usize| p.layer() == Some(l) && !p.has_role(Role::Embedding);
    let mut order: Vec<&Planned> = plan
        .iter()
        .filter(|p| p.has_role(Role::Embedding))
        .collect();
    for l in 0..num_layers {
        order.extend(
            plan.iter()
                .filter(|p| in_layer(p, l) && !p.has_role(Role::Other)),
        );
        order.extend(
            plan.iter()
                .filter(|p| in_layer(p, l) && p.has_role(Role::Other)),
        );
    }
    order.extend(
        plan.iter()
            .filter(|p| !p.has_role(Role::Embedding) && p.layer().is_none()),
    );

    for p in order {
        if p.layer() != cur_layer {
            qb.flush()?;
            cur_layer = p.layer();
        }
        pb.set_message(match p.layer() {
            Some(l) => format!("layer {l}/{num_layers}"),
            None => "global tensors".to_string(),
        });
        // GGUF passthrough needs the stored tensor to be the source tensor unchanged: the whole
        // of it, or one expert of a stacked `ffn_*_exps`.
        let one_to_one = matches!(p.transform, TensorTransform::AsIs) && p.outs.len() == 1;
        let stacked = p.transform == TensorTransform::SplitExperts(ExpertsPart::Stacked);
        let src = |i: usize| -> Option<SourceRef<'_>> {
            let name = p.info.name.as_str();
            if one_to_one {
                Some(SourceRef::whole(name))
            } else if stacked {
                Some(SourceRef {
                    name,
                    expert: Some((i, p.outs.len())),
                })
            } else {
                None
            }
        };
        if one_to_one && stream_quantized(source, p, &mut qb, &mut w, opts)? {
            pb.inc(1);
            continue;
        }
        if stacked && stream_stacked_experts(source, p, &mut qb, opts)? {
            pb.inc(1);
            continue;
        }
        let t = source.tensors.read_f32(&p.info.name)?;
        if t.shape != p.info.shape || t.data.len() != t.shape.iter().product::<usize>() {
            return Err(bad_source(
                source,
                format!(
                    "tensor '{}' read as shape {:?} with {} values; listed as {:?}",
                    p.info.name,
                    t.shape,
                    t.data.len(),
                    p.info.shape
                ),
            ));
        }
        let row_len = t.shape.last().copied().unwrap_or(1);
        check_finite(source, &p.info.name, Values::F32(&t.data), row_len)?;
        let parts = apply(cfg, t.data, &t.shape, p.transform);
        for (i, (o, data)) in p.outs.iter().zip(parts).enumerate() {
            let role = o.place.role;
            let values = Values::F32(&data);
            qb.add(role, o.place.layer, &o.key, &o.shape, values, src(i))?;
            if !opts.float_tier {
                if role == Role::Embedding {
                    let (format, bytes) = qb.embedding(&o.key, &o.shape, values, src(i))?;
                    w.embeddings.write_raw(&o.key, &o.shape, format, bytes)?;
                    continue;
                }
                if qb.covers(role, &o.key) {
                    continue;
                }
            }
            let format = if o.shape.len() <= 1 || !opts.float_tier {
                QuantFormat::F32
            } else {
                opts.dtype.format()
            };
            let entry = if o.place.role == Role::FfnDown {
                let (h, i) = (o.shape[0], o.shape[1]);
                let tr = transpose(&data, h, i);
                drop(data);
                w.down.write_tensor(&o.key, &[i, h], format, &tr)?
            } else {
                w.for_role(o.place.role)
                    .write_tensor(&o.key, &o.shape, format, &data)?
            };
            // `plan` refused layers ≥ num_layers (check_layer_count).
            if let Some(l) = o.place.layer {
                match o.place.role {
                    Role::FfnGate => layers[l].gate = Some(entry),
                    Role::FfnUp => layers[l].up = Some(entry),
                    Role::FfnDown => layers[l].down = Some(entry),
                    _ => {}
                }
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();

    let mut file_hashes: Vec<FileHash> = Vec::new();
    let mut finish = |bw: BinWriter,
                      manifest: Option<&str>|
     -> Result<Option<crate::TensorEntry>, VindexError> {
        if bw.is_empty() {
            bw.discard()?;
            return Ok(None);
        }
        let (hash, entries) = bw.finish()?;
        file_hashes.push(hash);
        if let Some(mname) = manifest {
            let text =
                serde_json::to_string_pretty(&entries).map_err(|e| VindexError::BadJson {
                    path: dir.join(mname),
                    msg: e.to_string(),
                })?;
            file_hashes.push(write_text(dir, mname, &text)?);
        }
        Ok(entries.into_iter().next())
    };
    let embeddings = finish(w.embeddings, None)?
        .ok_or_else(|| bad_source(source, "no embeddings written".into()))?;
    finish(w.norms, Some(files::NORMS_MANIFEST))?;
    finish(w.attn, Some(files::ATTN_WEIGHTS_MANIFEST))?;
    finish(w.gate, None)?;
    finish(w.up, None)?;
    finish(w.down, None)?;
    let lm_head = finish(w.lm_head, None)?;
    finish(w.other, Some(files::OTHER_MANIFEST))?;
    let (quant_tiers, passthrough) = qb.finish(dir, &mut file_hashes)?;

    if let Some(text) = tokenizer_json {
        file_hashes.push(write_text(dir, files::TOKENIZER_JSON, text)?);
    }
    if !opts.skip_tokenizer {
        if let Some(text) = &source.tokenizer_config_json {
            file_hashes.push(write_text(dir, files::TOKENIZER_CONFIG_JSON, text)?);
        }
        if let Some(text) = &source.chat_template {
            file_hashes.push(write_text(dir, files::CHAT_TEMPLATE_JINJA, text)?);
        }
    }

    let intermediate = layers
        .iter()
        .find_map(|l| l.gate.as_ref().or(l.up.as_ref()).map(|e| e.shape[0]))
        .unwrap_or(cfg.intermediate_size);
    let index = VindexIndex {
        format_version: FORMAT_VERSION,
        model_type: cfg.model_type.clone(),
        model_name: model_name(&source.path),
        provenance: provenance()?,
        config: cfg.clone(),
        shapes: Shapes {
            vocab_size: embeddings.shape[0],
            hidden_size: cfg.hidden_size,
            intermediate_size: intermediate,
            num_layers,
        },
        dtype: if opts.float_tier {
            opts.dtype
        } else {
            Dtype::F32
        },
        tiers: opts
            .float_tier
            .then(|| opts.dtype.name().to_string())
            .into_iter()
            .chain(quant_tiers.iter().map(|t| t.name().to_string()))
            .collect(),
        passthrough,
        embeddings,
        lm_head,
        layers,
        has_tokenizer: tokenizer_json.is_some(),
        files: file_hashes,
        index_sha256: None, // set by write_index
    };
    write_index(dir, &index)?;
    Ok(index)
}

/// Write (or rewrite) `dir/index.json`.
fn write_index(dir: &Path, index: &VindexIndex) -> Result<(), VindexError> {
    let text = serde_json::to_string_pretty(&index.sealed()).map_err(|e| VindexError::BadJson {
        path: dir.join(files::INDEX_JSON),
        msg: e.to_string(),
    })?;
    write_text(dir, files::INDEX_JSON, &text)?;
    Ok(())
}

/// Source file or folder name without extension.
fn model_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Provenance: source path and kind, sha256 of its weight files, tool version, build time.
/// `stop` set: give up at the next chunk (the build failed; the result is not used).
fn provenance(source: &ModelSource, stop: &AtomicBool) -> Result<Provenance, VindexError> {
    let (kind, weight_files): (&str, Vec<PathBuf>) = match source.kind {
        SourceKind::Gguf => ("gguf", vec![source.path.clone()]),
        SourceKind::HfFolder => {
            // Only the model's weight files (`model.safetensors`, or the shards named by
            // `model.safetensors.index.json`), not every *.safetensors lying in the folder.
            // (A source that opened has them; an in-memory test source may not: hash none.)
            let mut v = infer_models::hf::safetensors_files(&source.path)
                .map(|(v, _)| v)
                .unwrap_or_default();
            v.sort();
            v.dedup();
            ("hf_folder", v)
        }
    };
    let mut hashes = Vec::new();
    for f in weight_files {
        let (sha256, bytes) = sha256_file_until(&f, stop)?;
        hashes.push(FileHash {
            name: f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            bytes,
            sha256,
        });
    }
    Ok(Provenance {
        source_path: source.path.display().to_string(),
        source_kind: kind.to_string(),
        source_sha256: hashes,
        infer_version: crate::index::INFER_VERSION.to_string(),
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    })
}
