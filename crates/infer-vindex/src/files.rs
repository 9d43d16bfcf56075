//! The one registry of vindex file names. Every other module refers to files through these
//! constants, so a rename happens in exactly one place.

/// Versioned metadata: config, provenance, shapes, per-layer FFN entries, file hashes.
pub const INDEX_JSON: &str = "index.json";
/// Token embeddings `[vocab, hidden]`: in the float tier's dtype, or, in a vindex without a
/// float tier, ggml blocks (a GGUF's own `token_embd` blocks; the entry's format tag says which).
pub const EMBEDDINGS_BIN: &str = "embeddings.bin";
/// Every 1-D norm weight/bias (per layer and final), described by [`NORMS_MANIFEST`].
pub const NORMS_BIN: &str = "norms.bin";
/// Manifest of [`NORMS_BIN`].
pub const NORMS_MANIFEST: &str = "norms_manifest.json";
/// FFN gate rows `[intermediate, hidden]` per layer: the gate KNN index.
pub const GATE_VECTORS_BIN: &str = "gate_vectors.bin";
/// FFN up rows `[intermediate, hidden]` per layer (feature-major).
pub const UP_FEATURES_BIN: &str = "up_features.bin";
/// FFN down columns, transposed to `[intermediate, hidden]` per layer (feature-major).
pub const DOWN_FEATURES_BIN: &str = "down_features.bin";
/// Every attention tensor (q/k/v/o weights and biases, q/k norms), described by
/// [`ATTN_WEIGHTS_MANIFEST`].
pub const ATTN_WEIGHTS_BIN: &str = "attn_weights.bin";
/// Manifest of [`ATTN_WEIGHTS_BIN`].
pub const ATTN_WEIGHTS_MANIFEST: &str = "attn_weights_manifest.json";
/// Output projection `[vocab, hidden]`; absent when the source has none (tied embeddings).
pub const LM_HEAD_BIN: &str = "lm_head.bin";
/// Tensors the builder could not classify (MoE experts of the float tier, routers, FFN biases,
/// …); the quantized tiers store MoE experts per expert in the interleaved FFN files.
pub const OTHER_BIN: &str = "other_weights.bin";
/// Manifest of [`OTHER_BIN`].
pub const OTHER_MANIFEST: &str = "other_weights_manifest.json";
/// Per FFN feature, the top-N tokens of its down vector projected through the unembedding
/// (opt-in: `infer extract --down-meta`); layout in [`crate::down_meta`]. Memory-mapped at open
/// when listed, but not one of [`BIN_FILES`] (it holds no tensors).
pub const DOWN_META_BIN: &str = "down_meta.bin";
/// Hugging Face `tokenizer.json`.
pub const TOKENIZER_JSON: &str = "tokenizer.json";
/// Hugging Face `tokenizer_config.json`, when the source has one.
pub const TOKENIZER_CONFIG_JSON: &str = "tokenizer_config.json";
/// Jinja chat template, when the source has one.
pub const CHAT_TEMPLATE_JINJA: &str = "chat_template.jinja";

/// Attention Q, K, V, O per layer (in that order), `[out, in]`: Q, K, O in Q4_K and V in Q6_K,
/// or Q5_0 / Q8_0 for a tensor whose row length is not a multiple of 256 (the manifest's format
/// tag is the truth). Described by [`ATTN_Q4K_MANIFEST`].
pub const ATTN_Q4K_BIN: &str = "attn_weights_q4k.bin";
/// Manifest of [`ATTN_Q4K_BIN`].
pub const ATTN_Q4K_MANIFEST: &str = "attn_weights_q4k_manifest.json";
/// Attention Q, K, V, O per layer as int8 values (Q8_0's `qs`, `[out, in]`, format tag `I8`);
/// their per-32 f32 scales are in [`ATTN_Q8_SCALES_BIN`]. Described by [`ATTN_Q8_MANIFEST`].
pub const ATTN_Q8_BIN: &str = "attn_weights_q8.bin";
/// Manifest of [`ATTN_Q8_BIN`] (entries with format `I8`).
pub const ATTN_Q8_MANIFEST: &str = "attn_weights_q8_manifest.json";
/// f32 scales of [`ATTN_Q8_BIN`], `[out, in/32]` per tensor (Q8_0's `d`, widened exactly).
pub const ATTN_Q8_SCALES_BIN: &str = "attn_weights_q8_scales.bin";
/// Manifest of [`ATTN_Q8_SCALES_BIN`].
pub const ATTN_Q8_SCALES_MANIFEST: &str = "attn_weights_q8_scales_manifest.json";
/// FFN gate, up, down per layer (in that order) in HF Linear layout `[out, in]` (gate/up
/// `[intermediate, hidden]`, down `[hidden, intermediate]`): gate/up Q4_K, down Q6_K (Q4_K
/// with `--down-q4k`), with Q5_0 / Q8_0 fallbacks per tensor (a GGUF tensor already in one of
/// Q4_K, Q6_K, Q5_0, Q8_0 keeps its blocks); after them, a MoE layer's experts
/// (`….mlp.experts.{e}.{gate,up,down}_proj.weight`, then the shared expert), each as its own
/// tensor. See [`INTERLEAVED_Q4K_MANIFEST`].
pub const INTERLEAVED_Q4K_BIN: &str = "interleaved_q4k.bin";
/// Manifest of [`INTERLEAVED_Q4K_BIN`].
pub const INTERLEAVED_Q4K_MANIFEST: &str = "interleaved_q4k_manifest.json";
/// FFN gate, up, down per layer in Q4_0, `[out, in]` as [`INTERLEAVED_Q4K_BIN`].
pub const INTERLEAVED_Q4_BIN: &str = "interleaved_q4.bin";
/// Manifest of [`INTERLEAVED_Q4_BIN`].
pub const INTERLEAVED_Q4_MANIFEST: &str = "interleaved_q4_manifest.json";
/// FFN gate rows `[intermediate, hidden]` per layer in Q4_0 (the quantized gate KNN index).
pub const GATE_Q4_BIN: &str = "gate_vectors_q4.bin";
/// Manifest of [`GATE_Q4_BIN`].
pub const GATE_Q4_MANIFEST: &str = "gate_vectors_q4_manifest.json";
/// Output projection `[vocab, hidden]` in Q4_0 (from the embeddings when tied).
pub const LM_HEAD_Q4_BIN: &str = "lm_head_q4.bin";
/// Manifest of [`LM_HEAD_Q4_BIN`].
pub const LM_HEAD_Q4_MANIFEST: &str = "lm_head_q4_manifest.json";
/// Output projection `[vocab, hidden]` in Q6_K (Q8_0 when rows are not a multiple of 256), the
/// q4k tier's output matrix, as llama.cpp's Q4_K_M keeps `output` in Q6_K. Absent in a vindex
/// without a float tier whose output is tied: the quantized embeddings are the output matrix.
pub const LM_HEAD_Q6K_BIN: &str = "lm_head_q6k.bin";
/// Manifest of [`LM_HEAD_Q6K_BIN`].
pub const LM_HEAD_Q6K_MANIFEST: &str = "lm_head_q6k_manifest.json";

/// The quantized tensor files whose manifests hold ggml-format [`crate::TensorEntry`]s, as
/// `(bin, manifest)` (the I8 plane [`ATTN_Q8_BIN`] has its own entry type).
pub const QUANT_BINS: &[(&str, &str)] = &[
    (ATTN_Q4K_BIN, ATTN_Q4K_MANIFEST),
    (ATTN_Q8_SCALES_BIN, ATTN_Q8_SCALES_MANIFEST),
    (INTERLEAVED_Q4K_BIN, INTERLEAVED_Q4K_MANIFEST),
    (INTERLEAVED_Q4_BIN, INTERLEAVED_Q4_MANIFEST),
    (GATE_Q4_BIN, GATE_Q4_MANIFEST),
    (LM_HEAD_Q4_BIN, LM_HEAD_Q4_MANIFEST),
    (LM_HEAD_Q6K_BIN, LM_HEAD_Q6K_MANIFEST),
];

/// The tensor data files that have a separate JSON manifest, as `(bin, manifest)`.
pub const MANIFESTED_BINS: &[(&str, &str)] = &[
    (NORMS_BIN, NORMS_MANIFEST),
    (ATTN_WEIGHTS_BIN, ATTN_WEIGHTS_MANIFEST),
    (OTHER_BIN, OTHER_MANIFEST),
];

/// Every tensor data file a vindex may hold (each is memory-mapped at open).
pub const BIN_FILES: &[&str] = &[
    EMBEDDINGS_BIN,
    NORMS_BIN,
    GATE_VECTORS_BIN,
    UP_FEATURES_BIN,
    DOWN_FEATURES_BIN,
    ATTN_WEIGHTS_BIN,
    LM_HEAD_BIN,
    OTHER_BIN,
    ATTN_Q4K_BIN,
    ATTN_Q8_BIN,
    ATTN_Q8_SCALES_BIN,
    INTERLEAVED_Q4K_BIN,
    INTERLEAVED_Q4_BIN,
    GATE_Q4_BIN,
    LM_HEAD_Q4_BIN,
    LM_HEAD_Q6K_BIN,
];

/// Every file name a vindex may hold besides `index.json` (tensor data, manifests, tokenizer
/// and template files): what `verify` looks for on disk when index.json does not list it.
pub fn known_files() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = BIN_FILES.to_vec();
    v.extend(QUANT_BINS.iter().chain(MANIFESTED_BINS).map(|(_, m)| *m));
    v.extend([
        ATTN_Q8_MANIFEST,
        DOWN_META_BIN,
        TOKENIZER_JSON,
        TOKENIZER_CONFIG_JSON,
        CHAT_TEMPLATE_JINJA,
    ]);
    v
}

/// True when `name` is a plain file name inside the vindex directory: not empty, not `.` or
/// `..`, and free of `/`, `\`, `:` and NUL (so it can be neither absolute nor a path that
/// leaves the directory). Every file name read from `index.json` must pass this before it is
/// joined to the vindex path.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', ':', '\0'])
}

/// Name of the temporary build directory for a target named `name` (`.NAME.tmp-PID`), created
/// in the target's parent so the final rename stays on one file system.
pub fn temp_dir_name(target_name: &str, pid: u32) -> String {
    format!("{}{pid}", temp_dir_prefix(target_name))
}

/// Prefix shared by every temporary build directory of `target_name` (used to find stale ones).
pub fn temp_dir_prefix(target_name: &str) -> String {
    format!(".{target_name}.tmp-")
}

/// Name under which an existing target is parked while `--force` swaps in the new one.
pub fn old_dir_name(target_name: &str, pid: u32) -> String {
    format!(".{target_name}.old-{pid}")
}
