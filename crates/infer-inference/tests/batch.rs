//! The batched forward pass ([`Model::forward_batch`]): each sequence of a mixed batch
//! (prompt chunks and decode tokens of several sequences in one step) gets the logits it gets
//! when it runs alone through [`Model::forward`] with the same chunks, within 1e-5 × std of
//! those logits, and the same greedy tokens — on every archrefs family (float tier and the
//! default quantized plan) and on the two real models (default quantized plan).

mod common;

use common::*;
use infer_compute::CpuBackend;
use infer_inference::forward::{BatchBuffers, BatchSeq, Logits};
use infer_inference::{AttnChoice, FfnChoice, FormatRequest, KvCache, LmHeadChoice, Model};
use infer_vindex::Vindex;

/// max |Δ| ≤ TOL × std(logits of the sequence run alone).
const TOL: f64 = 1e-5;

const FLOAT: FormatRequest = FormatRequest {
    attn: AttnChoice::F32,
    ffn: FfnChoice::Walk,
    lm_head: LmHeadChoice::F32,
};

/// One sequence of the scenario: its chunk of each step (empty: not in that step's batch) and,
/// after the prompt chunks, `decode` greedy tokens.
struct Script {
    chunks: Vec<Vec<u32>>,
    decode: usize,
}

/// Run `scripts` alone (one sequence at a time, the same chunks, then greedy decode): the logits
/// of every step (`Logits::All` for the first chunk, `Last` after) and the greedy tokens.
fn alone(model: &Model<'_>, script: &Script, ctx: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let backend = CpuBackend::new();
    let mut cache = model.new_cache(ctx);
    let mut out = Vec::new();
    for (i, c) in script.chunks.iter().filter(|c| !c.is_empty()).enumerate() {
        let which = if i == 0 { Logits::All } else { Logits::Last };
        out.push(
            model
                .forward(&backend, c, &mut cache, which)
                .expect("alone"),
        );
    }
    let mut tokens = Vec::new();
    for _ in 0..script.decode {
        let last = out.last().expect("a chunk ran");
        let tok = infer_inference::sampling::argmax(&last[last.len() - model.vocab_size..]);
        tokens.push(tok);
        out.push(
            model
                .forward(&backend, &[tok], &mut cache, Logits::Last)
                .expect("alone decode"),
        );
    }
    (out, tokens)
}

/// Run every script in one batch per step: step `i` holds each sequence's chunk `i` (if any)
/// and the decode tokens of sequences whose chunks are done (up to their `decode` count).
/// `greedy`: through [`Model::forward_batch_greedy`], the decode tokens being its choices (no
/// logits are returned then).
fn batched(
    model: &Model<'_>,
    scripts: &[Script],
    ctx: usize,
    greedy: bool,
) -> (Vec<Vec<Vec<f32>>>, Vec<Vec<u32>>) {
    let backend = CpuBackend::new();
    let vocab = model.vocab_size;
    let mut caches: Vec<KvCache> = scripts.iter().map(|_| model.new_cache(ctx)).collect();
    let mut outs: Vec<Vec<Vec<f32>>> = scripts.iter().map(|_| Vec::new()).collect();
    let mut tokens: Vec<Vec<u32>> = scripts.iter().map(|_| Vec::new()).collect();
    let mut bufs = BatchBuffers::default();
    let mut logits = Vec::new();
    let mut chosen = Vec::new();
    // The greedy choice after each sequence's last step (greedy runs).
    let mut next: Vec<Option<u32>> = vec![None; scripts.len()];
    let steps = scripts
        .iter()
        .map(|s| s.chunks.len() + s.decode)
        .max()
        .unwrap_or(0);
    for step in 0..steps {
        // What each sequence runs in this step.
        let mut inputs: Vec<(usize, Vec<u32>, Logits)> = Vec::new();
        for (i, s) in scripts.iter().enumerate() {
            if step < s.chunks.len() {
                if s.chunks[step].is_empty() {
                    continue;
                }
                let first = outs[i].is_empty() && next[i].is_none();
                let which = if first { Logits::All } else { Logits::Last };
                inputs.push((i, s.chunks[step].clone(), which));
            } else if tokens[i].len() < s.decode {
                let tok = match next[i] {
                    Some(t) => t,
                    None => {
                        let last = outs[i].last().expect("prompt ran");
                        infer_inference::sampling::argmax(&last[last.len() - vocab..])
                    }
                };
                tokens[i].push(tok);
                inputs.push((i, vec![tok], Logits::Last));
            }
        }
        if inputs.is_empty() {
            continue;
        }
        let mut seqs: Vec<BatchSeq<'_>> = Vec::new();
        let mut rest = &mut caches[..];
        let mut taken = 0;
        for (i, toks, which) in &inputs {
            let (_, tail) = rest.split_at_mut(i - taken);
            let (cache, tail) = tail.split_first_mut().expect("cache");
            rest = tail;
            taken = i + 1;
            seqs.push(BatchSeq {
                tokens: toks,
                cache,
                logits: *which,
            });
        }
        if greedy {
            model
                .forward_batch_greedy(&backend, &mut seqs, &mut bufs, &mut chosen)
                .expect("forward_batch_greedy");
            assert_eq!(chosen.len(), inputs.len());
            for ((i, _, _), a) in inputs.iter().zip(&chosen) {
                assert!(a.all_finite);
                next[*i] = Some(a.token);
            }
            continue;
        }
        let rows: Vec<usize> = seqs.iter().map(|q| q.logit_rows()).collect();
        model
            .forward_batch(&backend, &mut seqs, &mut bufs, &mut logits)
            .expect("forward_batch");
        assert_eq!(logits.len(), rows.iter().sum::<usize>() * vocab);
        let mut off = 0;
        for ((i, _, _), n) in inputs.iter().zip(rows) {
            outs[*i].push(logits[off * vocab..(off + n) * vocab].to_vec());
            off += n;
        }
    }
    (outs, tokens)
}

/// The scenario of a case with reference prompt `ids` (length `t`): three sequences — A in two
/// prompt chunks, B whole in step 0, C joining in step 1 — then greedy decode, so that steps
/// mix prefill chunks with decode tokens of other sequences.
fn scripts_for(ids: &[u32], decode: usize) -> Vec<Script> {
    let t = ids.len();
    let rot = |k: usize| -> Vec<u32> { (0..t).map(|i| ids[(i + k) % t]).collect() };
    let a = rot(0);
    let (b, c) = (rot(t / 3), rot(2 * t / 3 + 1));
    let cut = (t / 2).max(1);
    vec![
        Script {
            chunks: vec![a[..cut].to_vec(), a[cut..].to_vec()],
            decode,
        },
        Script {
            chunks: vec![b],
            decode: decode + 2,
        },
        Script {
            chunks: vec![Vec::new(), c[..t - 2].to_vec()],
            decode,
        },
    ]
}

/// Batched vs alone for `model`; `label` names the case in messages.
fn check(label: &str, model: &Model<'_>, scripts: &[Script], ctx: usize) {
    let (b_out, b_tok) = batched(model, scripts, ctx, false);
    // The greedy batch chooses the tokens the logits' argmax chose.
    let (_, g_tok) = batched(model, scripts, ctx, true);
    assert_eq!(g_tok, b_tok, "{label}: forward_batch_greedy's tokens");
    for (i, script) in scripts.iter().enumerate() {
        let (a_out, a_tok) = alone(model, script, ctx);
        assert_eq!(a_out.len(), b_out[i].len(), "{label} seq {i}: step count");
        for (step, (a, b)) in a_out.iter().zip(&b_out[i]).enumerate() {
            let d = max_abs_diff(a, b);
            let s = std_dev(a);
            assert!(
                d <= TOL * s,
                "{label} seq {i} step {step}: max|Δ| {d:e} > {TOL} × std {s:e}"
            );
        }
        assert_eq!(a_tok, b_tok[i], "{label} seq {i}: greedy tokens");
    }
}

fn check_case(case: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, vpath) = archrefs_q4k(case, tmp.path());
    let vindex = Vindex::open(&vpath).expect("open vindex");
    let r = StFile::open(&dir.join("reference.safetensors"));
    let t = r.shape("input_ids")[1];
    let ids = r.i64_as_u32("input_ids")[..t].to_vec();
    let scripts = scripts_for(&ids, 4);
    let ctx = t + 8;
    let float = Model::from_vindex_with(&vindex, &FLOAT).expect("float model");
    check(&format!("{case} float"), &float, &scripts, ctx);
    let quant = Model::from_vindex(&vindex).expect("quantized model");
    check(&format!("{case} {}", quant.plan), &quant, &scripts, ctx);
}

#[test]
fn mixed_batches_match_single_sequences_on_every_archrefs_family() {
    let names = archrefs_cases_except(&[]);
    let failed: Vec<&String> = names
        .iter()
        .filter(|n| {
            let ok = std::panic::catch_unwind(|| check_case(n)).is_ok();
            println!("batch {n}: {}", if ok { "ok" } else { "FAILED" });
            !ok
        })
        .collect();
    assert!(failed.is_empty(), "batched forward differs on: {failed:?}");
}

/// The families of `../shared/archrefs-next` (Qwen3-MoE, gpt-oss with attention sinks and
/// YaRN, Cohere-2 with its NoPE global layer), as the archrefs families above.
#[test]
fn mixed_batches_match_single_sequences_on_archrefs_next() {
    for case in ["qwen3-moe", "gpt-oss", "cohere2"] {
        check_case(case);
        println!("batch {case}: ok");
    }
}

/// The longest prompt's `input_ids` of a real model's reference (`reference/NAME/index.json`).
fn reference_ids(name: &str) -> Vec<u32> {
    let path = shared_dir().join("reference").join(name).join("index.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let index: serde_json::Value = serde_json::from_str(&text).expect("index.json");
    let prompts = index["prompts"].as_array().expect("prompts");
    let ids = prompts
        .iter()
        .map(|p| p["input_ids"].as_array().expect("input_ids"))
        .filter(|ids| ids.len() <= 48)
        .max_by_key(|ids| ids.len())
        .expect("a prompt of at most 48 tokens");
    ids.iter().map(|v| v.as_u64().expect("id") as u32).collect()
}

/// A real model's GGUF (`INFER_MODELS`) with its f16 float tier and the q4k tier, on the
/// default (quantized) plan, batched vs alone.
fn check_real_model(name: &str, gguf: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let vpath = extract_with(
        &models_dir().join(gguf),
        tmp.path(),
        name,
        "f16",
        None,
        infer_vindex::QuantTiers::Q4K,
    );
    let vindex = Vindex::open(&vpath).expect("open");
    let model = Model::from_vindex(&vindex).expect("model");
    let ids = reference_ids(name);
    let scripts = scripts_for(&ids, 8);
    check(
        &format!("{name} {}", model.plan),
        &model,
        &scripts,
        ids.len() + 16,
    );
}

#[test]
fn mixed_batches_match_single_sequences_on_smollm2() {
    check_real_model("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn mixed_batches_match_single_sequences_on_gemma3() {
    check_real_model("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");
}
