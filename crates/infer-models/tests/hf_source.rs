//! HF folder source: every archref opens and reads, sharded folders, F16/BF16 decoding, corrupt
//! and missing files, tokenizer and chat-template material.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use infer_models::hf::open_hf_folder;
use infer_models::{ModelError, SourceKind};
use infer_quant::QuantFormat;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

fn shared() -> PathBuf {
    let p = std::env::var_os("INFER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        p.join("archrefs").is_dir(),
        "shared reference data missing at {} (set INFER_SHARED)",
        p.display()
    );
    p
}

fn archref_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(shared().join("archrefs"))
        .expect("archrefs readable")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 19, "expected the 19 archrefs cases");
    dirs
}

/// Tensor count of each archref's model.safetensors (from its header).
const TENSOR_COUNTS: &[(&str, usize)] = &[
    ("gemma", 29),
    ("gemma2", 46),
    ("gemma3", 80),
    ("gemma3-ropescale", 54),
    ("gpt2", 40),
    ("gpt_neox", 40),
    ("granite", 30),
    ("llama", 30),
    ("llama-tied-gqa1", 29),
    ("llama3-rope", 30),
    ("mistral-swa", 30),
    ("mixtral", 60),
    ("olmo2", 36),
    ("phi", 47),
    ("phi3-partial", 21),
    ("qwen2", 38),
    ("qwen2-moe", 81),
    ("qwen3", 36),
    ("starcoder2", 51),
];

#[test]
fn every_archref_folder_opens_and_every_tensor_reads() {
    let counts: HashMap<&str, usize> = TENSOR_COUNTS.iter().copied().collect();
    for dir in archref_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let src = open_hf_folder(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(src.kind, SourceKind::HfFolder);
        assert_eq!(src.path, dir);
        assert!(src.gguf.is_none());
        let infos = src.tensors.tensors();
        let n = *counts
            .get(name.as_str())
            .unwrap_or_else(|| panic!("{name} not in table"));
        assert_eq!(infos.len(), n, "{name}: tensor count");
        assert!(!infos.is_empty(), "{name}");
        for info in infos {
            assert_eq!(info.dtype, QuantFormat::F32, "{name}/{}", info.name);
            let elems: usize = info.shape.iter().product();
            assert_eq!(info.bytes, elems * 4, "{name}/{}: bytes", info.name);
            let t = src.tensors.read_f32(&info.name).unwrap();
            assert_eq!(t.shape, info.shape, "{name}/{}", info.name);
            assert_eq!(t.data.len(), elems, "{name}/{}", info.name);
            assert!(t.data.iter().all(|x| x.is_finite()), "{name}/{}", info.name);
            assert_eq!(src.tensors.info(&info.name), Some(info));
        }
    }
}

#[test]
fn known_values_are_decoded() {
    // Values decoded independently (Python struct.unpack of the raw bytes).
    let src = open_hf_folder(&shared().join("archrefs/llama")).unwrap();
    let norm = src
        .tensors
        .read_f32("model.layers.0.input_layernorm.weight")
        .unwrap();
    assert_eq!(norm.shape, vec![64]);
    assert_eq!(&norm.data[..3], &[0.871_148_05, 1.048_082_2, 1.101_983_3]);
    assert_eq!(norm.data[63], 1.093_190_8);
    let down = src
        .tensors
        .read_f32("model.layers.2.mlp.down_proj.weight")
        .unwrap();
    assert_eq!(down.shape, vec![64, 128]);
    assert_eq!(
        &down.data[..3],
        &[0.074_526_69, -0.010_564_184, 0.107_343_81]
    );
    assert_eq!(down.data[64 * 128 - 1], 0.016_372_517);
    // Matrices are N(0, 1/fan_in).
    let q = src
        .tensors
        .read_f32("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    let var = q.data.iter().map(|x| x * x).sum::<f32>() / q.data.len() as f32;
    assert!((var - 1.0 / 64.0).abs() < 0.004, "q variance {var}");

    let g = open_hf_folder(&shared().join("archrefs/gemma")).unwrap();
    let gn = g.tensors.read_f32("model.norm.weight").unwrap();
    let mean = gn.data.iter().sum::<f32>() / gn.data.len() as f32;
    assert!(
        mean.abs() < 0.05,
        "gemma norms are stored as offsets w of 1 + w: mean {mean}"
    );

    // gpt2 names kept as stored.
    let g2 = open_hf_folder(&shared().join("archrefs/gpt2")).unwrap();
    assert!(g2
        .tensors
        .info("transformer.h.0.attn.c_attn.weight")
        .is_some());
    assert_eq!(
        g2.tensors
            .info("transformer.h.0.attn.c_attn.weight")
            .unwrap()
            .shape,
        vec![64, 192]
    );
}

#[test]
fn missing_tensor_is_no_such_tensor() {
    let src = open_hf_folder(&shared().join("archrefs/llama")).unwrap();
    assert!(matches!(
        src.tensors.read_f32("model.layers.99.mlp.up_proj.weight"),
        Err(ModelError::NoSuchTensor { name, .. }) if name == "model.layers.99.mlp.up_proj.weight"
    ));
}

fn copy_config(from: &Path, to: &Path) {
    std::fs::copy(from.join("config.json"), to.join("config.json")).unwrap();
}

/// Raw little-endian bytes of f32 values.
fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn sharded_folder_reads_the_same_tensors() {
    let orig_dir = shared().join("archrefs/qwen2");
    let orig = open_hf_folder(&orig_dir).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    copy_config(&orig_dir, tmp.path());

    let names: Vec<String> = orig
        .tensors
        .tensors()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    let (first, second) = names.split_at(names.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [first, second].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let tensors: Vec<(String, Vec<u8>, Vec<usize>)> = part
            .iter()
            .map(|n| {
                let t = orig.tensors.read_f32(n).unwrap();
                (n.clone(), f32_bytes(&t.data), t.shape)
            })
            .collect();
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, b, s)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, &None, &tmp.path().join(&file)).unwrap();
        for n in part.iter() {
            weight_map.insert(n.clone(), serde_json::json!(file));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        serde_json::to_string(&index).unwrap(),
    )
    .unwrap();

    let sharded = open_hf_folder(tmp.path()).unwrap();
    assert_eq!(sharded.config, orig.config);
    assert_eq!(sharded.tensors.tensors().len(), names.len());
    for n in &names {
        let a = orig.tensors.read_f32(n).unwrap();
        let b = sharded.tensors.read_f32(n).unwrap();
        assert_eq!(a, b, "{n}");
        assert_eq!(orig.tensors.info(n), sharded.tensors.info(n), "{n}");
    }

    // An index entry that points at the wrong shard is an error naming the tensor.
    let mut bad_map = weight_map.clone();
    bad_map.insert(
        first[0].clone(),
        serde_json::json!("model-00002-of-00002.safetensors"),
    );
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        serde_json::to_string(&serde_json::json!({"weight_map": bad_map})).unwrap(),
    )
    .unwrap();
    assert!(matches!(open_hf_folder(tmp.path()),
        Err(ModelError::BadTensor { name, .. }) if name == first[0]));

    // A shard named in the index but absent → Io naming it.
    std::fs::remove_file(tmp.path().join("model-00002-of-00002.safetensors")).unwrap();
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        serde_json::to_string(&index).unwrap(),
    )
    .unwrap();
    match open_hf_folder(tmp.path()) {
        Err(ModelError::Io { path, .. }) => {
            assert!(
                path.ends_with("model-00002-of-00002.safetensors"),
                "{path:?}"
            )
        }
        other => panic!("expected Io, got {:?}", other.err()),
    }
}

/// A header declaring 64 F32 values while the data section holds only 16 bytes.
fn lying_safetensors() -> Vec<u8> {
    let header = br#"{"w":{"dtype":"F32","shape":[8,8],"data_offsets":[0,256]}}"#;
    let mut buf = (header.len() as u64).to_le_bytes().to_vec();
    buf.extend_from_slice(header);
    buf.extend_from_slice(&[0u8; 16]);
    buf
}

#[test]
fn header_that_lies_about_sizes_is_bad_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    copy_config(&shared().join("archrefs/llama"), tmp.path());
    let file = tmp.path().join("model.safetensors");
    std::fs::write(&file, lying_safetensors()).unwrap();
    match open_hf_folder(tmp.path()) {
        Err(ModelError::BadSafetensors { path, .. }) => assert_eq!(path, file),
        other => panic!("expected BadSafetensors, got {:?}", other.err()),
    }
    // Truncated below the 8-byte length, and a header length past the end.
    std::fs::write(&file, [1u8, 2, 3]).unwrap();
    assert!(matches!(
        open_hf_folder(tmp.path()),
        Err(ModelError::BadSafetensors { .. })
    ));
    std::fs::write(&file, 1_000u64.to_le_bytes()).unwrap();
    assert!(matches!(
        open_hf_folder(tmp.path()),
        Err(ModelError::BadSafetensors { .. })
    ));
    // shape × dtype size ≠ offsets span: the tensor is named.
    let header = br#"{"w":{"dtype":"F32","shape":[8],"data_offsets":[0,16]}}"#;
    let mut buf = (header.len() as u64).to_le_bytes().to_vec();
    buf.extend_from_slice(header);
    buf.extend_from_slice(&[0u8; 16]);
    std::fs::write(&file, buf).unwrap();
    assert!(matches!(
        open_hf_folder(tmp.path()),
        Err(ModelError::BadTensor { name, .. }) if name == "w"
    ));
}

#[test]
fn f16_bf16_are_converted_and_other_dtypes_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    copy_config(&shared().join("archrefs/llama"), tmp.path());
    let vals = [1.5f32, -2.25, 0.0, 65504.0, 3.0e-5];
    let h: Vec<u8> = vals
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    let b: Vec<u8> = vals
        .iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    let views = vec![
        ("h", TensorView::new(Dtype::F16, vec![5], &h).unwrap()),
        ("b", TensorView::new(Dtype::BF16, vec![1, 5], &b).unwrap()),
    ];
    let file = tmp.path().join("model.safetensors");
    safetensors::serialize_to_file(views, &None, &file).unwrap();
    let src = open_hf_folder(tmp.path()).unwrap();
    let th = src.tensors.read_f32("h").unwrap();
    let tb = src.tensors.read_f32("b").unwrap();
    assert_eq!(src.tensors.info("h").unwrap().dtype, QuantFormat::F16);
    assert_eq!(src.tensors.info("b").unwrap().dtype, QuantFormat::BF16);
    assert_eq!(src.tensors.info("b").unwrap().bytes, 10);
    assert_eq!(tb.shape, vec![1, 5]);
    for (i, &x) in vals.iter().enumerate() {
        assert_eq!(th.data[i], half::f16::from_f32(x).to_f32());
        assert_eq!(tb.data[i], half::bf16::from_f32(x).to_f32());
    }
    assert_eq!(&th.data[..2], &[1.5, -2.25]);
    assert_eq!(&tb.data[..2], &[1.5, -2.25]);
    assert!((th.data[4] - 3.0e-5).abs() < 1e-7);

    let ints: Vec<u8> = [1i64, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
    let views = vec![("ids", TensorView::new(Dtype::I64, vec![2], &ints).unwrap())];
    safetensors::serialize_to_file(views, &None, &file).unwrap();
    match open_hf_folder(tmp.path()) {
        Err(ModelError::BadTensor { name, msg, path }) => {
            assert_eq!(name, "ids");
            assert_eq!(path, file);
            assert!(msg.contains("I64"), "{msg}");
        }
        other => panic!("expected BadTensor, got {:?}", other.err()),
    }
}

#[test]
fn missing_files_are_io_errors_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    match open_hf_folder(tmp.path()) {
        Err(ModelError::Io { path, .. }) => assert_eq!(path, tmp.path().join("config.json")),
        other => panic!("expected Io, got {:?}", other.err()),
    }
    copy_config(&shared().join("archrefs/llama"), tmp.path());
    match open_hf_folder(tmp.path()) {
        Err(ModelError::Io { path, .. }) => {
            assert_eq!(path, tmp.path().join("model.safetensors"))
        }
        other => panic!("expected Io, got {:?}", other.err()),
    }
    // open_source dispatches directories to the HF reader.
    assert!(infer_models::open_source(&shared().join("archrefs/llama")).is_ok());
}

fn folder_with_llama_weights() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = shared().join("archrefs/llama");
    copy_config(&src, tmp.path());
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    tmp
}

#[test]
fn tokenizer_and_chat_template_material() {
    let smol = shared().join("models/smollm2-135m-instruct");
    let tmp = folder_with_llama_weights();
    let bare = open_hf_folder(tmp.path()).unwrap();
    assert!(bare.tokenizer_json.is_none() && bare.chat_template.is_none());

    // tokenizer.json + tokenizer_config.json with a list of templates → "default".
    std::fs::copy(
        smol.join("tokenizer.json"),
        tmp.path().join("tokenizer.json"),
    )
    .unwrap();
    let tc = serde_json::json!({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "DEFAULT {{ messages }}"}
    ]});
    std::fs::write(tmp.path().join("tokenizer_config.json"), tc.to_string()).unwrap();
    let s = open_hf_folder(tmp.path()).unwrap();
    let tok = s.tokenizer_json.as_deref().unwrap();
    assert_eq!(
        tok,
        std::fs::read_to_string(smol.join("tokenizer.json")).unwrap()
    );
    assert_eq!(
        s.tokenizer_config_json.as_deref(),
        Some(tc.to_string().as_str())
    );
    assert_eq!(s.chat_template.as_deref(), Some("DEFAULT {{ messages }}"));

    // A string template.
    let tc = serde_json::json!({"chat_template": "STRING"});
    std::fs::write(tmp.path().join("tokenizer_config.json"), tc.to_string()).unwrap();
    assert_eq!(
        open_hf_folder(tmp.path()).unwrap().chat_template.as_deref(),
        Some("STRING")
    );

    // chat_template.jinja wins.
    std::fs::copy(
        smol.join("chat_template.jinja"),
        tmp.path().join("chat_template.jinja"),
    )
    .unwrap();
    let s = open_hf_folder(tmp.path()).unwrap();
    let jinja = std::fs::read_to_string(smol.join("chat_template.jinja")).unwrap();
    assert_eq!(s.chat_template.as_deref(), Some(jinja.as_str()));
    assert!(jinja.contains("<|im_start|>"));
}

/// Issue 15: safetensors errors were shown as the crate's enum names
/// (`InvalidHeaderDeserialization`, `TensorInvalidInfo`); they are now said in words, and a bad
/// entry (not an object, an unknown dtype, a malformed shape or offsets, offsets that do not
/// hold shape × dtype size) names its tensor.
#[test]
fn safetensors_errors_are_said_in_words() {
    let tmp = tempfile::tempdir().unwrap();
    copy_config(&shared().join("archrefs/llama"), tmp.path());
    let file = tmp.path().join("model.safetensors");
    let with_header = |header: &[u8], data: usize| {
        let mut buf = (header.len() as u64).to_le_bytes().to_vec();
        buf.extend_from_slice(header);
        buf.extend(std::iter::repeat(0u8).take(data));
        buf
    };
    for (bytes, want) in [
        (
            with_header(br#"{"w": 5}"#, 0),
            "tensor 'w': the entry has no 'dtype' (expected {dtype, shape, data_offsets}, got 5)",
        ),
        (
            with_header(br#"{"w":{"dtype":"F32","shape":[8],"data_offsets":[0,16]}}"#, 16),
            "tensor 'w': data_offsets [0, 16] hold 16 bytes, but shape [8] of F32 needs 32",
        ),
        (
            with_header(br#"{"w":{"dtype":"Q99","shape":[4],"data_offsets":[0,16]}}"#, 16),
            "tensor 'w': dtype \"Q99\" is not a safetensors dtype (infer reads F32, F16, BF16)",
        ),
        (
            with_header(br#"{"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}"#, 16),
            "tensor 'w': shape [-4] is not a list of non-negative integers",
        ),
        (
            with_header(br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}}"#, 16),
            "tensor 'w': data_offsets [16,0] are not [begin, end] with begin <= end",
        ),
        (with_header(br#"[1, 2]"#, 0), "the header is not valid safetensors JSON"),
        (
            with_header(
                br#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#,
                24,
            ),
            "do not start where the tensor before it (in data order) ends",
        ),
    ] {
        std::fs::write(&file, bytes).unwrap();
        match open_hf_folder(tmp.path()) {
            Err(e @ (ModelError::BadSafetensors { .. } | ModelError::BadTensor { .. })) => {
                let msg = e.to_string();
                assert!(msg.contains(want), "{msg}");
                assert!(msg.contains("model.safetensors"), "{msg}");
                for name in ["InvalidHeaderDeserialization", "TensorInvalidInfo", "InvalidOffset"] {
                    assert!(!msg.contains(name), "{msg}");
                }
            }
            other => panic!("expected BadSafetensors or BadTensor, got {:?}", other.err()),
        }
    }
}
