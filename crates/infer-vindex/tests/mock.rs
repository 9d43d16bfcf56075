//! Builder, loader and verifier on an in-memory mock source (no shared data needed).

mod common;

use std::path::{Path, PathBuf};

use common::{assert_roundtrip, mock_source, MockDims, MockTensors};
use infer_vindex::{build, files, verify, BuildOptions, Dtype, Vindex, VindexError};

const DIMS: MockDims = MockDims {
    vocab: 96,
    hidden: 32,
    inter: 80,
    layers: 3,
    tied: false,
};

fn opts(dtype: Dtype) -> BuildOptions {
    BuildOptions {
        dtype,
        ..Default::default()
    }
}

fn built(dtype: Dtype) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("m.vindex");
    build(&mock_source(&DIMS), &target, &opts(dtype)).unwrap();
    (root, target)
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn roundtrip_f32_bit_exact() {
    let (_root, target) = built(Dtype::F32);
    let v = Vindex::open(&target).unwrap();
    let src = mock_source(&DIMS);
    // 1 embedding + 15 per layer + final norm + lm_head + 1 other.
    assert_eq!(assert_roundtrip(&src, &v), 1 + 15 * 3 + 3);
    assert_eq!(v.num_layers(), 3);
    assert_eq!(v.config(), &src.config);
    assert_eq!(v.intermediate_size(1).unwrap(), 80);
    assert_eq!(
        v.tokenizer_json().unwrap(),
        src.tokenizer_json.clone().unwrap()
    );
    assert_eq!(
        v.tokenizer_config_json(),
        src.tokenizer_config_json.as_deref()
    );
    assert_eq!(v.chat_template(), Some("{{ messages }}"));
    // Unclassifiable tensors are kept in other_weights.bin.
    assert_eq!(
        v.entry("model.layers.2.mlp.router.weight").unwrap().0,
        files::OTHER_BIN
    );
    assert_eq!(
        v.entry("model.layers.0.self_attn.q_norm.weight").unwrap().0,
        files::ATTN_WEIGHTS_BIN
    );
    assert_eq!(
        v.entry("model.layers.0.input_layernorm.weight").unwrap().0,
        files::NORMS_BIN
    );
    // Every tensor is 64-byte aligned.
    for k in v.keys() {
        assert_eq!(v.entry(k).unwrap().1.offset % 64, 0, "{k}");
    }
    let names = dir_names(&target);
    for f in [
        files::INDEX_JSON,
        files::EMBEDDINGS_BIN,
        files::NORMS_BIN,
        files::NORMS_MANIFEST,
        files::GATE_VECTORS_BIN,
        files::UP_FEATURES_BIN,
        files::DOWN_FEATURES_BIN,
        files::ATTN_WEIGHTS_BIN,
        files::ATTN_WEIGHTS_MANIFEST,
        files::LM_HEAD_BIN,
        files::OTHER_BIN,
        files::OTHER_MANIFEST,
        files::TOKENIZER_JSON,
        files::TOKENIZER_CONFIG_JSON,
        files::CHAT_TEMPLATE_JINJA,
    ] {
        assert!(names.contains(&f.to_string()), "{f} missing from {names:?}");
    }
    assert_eq!(names.len(), 15, "{names:?}");
    // Only the target is left in the parent (no temp dir).
    assert_eq!(dir_names(target.parent().unwrap()), vec!["m.vindex"]);
}

#[test]
fn roundtrip_f16_equals_f16_rounding_and_halves_files() {
    let (_r32, t32) = built(Dtype::F32);
    let (_r16, t16) = built(Dtype::F16);
    let v = Vindex::open(&t16).unwrap();
    assert_eq!(v.dtype(), Dtype::F16);
    assert_eq!(assert_roundtrip(&mock_source(&DIMS), &v), 49);
    for f in [
        files::EMBEDDINGS_BIN,
        files::GATE_VECTORS_BIN,
        files::DOWN_FEATURES_BIN,
    ] {
        let a = std::fs::metadata(t32.join(f)).unwrap().len();
        let b = std::fs::metadata(t16.join(f)).unwrap().len();
        assert!(
            b * 2 <= a + 64 * 3 && b * 2 >= a - 64 * 3,
            "{f}: f32 {a} B, f16 {b} B"
        );
    }
    // f32-only accessors refuse an f16 vindex with guidance; f16 views work.
    let e = v.gate_vectors(0).unwrap_err();
    assert!(
        matches!(e, VindexError::WrongDtype { .. }) && e.to_string().contains("gate_vectors_f16"),
        "{e}"
    );
    assert!(v.down_layer_matrix(0).is_err() && v.up_layer_matrix(0).is_err());
    assert_eq!(v.gate_vectors_f16(2).unwrap().len(), 80 * 32);
}

#[test]
fn views_point_into_the_mmap() {
    let (_root, target) = built(Dtype::F32);
    let v = Vindex::open(&target).unwrap();
    let inside = |file: &str, ptr: usize, bytes: usize| {
        let r = v.mapped_range(file).unwrap();
        assert!(
            r.start <= ptr && ptr + bytes <= r.end,
            "{file}: {ptr:#x}+{bytes} not in {r:?}"
        );
    };
    for l in 0..3 {
        let g = v.gate_vectors(l).unwrap();
        inside(files::GATE_VECTORS_BIN, g.as_ptr() as usize, g.len() * 4);
        assert_eq!(g.as_ptr() as usize % 64, 0);
        let u = v.up_layer_matrix(l).unwrap();
        assert_eq!(u.dim(), (80, 32));
        inside(files::UP_FEATURES_BIN, u.as_ptr() as usize, u.len() * 4);
        let d = v.down_layer_matrix(l).unwrap();
        assert_eq!(d.dim(), (80, 32));
        assert!(d.is_standard_layout());
        inside(files::DOWN_FEATURES_BIN, d.as_ptr() as usize, d.len() * 4);
    }
    let (e, _) = v.embeddings();
    let r = e.addr_range();
    inside(files::EMBEDDINGS_BIN, r.start, r.len());
    let (q, _) = v.tensor("model.layers.1.self_attn.q_proj.weight").unwrap();
    let r = q.addr_range();
    inside(files::ATTN_WEIGHTS_BIN, r.start, r.len());
}

#[test]
fn out_of_range_and_unknown_keys_are_errors() {
    let (_root, target) = built(Dtype::F32);
    let v = Vindex::open(&target).unwrap();
    assert!(matches!(
        v.gate_vectors(3),
        Err(VindexError::LayerOutOfRange {
            layer: 3,
            num_layers: 3
        })
    ));
    assert!(matches!(
        v.down_layer_matrix(99),
        Err(VindexError::LayerOutOfRange { .. })
    ));
    assert!(matches!(
        v.up_layer(7),
        Err(VindexError::LayerOutOfRange { .. })
    ));
    assert!(matches!(
        v.tensor("nope"),
        Err(VindexError::NoSuchTensor { .. })
    ));
    // FFN keys point to the per-layer accessors.
    let e = v.tensor("model.layers.0.mlp.down_proj.weight").unwrap_err();
    assert!(e.to_string().contains("down_layer"), "{e}");
}

#[test]
fn tied_model_has_no_lm_head() {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("t.vindex");
    let d = MockDims { tied: true, ..DIMS };
    build(&mock_source(&d), &target, &opts(Dtype::F32)).unwrap();
    let v = Vindex::open(&target).unwrap();
    assert!(v.lm_head().is_none());
    assert!(!target.join(files::LM_HEAD_BIN).exists());
    assert_roundtrip(&mock_source(&d), &v);
}

/// Rewrite index.json through a closure on its JSON value.
fn edit_index(target: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = target.join(files::INDEX_JSON);
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut j);
    std::fs::write(&p, serde_json::to_string_pretty(&j).unwrap()).unwrap();
}

fn open_err(target: &Path) -> String {
    match Vindex::open(target) {
        Ok(_) => panic!("open succeeded on a damaged vindex"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn corrupt_index_json_is_a_named_error() {
    let (_root, target) = built(Dtype::F32);
    let p = target.join(files::INDEX_JSON);
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    // It records its sha256 (at its start): a change since it was written, not just bad JSON.
    let e = Vindex::open(&target).err().unwrap();
    assert!(matches!(e, VindexError::IndexChanged { .. }), "{e}");
    assert!(e.to_string().contains("index.json"), "{e}");
    assert!(verify(&target).is_err());
    // Without the seal: corrupt JSON.
    let unsealed: String = text
        .lines()
        .filter(|l| !l.contains("\"index_sha256\""))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&p, &unsealed[..unsealed.len() / 2]).unwrap();
    let e = Vindex::open(&target).err().unwrap();
    assert!(matches!(e, VindexError::BadJson { .. }), "{e}");
    assert!(e.to_string().contains("index.json"), "{e}");

    // Another format_version in a file this infer wrote (its provenance says so): changed.
    std::fs::write(&p, &text).unwrap();
    edit_index(&target, |j| j["format_version"] = 2.into());
    let e = Vindex::open(&target).err().unwrap();
    assert!(matches!(e, VindexError::IndexChanged { .. }), "{e}");
    assert!(e.to_string().contains("format_version 2"), "{e}");
    // Written by another infer: refused naming its version.
    std::fs::write(&p, &text).unwrap();
    edit_index(&target, |j| {
        j["format_version"] = 2.into();
        j["provenance"]["infer_version"] = "9.9.9".into();
    });
    let e = Vindex::open(&target).err().unwrap();
    assert!(
        matches!(
            e,
            VindexError::BadVersion {
                found: 2,
                expected: 1,
                ..
            }
        ),
        "{e}"
    );

    std::fs::write(&p, &text).unwrap();
    edit_index(&target, |j| {
        j.as_object_mut().unwrap().remove("config");
    });
    let e = open_err(&target);
    assert!(e.contains("index.json") && e.contains("config"), "{e}");
}

#[test]
fn truncated_bin_is_a_named_error() {
    let (_root, target) = built(Dtype::F32);
    let p = target.join(files::DOWN_FEATURES_BIN);
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let e = Vindex::open(&target).err().unwrap();
    assert!(matches!(e, VindexError::SizeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("down_features.bin"), "{e}");
}

#[test]
fn missing_file_is_a_named_error() {
    let (_root, target) = built(Dtype::F32);
    std::fs::remove_file(target.join(files::ATTN_WEIGHTS_MANIFEST)).unwrap();
    let e = Vindex::open(&target).err().unwrap();
    assert!(matches!(e, VindexError::MissingFile { .. }), "{e}");
    assert!(e.to_string().contains("attn_weights_manifest.json"), "{e}");
    let e = open_err(&tempfile::tempdir().unwrap().path().join("none.vindex"));
    assert!(
        e.contains("none.vindex") && e.contains("does not exist"),
        "{e}"
    );
}

/// A directory without index.json, or a file (a GGUF passed by mistake), is "not a vindex",
/// both for open and verify — not a confusing "missing file"/"Not a directory" error.
#[test]
fn not_a_vindex_is_a_clear_error() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("noconf");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    let want = format!(
        "{} is not a vindex (no index.json); build one with `infer extract`",
        dir.display()
    );
    let e = Vindex::open(&dir).err().unwrap();
    assert!(matches!(e, VindexError::NotAVindex { .. }), "{e}");
    assert_eq!(e.to_string(), want);
    assert_eq!(verify(&dir).unwrap_err().to_string(), want);

    let file = root.path().join("model.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    // A GGUF given where a vindex was expected gets the hint to build one.
    let want = format!(
        "{} is a file, not a vindex directory (a GGUF file: build a vindex from it with `infer extract FILE -o NAME.vindex`)",
        file.display()
    );
    assert_eq!(Vindex::open(&file).err().unwrap().to_string(), want);
    assert_eq!(verify(&file).unwrap_err().to_string(), want);
    let other = root.path().join("notes.txt");
    std::fs::write(&other, b"text").unwrap();
    let want = format!("{} is a file, not a vindex directory", other.display());
    assert_eq!(Vindex::open(&other).err().unwrap().to_string(), want);
}

/// File names in index.json that leave the vindex directory (`../`, absolute, `\`, empty) are
/// refused by open and verify with an error naming index.json, and never hashed.
#[test]
fn index_file_names_must_be_plain() {
    let (root, target) = built(Dtype::F32);
    // A file outside the vindex that a traversal would reach.
    std::fs::write(root.path().join("secret"), "s").unwrap();
    let p = target.join(files::INDEX_JSON);
    let text = std::fs::read_to_string(&p).unwrap();
    for bad in [
        "../secret",
        "../../etc/passwd",
        "/etc/passwd",
        "sub/x.bin",
        "..\\secret",
        "..",
        "",
    ] {
        std::fs::write(&p, &text).unwrap();
        edit_index(&target, |j| {
            j["files"][0]["name"] = bad.into();
        });
        for e in [open_err(&target), verify(&target).unwrap_err().to_string()] {
            assert!(
                e.contains("index.json") && e.contains("not a plain file name"),
                "{bad:?}: {e}"
            );
        }
    }
    std::fs::write(&p, &text).unwrap();
    edit_index(&target, |j| {
        j["passthrough"] = serde_json::json!([{
            "file": "../secret", "key": "k", "format": "Q4_K",
            "source_tensor": "t", "rows_unpermuted": false
        }]);
    });
    let e = open_err(&target);
    assert!(e.contains("passthrough[0].file"), "{e}");
    std::fs::write(&p, &text).unwrap();
    assert!(verify(&target).unwrap().is_ok());
}

#[test]
fn manifest_length_disagreeing_with_shape_is_refused() {
    let (_root, target) = built(Dtype::F32);
    let mp = target.join(files::ATTN_WEIGHTS_MANIFEST);
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    let key = m[1]["key"].as_str().unwrap().to_string();
    let len = m[1]["length"].as_u64().unwrap();
    m[1]["length"] = (len - 4).into();
    let text = serde_json::to_string_pretty(&m).unwrap();
    std::fs::write(&mp, &text).unwrap();
    // Keep index.json's size record consistent so the entry check itself is what fires.
    edit_index(&target, |j| {
        for f in j["files"].as_array_mut().unwrap() {
            if f["name"] == files::ATTN_WEIGHTS_MANIFEST {
                f["bytes"] = text.len().into();
            }
        }
    });
    let e = Vindex::open(&target).err().unwrap();
    assert!(matches!(e, VindexError::BadEntry { .. }), "{e}");
    let s = e.to_string();
    assert!(
        s.contains("attn_weights.bin") && s.contains(&key) && s.contains("length"),
        "{s}"
    );

    // An entry whose format tag is missing is refused too (never defaulted).
    m[1]["length"] = len.into();
    m[1].as_object_mut().unwrap().remove("format");
    let text = serde_json::to_string_pretty(&m).unwrap();
    std::fs::write(&mp, &text).unwrap();
    edit_index(&target, |j| {
        for f in j["files"].as_array_mut().unwrap() {
            if f["name"] == files::ATTN_WEIGHTS_MANIFEST {
                f["bytes"] = text.len().into();
            }
        }
    });
    let s = open_err(&target);
    assert!(
        s.contains("attn_weights_manifest.json") && s.contains("format"),
        "{s}"
    );
}

#[test]
fn verify_reports_sha256_mismatch_by_file() {
    let (_root, target) = built(Dtype::F32);
    let report = verify(&target).unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.checked.len(), 14);
    // Flip one byte of gate_vectors.bin (same size: open still succeeds, verify does not).
    let p = target.join(files::GATE_VECTORS_BIN);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[1000] ^= 0x40;
    std::fs::write(&p, &bytes).unwrap();
    Vindex::open(&target).unwrap();
    let report = verify(&target).unwrap();
    assert_eq!(report.mismatches.len(), 1, "{report}");
    assert_eq!(report.mismatches[0].file, files::GATE_VECTORS_BIN);
    assert!(
        report.to_string().contains("MISMATCH gate_vectors.bin"),
        "{report}"
    );
    std::fs::remove_file(target.join(files::TOKENIZER_JSON)).unwrap();
    let report = verify(&target).unwrap();
    assert_eq!(report.mismatches.len(), 1, "{report}");
    assert_eq!(
        report.missing,
        vec![files::TOKENIZER_JSON.to_string()],
        "{report}"
    );
}

#[test]
fn existing_target_refused_unless_force() {
    let (root, target) = built(Dtype::F32);
    let e = build(&mock_source(&DIMS), &target, &opts(Dtype::F32)).unwrap_err();
    assert!(matches!(e, VindexError::TargetExists { .. }), "{e}");
    let o = BuildOptions {
        force: true,
        ..opts(Dtype::F16)
    };
    build(&mock_source(&DIMS), &target, &o).unwrap();
    assert_eq!(Vindex::open(&target).unwrap().dtype(), Dtype::F16);
    assert_eq!(dir_names(root.path()), vec!["m.vindex"]);
}

#[test]
fn failed_build_leaves_nothing_and_keeps_old_target() {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("m.vindex");
    let failing = || {
        let mut src = mock_source(&DIMS);
        let t = src.tensors;
        // Rebuild the mock with a read failure in the middle of layer 1.
        let infos = t.tensors().to_vec();
        let data = infos
            .iter()
            .map(|i| t.read_f32(&i.name).unwrap().data)
            .collect();
        src.tensors = Box::new(MockTensors {
            infos,
            data,
            fail_after: Some(20),
            reads: Default::default(),
        });
        src
    };
    let e = build(&failing(), &target, &opts(Dtype::F32)).unwrap_err();
    assert!(e.to_string().contains("simulated read failure"), "{e}");
    assert!(
        dir_names(root.path()).is_empty(),
        "{:?}",
        dir_names(root.path())
    );
    // With --force over an existing vindex, a failure keeps the old one intact.
    build(&mock_source(&DIMS), &target, &opts(Dtype::F32)).unwrap();
    let o = BuildOptions {
        force: true,
        ..opts(Dtype::F16)
    };
    assert!(build(&failing(), &target, &o).is_err());
    assert_eq!(dir_names(root.path()), vec!["m.vindex"]);
    assert_eq!(Vindex::open(&target).unwrap().dtype(), Dtype::F32);
}

#[test]
fn tokenizer_sources() {
    let root = tempfile::tempdir().unwrap();
    let mut src = mock_source(&DIMS);
    src.tokenizer_json = None;
    let e = build(&src, &root.path().join("a.vindex"), &opts(Dtype::F32)).unwrap_err();
    assert!(matches!(e, VindexError::NoTokenizer { .. }), "{e}");
    assert!(e.to_string().contains("--tokenizer"), "{e}");
    assert!(dir_names(root.path()).is_empty());

    let o = BuildOptions {
        allow_no_tokenizer: true,
        ..opts(Dtype::F32)
    };
    build(&src, &root.path().join("b.vindex"), &o).unwrap();
    let v = Vindex::open(&root.path().join("b.vindex")).unwrap();
    assert!(v.tokenizer_json_path().is_none());
    assert!(matches!(
        v.tokenizer_json(),
        Err(VindexError::Absent { .. })
    ));

    let tok = root.path().join("tok.json");
    let other = common::MOCK_TOKENIZER.replace("\"a\":3", "\"z\":3");
    std::fs::write(&tok, &other).unwrap();
    let o = BuildOptions {
        tokenizer: Some(tok.clone()),
        ..opts(Dtype::F32)
    };
    build(&src, &root.path().join("c.vindex"), &o).unwrap();
    let v = Vindex::open(&root.path().join("c.vindex")).unwrap();
    assert_eq!(v.tokenizer_json().unwrap(), other);

    // skip_tokenizer: weights only even though the source has a tokenizer and a template.
    let full = mock_source(&DIMS);
    assert!(full.tokenizer_json.is_some());
    let o = BuildOptions {
        skip_tokenizer: true,
        ..opts(Dtype::F32)
    };
    build(&full, &root.path().join("s.vindex"), &o).unwrap();
    let v = Vindex::open(&root.path().join("s.vindex")).unwrap();
    assert!(!v.index().has_tokenizer);
    assert!(v.tokenizer_json_path().is_none());
    for f in [
        files::TOKENIZER_JSON,
        files::TOKENIZER_CONFIG_JSON,
        files::CHAT_TEMPLATE_JINJA,
    ] {
        assert!(!root.path().join("s.vindex").join(f).exists(), "{f}");
    }

    std::fs::write(&tok, "not json").unwrap();
    let o = BuildOptions {
        tokenizer: Some(tok),
        ..opts(Dtype::F32)
    };
    let e = build(&src, &root.path().join("d.vindex"), &o).unwrap_err();
    assert!(e.to_string().contains("tok.json"), "{e}");
}

#[test]
fn bad_source_shapes_are_errors() {
    let root = tempfile::tempdir().unwrap();
    let mut src = mock_source(&DIMS);
    src.config.hidden_size = 40;
    let e = build(&src, &root.path().join("x.vindex"), &opts(Dtype::F32)).unwrap_err();
    assert!(matches!(e, VindexError::BadSource { .. }), "{e}");
    assert!(e.to_string().contains("model.embed_tokens.weight"), "{e}");
}

#[test]
fn index_records_provenance_and_hashes() {
    let (_root, target) = built(Dtype::F32);
    let v = Vindex::open(&target).unwrap();
    let ix = v.index();
    assert_eq!(ix.format_version, 1);
    assert_eq!(ix.provenance.infer_version, env!("CARGO_PKG_VERSION"));
    assert!(ix.provenance.created_unix > 1_600_000_000);
    assert_eq!(ix.tiers, vec!["f32"]);
    assert_eq!(ix.layers.len(), 3);
    for f in &ix.files {
        assert_eq!(f.sha256.len(), 64, "{}", f.name);
        assert_eq!(
            std::fs::metadata(target.join(&f.name)).unwrap().len(),
            f.bytes
        );
    }
    let d = infer_vindex::describe(&v);
    for s in [
        "gate_vectors.bin",
        "llama",
        "vocab 96",
        "3 layers",
        "\"hidden_size\": 32",
    ] {
        assert!(d.contains(s), "describe lacks '{s}':\n{d}");
    }
}
