//! Quantized tiers on an in-memory mock source: files, manifests, formats, API slices, errors.

mod common;

use std::path::Path;

use common::{mock_source, MockDims};
use infer_quant::QuantFormat;
use infer_vindex::{
    build, dequantize_stored, files, quant_stats, reference_f32, verify, BuildOptions, QuantTiers,
    Tier, Vindex, VindexError,
};

/// Every matrix row length a multiple of 256, so K-quants are kept.
const K_DIMS: MockDims = MockDims {
    vocab: 96,
    hidden: 256,
    inter: 512,
    layers: 2,
    tied: true,
};

fn build_quant(
    d: &MockDims,
    quant: QuantTiers,
    down_q4k: bool,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("q.vindex");
    let opts = BuildOptions {
        quant,
        down_q4k,
        ..Default::default()
    };
    build(&mock_source(d), &target, &opts).unwrap();
    (root, target)
}

#[test]
fn all_tiers_formats_and_slices() {
    let (_root, t) = build_quant(&K_DIMS, QuantTiers::ALL, false);
    assert!(verify(&t).unwrap().is_ok());
    let v = Vindex::open(&t).unwrap();
    assert_eq!(v.tiers(), &[Tier::F32, Tier::Q4K, Tier::Q8, Tier::Q4]);
    assert!(v.has_tier(Tier::Q4K) && !v.has_tier(Tier::F16));
    for l in 0..2 {
        let attn = v.attn_q4k_layer_data(l).unwrap();
        let fmts: Vec<QuantFormat> = attn.iter().map(|a| a.1).collect();
        use QuantFormat::*;
        assert_eq!(fmts, vec![Q4_K, Q4_K, Q6_K, Q4_K]);
        // [256,256] Q4_K = 256 rows × 144; [128,256] Q4_K / Q6_K.
        let lens: Vec<usize> = attn.iter().map(|a| a.0.len()).collect();
        assert_eq!(lens, vec![256 * 144, 128 * 144, 128 * 210, 256 * 144]);
        let ffn = v.ffn_q4k_layer_data(l).unwrap();
        assert_eq!(
            ffn.iter().map(|f| (f.0.len(), f.1)).collect::<Vec<_>>(),
            vec![(512 * 144, Q4_K), (512 * 144, Q4_K), (256 * 2 * 210, Q6_K)]
        );
        let ffn4 = v.ffn_q4_layer_data(l).unwrap();
        for f in &ffn4 {
            assert_eq!((f.0.len(), f.1), (512 * 256 / 32 * 18, Q4_0));
        }
        assert_eq!(
            v.gate_q4_data(l).unwrap(),
            ffn4[0].0,
            "gate q4 = interleaved gate"
        );
        let q8 = v.attn_q8_layer_data(l).unwrap();
        for ((vals, scales), rows) in q8.iter().zip([256, 128, 128, 256]) {
            assert_eq!(vals.len(), rows * 256);
            assert_eq!(scales.len(), rows * 256 / 32);
        }
    }
    // Slices point into the maps, at the manifest offsets.
    let whole = v.interleaved_q4k_mmap_ref().unwrap();
    let (b, e) = v
        .quant_tensor(
            files::INTERLEAVED_Q4K_BIN,
            "model.layers.1.mlp.down_proj.weight",
        )
        .unwrap();
    assert_eq!(b, &whole[e.offset..e.offset + e.length]);
    assert_eq!(
        e.shape,
        vec![256, 512],
        "down stored [hidden, intermediate]"
    );
    // Interleaved order per layer: gate, up, down, by offset.
    let mut es = v.quant_entries(files::INTERLEAVED_Q4_BIN);
    es.sort_by_key(|e| e.offset);
    let keys: Vec<&str> = es.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys[..3],
        [
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.down_proj.weight"
        ]
    );
    // Tied: the Q4_0 lm_head comes from the embeddings.
    let (lm_bytes, lm_format) = v.lm_head_q4_data().unwrap();
    assert_eq!(
        (lm_bytes.len(), lm_format),
        (96 * 256 / 32 * 18, QuantFormat::Q4_0)
    );
    let lm = dequantize_stored(&v, files::LM_HEAD_Q4_BIN, "lm_head.weight").unwrap();
    let emb = v.embeddings().0.to_f32_vec();
    let want = infer_quant::dequantize_to_vec(
        QuantFormat::Q4_0,
        &infer_quant::quantize(QuantFormat::Q4_0, &emb, 256, None).unwrap(),
        emb.len(),
    )
    .unwrap();
    assert_eq!(lm, want);
    // Q8 tier = Q8_0 blocks split: dequantization matches ggml's Q8_0 bit for bit.
    let key = "model.layers.0.self_attn.o_proj.weight";
    let r = reference_f32(&v, key).unwrap();
    let q = infer_quant::quantize(QuantFormat::Q8_0, &r, 256, None).unwrap();
    let want = infer_quant::dequantize_to_vec(QuantFormat::Q8_0, &q, r.len()).unwrap();
    assert_eq!(
        dequantize_stored(&v, files::ATTN_Q8_BIN, key).unwrap(),
        want
    );
    // Errors, not panics.
    assert!(matches!(
        v.attn_q4k_layer_data(2),
        Err(VindexError::LayerOutOfRange { .. })
    ));
    // Stats on synthetic data (uniform-ish values over 9 binades) stay within loose bounds.
    for s in quant_stats(&v).unwrap() {
        let bound = match s.format {
            QuantFormat::Q8_0 => 0.02,
            QuantFormat::Q6_K => 0.05,
            _ => 0.3,
        };
        assert!(
            s.rel_rmse < bound,
            "{} {} {}: {}",
            s.file,
            s.key,
            s.format,
            s.rel_rmse
        );
        assert!(!s.passthrough);
    }
}

#[test]
fn down_q4k_and_single_tiers() {
    let (_root, t) = build_quant(&K_DIMS, QuantTiers::Q4K, true);
    let v = Vindex::open(&t).unwrap();
    assert_eq!(v.tiers(), &[Tier::F32, Tier::Q4K]);
    assert_eq!(v.ffn_q4k_layer_data(0).unwrap()[2].1, QuantFormat::Q4_K);
    assert!(v.interleaved_q4_mmap_ref().is_none());
    assert!(matches!(
        v.lm_head_q4_data(),
        Err(VindexError::Absent { .. })
    ));
    assert!(matches!(
        v.attn_q8_layer_data(0),
        Err(VindexError::Absent { .. })
    ));
    // The library default writes no quantized tier.
    let root = tempfile::tempdir().unwrap();
    let t2 = root.path().join("f.vindex");
    build(&mock_source(&K_DIMS), &t2, &BuildOptions::default()).unwrap();
    let v = Vindex::open(&t2).unwrap();
    assert_eq!(v.tiers(), &[Tier::F32]);
    assert!(v.index().passthrough.is_empty());
}

/// hidden 64 / intermediate 96: Q5_0 / Q8_0 fallbacks for every matrix. Intermediate 80:
/// down's rows (80 values) cannot hold blocks of 32, so down is stored in F16 (issue 15 bug
/// 3: this was an error). Only the q8 tier (int8 blocks of 32) has no fallback: hidden 48 is
/// a clear error there, nothing left behind.
#[test]
fn fallback_formats_and_row_length_error() {
    let d = MockDims {
        vocab: 64,
        hidden: 64,
        inter: 96,
        layers: 1,
        tied: false,
    };
    let (_root, t) = build_quant(&d, QuantTiers::Q4K, false);
    let v = Vindex::open(&t).unwrap();
    let f: Vec<QuantFormat> = v
        .attn_q4k_layer_data(0)
        .unwrap()
        .iter()
        .map(|a| a.1)
        .collect();
    use QuantFormat::*;
    assert_eq!(f, vec![Q5_0, Q5_0, Q8_0, Q5_0]);
    let f: Vec<QuantFormat> = v
        .ffn_q4k_layer_data(0)
        .unwrap()
        .iter()
        .map(|a| a.1)
        .collect();
    assert_eq!(f, vec![Q5_0, Q5_0, Q8_0]);

    let odd = MockDims {
        vocab: 64,
        hidden: 32,
        inter: 80,
        layers: 1,
        tied: false,
    };
    let (_root, t) = build_quant(&odd, QuantTiers::ALL, false);
    let v = Vindex::open(&t).unwrap();
    let f: Vec<QuantFormat> = v
        .ffn_q4k_layer_data(0)
        .unwrap()
        .iter()
        .map(|a| a.1)
        .collect();
    assert_eq!(f, vec![Q5_0, Q5_0, F16]);

    let bad = MockDims {
        vocab: 64,
        hidden: 48,
        inter: 64,
        layers: 1,
        tied: false,
    };
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("bad.vindex");
    let opts = BuildOptions {
        quant: QuantTiers::ALL,
        ..Default::default()
    };
    let e = build(&mock_source(&bad), &target, &opts).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("q_proj") && msg.contains("the q8 tier stores blocks of 32"),
        "{msg}"
    );
    assert!(std::fs::read_dir(root.path()).unwrap().next().is_none());
}

/// Rewrite a manifest (and its size in index.json, resealed as a build would write it, so
/// the manifest's own check is what fires) in place.
fn rewrite_manifest(dir: &Path, manifest: &str, f: impl FnOnce(&mut serde_json::Value)) {
    let mp = dir.join(manifest);
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    f(&mut m);
    let text = serde_json::to_string_pretty(&m).unwrap();
    std::fs::write(&mp, &text).unwrap();
    let ip = dir.join(files::INDEX_JSON);
    let mut ix: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ip).unwrap()).unwrap();
    for fh in ix["files"].as_array_mut().unwrap() {
        if fh["name"] == manifest {
            fh["bytes"] = serde_json::json!(text.len());
        }
    }
    let ix: infer_vindex::VindexIndex = serde_json::from_value(ix).unwrap();
    std::fs::write(&ip, serde_json::to_string_pretty(&ix.sealed()).unwrap()).unwrap();
}

/// A manifest written for the seed's non-canonical 148-byte Q4_K blocks is refused at open.
#[test]
fn q4k_148_byte_blocks_are_rejected() {
    let (_root, t) = build_quant(&K_DIMS, QuantTiers::Q4K, false);
    rewrite_manifest(&t, files::ATTN_Q4K_MANIFEST, |m| {
        // The file's first tensor (layer 0 q_proj, [256, 256] Q4_K) as 148-byte blocks.
        let e = &mut m.as_array_mut().unwrap()[0];
        assert_eq!(e["format"], "Q4_K");
        e["length"] = serde_json::json!(256 * 148);
    });
    let e = Vindex::open(&t)
        .err()
        .expect("148-byte Q4_K blocks must be refused");
    let msg = e.to_string();
    assert!(matches!(e, VindexError::BadEntry { .. }), "{msg}");
    assert!(
        msg.contains("attn_weights_q4k.bin")
            && msg.contains("37888")
            && msg.contains("needs 36864"),
        "{msg}"
    );
}

#[test]
fn corrupt_quant_manifests_are_named_errors() {
    let (_root, t) = build_quant(&K_DIMS, QuantTiers::ALL, false);
    // Unknown format tag.
    rewrite_manifest(&t, files::INTERLEAVED_Q4_MANIFEST, |m| {
        m[0]["format"] = serde_json::json!("Q4_0_148");
    });
    let e = Vindex::open(&t).err().unwrap();
    assert!(matches!(e, VindexError::BadJson { .. }), "{e}");
    rewrite_manifest(&t, files::INTERLEAVED_Q4_MANIFEST, |m| {
        m[0]["format"] = serde_json::json!("F32");
    });
    let e = Vindex::open(&t).err().unwrap();
    assert!(e.to_string().contains("interleaved_q4.bin"), "{e}");
    rewrite_manifest(&t, files::INTERLEAVED_Q4_MANIFEST, |m| {
        m[0]["format"] = serde_json::json!("Q4_0");
    });
    Vindex::open(&t).unwrap();
    // The I8 plane: wrong tag, wrong length.
    rewrite_manifest(&t, files::ATTN_Q8_MANIFEST, |m| {
        m[1]["format"] = serde_json::json!("Q8_0");
    });
    let e = Vindex::open(&t).err().unwrap();
    assert!(e.to_string().contains("expected I8"), "{e}");
    rewrite_manifest(&t, files::ATTN_Q8_MANIFEST, |m| {
        m[1]["format"] = serde_json::json!("I8");
        m[1]["length"] = serde_json::json!(7);
    });
    let e = Vindex::open(&t).err().unwrap();
    assert!(e.to_string().contains("attn_weights_q8.bin"), "{e}");
}
