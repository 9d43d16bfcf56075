//! [`describe`]: the human-readable summary `infer inspect <vindex>` prints.

use std::fmt::Write;

use crate::load::Vindex;

fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Multi-line summary of an opened vindex: identity, provenance, tiers and dtype, shapes,
/// files with sizes, tensor counts, and the full config (pretty JSON).
pub fn describe(v: &Vindex) -> String {
    let ix = v.index();
    let mut s = String::new();
    let _ = writeln!(s, "vindex      {}", v.path().display());
    let _ = writeln!(s, "format      version {}", ix.format_version);
    let _ = writeln!(s, "model       {} ({})", ix.model_name, ix.model_type);
    let p = &ix.provenance;
    let _ = writeln!(s, "source      {} [{}]", p.source_path, p.source_kind);
    for h in &p.source_sha256 {
        let _ = writeln!(s, "  sha256    {}  {}", h.sha256, h.name);
    }
    let _ = writeln!(
        s,
        "built by    infer {} at unix {}",
        p.infer_version, p.created_unix
    );
    let float = ix.tiers.iter().any(|t| t == "f32" || t == "f16");
    let matrices = if float {
        format!("float matrices {}", ix.dtype)
    } else {
        format!(
            "no float tier: embeddings {}, other matrices in the quantized tiers",
            ix.embeddings.format
        )
    };
    let _ = writeln!(
        s,
        "tiers       {}  ({matrices}, 1-D tensors f32)",
        ix.tiers.join(", ")
    );
    if !ix.passthrough.is_empty() {
        let _ = writeln!(
            s,
            "passthrough {} quantized tensors copied unchanged from the GGUF's blocks",
            ix.passthrough.len()
        );
    }
    let sh = &ix.shapes;
    let _ = writeln!(
        s,
        "shapes      vocab {} × hidden {}, intermediate {}, {} layers",
        sh.vocab_size, sh.hidden_size, sh.intermediate_size, sh.num_layers
    );
    let ffn_layers = ix
        .layers
        .iter()
        .filter(|l| l.gate.is_some() || l.up.is_some())
        .count();
    let _ = writeln!(
        s,
        "tensors     {} stored ({} layers with a float-tier FFN), lm_head {}",
        v.keys().count(),
        ffn_layers,
        if ix.lm_head.is_some() {
            "untied"
        } else {
            "tied (absent)"
        }
    );
    let _ = writeln!(
        s,
        "tokenizer   {}{}",
        if ix.has_tokenizer {
            "tokenizer.json"
        } else {
            "none"
        },
        if v.chat_template().is_some() {
            ", chat template"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "files:");
    let total: u64 = ix.files.iter().map(|f| f.bytes).sum();
    for f in &ix.files {
        let _ = writeln!(
            s,
            "  {:32} {:>12}  sha256 {}",
            f.name,
            human(f.bytes),
            &f.sha256[..16.min(f.sha256.len())]
        );
    }
    let _ = writeln!(s, "  {:32} {:>12}", "(total)", human(total));
    let _ = writeln!(s, "config:");
    let cfg = serde_json::to_string_pretty(&ix.config).unwrap_or_else(|e| format!("<{e}>"));
    for line in cfg.lines() {
        let _ = writeln!(s, "  {line}");
    }
    s
}
