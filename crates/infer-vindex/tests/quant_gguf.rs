//! Quantized tiers of the two real GGUF models (`--quant all`): every tier present, verify
//! passes, API slices have the manifest's lengths, quantization error per format within its
//! bound against the f32 tier, and GGUF passthrough is byte-identical (after llama.cpp's Q/K
//! row permutation is undone) and dequantizes to the f32 tier bit for bit.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use common::model_file;
use infer_models::gguf::{GgufFile, GgufTensors};
use infer_models::TensorSource;
use infer_quant::QuantFormat;
use infer_vindex::quant_build::{quantize_rows_par, Values};
use infer_vindex::{
    build, dequantize_stored, files, quant_stats, reference_f32, verify, BuildOptions, QuantTiers,
    Tier, Vindex,
};

const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

fn build_all(model: &str, root: &Path, quant: QuantTiers, requantize: bool) -> PathBuf {
    let src = infer_models::open_source(&model_file(model)).unwrap();
    let target = root.join(format!("{model}.vindex"));
    let opts = BuildOptions {
        quant,
        requantize,
        allow_no_tokenizer: true,
        force: true,
        ..Default::default()
    };
    let t = Instant::now();
    build(&src, &target, &opts).unwrap_or_else(|e| panic!("{model}: {e}"));
    eprintln!(
        "{model}: built {quant:?} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    target
}

fn gguf_tensors(model: &str) -> GgufTensors {
    let src = infer_models::open_source(&model_file(model)).unwrap();
    let file = Arc::new(GgufFile::open(&model_file(model)).unwrap());
    GgufTensors::new(file, &src.config).unwrap()
}

/// Upper bound of relative RMSE per format (requantized tensors, vs the f32 tier).
fn bound(f: QuantFormat) -> f64 {
    match f {
        QuantFormat::Q8_0 => 0.01,
        QuantFormat::Q6_K => 0.03,
        QuantFormat::Q4_K | QuantFormat::Q5_0 => 0.1,
        QuantFormat::Q4_0 => 0.15,
        other => panic!("unexpected stored format {other}"),
    }
}

fn check(model: &str, layers: usize) {
    let root = tempfile::tempdir().unwrap();
    let t = build_all(model, root.path(), QuantTiers::ALL, false);
    assert!(verify(&t).unwrap().is_ok());
    let v = Vindex::open(&t).unwrap();
    assert_eq!(v.tiers(), &[Tier::F32, Tier::Q4K, Tier::Q8, Tier::Q4]);
    for f in files::BIN_FILES {
        if *f != files::LM_HEAD_BIN && *f != files::OTHER_BIN {
            assert!(v.mapped_bytes(f).is_some(), "{model}: {f} missing");
        }
    }

    // API slices = manifest entries (length and format).
    let q = |l: usize, m: &str, p: &str| format!("model.layers.{l}.{m}.{p}.weight");
    for l in 0..layers {
        for (i, (bytes, fmt)) in v.attn_q4k_layer_data(l).unwrap().iter().enumerate() {
            let key = q(l, "self_attn", ["q_proj", "k_proj", "v_proj", "o_proj"][i]);
            let (_, e) = v.quant_tensor(files::ATTN_Q4K_BIN, &key).unwrap();
            assert_eq!((bytes.len(), *fmt), (e.length, e.format), "{key}");
            assert_eq!(e.length, e.format.expected_bytes(&e.shape).unwrap());
        }
        for (i, (vals, scales)) in v.attn_q8_layer_data(l).unwrap().iter().enumerate() {
            let key = q(l, "self_attn", ["q_proj", "k_proj", "v_proj", "o_proj"][i]);
            let e = v
                .q8_value_entries()
                .into_iter()
                .find(|e| e.key == key)
                .unwrap();
            assert_eq!(vals.len(), e.length);
            assert_eq!(scales.len() * 32, e.length);
        }
        for (file, data) in [
            (files::INTERLEAVED_Q4K_BIN, v.ffn_q4k_layer_data(l).unwrap()),
            (files::INTERLEAVED_Q4_BIN, v.ffn_q4_layer_data(l).unwrap()),
        ] {
            for (i, (bytes, fmt)) in data.iter().enumerate() {
                let key = q(l, "mlp", ["gate_proj", "up_proj", "down_proj"][i]);
                let (_, e) = v.quant_tensor(file, &key).unwrap();
                assert_eq!((bytes.len(), *fmt), (e.length, e.format), "{file} {key}");
            }
        }
        assert_eq!(
            v.gate_q4_data(l).unwrap().len(),
            v.ffn_q4_layer_data(l).unwrap()[0].0.len()
        );
    }
    let (_, lm) = v
        .quant_tensor(files::LM_HEAD_Q4_BIN, "lm_head.weight")
        .unwrap();
    assert_eq!(v.lm_head_q4_data().unwrap().0.len(), lm.length);

    // Passthrough ⇔ the GGUF tensor already has the stored format; such tensors are the GGUF's
    // blocks (rows un-permuted) and dequantize to the f32 tier bit for bit.
    let g = gguf_tensors(model);
    let stats = quant_stats(&v).unwrap();
    let mut worst: Vec<(String, QuantFormat, f64, usize)> = Vec::new();
    let mut n_pass = 0;
    for s in &stats {
        let src_key = if s.key == "lm_head.weight" && g.gguf_name("lm_head.weight").is_none() {
            "model.embed_tokens.weight"
        } else {
            s.key.as_str()
        };
        let info = g.info(src_key).unwrap();
        let expect_pass = info.dtype == s.format;
        assert_eq!(
            s.passthrough, expect_pass,
            "{} {} {}",
            s.file, s.key, s.format
        );
        if s.passthrough {
            n_pass += 1;
            let (raw, _) = g.raw_blocks_hf_order(src_key).unwrap().unwrap();
            let file: &'static str = files::BIN_FILES
                .iter()
                .find(|f| **f == s.file)
                .copied()
                .unwrap();
            if file == files::ATTN_Q8_BIN {
                let (vals, scales) = v.q8_tensor(&s.key).unwrap();
                for (b, blk) in raw.chunks_exact(34).enumerate() {
                    assert_eq!(&vals[b * 32..b * 32 + 32], &blk[2..], "{}", s.key);
                    let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                    assert_eq!(scales[b].to_bits(), d.to_bits());
                }
            } else {
                assert_eq!(
                    v.quant_tensor(file, &s.key).unwrap().0,
                    &raw[..],
                    "{}",
                    s.key
                );
            }
            let deq = dequantize_stored(&v, file, &s.key).unwrap();
            let r = reference_f32(&v, &s.key).unwrap();
            assert!(
                deq.iter().zip(&r).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}: passthrough dequant differs from the f32 tier",
                s.key
            );
        } else {
            assert!(
                s.rel_rmse < bound(s.format),
                "{} {} {}: rel RMSE {}",
                s.file,
                s.key,
                s.format,
                s.rel_rmse
            );
            match worst.iter_mut().find(|w| w.1 == s.format && w.0 == s.file) {
                Some(w) => {
                    w.2 = w.2.max(s.rel_rmse);
                    w.3 += 1;
                }
                None => worst.push((s.file.clone(), s.format, s.rel_rmse, 1)),
            }
        }
    }
    assert_eq!(n_pass, v.index().passthrough.len());
    for (file, f, max, n) in worst {
        eprintln!("{model}: {file} {f}: {n} requantized tensors, max rel RMSE {max:.4}");
    }
    eprintln!("{model}: {n_pass} passthrough tensors");
}

#[test]
fn smollm2_all_tiers() {
    check(SMOLLM, 30);
}

#[test]
fn gemma3_all_tiers() {
    check(GEMMA, 18);
    // Gemma's Q4_K_M has Q4_K o_proj, Q5_0 q/k/gate/up, Q6_K / Q8_0 v and down: many pass through.
    let root = tempfile::tempdir().unwrap();
    let t = build_all(GEMMA, root.path(), QuantTiers::Q4K, false);
    let v = Vindex::open(&t).unwrap();
    assert!(
        v.index().passthrough.len() >= 90,
        "{}",
        v.index().passthrough.len()
    );
}

/// `requantize`: nothing passes through; the stored bytes are ggml's reference quantization of
/// the f32 tier.
#[test]
fn gemma3_requantize() {
    let root = tempfile::tempdir().unwrap();
    let t = build_all(GEMMA, root.path(), QuantTiers::Q4K, true);
    let v = Vindex::open(&t).unwrap();
    assert!(v.index().passthrough.is_empty());
    let key = "model.layers.3.self_attn.o_proj.weight";
    let (bytes, e) = v.quant_tensor(files::ATTN_Q4K_BIN, key).unwrap();
    assert_eq!(e.format, QuantFormat::Q4_K);
    let r = reference_f32(&v, key).unwrap();
    assert_eq!(
        bytes,
        &infer_quant::quantize(QuantFormat::Q4_K, &r, e.shape[1], None).unwrap()[..]
    );
}

/// SmolLM2 (llama) stores Q/K rows permuted: the raw blocks reordered by whole rows
/// dequantize to exactly the un-permuted f32 values.
#[test]
fn smollm2_unpermuted_raw_blocks_match_read_f32() {
    let g = gguf_tensors(SMOLLM);
    for key in [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.7.self_attn.k_proj.weight",
    ] {
        let (raw, info) = g.raw_blocks_hf_order(key).unwrap().unwrap();
        assert!(
            matches!(raw, std::borrow::Cow::Owned(_)),
            "{key} is permuted"
        );
        let deq =
            infer_quant::dequantize_to_vec(info.dtype, &raw, info.shape.iter().product()).unwrap();
        let want = g.read_f32(key).unwrap().data;
        assert!(
            deq.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{key}"
        );
        assert_ne!(
            &raw[..],
            g.raw_bytes(key).unwrap(),
            "{key}: rows were reordered"
        );
    }
}

/// Quantize throughput (MB/s of f32 input) on Gemma-3 layer-0 FFN matrices, 1 and 2 threads.
/// `cargo test --release -p infer-vindex --test quant_gguf -- --ignored --nocapture throughput`
#[test]
#[ignore]
fn quantize_throughput() {
    let src = infer_models::open_source(&model_file(GEMMA)).unwrap();
    let down = src
        .tensors
        .read_f32("model.layers.0.mlp.down_proj.weight")
        .unwrap();
    let gate = src
        .tensors
        .read_f32("model.layers.0.mlp.gate_proj.weight")
        .unwrap();
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (f, t) in [
            (QuantFormat::Q4_K, &down),
            (QuantFormat::Q6_K, &down),
            (QuantFormat::Q4_0, &down),
            (QuantFormat::Q5_0, &gate),
            (QuantFormat::Q8_0, &gate),
        ] {
            let mb = (t.data.len() * 4) as f64 / 1e6;
            let mut best = f64::MAX;
            for _ in 0..3 {
                let s = Instant::now();
                let q = pool
                    .install(|| quantize_rows_par(f, Values::F32(&t.data), t.shape[1]).unwrap());
                best = best.min(s.elapsed().as_secs_f64());
                assert!(!q.is_empty());
            }
            eprintln!(
                "{f} {:?}: {threads} thread(s): {:.0} MB/s ({mb:.1} MB in {:.1} ms)",
                t.shape,
                mb / best,
                best * 1e3
            );
        }
    }
}

/// A vindex without a float tier (`infer extract --float none`, the CLI default) of each real
/// GGUF: no float matrix files, the embedding table is the GGUF's own `token_embd` blocks
/// byte for byte (and, tied, the only output matrix), every passthrough tensor equals the
/// GGUF's blocks (Q/K rows un-permuted), the other quantized tensors equal those of a vindex
/// with a float tier (quantized from the same values), and the total size is within 1.12× the
/// GGUF (Gemma's Q4_K_M: within 1.05×; SmolLM2's Q4_1 is requantized to Q5_0/Q8_0/Q6_K).
#[test]
fn quantized_only_passes_gguf_blocks_through() {
    for (model, max_ratio) in [(GEMMA, 1.05), (SMOLLM, 1.12)] {
        let root = tempfile::tempdir().unwrap();
        let src = infer_models::open_source(&model_file(model)).unwrap();
        let target = root.path().join("q.vindex");
        let opts = BuildOptions {
            quant: QuantTiers::Q4K,
            float_tier: false,
            allow_no_tokenizer: true,
            force: true,
            ..Default::default()
        };
        build(&src, &target, &opts).unwrap_or_else(|e| panic!("{model}: {e}"));
        assert!(verify(&target).unwrap().is_ok());
        let v = Vindex::open(&target).unwrap();
        assert_eq!(v.tiers(), &[Tier::Q4K], "{model}");
        for f in [
            files::GATE_VECTORS_BIN,
            files::UP_FEATURES_BIN,
            files::DOWN_FEATURES_BIN,
            files::LM_HEAD_BIN,
            files::LM_HEAD_Q6K_BIN,
        ] {
            assert!(v.mapped_bytes(f).is_none(), "{model}: {f} written");
        }
        let g = gguf_tensors(model);
        let emb_key = "model.embed_tokens.weight";
        let (raw, info) = g.raw_blocks_hf_order(emb_key).unwrap().unwrap();
        let e = &v.index().embeddings;
        assert_eq!(e.format, info.dtype, "{model}: embedding format");
        let map = v.mapped_bytes(files::EMBEDDINGS_BIN).unwrap();
        assert_eq!(&map[e.offset..e.offset + e.length], &raw[..], "{model}");
        assert!(!v.has_lm_head_copy(Tier::Q4K), "{model}: tied, no copy");
        for p in &v.index().passthrough {
            let src_key = &p.key;
            let (raw, _) = g.raw_blocks_hf_order(src_key).unwrap().unwrap();
            let stored = if p.file == files::EMBEDDINGS_BIN {
                &map[e.offset..e.offset + e.length]
            } else {
                let f = files::BIN_FILES.iter().find(|f| **f == p.file).unwrap();
                v.quant_tensor(f, &p.key).unwrap().0
            };
            assert_eq!(stored, &raw[..], "{model}: {} not byte-exact", p.key);
        }
        // The rest is what the vindex with a float tier stores.
        let full = build_all(model, root.path(), QuantTiers::Q4K, false);
        let fv = Vindex::open(&full).unwrap();
        for file in [files::ATTN_Q4K_BIN, files::INTERLEAVED_Q4K_BIN] {
            for entry in fv.quant_entries(file) {
                let (a, ea) = fv.quant_tensor(file, &entry.key).unwrap();
                let (b, eb) = v.quant_tensor(file, &entry.key).unwrap();
                assert_eq!((ea.format, a), (eb.format, b), "{model}: {}", entry.key);
            }
        }
        let bytes: u64 = v.index().files.iter().map(|f| f.bytes).sum();
        let gguf = std::fs::metadata(model_file(model)).unwrap().len();
        let ratio = bytes as f64 / gguf as f64;
        eprintln!("{model}: vindex {bytes} B / GGUF {gguf} B = {ratio:.3}");
        assert!(ratio <= max_ratio, "{model}: {ratio:.3} > {max_ratio}");
    }
}
