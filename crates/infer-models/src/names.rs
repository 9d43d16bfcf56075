//! GGUF (llama.cpp) ↔ Hugging Face tensor-name maps, per GGUF architecture.
//!
//! Names follow llama.cpp's `gguf-py/gguf/tensor_mapping.py` (`TensorNameMap`): per-layer GGUF
//! names are `blk.N.<stem>.<weight|bias>`, HF names `model.layers.N.<module>.<weight|bias>`.
//! Only the *names* are mapped here; shapes (GGUF dims are fastest-first, so HF shape = reversed
//! dims) and value conventions (Q/K row permutation, Gemma norm `+1`) are undone by the GGUF
//! tensor source.

/// What a GGUF tensor name maps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappedName {
    /// A model weight, under its HF name.
    Hf(String),
    /// A tensor llama.cpp derives from config values rather than a weight of the HF checkpoint
    /// (`rope_freqs`, `rope_factors_long`, `rope_factors_short`: RoPE frequency factors).
    NotAWeight,
    /// A name this map does not know for the architecture.
    Unknown,
}

/// GGUF tensors that are RoPE frequency tables computed by the converter, not HF weights.
pub const ROPE_FACTOR_TENSORS: &[&str] = &["rope_freqs", "rope_factors_long", "rope_factors_short"];

/// Whole-model tensors (GGUF stem, HF module), shared by every architecture.
const GLOBAL: &[(&str, &str)] = &[
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

/// Per-layer stems common to the Llama-like families (GGUF stem, HF module under `model.layers.N`).
const LAYER_COMMON: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
];

/// Per-layer stems that differ by architecture.
fn layer_specific(arch: &str) -> &'static [(&'static str, &'static str)] {
    match arch {
        // Gemma-2/3: four norms per block; `ffn_norm` is the pre-FFN norm.
        "gemma2" | "gemma3" => &[
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ],
        // StarCoder2: plain MLP `c_fc` → act → `c_proj`.
        "starcoder2" => &[
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_up", "mlp.c_fc"),
            ("ffn_down", "mlp.c_proj"),
        ],
        // Phi-3: fused QKV and fused gate/up (kept fused, as HF stores them).
        "phi3" => &[
            ("attn_qkv", "self_attn.qkv_proj"),
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_up", "mlp.gate_up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ],
        // gpt-oss: the pre-FFN norm is `post_attention_norm`, the router `ffn_gate_inp` (the
        // sinks and stacked experts are in [`bare_specific`]).
        "gpt-oss" => &[
            ("post_attention_norm", "post_attention_layernorm"),
            ("ffn_gate_inp", "mlp.router"),
        ],
        // llama, qwen2, qwen3, gemma (v1), …: `ffn_norm` is HF's `post_attention_layernorm`.
        // A MoE's router `ffn_gate_inp` (llama's Mixtral, qwen3moe) is the canonical
        // `mlp.gate` (HF Qwen3-MoE's name; Mixtral's `block_sparse_moe.gate`).
        _ => &[
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
            ("ffn_gate_inp", "mlp.gate"),
        ],
    }
}

/// The experts stacked per projection as llama.cpp stores them (`ffn_{gate,up,down}_exps`,
/// `[E, rows, cols]` of HF Linear matrices; convert_hf_to_gguf.py merges Mixtral's and
/// Qwen-MoE's per-expert tensors so), which have no HF name (gpt-oss fuses gate and up and
/// stores down transposed): `mlp.experts.stacked_{gate,up,down}_proj`, split per expert at
/// extract time. Bare names, as in [`bare_specific`].
const STACKED_EXPERTS: &[(&str, &str)] = &[
    ("ffn_gate_exps", "mlp.experts.stacked_gate_proj"),
    ("ffn_up_exps", "mlp.experts.stacked_up_proj"),
    ("ffn_down_exps", "mlp.experts.stacked_down_proj"),
];

/// Per-layer stems whose HF tensors have no `.weight` suffix (GGUF stem, HF name under
/// `model.layers.N`): the `.weight` tensor maps to the bare name, the `.bias` one to the name
/// plus `_bias` (HF's own spelling for gpt-oss's expert biases). Every architecture: the
/// [`STACKED_EXPERTS`]; gpt-oss also the attention sinks (`self_attn.sinks`).
fn bare_specific(arch: &str) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    let own: &[(&str, &str)] = match arch {
        "gpt-oss" => &[("attn_sinks", "self_attn.sinks")],
        _ => &[],
    };
    own.iter().chain(STACKED_EXPERTS)
}

/// Split `name` into (stem, suffix) where suffix is `weight` or `bias`.
fn split_suffix(name: &str) -> Option<(&str, &str)> {
    let (stem, suffix) = name.rsplit_once('.')?;
    matches!(suffix, "weight" | "bias").then_some((stem, suffix))
}

/// Map a GGUF tensor name of GGUF architecture `arch` (`general.architecture`) to its HF name,
/// e.g. `blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`, and for gemma3
/// `blk.3.ffn_norm.weight` → `model.layers.3.pre_feedforward_layernorm.weight`.
pub fn gguf_to_hf_name(arch: &str, gguf_name: &str) -> MappedName {
    let Some((stem, suffix)) = split_suffix(gguf_name) else {
        return MappedName::Unknown;
    };
    if ROPE_FACTOR_TENSORS.contains(&stem) {
        return MappedName::NotAWeight;
    }
    if let Some((_, hf)) = GLOBAL.iter().find(|(g, _)| *g == stem) {
        return MappedName::Hf(format!("{hf}.{suffix}"));
    }
    let Some(rest) = stem.strip_prefix("blk.") else {
        return MappedName::Unknown;
    };
    let Some((layer, layer_stem)) = rest.split_once('.') else {
        return MappedName::Unknown;
    };
    let Ok(layer) = layer.parse::<usize>() else {
        return MappedName::Unknown;
    };
    if let Some((_, hf)) = bare_specific(arch).find(|(g, _)| *g == layer_stem) {
        let bias = if suffix == "bias" { "_bias" } else { "" };
        return MappedName::Hf(format!("model.layers.{layer}.{hf}{bias}"));
    }
    LAYER_COMMON
        .iter()
        .chain(layer_specific(arch))
        .find(|(g, _)| *g == layer_stem)
        .map_or(MappedName::Unknown, |(_, hf)| {
            MappedName::Hf(format!("model.layers.{layer}.{hf}.{suffix}"))
        })
}

/// Inverse of [`gguf_to_hf_name`]: the GGUF name of an HF tensor name, `None` when unmapped.
pub fn hf_to_gguf_name(arch: &str, hf_name: &str) -> Option<String> {
    if let Some((layer, rest)) = hf_name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
    {
        let (module, suffix) = match rest.strip_suffix("_bias") {
            Some(m) => (m, "bias"),
            None => (rest, "weight"),
        };
        if let Some((g, _)) = bare_specific(arch).find(|(_, h)| *h == module) {
            return Some(format!("blk.{layer}.{g}.{suffix}"));
        }
    }
    let (module, suffix) = split_suffix(hf_name)?;
    if let Some((g, _)) = GLOBAL.iter().find(|(_, h)| *h == module) {
        return Some(format!("{g}.{suffix}"));
    }
    let rest = module.strip_prefix("model.layers.")?;
    let (layer, hf_module) = rest.split_once('.')?;
    let layer = layer.parse::<usize>().ok()?;
    LAYER_COMMON
        .iter()
        .chain(layer_specific(arch))
        .find(|(_, h)| *h == hf_module)
        .map(|(g, _)| format!("blk.{layer}.{g}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf(s: &str) -> MappedName {
        MappedName::Hf(s.to_string())
    }

    #[test]
    fn llama_and_gemma3_names() {
        assert_eq!(
            gguf_to_hf_name("llama", "token_embd.weight"),
            hf("model.embed_tokens.weight")
        );
        assert_eq!(
            gguf_to_hf_name("llama", "blk.12.ffn_norm.weight"),
            hf("model.layers.12.post_attention_layernorm.weight")
        );
        assert_eq!(
            gguf_to_hf_name("gemma3", "blk.0.ffn_norm.weight"),
            hf("model.layers.0.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            gguf_to_hf_name("gemma3", "blk.17.post_ffw_norm.weight"),
            hf("model.layers.17.post_feedforward_layernorm.weight")
        );
        assert_eq!(
            gguf_to_hf_name("qwen2", "blk.1.attn_q.bias"),
            hf("model.layers.1.self_attn.q_proj.bias")
        );
        assert_eq!(
            gguf_to_hf_name("llama", "rope_freqs.weight"),
            MappedName::NotAWeight
        );
        assert_eq!(
            gguf_to_hf_name("llama", "blk.x.attn_q.weight"),
            MappedName::Unknown
        );
        assert_eq!(
            gguf_to_hf_name("llama", "blk.0.post_ffw_norm.weight"),
            MappedName::Unknown
        );
        assert_eq!(gguf_to_hf_name("llama", "output"), MappedName::Unknown);
    }

    /// gpt-oss: sinks and stacked experts have bare HF names (`_bias` for biases).
    #[test]
    fn gpt_oss_names() {
        for (g, h) in [
            ("blk.2.attn_sinks.weight", "model.layers.2.self_attn.sinks"),
            (
                "blk.2.ffn_gate_exps.weight",
                "model.layers.2.mlp.experts.stacked_gate_proj",
            ),
            (
                "blk.2.ffn_down_exps.bias",
                "model.layers.2.mlp.experts.stacked_down_proj_bias",
            ),
            ("blk.2.ffn_gate_inp.bias", "model.layers.2.mlp.router.bias"),
            (
                "blk.2.post_attention_norm.weight",
                "model.layers.2.post_attention_layernorm.weight",
            ),
        ] {
            assert_eq!(gguf_to_hf_name("gpt-oss", g), hf(h), "{g}");
            assert_eq!(hf_to_gguf_name("gpt-oss", h).as_deref(), Some(g), "{h}");
        }
        assert_eq!(
            gguf_to_hf_name("llama", "blk.0.attn_sinks.weight"),
            MappedName::Unknown
        );
    }

    /// Mixtral (`llama`) and Qwen3-MoE (`qwen3moe`): the router is the canonical `mlp.gate`, the
    /// stacked experts have the bare `stacked_*` names gpt-oss's have.
    #[test]
    fn moe_names() {
        for arch in ["llama", "qwen3moe"] {
            for (g, h) in [
                (
                    "blk.1.ffn_gate_inp.weight",
                    "model.layers.1.mlp.gate.weight",
                ),
                (
                    "blk.1.ffn_gate_exps.weight",
                    "model.layers.1.mlp.experts.stacked_gate_proj",
                ),
                (
                    "blk.1.ffn_up_exps.weight",
                    "model.layers.1.mlp.experts.stacked_up_proj",
                ),
                (
                    "blk.1.ffn_down_exps.weight",
                    "model.layers.1.mlp.experts.stacked_down_proj",
                ),
                (
                    "blk.1.attn_q_norm.weight",
                    "model.layers.1.self_attn.q_norm.weight",
                ),
            ] {
                assert_eq!(gguf_to_hf_name(arch, g), hf(h), "{arch} {g}");
                assert_eq!(hf_to_gguf_name(arch, h).as_deref(), Some(g), "{arch} {h}");
            }
        }
    }

    #[test]
    fn inverse_round_trips() {
        for arch in ["llama", "gemma3", "starcoder2", "phi3"] {
            for g in [
                "output.weight",
                "blk.4.attn_k.weight",
                "blk.4.ffn_norm.weight",
                "blk.9.ffn_up.bias",
            ] {
                let MappedName::Hf(h) = gguf_to_hf_name(arch, g) else {
                    panic!("{arch} {g} unmapped");
                };
                assert_eq!(hf_to_gguf_name(arch, &h).as_deref(), Some(g), "{arch} {h}");
            }
        }
    }
}
