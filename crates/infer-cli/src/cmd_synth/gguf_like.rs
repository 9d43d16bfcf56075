//! `infer synth --like config.json --gguf PRESET [--vocab VOCAB.gguf]`: the GGUF header
//! llama.cpp's `convert_hf_to_gguf.py` + `llama-quantize PRESET` would write for that config —
//! its tensor names, `{arch}.*` metadata and the preset's per-tensor type mix — with the
//! tokenizer metadata (`tokenizer.*`) of a vocabulary-only GGUF (llama.cpp's
//! `models/ggml-vocab-*.gguf`), padded to the config's `vocab_size` as the converter pads
//! ([`vocab_metadata`]). The data is then streamed like any GGUF synth ([`super::gguf`]).
//!
//! MoE configs (Mixtral, written as llama.cpp's `llama` with experts; Qwen3-MoE as `qwen3moe`)
//! get per layer the router `ffn_gate_inp` (ggml dims `[n_embd, n_expert]`) and each
//! projection's experts stacked in one tensor, `ffn_gate_exps` / `ffn_up_exps` (`[n_embd,
//! n_ff_exp, n_expert]`) and `ffn_down_exps` (`[n_ff_exp, n_embd, n_expert]`), instead of
//! `ffn_gate` / `ffn_up` / `ffn_down`, and `{arch}.expert_count`, `{arch}.expert_used_count`
//! (qwen3moe: `expert_feed_forward_length`) — convert_hf_to_gguf.py's `LlamaModel` /
//! `Qwen2MoeModel` merge, gguf-py's `tensor_mapping.py` names, the shapes llama.cpp's
//! `load_arch_tensors` asks for.
//!
//! The type mix follows llama.cpp's `llama_tensor_get_type` for these presets: Q4_K_M stores
//! matrices in Q4_K except the output matrix (Q6_K; the token embeddings when tied),
//! `attn_v` / `ffn_down` (a MoE's `ffn_down_exps`) of the layers `use_more_bits` picks (Q6_K)
//! and, in what llama.cpp types a 70B model (80 layers), the other layers' `attn_v` (Q5_K);
//! Q4_0 stores Q4_0 with a Q6_K output; Q8_0 and F16 store every matrix in that type. With
//! exactly 8 experts (Mixtral-8x7B) `attn_v` and `attn_k` are Q8_0 in Q4_K_M and Q4_0, and
//! `attn_output` Q5_K in Q4_K_M. A MoE router and 1-D tensors are F32. A row length no K-quant
//! block divides falls back as llama.cpp does (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0), and to
//! F16 when no block divides it. Llama-3 RoPE scaling is written as plain RoPE (no `rope_freqs`
//! tensor, which llama.cpp treats as optional): both engines then run the same bytes.

use std::path::Path;

use anyhow::{bail, Context};
use infer_models::gguf::{GgufArray, GgufHeader, GgufTensorInfo, GgufValue, DEFAULT_ALIGNMENT};
use infer_models::{ModelConfig, RopeScaling};
use infer_quant::QuantFormat;

/// A llama-quantize preset (`--gguf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    Q4KM,
    Q4_0,
    Q8_0,
    F16,
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_uppercase().as_str() {
            "Q4_K_M" => Ok(Preset::Q4KM),
            "Q4_0" => Ok(Preset::Q4_0),
            "Q8_0" => Ok(Preset::Q8_0),
            "F16" => Ok(Preset::F16),
            _ => Err(format!(
                "unknown GGUF preset '{s}' (expected Q4_K_M, Q4_0, Q8_0 or F16)"
            )),
        }
    }
}

impl Preset {
    /// llama.cpp's `general.file_type` (`enum llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            Preset::F16 => 1,
            Preset::Q4_0 => 2,
            Preset::Q8_0 => 7,
            Preset::Q4KM => 15,
        }
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`: the first and last eighth of the layers and
/// every third one between get the bigger type in the `_M` presets.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2
}

/// What llama-quantize's type choice (`llama_tensor_get_type_impl`, src/llama-quant.cpp) reads
/// of the model besides a tensor's own name and shape.
#[derive(Clone, Copy, Debug)]
struct Mix {
    preset: Preset,
    /// `hparams.n_layer`: `use_more_bits`' second argument.
    n_layers: usize,
    /// `model.type == LLM_TYPE_70B` as llama.cpp's loader types the model: `llama` with 80
    /// layers and fewer KV heads than heads (src/models/llama.cpp), `qwen2` with 80 layers
    /// (src/models/qwen2.cpp). Its Q4_K `attn_v` becomes Q5_K.
    is_70b: bool,
    /// `hparams.n_expert == 8` (Mixtral-8x7B): `attn_v` and `attn_k` Q8_0 in every quantized
    /// preset ("bumping this to Q8_0 trades just ~128MB"), `attn_output` Q5_K in Q4_K_M.
    eight_experts: bool,
}

/// What a matrix is in the model (llama-quantize's `tensor_category`; decides its type in the
/// preset).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The output projection (the token embeddings when tied).
    Output,
    /// Untied token embeddings.
    Embedding,
    /// `attn_v` of layer `i`.
    AttnV(usize),
    /// `attn_k`.
    AttnK,
    /// `attn_output`.
    AttnOutput,
    /// `ffn_down` of layer `i`, or its experts `ffn_down_exps` (llama.cpp's `layer_info` reads
    /// a MoE's layer from the name, so the experts count as their layer's `ffn_down`).
    FfnDown(usize),
    /// A MoE router `ffn_gate_inp`: written F32 by the converter (its `FFN_GATE_INP` is among
    /// the tensors kept in float32) and never quantized by llama-quantize
    /// (`tensor_allows_quantization`: "do not quantize expert gating tensors").
    Router,
    Other,
}

/// The stored type of a matrix with rows of `row` values.
fn matrix_type(mix: Mix, role: Role, row: usize) -> QuantFormat {
    let more_bits = |i| use_more_bits(i, mix.n_layers);
    let want = match (mix.preset, role) {
        (_, Role::Router) => return QuantFormat::F32,
        (Preset::F16, _) => QuantFormat::F16,
        (Preset::Q8_0, _) => QuantFormat::Q8_0,
        (Preset::Q4_0 | Preset::Q4KM, Role::Output) => QuantFormat::Q6_K,
        (_, Role::AttnV(_) | Role::AttnK) if mix.eight_experts => QuantFormat::Q8_0,
        (Preset::Q4_0, _) => QuantFormat::Q4_0,
        (Preset::Q4KM, Role::AttnV(i) | Role::FfnDown(i)) if more_bits(i) => QuantFormat::Q6_K,
        (Preset::Q4KM, Role::AttnV(_)) if mix.is_70b => QuantFormat::Q5_K,
        (Preset::Q4KM, Role::AttnOutput) if mix.eight_experts => QuantFormat::Q5_K,
        (Preset::Q4KM, _) => QuantFormat::Q4_K,
    };
    // llama-quantize's `tensor_type_fallback`, then F16 when no block divides the row.
    let chain: &[QuantFormat] = match want {
        QuantFormat::Q4_K => &[QuantFormat::Q4_K, QuantFormat::Q5_0],
        QuantFormat::Q5_K => &[QuantFormat::Q5_K, QuantFormat::Q5_1],
        QuantFormat::Q6_K => &[QuantFormat::Q6_K, QuantFormat::Q8_0],
        QuantFormat::F16 => &[QuantFormat::F16],
        other => &[other, QuantFormat::F16],
    };
    chain
        .iter()
        .copied()
        .find(|f| row % f.block_elems() == 0)
        .unwrap_or(QuantFormat::F16)
}

/// llama.cpp's architecture name of a HF `model_type` this writer covers (convert_hf_to_gguf.py
/// writes Mixtral as `llama` with experts, Qwen3-MoE as `qwen3moe`).
fn gguf_arch(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "llama" | "mistral" | "mixtral" => "llama",
        "qwen2" => "qwen2",
        "qwen3" => "qwen3",
        "qwen3_moe" => "qwen3moe",
        "gemma3" | "gemma3_text" => "gemma3",
        _ => return None,
    })
}

/// The experts of a MoE config: `n` experts of width `width` (Mixtral's `intermediate_size`,
/// Qwen3-MoE's `moe_intermediate_size`), `used` per token.
struct Experts {
    n: usize,
    used: usize,
    width: usize,
}

/// llama.cpp's `llama_token_type` UNUSED (gguf-py `TokenType.UNUSED`).
const TOKEN_TYPE_UNUSED: i32 = 5;
/// The score convert_hf_to_gguf.py's `_create_vocab_sentencepiece` gives a padding token.
const PAD_SCORE: f32 = -10000.0;

/// The `tokenizer.*` metadata of the vocabulary GGUF `v` for a model of `vocab_size` tokens.
/// A vocabulary with fewer tokens is padded as convert_hf_to_gguf.py pads a tokenizer shorter
/// than the config's `vocab_size` (Qwen2.5-7B: 152064 for 151665 tokens; Gemma-3-4B: 262208
/// for 262145): token `i` of the gap is `[PAD{i}]` (its `get_vocab_base` and
/// `_create_vocab_sentencepiece`), typed UNUSED, scored -10000 where the vocabulary has
/// scores; merges and the special token ids are unchanged. More tokens than `vocab_size` is an
/// error.
fn vocab_metadata(
    path: &Path,
    v: &GgufHeader,
    vocab_size: usize,
    like: &Path,
) -> anyhow::Result<Vec<(String, GgufValue)>> {
    let tokens = v.metadata.iter().find_map(|(key, val)| match val {
        GgufValue::Array(GgufArray::String(a)) if key == "tokenizer.ggml.tokens" => Some(a.len()),
        _ => None,
    });
    let have = match tokens {
        Some(t) if t <= vocab_size => t,
        Some(t) => bail!(
            "{}: {t} tokens, more than vocab_size {vocab_size} of {}: pass the vocabulary of this model family",
            path.display(),
            like.display(),
        ),
        None => bail!("{}: no tokenizer.ggml.tokens", path.display()),
    };
    let mut md: Vec<(String, GgufValue)> = Vec::new();
    for (key, val) in v
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
    {
        let mut val = val.clone();
        if have < vocab_size {
            let gap = have..vocab_size;
            match (key.as_str(), &mut val) {
                ("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(a))) => {
                    a.extend(gap.map(|i| format!("[PAD{i}]")))
                }
                ("tokenizer.ggml.token_type", GgufValue::Array(GgufArray::I32(a))) if a.len() == have => {
                    a.extend(gap.map(|_| TOKEN_TYPE_UNUSED))
                }
                ("tokenizer.ggml.scores", GgufValue::Array(GgufArray::F32(a))) if a.len() == have => {
                    a.extend(gap.map(|_| PAD_SCORE))
                }
                ("tokenizer.ggml.token_type" | "tokenizer.ggml.scores", _) => bail!(
                    "{}: {key} is not one entry per token (I32 types, F32 scores): cannot pad it to vocab_size {vocab_size}",
                    path.display()
                ),
                _ => {}
            }
        }
        md.push((key.clone(), val));
    }
    Ok(md)
}

/// The GGUF header of `cfg` (read from `like`) in `preset`, with the `tokenizer.*` metadata of
/// `vocab` when given (padded to the config's `vocab_size`, [`vocab_metadata`]). Errors: a
/// family this writer does not cover (qwen2_moe's shared experts, fused-tensor families), a
/// vocabulary with more tokens than the config's `vocab_size`, a header whose offsets overflow.
pub fn header(
    cfg: &ModelConfig,
    preset: Preset,
    vocab: Option<(&Path, &GgufHeader)>,
    like: &Path,
) -> anyhow::Result<GgufHeader> {
    let Some(arch) = gguf_arch(&cfg.model_type) else {
        bail!(
            "{}: --gguf covers the llama, mistral, mixtral, qwen2, qwen3, qwen3_moe and gemma3 families, not model_type '{}'",
            like.display(),
            cfg.model_type
        );
    };
    let experts = (cfg.num_experts > 0).then(|| Experts {
        n: cfg.num_experts,
        used: cfg.num_experts_per_tok,
        width: cfg.moe_intermediate_size.unwrap_or(cfg.intermediate_size),
    });
    let (h, inter, n) = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_hidden_layers,
    );
    let (hd, qd, kvd) = (
        cfg.head_dim,
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    );
    let u32v = |v: usize| -> anyhow::Result<GgufValue> {
        Ok(GgufValue::U32(u32::try_from(v).with_context(|| {
            format!("{}: {v} does not fit a GGUF u32", like.display())
        })?))
    };
    let k = |s: &str| format!("{arch}.{s}");
    let mut md: Vec<(String, GgufValue)> = vec![
        (
            "general.architecture".into(),
            GgufValue::String(arch.into()),
        ),
        (
            "general.name".into(),
            GgufValue::String(format!("infer synth of {}", like.display())),
        ),
        (
            "general.file_type".into(),
            GgufValue::U32(preset.file_type()),
        ),
        ("general.quantization_version".into(), GgufValue::U32(2)),
        (k("context_length"), u32v(cfg.max_position_embeddings)?),
        (k("embedding_length"), u32v(h)?),
        (k("block_count"), u32v(n)?),
        (k("feed_forward_length"), u32v(inter)?),
        (k("attention.head_count"), u32v(cfg.num_attention_heads)?),
        (k("attention.head_count_kv"), u32v(cfg.num_key_value_heads)?),
        (k("attention.key_length"), u32v(hd)?),
        (k("attention.value_length"), u32v(hd)?),
        (
            k("rope.dimension_count"),
            u32v((hd as f64 * cfg.partial_rotary_factor) as usize)?,
        ),
        (k("rope.freq_base"), GgufValue::F32(cfg.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            GgufValue::F32(cfg.norm_eps as f32),
        ),
    ];
    // convert_hf_to_gguf.py `TextModel.set_gguf_parameters` (`add_expert_count`,
    // `add_expert_used_count`), `Qwen2MoeModel` (`add_expert_feed_forward_length`; llama.cpp's
    // `qwen3moe` reads it, its `llama` takes the experts' width from `feed_forward_length`).
    if let Some(e) = &experts {
        md.push((k("expert_count"), u32v(e.n)?));
        md.push((k("expert_used_count"), u32v(e.used)?));
        if arch == "qwen3moe" {
            md.push((k("expert_feed_forward_length"), u32v(e.width)?));
        }
    }
    if let Some(RopeScaling::Linear { factor }) = cfg.rope_scaling {
        md.push((k("rope.scaling.type"), GgufValue::String("linear".into())));
        md.push((k("rope.scaling.factor"), GgufValue::F32(factor as f32)));
    }
    if arch == "gemma3" {
        if let Some(w) = cfg.sliding_window {
            md.push((k("attention.sliding_window"), u32v(w)?));
        }
    }
    if let Some((path, v)) = vocab {
        md.extend(vocab_metadata(path, v, cfg.vocab_size, like)?);
    }

    // (name, ggml dims fastest first (row length first), type)
    let mut t: Vec<(String, Vec<usize>, QuantFormat)> = Vec::new();
    let mix = Mix {
        preset,
        n_layers: n,
        eight_experts: cfg.num_experts == 8,
        is_70b: n == 80
            && match arch {
                "llama" => cfg.num_key_value_heads != cfg.num_attention_heads,
                "qwen2" => true,
                _ => false,
            },
    };
    let mut mat = |name: String, dims: &[usize], role: Role| {
        let f = matrix_type(mix, role, dims[0]);
        t.push((name, dims.to_vec(), f));
    };
    let tied = cfg.tie_word_embeddings;
    let emb_role = if tied { Role::Output } else { Role::Embedding };
    mat("token_embd.weight".into(), &[h, cfg.vocab_size], emb_role);
    for i in 0..n {
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        mat(b("attn_q"), &[h, qd], Role::Other);
        mat(b("attn_k"), &[h, kvd], Role::AttnK);
        mat(b("attn_v"), &[h, kvd], Role::AttnV(i));
        mat(b("attn_output"), &[qd, h], Role::AttnOutput);
        match &experts {
            None => {
                mat(b("ffn_gate"), &[h, inter], Role::Other);
                mat(b("ffn_up"), &[h, inter], Role::Other);
                mat(b("ffn_down"), &[inter, h], Role::FfnDown(i));
            }
            // llama.cpp's `LLM_TENSOR_FFN_GATE_INP` and `FFN_{GATE,UP,DOWN}_EXPS`
            // (src/models/llama.cpp, qwen3moe.cpp `load_arch_tensors`): each projection's
            // experts stacked on the slowest axis.
            Some(e) => {
                mat(b("ffn_gate_inp"), &[h, e.n], Role::Router);
                mat(b("ffn_gate_exps"), &[h, e.width, e.n], Role::Other);
                mat(b("ffn_up_exps"), &[h, e.width, e.n], Role::Other);
                mat(b("ffn_down_exps"), &[e.width, h, e.n], Role::FfnDown(i));
            }
        }
    }
    if !tied {
        mat("output.weight".into(), &[h, cfg.vocab_size], Role::Output);
    }
    let mut vec1 = |name: String, len: usize| t.push((name, vec![len], QuantFormat::F32));
    for i in 0..n {
        vec1(format!("blk.{i}.attn_norm.weight"), h);
        vec1(format!("blk.{i}.ffn_norm.weight"), h);
        if cfg.attention_bias {
            vec1(format!("blk.{i}.attn_q.bias"), qd);
            vec1(format!("blk.{i}.attn_k.bias"), kvd);
            vec1(format!("blk.{i}.attn_v.bias"), kvd);
        }
        if matches!(arch, "qwen3" | "qwen3moe" | "gemma3") {
            vec1(format!("blk.{i}.attn_q_norm.weight"), hd);
            vec1(format!("blk.{i}.attn_k_norm.weight"), hd);
        }
        if arch == "gemma3" {
            vec1(format!("blk.{i}.post_attention_norm.weight"), h);
            vec1(format!("blk.{i}.post_ffw_norm.weight"), h);
        }
    }
    vec1("output_norm.weight".into(), h);

    let align = DEFAULT_ALIGNMENT;
    let mut offset = 0usize;
    let mut tensors = Vec::with_capacity(t.len());
    for (name, dims, format) in t {
        let n_elems = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let n_bytes = n_elems
            .map(|e| format.bytes_for(e))
            .with_context(|| format!("{}: tensor '{name}' is too large", like.display()))??;
        tensors.push(GgufTensorInfo {
            name,
            dims,
            format,
            offset,
            n_bytes,
        });
        offset = offset
            .checked_add(n_bytes.div_ceil(align) * align)
            .with_context(|| format!("{}: the data section overflows", like.display()))?;
    }
    Ok(GgufHeader {
        version: 3,
        metadata: md,
        tensors,
        alignment: align,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(preset: Preset, n_layers: usize) -> Mix {
        Mix {
            preset,
            n_layers,
            is_70b: false,
            eight_experts: false,
        }
    }

    /// A vocabulary shorter than `vocab_size` is padded with `[PAD{i}]` (absolute id), UNUSED,
    /// score -10000 — convert_hf_to_gguf.py's padding —; merges and scalars are unchanged, other
    /// keys dropped; an equal count is copied as is; more tokens, or a token_type array not one
    /// per token, is refused.
    #[test]
    fn vocab_is_padded_as_the_converter_pads() {
        let strs = |v: &[&str]| GgufArray::String(v.iter().map(|s| s.to_string()).collect());
        let v = GgufHeader {
            version: 3,
            metadata: vec![
                ("general.name".into(), GgufValue::String("v".into())),
                (
                    "tokenizer.ggml.model".into(),
                    GgufValue::String("gpt2".into()),
                ),
                (
                    "tokenizer.ggml.tokens".into(),
                    GgufValue::Array(strs(&["a", "b", "c"])),
                ),
                (
                    "tokenizer.ggml.token_type".into(),
                    GgufValue::Array(GgufArray::I32(vec![1, 1, 3])),
                ),
                (
                    "tokenizer.ggml.scores".into(),
                    GgufValue::Array(GgufArray::F32(vec![0.0, -1.0, -2.0])),
                ),
                (
                    "tokenizer.ggml.merges".into(),
                    GgufValue::Array(strs(&["a b"])),
                ),
                ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(2)),
            ],
            tensors: vec![],
            alignment: DEFAULT_ALIGNMENT,
        };
        let (p, like) = (Path::new("v.gguf"), Path::new("config.json"));
        let md = vocab_metadata(p, &v, 5, like).unwrap();
        let get = |k: &str| md.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert!(get("general.name").is_none());
        assert_eq!(md.len(), 6);
        assert_eq!(
            get("tokenizer.ggml.tokens"),
            Some(GgufValue::Array(strs(&["a", "b", "c", "[PAD3]", "[PAD4]"])))
        );
        assert_eq!(
            get("tokenizer.ggml.token_type"),
            Some(GgufValue::Array(GgufArray::I32(vec![1, 1, 3, 5, 5])))
        );
        assert_eq!(
            get("tokenizer.ggml.scores"),
            Some(GgufValue::Array(GgufArray::F32(vec![
                0.0, -1.0, -2.0, -10000.0, -10000.0
            ])))
        );
        assert_eq!(
            get("tokenizer.ggml.merges"),
            Some(GgufValue::Array(strs(&["a b"])))
        );
        assert_eq!(get("tokenizer.ggml.eos_token_id"), Some(GgufValue::U32(2)));
        let same = vocab_metadata(p, &v, 3, like).unwrap();
        assert_eq!(same[..], v.metadata[1..]);
        let err = vocab_metadata(p, &v, 2, like).unwrap_err().to_string();
        assert!(err.contains("3 tokens, more than vocab_size 2"), "{err}");
        let mut bad = v.clone();
        bad.metadata[3].1 = GgufValue::Array(GgufArray::U8(vec![1, 1, 3]));
        let err = vocab_metadata(p, &bad, 5, like).unwrap_err().to_string();
        assert!(
            err.contains("token_type is not one entry per token"),
            "{err}"
        );
    }

    #[test]
    fn q4_k_m_mix_follows_llama_cpp() {
        // 32 layers (Llama-3.1-8B): Q6_K attn_v/ffn_down on layers 0-3, 28-31 and every third.
        let more: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(
            more,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        let f = |role, row| matrix_type(mix(Preset::Q4KM, 32), role, row);
        assert_eq!(f(Role::Other, 4096), QuantFormat::Q4_K);
        assert_eq!(f(Role::AttnV(0), 4096), QuantFormat::Q6_K);
        assert_eq!(f(Role::FfnDown(0), 4096), QuantFormat::Q6_K);
        assert_eq!(f(Role::AttnV(4), 4096), QuantFormat::Q4_K);
        assert_eq!(f(Role::FfnDown(4), 4096), QuantFormat::Q4_K);
        assert_eq!(f(Role::Output, 4096), QuantFormat::Q6_K);
        assert_eq!(f(Role::Embedding, 4096), QuantFormat::Q4_K);
        // Rows no K-quant block divides: llama.cpp's fallbacks.
        assert_eq!(f(Role::Other, 576), QuantFormat::Q5_0);
        assert_eq!(f(Role::Output, 640), QuantFormat::Q8_0);
        assert_eq!(f(Role::Other, 144), QuantFormat::F16);
        let q40 = |role| matrix_type(mix(Preset::Q4_0, 32), role, 4096);
        assert_eq!(q40(Role::Output), QuantFormat::Q6_K);
        assert_eq!(q40(Role::AttnV(0)), QuantFormat::Q4_0);
        assert_eq!(
            matrix_type(mix(Preset::Q8_0, 32), Role::Output, 4096),
            QuantFormat::Q8_0
        );
    }

    /// llama.cpp's `LLM_TYPE_70B` (Llama-3.1-70B: 80 layers): Q5_K `attn_v` where
    /// `use_more_bits` leaves Q4_K (Q5_1 when no 256-block divides the row), Q6_K where it
    /// picks; `ffn_down` and the other presets are unchanged.
    #[test]
    fn q4_k_m_70b_gets_q5_k_attn_v() {
        let m70 = |preset| Mix {
            is_70b: true,
            ..mix(preset, 80)
        };
        let f = |role, row| matrix_type(m70(Preset::Q4KM), role, row);
        assert!(use_more_bits(0, 80) && !use_more_bits(10, 80));
        assert_eq!(f(Role::AttnV(10), 8192), QuantFormat::Q5_K);
        assert_eq!(f(Role::AttnV(10), 160), QuantFormat::Q5_1);
        assert_eq!(f(Role::AttnV(0), 8192), QuantFormat::Q6_K);
        assert_eq!(f(Role::FfnDown(10), 28672), QuantFormat::Q4_K);
        assert_eq!(f(Role::Other, 8192), QuantFormat::Q4_K);
        assert_eq!(
            matrix_type(m70(Preset::Q4_0), Role::AttnV(10), 8192),
            QuantFormat::Q4_0
        );
    }

    /// MoE: the router stays F32 in every preset; Mixtral's 8 experts (32 layers) get Q8_0
    /// `attn_v` / `attn_k` in the quantized presets and Q5_K `attn_output` in Q4_K_M; the
    /// experts' `ffn_down_exps` follow `use_more_bits` like a dense `ffn_down`. Qwen3-MoE's 128
    /// experts change nothing but the router.
    #[test]
    fn moe_mix_follows_llama_cpp() {
        let mixtral = |preset| Mix {
            eight_experts: true,
            ..mix(preset, 32)
        };
        for p in [Preset::F16, Preset::Q8_0, Preset::Q4_0, Preset::Q4KM] {
            assert_eq!(
                matrix_type(mixtral(p), Role::Router, 4096),
                QuantFormat::F32
            );
            assert_eq!(
                matrix_type(mix(p, 48), Role::Router, 2048),
                QuantFormat::F32
            );
        }
        let f = |p, role| matrix_type(mixtral(p), role, 4096);
        for role in [Role::AttnV(0), Role::AttnV(4), Role::AttnK] {
            assert_eq!(f(Preset::Q4KM, role), QuantFormat::Q8_0);
            assert_eq!(f(Preset::Q4_0, role), QuantFormat::Q8_0);
            assert_eq!(f(Preset::F16, role), QuantFormat::F16);
        }
        assert_eq!(f(Preset::Q4KM, Role::AttnOutput), QuantFormat::Q5_K);
        assert_eq!(f(Preset::Q4_0, Role::AttnOutput), QuantFormat::Q4_0);
        assert_eq!(f(Preset::Q4KM, Role::FfnDown(0)), QuantFormat::Q6_K);
        assert_eq!(f(Preset::Q4KM, Role::FfnDown(4)), QuantFormat::Q4_K);
        assert_eq!(f(Preset::Q4KM, Role::Other), QuantFormat::Q4_K);
        assert_eq!(f(Preset::Q4KM, Role::Output), QuantFormat::Q6_K);
        let q3 = |role| matrix_type(mix(Preset::Q4KM, 48), role, 2048);
        assert_eq!(q3(Role::AttnK), QuantFormat::Q4_K);
        assert_eq!(q3(Role::AttnOutput), QuantFormat::Q4_K);
        assert_eq!(q3(Role::AttnV(0)), QuantFormat::Q6_K);
        assert_eq!(
            matrix_type(mix(Preset::Q4KM, 48), Role::FfnDown(7), 768),
            QuantFormat::Q4_K
        );
    }
}
