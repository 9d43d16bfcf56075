//! `down_meta.bin`: built with `BuildOptions::down_meta` on archrefs checkpoints and checked
//! against a brute-force f64 projection of every feature's down vector, scaled by the final
//! norm weight γ, through the unembedding (top and bottom lists); corrupt and truncated files
//! give errors naming the file.

mod common;

use std::path::{Path, PathBuf};

use common::shared_dir;
use infer_vindex::{build, files, BuildOptions, Dtype, Unembedding, Vindex, VindexError};

fn build_case(case: &str, dtype: Dtype, top_n: Option<usize>, dir: &Path) -> PathBuf {
    let src = infer_models::open_source(&shared_dir().join("archrefs").join(case))
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let target = dir.join(format!("{case}-{dtype}.vindex"));
    let opts = BuildOptions {
        dtype,
        allow_no_tokenizer: true,
        down_meta: top_n,
        ..Default::default()
    };
    build(&src, &target, &opts).unwrap_or_else(|e| panic!("{case}: build: {e}"));
    target
}

/// Brute force: for every layer and feature, all vocab scores `W[t] · (γ ⊙ down[:, i])` in f64
/// from the source checkpoint (γ = final norm weight + offset), sorted; compared with the stored
/// top-N and bottom-N.
/// `rel_tol` is relative to the largest |score| of the feature.
fn check_against_brute_force(case: &str, dtype: Dtype, top_n: usize, rel_tol: f64) {
    let root = tempfile::tempdir().unwrap();
    let target = build_case(case, dtype, Some(top_n), root.path());
    let v = Vindex::open(&target).unwrap();
    assert!(v.has_down_meta());
    assert!(
        infer_vindex::verify(&target).unwrap().is_ok(),
        "{case}: verify"
    );
    assert!(v.index().file(files::DOWN_META_BIN).is_some());

    let src = infer_models::open_source(&shared_dir().join("archrefs").join(case)).unwrap();
    let cfg = &src.config;
    let (w_name, want_unembed) = if src
        .tensors
        .tensors()
        .iter()
        .any(|t| t.name == "lm_head.weight")
    {
        ("lm_head.weight", Unembedding::LmHead)
    } else {
        ("model.embed_tokens.weight", Unembedding::Embeddings)
    };
    let w = src.tensors.read_f32(w_name).unwrap();
    let arch = infer_models::architecture_for(cfg).unwrap();
    let gamma: Vec<f64> = src
        .tensors
        .read_f32(&arch.final_norm_key())
        .unwrap()
        .data
        .iter()
        .map(|&g| g as f64 + arch.norm_weight_offset() as f64)
        .collect();
    let (vocab, hidden) = (w.shape[0], w.shape[1]);
    let h = v.down_meta_header().unwrap().expect("header");
    assert_eq!(h.unembedding, want_unembed, "{case}");
    assert_eq!(h.top_n, top_n);
    assert_eq!(h.vocab_size, vocab);
    assert_eq!(h.num_layers, cfg.num_hidden_layers);
    assert!(h.final_norm_weighted);

    let mut checked = 0;
    for l in 0..cfg.num_hidden_layers {
        let down = src
            .tensors
            .read_f32(&format!("model.layers.{l}.mlp.down_proj.weight"))
            .unwrap(); // [hidden, intermediate]
        let inter = down.shape[1];
        let meta = v.down_meta(l).unwrap().expect("dense layer has down_meta");
        assert_eq!(meta.num_features(), inter);
        assert_eq!(meta.top_n(), top_n);
        assert!(meta.top(inter).is_none() && meta.bottom(inter).is_none());
        for i in 0..inter {
            let mut brute: Vec<(f64, u32)> = (0..vocab)
                .map(|t| {
                    let s: f64 = (0..hidden)
                        .map(|k| {
                            w.data[t * hidden + k] as f64
                                * gamma[k]
                                * down.data[k * inter + i] as f64
                        })
                        .sum();
                    (s, t as u32)
                })
                .collect();
            let by_token: Vec<f64> = brute.iter().map(|b| b.0).collect();
            let scale = by_token.iter().fold(0f64, |m, s| m.max(s.abs()));
            let tol = rel_tol * scale;
            // Top: brute force descending; bottom: ascending.
            brute.sort_by(|a, b| b.0.total_cmp(&a.0));
            let ascending: Vec<(f64, u32)> = brute.iter().rev().copied().collect();
            for (stored, want, what) in [
                (meta.top(i).unwrap(), &brute, "top"),
                (meta.bottom(i).unwrap(), &ascending, "bottom"),
            ] {
                assert_eq!(stored.len(), top_n);
                for (k, r) in stored.iter().enumerate() {
                    // The k-th stored score is the true k-th, and it belongs to its token.
                    let d_rank = (r.score as f64 - want[k].0).abs();
                    let d_tok = (r.score as f64 - by_token[r.token as usize]).abs();
                    assert!(
                        d_rank <= tol && d_tok <= tol,
                        "{case} {dtype} layer {l} feature {i} {what} rank {k}: stored ({}, {}), \
                         brute force ({}, {}), token's score {} (tol {tol})",
                        r.token,
                        r.score,
                        want[k].1,
                        want[k].0,
                        by_token[r.token as usize]
                    );
                }
                // Same token ids wherever the brute-force ranking is not a near tie.
                let margin = (want[top_n - 1].0 - want[top_n].0).abs();
                if margin > 2.0 * tol {
                    let mut a: Vec<u32> = stored.iter().map(|r| r.token).collect();
                    let mut b: Vec<u32> = want[..top_n].iter().map(|b| b.1).collect();
                    a.sort_unstable();
                    b.sort_unstable();
                    assert_eq!(
                        a, b,
                        "{case} layer {l} feature {i}: {what}-{top_n} token set"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0, "{case}: every feature was a near tie");
    eprintln!("{case} {dtype}: down_meta matches brute force ({checked} exact token sets)");
}

#[test]
fn llama_untied_f32_matches_brute_force() {
    check_against_brute_force("llama", Dtype::F32, 10, 1e-5);
}

#[test]
fn tied_embeddings_f16_matches_brute_force() {
    // f16 storage rounds both factors (relative 2^-11 each).
    check_against_brute_force("llama-tied-gqa1", Dtype::F16, 7, 3e-3);
}

#[test]
fn gemma3_tied_one_plus_w_norm_matches_brute_force() {
    check_against_brute_force("gemma3", Dtype::F32, 5, 1e-5);
}

#[test]
fn without_down_meta_is_none_and_moe_layers_are_none() {
    let root = tempfile::tempdir().unwrap();
    let t = build_case("llama", Dtype::F32, None, root.path());
    let v = Vindex::open(&t).unwrap();
    assert!(!v.has_down_meta());
    assert!(v.down_meta_header().unwrap().is_none());
    assert!(v.down_meta(0).unwrap().is_none());
    assert!(matches!(
        v.down_meta(3),
        Err(VindexError::LayerOutOfRange { .. })
    ));
    assert!(!t.join(files::DOWN_META_BIN).exists());

    // Mixtral: experts only, no dense FFN: every layer has 0 features.
    let t = build_case("mixtral", Dtype::F32, Some(4), root.path());
    let v = Vindex::open(&t).unwrap();
    let h = v.down_meta_header().unwrap().unwrap();
    assert!(h.features.iter().all(|&f| f == 0), "{:?}", h.features);
    for l in 0..v.num_layers() {
        assert!(v.down_meta(l).unwrap().is_none());
    }
}

#[test]
fn top_n_zero_is_refused_and_larger_than_vocab_is_clamped() {
    let root = tempfile::tempdir().unwrap();
    let src = infer_models::open_source(&shared_dir().join("archrefs/llama")).unwrap();
    let opts = BuildOptions {
        allow_no_tokenizer: true,
        down_meta: Some(0),
        ..Default::default()
    };
    let e = build(&src, &root.path().join("z.vindex"), &opts).unwrap_err();
    assert!(e.to_string().contains("at least 1"), "{e}");
    assert!(!root.path().join("z.vindex").exists());

    let t = build_case("llama", Dtype::F32, Some(1000), root.path());
    let v = Vindex::open(&t).unwrap();
    let m = v.down_meta(2).unwrap().unwrap();
    assert_eq!(m.top_n(), 256); // vocab
                                // The whole vocabulary, sorted: every token exactly once, the bottom list the reverse.
    let top = m.top(0).unwrap();
    let mut toks: Vec<u32> = top.iter().map(|r| r.token).collect();
    toks.sort_unstable();
    assert_eq!(toks, (0..256).collect::<Vec<u32>>());
    let bottom = m.bottom(0).unwrap();
    assert_eq!(bottom[0].score, top[255].score);
    assert_eq!(bottom[255].score, top[0].score);
    assert_eq!(m.promoted(0, -1.0).unwrap()[0], bottom[0]);
    assert_eq!(m.promoted(0, 1.0).unwrap()[0], top[0]);
}

/// Rewrite the size recorded for `down_meta.bin` in index.json (so open gets past the size
/// check and the reader's own checks are exercised).
fn set_recorded_size(vindex: &Path, bytes: u64) {
    let p = vindex.join(files::INDEX_JSON);
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    for f in j["files"].as_array_mut().unwrap() {
        if f["name"] == files::DOWN_META_BIN {
            f["bytes"] = bytes.into();
        }
    }
    std::fs::write(&p, serde_json::to_string(&j).unwrap()).unwrap();
}

#[test]
fn corrupt_or_truncated_down_meta_is_a_named_error() {
    let root = tempfile::tempdir().unwrap();
    let t = build_case("llama", Dtype::F32, Some(4), root.path());
    let dm = t.join(files::DOWN_META_BIN);
    let good = std::fs::read(&dm).unwrap();
    let h = Vindex::open(&t)
        .unwrap()
        .down_meta_header()
        .unwrap()
        .unwrap();
    assert_eq!(good.len(), h.file_size());
    assert_eq!(good.len(), 48 + 16 * 4 * 3 * 128);
    let named = |e: &VindexError| {
        let s = e.to_string();
        assert!(s.contains("down_meta.bin"), "{s}");
        s
    };

    // Truncated with index.json untouched: open refuses it, naming the file.
    std::fs::write(&dm, &good[..good.len() - 8]).unwrap();
    let e = Vindex::open(&t).err().expect("open must fail");
    named(&e);
    assert!(matches!(e, VindexError::SizeMismatch { .. }), "{e}");
    assert!(!infer_vindex::verify(&t).unwrap().is_ok());

    // Truncated with a matching index.json: the reader's size check.
    set_recorded_size(&t, good.len() as u64 - 8);
    let v = Vindex::open(&t).unwrap();
    let e = v.down_meta(0).unwrap_err();
    assert!(named(&e).contains("truncated"), "{e}");
    drop(v);
    set_recorded_size(&t, good.len() as u64);

    let corrupt = |at: usize, bytes: &[u8]| -> VindexError {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        std::fs::write(&dm, &b).unwrap();
        let v = Vindex::open(&t).unwrap();
        let e = v.down_meta(1).unwrap_err();
        named(&e);
        e
    };
    assert!(corrupt(0, b"NOTMETA!").to_string().contains("magic"));
    assert!(corrupt(8, &2u32.to_le_bytes())
        .to_string()
        .contains("version"));
    assert!(corrupt(12, &4u32.to_le_bytes())
        .to_string()
        .contains("covers 4 layers"));
    assert!(corrupt(12, &5u32.to_le_bytes())
        .to_string()
        .contains("header implies"));
    assert!(corrupt(20, &300u32.to_le_bytes())
        .to_string()
        .contains("vocab_size"));
    // Layer 1's first record: token id past the vocabulary; then a score out of order.
    let l1 = 48 + 16 * 4 * 128;
    let e = corrupt(l1, &9999u32.to_le_bytes());
    assert!(e.to_string().contains("token id 9999"), "{e}");
    let e = corrupt(l1 + 4, &f32::MIN.to_le_bytes());
    assert!(e.to_string().contains("top scores are not sorted"), "{e}");
    // Feature 0's first bottom record (after its 4 top records).
    let e = corrupt(l1 + 8 * 4 + 4, &f32::MAX.to_le_bytes());
    assert!(
        e.to_string().contains("bottom scores are not sorted"),
        "{e}"
    );
    assert!(corrupt(28, &7u32.to_le_bytes())
        .to_string()
        .contains("flags"));
    // Restored, every layer reads again.
    std::fs::write(&dm, &good).unwrap();
    let v = Vindex::open(&t).unwrap();
    for l in 0..3 {
        assert!(v.down_meta(l).unwrap().is_some());
    }
}
