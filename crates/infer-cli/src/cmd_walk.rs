//! `infer walk`: which FFN features fire for the last token of a prompt, and what they write.
//!
//! For each layer (or `--layer L`), with x the last token's FFN input (after the pre-FFN norm,
//! from `Model::forward_with_ffn_inputs`), every feature i gets its gate score gᵢ·x (+ gate
//! bias), up score uᵢ·x (+ up bias) and activation act(gᵢ·x)·(uᵢ·x) (gated FFN) or act(uᵢ·x)
//! (non-gated). The `--top` features by |activation| are listed with the tokens they promote:
//! the top tokens of dᵢ projected through the unembedding when the activation is positive, the
//! bottom ones (those of −dᵢ) when it is negative, read from `down_meta.bin`
//! (`infer extract --down-meta`; see `infer_vindex::down_meta` for the score: the final norm
//! weight is applied, the 1/RMS scale is not).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use infer_compute::ops::{gelu, gelu_tanh, silu};
use infer_compute::{ComputeBackend, CpuBackend};
use infer_inference::layer::Ffn;
use infer_inference::{Model, Tokenizer};
use infer_models::arch::{Activation, FfnType};
use infer_vindex::{FloatSlice, Tier, Vindex};
use rayon::prelude::*;
use serde_json::{json, Value};

use crate::format_args::FormatArgs;

/// Arguments of `infer walk`.
#[derive(Args)]
pub struct WalkArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
    /// Prompt text (the tokenizer's BOS rule applies); the last token is inspected.
    pub prompt: String,
    /// Only this layer (default: every layer).
    #[arg(long)]
    pub layer: Option<usize>,
    /// Features listed per layer, by |activation|.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub top: u64,
    /// Tokens shown per feature from down_meta.bin (at most what it stores).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub tokens: u64,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub formats: FormatArgs,
}

/// One listed feature.
struct Feature {
    index: usize,
    gate: Option<f32>,
    up: f32,
    act: f32,
    /// Tokens the feature promotes at its activation's sign, from down_meta.bin: (token id,
    /// decoded text, score of sign(act)·dᵢ, so larger = more promoted).
    tokens: Vec<(u32, String, f32)>,
}

/// What walk found in one layer.
enum LayerReport {
    Dense {
        layer: usize,
        x_norm: f32,
        features: Vec<Feature>,
    },
    /// A MoE layer or one without dense FFN matrices.
    Skipped { layer: usize, reason: String },
}

fn act_fn(a: Activation) -> fn(f32) -> f32 {
    match a {
        Activation::Silu => silu,
        Activation::GeluTanh => gelu_tanh,
        Activation::Gelu => gelu,
    }
}

/// `y = M·x` for `M` `[n, k]` in its stored dtype (f16 rows widened on the fly). Errors: the
/// backend's.
fn matvec(
    backend: &dyn ComputeBackend,
    m: FloatSlice<'_>,
    x: &[f32],
    n: usize,
) -> anyhow::Result<Vec<f32>> {
    let k = x.len();
    let mut y = vec![0.0f32; n];
    match m {
        FloatSlice::F32(s) => backend.gemv(s, x, n, k, &mut y)?,
        FloatSlice::F16(s) => y.par_iter_mut().enumerate().for_each(|(i, yi)| {
            *yi = s[i * k..(i + 1) * k]
                .iter()
                .zip(x)
                .map(|(w, v)| w.to_f32() * v)
                .sum();
        }),
        // The float tier's FFN files hold F32/F16 only (checked at open).
        FloatSlice::Blocks { .. } => backend.gemv(&m.to_f32_vec(), x, n, k, &mut y)?,
    }
    Ok(y)
}

/// `y = W·x` for a layer's FFN matrix as the model holds it (a vindex without a float tier:
/// the quantized tier's rows, dequantized by the product). `None` when it has no such matrix.
fn model_matvec(
    backend: &dyn ComputeBackend,
    ffn: &Ffn<'_>,
    gate: bool,
    x: &[f32],
    n: usize,
) -> anyhow::Result<Option<Vec<f32>>> {
    let mut y = vec![0.0f32; n];
    match ffn {
        Ffn::Dense(d) => {
            let Some(lin) = (if gate { d.gate.as_ref() } else { Some(&d.up) }) else {
                return Ok(None);
            };
            backend.linear(&lin.matrix(), x, 1, &mut y)?;
        }
        Ffn::Walk(w) => {
            let Some(rows) = (if gate { w.gate.as_ref() } else { Some(&w.up) }) else {
                return Ok(None);
            };
            rows.matmul_transb(backend, x, 1, x.len(), n, &mut y)?;
        }
        Ffn::Moe(_) => return Ok(None),
    }
    Ok(Some(y))
}

/// A 1-D bias by key, when the architecture names one and the vindex holds it.
fn bias(v: &Vindex, key: Option<String>, n: usize) -> anyhow::Result<Option<Vec<f32>>> {
    let Some(key) = key.filter(|k| v.has_tensor(k)) else {
        return Ok(None);
    };
    let (s, _) = v.tensor(&key)?;
    if s.len() != n {
        bail!(
            "{}: bias '{key}' has {} values, expected {n}",
            v.path().display(),
            s.len()
        );
    }
    Ok(Some(s.to_f32_vec()))
}

fn add(y: &mut [f32], b: Option<Vec<f32>>) {
    if let Some(b) = b {
        y.iter_mut().zip(b).for_each(|(a, b)| *a += b);
    }
}

/// What every layer's walk reads.
struct Ctx<'a> {
    v: &'a Vindex,
    model: &'a Model<'a>,
    tok: &'a Tokenizer,
    backend: &'a dyn ComputeBackend,
    /// Features listed per layer.
    top: usize,
    /// down_meta tokens shown per feature.
    n_tokens: usize,
}

/// Scores and the top features of layer `l` for FFN input `x` `[hidden]`.
fn walk_layer(c: &Ctx<'_>, l: usize, x: &[f32]) -> anyhow::Result<LayerReport> {
    let (v, backend, tok) = (c.v, c.backend, c.tok);
    let (top, n_tokens) = (c.top, c.n_tokens);
    let arch = c.model.arch.as_ref();
    let entries = &v.index().layers[l];
    let skipped = |reason: &str| LayerReport::Skipped {
        layer: l,
        reason: reason.into(),
    };
    if arch.num_experts_for_layer(l) > 0 {
        return Ok(skipped("is MoE: not supported by walk"));
    }
    let float_rows = entries.up.is_some() && entries.down.is_some();
    let ffn = &c.model.layers[l].ffn;
    if !float_rows && matches!(ffn, Ffn::Moe(_)) {
        return Ok(skipped("has no dense FFN: not supported by walk"));
    }
    let n = c.model.layers[l].geometry.intermediate_size;
    let act = act_fn(arch.activation());
    // The float tier's rows when the vindex has them, else the quantized tier's (the model's).
    let scores = |gate: bool| -> anyhow::Result<Vec<f32>> {
        if float_rows {
            let m = if gate {
                v.gate_layer(l)?
            } else {
                v.up_layer(l)?
            };
            return matvec(backend, m, x, n);
        }
        model_matvec(backend, ffn, gate, x, n)?.with_context(|| {
            format!(
                "layer {l}: no FFN {} rows",
                if gate { "gate" } else { "up" }
            )
        })
    };
    let mut up = scores(false)?;
    add(&mut up, bias(v, arch.ffn_up_bias_key(l), n)?);
    let gate = match arch.ffn_type() {
        FfnType::Gated => {
            let mut g = scores(true)?;
            add(&mut g, bias(v, arch.ffn_gate_bias_key(l), n)?);
            Some(g)
        }
        FfnType::Standard => None,
    };
    let acts: Vec<f32> = match &gate {
        Some(g) => g.iter().zip(&up).map(|(&g, &u)| act(g) * u).collect(),
        None => up.iter().map(|&u| act(u)).collect(),
    };
    let mut order: Vec<usize> = (0..n).collect();
    let key = |i: usize| acts[i].abs();
    let top = top.min(n);
    if top < n {
        order.select_nth_unstable_by(top - 1, |&a, &b| key(b).total_cmp(&key(a)));
        order.truncate(top);
    }
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    let meta = v.down_meta(l)?;
    let mut features = Vec::with_capacity(top);
    for i in order {
        // A negative activation writes −dᵢ: it promotes the bottom of dᵢ's list, whose score
        // for −dᵢ is −score.
        let sign = if acts[i] < 0.0 { -1.0 } else { 1.0 };
        let tokens = match meta.as_ref().and_then(|m| m.promoted(i, acts[i])) {
            Some(recs) => recs
                .iter()
                .take(n_tokens)
                .map(|r| {
                    let text = tok.decode(&[r.token], false)?;
                    Ok((r.token, text, sign * r.score))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        features.push(Feature {
            index: i,
            gate: gate.as_ref().map(|g| g[i]),
            up: up[i],
            act: acts[i],
            tokens,
        });
    }
    Ok(LayerReport::Dense {
        layer: l,
        x_norm: x.iter().map(|v| v * v).sum::<f32>().sqrt(),
        features,
    })
}

/// Top `k` of the final logits as (id, text, logit).
fn next_tokens(
    tok: &Tokenizer,
    logits: &[f32],
    k: usize,
) -> anyhow::Result<Vec<(u32, String, f32)>> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order
        .into_iter()
        .take(k)
        .map(|i| Ok((i as u32, tok.decode(&[i as u32], false)?, logits[i])))
        .collect()
}

fn text_report(
    args: &WalkArgs,
    scores_from: &str,
    tokens: &[u32],
    last: &str,
    has_meta: bool,
    layers: &[LayerReport],
    next: &[(u32, String, f32)],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "walk {}: {} prompt tokens; inspecting the last token {last:?} (position {})",
        args.vindex.display(),
        tokens.len(),
        tokens.len() - 1
    );
    if !has_meta {
        let _ = writeln!(
            s,
            "(no down_meta.bin in this vindex: features only; add top tokens with \
             `infer extract SOURCE -o VINDEX --down-meta --float f32 --force`)"
        );
    }
    let _ = writeln!(s, "(gate/up scores from {scores_from})");
    for r in layers {
        match r {
            LayerReport::Skipped { layer, reason } => {
                let _ = writeln!(s, "layer {layer} {reason}");
            }
            LayerReport::Dense {
                layer,
                x_norm,
                features,
            } => {
                let _ = writeln!(s, "layer {layer} (|x| = {x_norm:.3})");
                let _ = writeln!(
                    s,
                    "  {:>7} {:>9} {:>9} {:>9}  tokens promoted by act·d_i (score of ±d_i)",
                    "feature", "gate", "up", "act"
                );
                for f in features {
                    let gate = f.gate.map_or("-".to_string(), |g| format!("{g:.3}"));
                    let toks: Vec<String> = f
                        .tokens
                        .iter()
                        .map(|(_, t, sc)| format!("{t:?} ({sc:.2})"))
                        .collect();
                    let _ = writeln!(
                        s,
                        "  {:>7} {gate:>9} {:>9.3} {:>9.3}  {}",
                        f.index,
                        f.up,
                        f.act,
                        toks.join(", ")
                    );
                }
            }
        }
    }
    let nt: Vec<String> = next
        .iter()
        .map(|(_, t, l)| format!("{t:?} ({l:.2})"))
        .collect();
    let _ = writeln!(s, "next token (logits): {}", nt.join(", "));
    s
}

fn json_report(
    args: &WalkArgs,
    scores_from: &str,
    tokens: &[u32],
    has_meta: bool,
    layers: &[LayerReport],
    next: &[(u32, String, f32)],
) -> Value {
    let toks = |v: &[(u32, String, f32)], name: &str| -> Value {
        v.iter()
            .map(|(id, t, sc)| json!({"id": id, "text": t, name: sc}))
            .collect()
    };
    let layers: Vec<Value> = layers
        .iter()
        .map(|r| match r {
            LayerReport::Skipped { layer, reason } => {
                json!({"layer": layer, "skipped": reason})
            }
            LayerReport::Dense {
                layer,
                x_norm,
                features,
            } => json!({
                "layer": layer,
                "x_norm": x_norm,
                "features": features.iter().map(|f| json!({
                    "feature": f.index,
                    "gate": f.gate,
                    "up": f.up,
                    "activation": f.act,
                    "tokens": toks(&f.tokens, "score"),
                })).collect::<Vec<_>>(),
            }),
        })
        .collect();
    json!({
        "vindex": args.vindex.display().to_string(),
        "prompt": args.prompt,
        "tokens": tokens,
        "position": tokens.len() - 1,
        "down_meta": has_meta,
        "scores_from": scores_from,
        "layers": layers,
        "next_tokens": toks(next, "logit"),
    })
}

/// Run the prompt, then report per layer the top features of the last token.
pub fn run(args: WalkArgs) -> anyhow::Result<()> {
    let v = Vindex::open(&args.vindex)
        .with_context(|| format!("opening vindex {}", args.vindex.display()))?;
    let tok_json = v
        .tokenizer_json()
        .with_context(|| format!("{}: walk needs the tokenizer", args.vindex.display()))?;
    let tok = Tokenizer::from_json(&tok_json)
        .with_context(|| format!("{}: tokenizer.json", args.vindex.display()))?;
    let model = crate::cmd_run::build_model(&v, &args.vindex, &args.formats)?;
    let layers: Vec<usize> = match args.layer {
        Some(l) if l >= v.num_layers() => bail!(
            "--layer {l}: the model has {} layers (0..={})",
            v.num_layers(),
            v.num_layers().saturating_sub(1)
        ),
        Some(l) => vec![l],
        None => (0..v.num_layers()).collect(),
    };
    let has_meta = v.down_meta_header()?.is_some();
    let tokens = tok.encode(&args.prompt, true)?;
    if tokens.is_empty() {
        bail!("the prompt is empty: give some text to inspect");
    }
    let max = model.arch.config().max_position_embeddings.max(1);
    if tokens.len() > max {
        bail!(
            "the prompt has {} tokens, more than the model's {max}",
            tokens.len()
        );
    }
    let backend = CpuBackend::new();
    let mut cache = model.new_cache(tokens.len());
    let (logits, inputs) = model.forward_with_ffn_inputs(&backend, &tokens, &mut cache)?;
    if inputs.len() != v.num_layers() {
        bail!(
            "the forward pass returned {} FFN inputs for {} layers",
            inputs.len(),
            v.num_layers()
        );
    }
    let ctx = Ctx {
        v: &v,
        model: &model,
        tok: &tok,
        backend: &backend,
        top: args.top as usize,
        n_tokens: args.tokens as usize,
    };
    let mut reports = Vec::with_capacity(layers.len());
    for &l in &layers {
        let x = &inputs[l];
        if x.iter().any(|v| !v.is_finite()) {
            bail!(
                "{}: layer {l}'s FFN input is not finite",
                args.vindex.display()
            );
        }
        reports.push(walk_layer(&ctx, l, x)?);
    }
    let next = next_tokens(&tok, &logits, 5)?;
    let float = v.has_tier(Tier::F32) || v.has_tier(Tier::F16);
    let scores_from = if float {
        "the float tier".to_string()
    } else {
        let tier = if v.has_tier(Tier::Q4K) { "q4k" } else { "q4" };
        format!("the {tier} tier's rows, dequantized (this vindex has no float tier)")
    };
    if args.json {
        let doc = json_report(&args, &scores_from, &tokens, has_meta, &reports, &next);
        crate::print_stdout(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
    } else {
        let last = tok.decode(&tokens[tokens.len() - 1..], false)?;
        crate::print_stdout(&text_report(
            &args,
            &scores_from,
            &tokens,
            &last,
            has_meta,
            &reports,
            &next,
        ));
    }
    Ok(())
}
