//! [`expected_tensors`]: the canonical key and HF (row-major `[out, in]`) shape of every tensor
//! an architecture loads, and whether the loader needs it. Extract checks a checkpoint against
//! it before writing anything; `infer synth` writes exactly these tensors.

use super::ModelArchitecture;

/// One tensor the forward pass reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedTensor {
    /// Canonical key (as the vindex stores it).
    pub key: String,
    /// HF Linear layout shape (`[out, in]` for matrices).
    pub shape: Vec<usize>,
    /// The model cannot be assembled without it (false for attention and norm biases, which
    /// are used when present, and for an untied `lm_head`, which falls back to the embeddings).
    pub required: bool,
}

/// Every tensor `a` loads, in a fixed order: embeddings, learned positions, final norm,
/// lm_head (+ bias), then per layer attention, norms and FFN (dense or MoE experts).
pub fn expected_tensors(a: &dyn ModelArchitecture) -> Vec<ExpectedTensor> {
    let (h, v) = (a.hidden_size(), a.vocab_size());
    let mut out = Vec::new();
    let mut add = |key: String, shape: Vec<usize>, required: bool| {
        out.push(ExpectedTensor {
            key,
            shape,
            required,
        })
    };
    let norm = |add: &mut dyn FnMut(String, Vec<usize>, bool), key: Option<String>, n: usize| {
        if let Some(k) = key {
            if let Some(b) = a.norm_bias_key(&k) {
                add(b, vec![n], false);
            }
            add(k, vec![n], true);
        }
    };
    add(a.embed_key(), vec![v, h], true);
    if let Some(k) = a.position_embed_key() {
        add(k, vec![a.config().max_position_embeddings, h], true);
    }
    norm(&mut add, Some(a.final_norm_key()), h);
    if a.lm_head_key() != a.embed_key() {
        add(a.lm_head_key(), vec![v, h], false);
    }
    if let Some(k) = a.lm_head_bias_key() {
        add(k, vec![v], true);
    }
    for l in 0..a.num_layers() {
        let hd = a.head_dim_for_layer(l);
        let (q, kv) = (
            a.num_q_heads_for_layer(l) * hd,
            a.num_kv_heads_for_layer(l) * hd,
        );
        add(a.attn_q_key(l), vec![q, h], true);
        add(a.attn_k_key(l), vec![kv, h], true);
        add(a.attn_v_key(l), vec![kv, h], true);
        add(a.attn_o_key(l), vec![h, q], true);
        if let Some(k) = a.attn_sinks_key(l) {
            add(k, vec![a.num_q_heads_for_layer(l)], true);
        }
        for (k, n) in [
            (a.attn_q_bias_key(l), q),
            (a.attn_k_bias_key(l), kv),
            (a.attn_v_bias_key(l), kv),
            (a.attn_o_bias_key(l), h),
        ] {
            if let Some(k) = k {
                add(k, vec![n], false);
            }
        }
        let whole = a.qk_norm_whole_projection();
        norm(&mut add, a.q_norm_key(l), if whole { q } else { hd });
        norm(&mut add, a.k_norm_key(l), if whole { kv } else { hd });
        for k in [
            a.pre_attn_norm_key(l),
            a.post_attn_norm_key(l),
            a.pre_ffn_norm_key(l),
            a.post_ffn_norm_key(l),
        ] {
            norm(&mut add, k, h);
        }
        let i = a.intermediate_size_for_layer(l);
        let experts = a.num_experts_for_layer(l);
        if experts > 0 {
            if let Some(k) = a.moe_router_key(l) {
                add(k, vec![experts, h], true);
            }
            if let Some(k) = a.moe_router_bias_key(l) {
                add(k, vec![experts], true);
            }
            for e in 0..experts {
                add(a.expert_gate_key(l, e), vec![i, h], true);
                add(a.expert_up_key(l, e), vec![i, h], true);
                add(a.expert_down_key(l, e), vec![h, i], true);
                if let Some([g, u, d]) = a.expert_bias_keys(l, e) {
                    add(g, vec![i], true);
                    add(u, vec![i], true);
                    add(d, vec![h], true);
                }
            }
            if let (Some([g, u, d]), Some(si)) =
                (a.shared_expert_keys(l), a.shared_expert_intermediate_size())
            {
                add(g, vec![si, h], true);
                add(u, vec![si, h], true);
                add(d, vec![h, si], true);
            }
            if let Some(k) = a.shared_expert_gate_key(l) {
                add(k, vec![1, h], true);
            }
        } else {
            if let Some(k) = a.ffn_gate_key(l) {
                add(k, vec![i, h], true);
            }
            add(a.ffn_up_key(l), vec![i, h], true);
            add(a.ffn_down_key(l), vec![h, i], true);
            for (k, n) in [
                (a.ffn_gate_bias_key(l), i),
                (a.ffn_up_bias_key(l), i),
                (a.ffn_down_bias_key(l), h),
            ] {
                if let Some(k) = k {
                    add(k, vec![n], true);
                }
            }
        }
    }
    out
}
