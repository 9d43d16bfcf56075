//! Round trip of every architecture reference checkpoint (shared/archrefs and archrefs-next, HF
//! safetensors f32):
//! extract (f32 and f16 tiers), open, and compare every tensor with the source.

mod common;

use common::{assert_roundtrip, shared_dir};
use infer_vindex::{build, BuildOptions, Dtype, Vindex};

fn cases() -> Vec<String> {
    let dir = shared_dir().join("archrefs");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    assert_eq!(
        v.len(),
        19,
        "expected 19 archref cases in {}: {v:?}",
        dir.display()
    );
    v
}

/// The families of `../shared/archrefs-next` (same layout), added after the 19.
const NEXT: &[&str] = &["qwen3-moe", "gpt-oss", "cohere2"];

fn roundtrip(dtype: Dtype) {
    let root = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let all = cases()
        .into_iter()
        .map(|c| ("archrefs", c))
        .chain(NEXT.iter().map(|c| ("archrefs-next", c.to_string())));
    for (folder, case) in all {
        let src_path = shared_dir().join(folder).join(&case);
        let src = infer_models::open_source(&src_path)
            .unwrap_or_else(|e| panic!("{case}: open source: {e}"));
        let target = root.path().join(format!("{case}-{dtype}.vindex"));
        let opts = BuildOptions {
            dtype,
            allow_no_tokenizer: true, // archrefs carry no tokenizer
            ..Default::default()
        };
        match build(&src, &target, &opts) {
            Ok(index) => {
                let v = Vindex::open(&target).unwrap_or_else(|e| panic!("{case}: open: {e}"));
                let n = assert_roundtrip(&src, &v);
                assert_eq!(v.config(), &src.config, "{case}: config");
                assert_eq!(index.shapes.num_layers, src.config.num_hidden_layers);
                // Provenance hashes the model's weight files only (not reference.safetensors).
                let hashed: Vec<&str> = index
                    .provenance
                    .source_sha256
                    .iter()
                    .map(|h| h.name.as_str())
                    .collect();
                assert!(
                    !hashed.is_empty() && hashed.iter().all(|n| n.starts_with("model")),
                    "{case}: provenance hashes {hashed:?}"
                );
                assert!(
                    infer_vindex::verify(&target).unwrap().is_ok(),
                    "{case}: verify"
                );
                eprintln!("{case}: {n} tensors round-trip ({dtype})");
            }
            Err(e) => failures.push(format!("{case}: {e}")),
        }
    }
    // Every family extracts (name maps and fused-tensor splits come from ModelArchitecture).
    assert!(failures.is_empty(), "extract failed for: {failures:#?}");
}

#[test]
fn archrefs_roundtrip_f32() {
    roundtrip(Dtype::F32);
}

#[test]
fn archrefs_roundtrip_f16() {
    roundtrip(Dtype::F16);
}

/// The stored FFN tiers are feature-major: for Llama, row i of down_features is column i of HF's
/// down_proj, and gate_vectors row i is gate_proj row i.
#[test]
fn llama_feature_major_layout() {
    let src = infer_models::open_source(&shared_dir().join("archrefs/llama")).unwrap();
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("l.vindex");
    let opts = BuildOptions {
        allow_no_tokenizer: true,
        ..Default::default()
    };
    build(&src, &target, &opts).unwrap();
    let v = Vindex::open(&target).unwrap();
    let down = src
        .tensors
        .read_f32("model.layers.1.mlp.down_proj.weight")
        .unwrap(); // [64, 128]
    let (h, i) = (down.shape[0], down.shape[1]);
    let m = v.down_layer_matrix(1).unwrap();
    assert_eq!(m.dim(), (i, h));
    for feat in [0, 5, i - 1] {
        for d in 0..h {
            assert_eq!(m[[feat, d]].to_bits(), down.data[d * i + feat].to_bits());
        }
    }
    let gate = src
        .tensors
        .read_f32("model.layers.1.mlp.gate_proj.weight")
        .unwrap();
    assert_eq!(v.gate_vectors(1).unwrap(), &gate.data[..]);
    let up = src
        .tensors
        .read_f32("model.layers.0.mlp.up_proj.weight")
        .unwrap();
    assert_eq!(
        v.up_layer_matrix(0).unwrap().as_slice().unwrap(),
        &up.data[..]
    );
}
