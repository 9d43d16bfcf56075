//! End-to-end check of `read_f32` on the real GGUFs: a plain f32 forward pass (HF semantics)
//! over tensors read through the GGUF source must reproduce the reference logits
//! (shared/reference: |Δ| ≤ 1e-3 on the top-32 logits of every prompt position). This fails if
//! dequantization, llama.cpp's Q/K row permutation (SmolLM2) or the Gemma norm `+1` (Gemma-3)
//! were not undone exactly.

mod gguf_common;

use gguf_common::{model_path, shared_dir, GEMMA3, SMOLLM2};
use infer_models::gguf::{open_gguf_source, unpermute_qk_rows};
use infer_models::{LayerKind, ModelConfig, ModelSource};
use infer_quant::QuantFormat;

const TOL: f32 = 1e-3;

/// `x[t] · w[o]` for every row `o` of `w` (`[out, in]` row-major): `[T, out]`.
fn linear(x: &[Vec<f32>], w: &[f32]) -> Vec<Vec<f32>> {
    let n_in = x[0].len();
    x.iter()
        .map(|xt| {
            w.chunks_exact(n_in)
                .map(|row| row.iter().zip(xt).map(|(a, b)| (a * b) as f64).sum::<f64>() as f32)
                .collect()
        })
        .collect()
}

/// RMSNorm of `x` with weight `w` (+ `offset`, Gemma's `1 + w`).
fn rms_norm(x: &[f32], w: &[f32], eps: f64, offset: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (v * v) as f64).sum::<f64>() / x.len() as f64;
    let r = (1.0 / (ms + eps).sqrt()) as f32;
    x.iter().zip(w).map(|(v, w)| v * r * (w + offset)).collect()
}

/// HF rotate_half RoPE on one head vector at position `pos`.
fn rope(x: &mut [f32], pos: usize, theta: f64) {
    let half = x.len() / 2;
    for i in 0..half {
        let inv = 1.0 / theta.powf(2.0 * i as f64 / x.len() as f64);
        let (s, c) = ((pos as f64) * inv).sin_cos();
        let (a, b) = (x[i] as f64, x[i + half] as f64);
        x[i] = (a * c - b * s) as f32;
        x[i + half] = (b * c + a * s) as f32;
    }
}

fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()))
        as f32
}

struct Model {
    src: ModelSource,
}

impl Model {
    fn w(&self, name: &str) -> Vec<f32> {
        self.src.tensors.read_f32(name).unwrap().data
    }
    fn cfg(&self) -> &ModelConfig {
        &self.src.config
    }
    fn gemma(&self) -> bool {
        self.cfg().model_type.starts_with("gemma")
    }
    fn norm(&self, x: &[Vec<f32>], name: &str) -> Vec<Vec<f32>> {
        let w = self.w(name);
        let off = if self.gemma() { 1.0 } else { 0.0 };
        x.iter()
            .map(|r| rms_norm(r, &w, self.cfg().norm_eps, off))
            .collect()
    }
    /// One embedding row, dequantized from the raw bytes (avoids decoding the whole table).
    fn embed_row(&self, id: usize) -> Vec<f32> {
        let name = "model.embed_tokens.weight";
        let info = self.src.tensors.info(name).unwrap();
        let h = info.shape[1];
        let row_bytes = info.dtype.bytes_for(h).unwrap();
        let all = self.src.gguf.as_ref().unwrap();
        let bytes = all.tensor_bytes("token_embd.weight").unwrap();
        let mut out = vec![0f32; h];
        infer_quant::dequantize(
            info.dtype,
            &bytes[id * row_bytes..(id + 1) * row_bytes],
            &mut out,
        )
        .unwrap();
        out
    }

    /// Hidden states after the final norm, `[T, hidden]`.
    fn forward(&self, ids: &[usize]) -> Vec<Vec<f32>> {
        let c = self.cfg().clone();
        let (hd, nq, nkv) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let scale = 1.0 / c.query_pre_attn_scalar.unwrap_or(hd as f64).sqrt();
        let emb_scale = if self.gemma() {
            (c.hidden_size as f32).sqrt()
        } else {
            1.0
        };
        let mut x: Vec<Vec<f32>> = ids
            .iter()
            .map(|&i| self.embed_row(i).iter().map(|v| v * emb_scale).collect())
            .collect();
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}.");
            let h = self.norm(&x, &format!("{p}input_layernorm.weight"));
            let mut q = linear(&h, &self.w(&format!("{p}self_attn.q_proj.weight")));
            let mut k = linear(&h, &self.w(&format!("{p}self_attn.k_proj.weight")));
            let v = linear(&h, &self.w(&format!("{p}self_attn.v_proj.weight")));
            let theta = match (c.layer_types[l], c.rope_local_theta) {
                (LayerKind::Sliding, Some(t)) => t,
                _ => c.rope_theta,
            };
            for (t, (qt, kt)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
                for (m, n) in [(&mut *qt, "q"), (&mut *kt, "k")] {
                    let nw = self
                        .gemma()
                        .then(|| self.w(&format!("{p}self_attn.{n}_norm.weight")));
                    for head in m.chunks_exact_mut(hd) {
                        if let Some(w) = &nw {
                            head.copy_from_slice(&rms_norm(head, w, c.norm_eps, 1.0));
                        }
                        rope(head, t, theta);
                    }
                }
            }
            let mut att = vec![vec![0f32; nq * hd]; ids.len()];
            for t in 0..ids.len() {
                for hq in 0..nq {
                    let hk = hq / (nq / nkv);
                    let qh = &q[t][hq * hd..(hq + 1) * hd];
                    let s: Vec<f64> = (0..=t)
                        .map(|u| {
                            let kh = &k[u][hk * hd..(hk + 1) * hd];
                            qh.iter().zip(kh).map(|(a, b)| (a * b) as f64).sum::<f64>() * scale
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (u, eu) in e.iter().enumerate() {
                        for d in 0..hd {
                            att[t][hq * hd + d] += (eu / z) as f32 * v[u][hk * hd + d];
                        }
                    }
                }
            }
            let mut o = linear(&att, &self.w(&format!("{p}self_attn.o_proj.weight")));
            if self.gemma() {
                o = self.norm(&o, &format!("{p}post_attention_layernorm.weight"));
            }
            x.iter_mut()
                .zip(&o)
                .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
            let pre = if self.gemma() {
                "pre_feedforward_layernorm"
            } else {
                "post_attention_layernorm"
            };
            let h = self.norm(&x, &format!("{p}{pre}.weight"));
            let g = linear(&h, &self.w(&format!("{p}mlp.gate_proj.weight")));
            let u = linear(&h, &self.w(&format!("{p}mlp.up_proj.weight")));
            let act: Vec<Vec<f32>> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| {
                    g.iter()
                        .zip(u)
                        .map(|(&g, &u)| {
                            let a = if self.gemma() {
                                gelu_tanh(g)
                            } else {
                                g / (1.0 + (-g).exp())
                            };
                            a * u
                        })
                        .collect()
                })
                .collect();
            let mut d = linear(&act, &self.w(&format!("{p}mlp.down_proj.weight")));
            if self.gemma() {
                d = self.norm(&d, &format!("{p}post_feedforward_layernorm.weight"));
            }
            x.iter_mut()
                .zip(&d)
                .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
        }
        self.norm(&x, "model.norm.weight")
    }
}

/// Run `prompt` of reference `model_dir` (first `n` tokens) and compare the top-32 logits.
fn check(gguf: &str, model_dir: &str, prompt: &str, n: usize) {
    let m = Model {
        src: open_gguf_source(&model_path(gguf)).unwrap(),
    };
    assert!(m.cfg().tie_word_embeddings);
    let p = shared_dir()
        .join("reference")
        .join(model_dir)
        .join(format!("{prompt}.safetensors"));
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let i64s = |name: &str| -> Vec<i64> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let ids: Vec<usize> = i64s("input_ids")
        .iter()
        .take(n)
        .map(|&i| i as usize)
        .collect();
    let topk_ids = i64s("topk_ids");
    let topk_logits: Vec<f32> = st
        .tensor("topk_logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let hidden = m.forward(&ids);
    let mut max_err = 0f32;
    for (t, h) in hidden.iter().enumerate() {
        for j in 0..32 {
            let id = topk_ids[t * 32 + j] as usize;
            let e = m.embed_row(id);
            let logit = h.iter().zip(&e).map(|(a, b)| (a * b) as f64).sum::<f64>() as f32;
            let want = topk_logits[t * 32 + j];
            max_err = max_err.max((logit - want).abs());
            assert!(
                (logit - want).abs() <= TOL,
                "{prompt} pos {t} id {id}: {logit} vs {want}"
            );
        }
    }
    eprintln!(
        "{gguf} {prompt}: {} positions, max |Δ| top-32 logits = {max_err:.2e}",
        ids.len()
    );
}

#[test]
fn smollm2_forward_matches_reference_logits() {
    check(SMOLLM2, "smollm2-135m-instruct", "chat_capital", 8);
}

#[test]
fn gemma3_forward_matches_reference_logits() {
    check(GEMMA3, "gemma3-270m", "capital", 6);
}

/// The read Q/K weights differ from the raw dequantized ones exactly by the row permutation.
#[test]
fn smollm2_q_and_k_are_unpermuted() {
    let src = open_gguf_source(&model_path(SMOLLM2)).unwrap();
    let g = src.gguf.as_ref().unwrap();
    for (hf, gg, heads) in [
        (
            "model.layers.0.self_attn.q_proj.weight",
            "blk.0.attn_q.weight",
            9,
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            "blk.0.attn_k.weight",
            3,
        ),
    ] {
        let t = src.tensors.read_f32(hf).unwrap();
        let raw = infer_quant::dequantize_to_vec(
            QuantFormat::Q4_1,
            g.tensor_bytes(gg).unwrap(),
            t.data.len(),
        )
        .unwrap();
        assert_ne!(raw, t.data, "{hf}: permutation must change the rows");
        assert_eq!(
            unpermute_qk_rows(&raw, t.shape[0], heads).unwrap(),
            t.data,
            "{hf}"
        );
    }
    // V is not permuted.
    let v = src
        .tensors
        .read_f32("model.layers.0.self_attn.v_proj.weight")
        .unwrap();
    let raw = infer_quant::dequantize_to_vec(
        QuantFormat::Q4_1,
        g.tensor_bytes("blk.0.attn_v.weight").unwrap(),
        v.data.len(),
    )
    .unwrap();
    assert_eq!(raw, v.data);
}

/// Gemma norms come back as HF's `w` (stored `1 + w`), others untouched.
#[test]
fn gemma3_norms_have_one_subtracted() {
    let src = open_gguf_source(&model_path(GEMMA3)).unwrap();
    let g = src.gguf.as_ref().unwrap();
    for (hf, gg) in [
        ("model.norm.weight", "output_norm.weight"),
        (
            "model.layers.3.self_attn.k_norm.weight",
            "blk.3.attn_k_norm.weight",
        ),
        (
            "model.layers.3.pre_feedforward_layernorm.weight",
            "blk.3.ffn_norm.weight",
        ),
    ] {
        let t = src.tensors.read_f32(hf).unwrap();
        let raw = infer_quant::dequantize_to_vec(
            QuantFormat::F32,
            g.tensor_bytes(gg).unwrap(),
            t.data.len(),
        )
        .unwrap();
        assert!(t.data.iter().zip(&raw).all(|(a, b)| *a == b - 1.0), "{hf}");
    }
}
