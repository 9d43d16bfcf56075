//! `infer extract --q4-x16` (the q4 tier's FFN and lm_head stored as Q4_0x16, the Q4_0 blocks
//! re-laid sixteen rows per group) gives the same model as plain Q4_0: the real SmolLM2 GGUF
//! extracted both ways, the q4 plan's logits over a prompt (the int8 tile GEMM) and 8 greedy
//! decode steps (the mat-vec kernels) equal **bit for bit**, with the same stored bytes once
//! un-laid; and `--explain` names the format.

mod common;

use common::*;
use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::{AttnChoice, FfnChoice, FormatRequest, LmHeadChoice, Model};
use infer_quant::QuantFormat;
use infer_vindex::{files, QuantTiers, Vindex};

fn extract(dir: &std::path::Path, name: &str, q4_x16: bool) -> Vindex {
    let out = dir.join(format!("{name}.vindex"));
    let opts = infer_vindex::BuildOptions {
        force: true,
        allow_no_tokenizer: true,
        quant: QuantTiers {
            q4: true,
            ..QuantTiers::NONE
        },
        q4_x16,
        ..Default::default()
    };
    let gguf = models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    infer_vindex::extract(&gguf, &out, &opts).expect("extract");
    Vindex::open(&out).expect("open")
}

#[test]
fn smollm2_q4_x16_equals_q4_0_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let plain = extract(dir.path(), "plain", false);
    let x16 = extract(dir.path(), "x16", true);
    // The stored matrices are the plain ones re-laid (lossless), tagged Q4_0x16.
    let (pb, pf) = plain.lm_head_q4_data().unwrap();
    let (xb, xf) = x16.lm_head_q4_data().unwrap();
    assert_eq!((pf, xf), (QuantFormat::Q4_0, QuantFormat::Q4_0x16));
    let (_, e) = x16
        .quant_tensor(files::LM_HEAD_Q4_BIN, "lm_head.weight")
        .unwrap();
    let (rows, cols) = (e.shape[0], e.shape[1]);
    let unlaid = infer_quant::interleave::to_rows(xf, xb, rows, cols).unwrap();
    assert_eq!(unlaid.as_ref(), pb);
    for (p, x) in plain
        .ffn_q4_layer_data(0)
        .unwrap()
        .iter()
        .zip(x16.ffn_q4_layer_data(0).unwrap())
    {
        assert_eq!((p.1, x.1), (QuantFormat::Q4_0, QuantFormat::Q4_0x16));
        assert_eq!(p.0.len(), x.0.len());
        assert_ne!(p.0, x.0, "re-laid");
    }
    let req = FormatRequest {
        attn: AttnChoice::F32,
        ffn: FfnChoice::Q4,
        lm_head: LmHeadChoice::Q4,
    };
    let a = Model::from_vindex_with(&plain, &req).expect("plain q4 model");
    let b = Model::from_vindex_with(&x16, &req).expect("Q4_0x16 model");
    // Every FFN matrix and the lm_head name the layout (the plan lines name both formats).
    let named = |m: &Model| m.explain().matches("Q4_0x16").count();
    assert!(named(&b) >= named(&a) + 4, "{}", b.explain());
    let backend = CpuBackend::new();
    let ids: Vec<u32> = (0..37).map(|i| 1 + (i * 7919) % 40000).collect();
    let run = |model: &Model| {
        let mut cache = model.new_cache(ids.len() + 8);
        let logits = model
            .forward(&backend, &ids, &mut cache, Logits::All)
            .expect("forward");
        let mut last = logits[(ids.len() - 1) * model.vocab_size..].to_vec();
        let mut steps = Vec::new();
        for _ in 0..8 {
            let id = infer_inference::sampling::argmax(&last);
            last = model
                .forward(&backend, &[id], &mut cache, Logits::Last)
                .expect("decode");
            steps.push((id, last.iter().map(|v| v.to_bits()).collect::<Vec<_>>()));
        }
        (
            logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            steps,
        )
    };
    let (la, sa) = run(&a);
    let (lb, sb) = run(&b);
    assert_eq!(la.len(), ids.len() * a.vocab_size);
    assert!(la == lb, "prompt logits differ");
    assert!(sa == sb, "decode steps differ");
}
