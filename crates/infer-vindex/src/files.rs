//! The one registry of vindex file names. Every other module refers to files through these
//! constants, so a rename happens in exactly one place.

/// Versioned metadata: config, provenance, shapes, per-layer FFN entries, file hashes.
pub const INDEX_JSON: &str = "index.json";
/// Token embeddings `[vocab, hidden]`.
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
/// Tensors the builder could not classify (MoE experts, routers, FFN biases, …).
pub const OTHER_BIN: &str = "other_weights.bin";
/// Manifest of [`OTHER_BIN`].
pub const OTHER_MANIFEST: &str = "other_weights_manifest.json";
/// Hugging Face `tokenizer.json`.
pub const TOKENIZER_JSON: &str = "tokenizer.json";
/// Hugging Face `tokenizer_config.json`, when the source has one.
pub const TOKENIZER_CONFIG_JSON: &str = "tokenizer_config.json";
/// Jinja chat template, when the source has one.
pub const CHAT_TEMPLATE_JINJA: &str = "chat_template.jinja";

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
];

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
