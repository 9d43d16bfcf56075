//! `infer export` end to end: vindex → Hugging Face folder → `infer extract` gives the float
//! tier back bit for bit (every archrefs case, f32 and f16, sharded), and the folder's tensors
//! are the original checkpoint's byte for byte; vindex → GGUF → `infer extract` gives every
//! quantized block back byte for byte (the real SmolLM2 and Gemma-3 q4k vindexes, with
//! identical logits; q8 and q4 tiers) and the float tier exactly (Gemma's `1 + w` norms within
//! one f32 step); refusals (tiers the vindex lacks or llama.cpp cannot hold, families without a
//! GGUF form, bad or existing output paths) write nothing; SIGTERM leaves nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;
use common::{infer, model_file, shared_dir, text};
use infer_vindex::{files, Vindex};

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Run `infer ARGS`, which must succeed.
fn ok(args: &[&str]) -> String {
    let o = infer(args);
    assert!(o.status.success(), "infer {args:?} failed: {}", text(&o));
    text(&o)
}

/// Run `infer ARGS`, which must fail naming every needle; returns the output.
fn fails(args: &[&str], needles: &[&str]) -> String {
    let o = infer(args);
    let t = text(&o);
    assert!(!o.status.success(), "infer {args:?} succeeded: {t}");
    for n in needles {
        assert!(t.contains(n), "infer {args:?}: output lacks {n:?}: {t}");
    }
    t
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// One stored tensor: shape, format tag, bytes.
type Stored = (Vec<usize>, String, Vec<u8>);

/// Every tensor a vindex stores, by (file, key): the float tier and embeddings/norms/other
/// files, every quantized file (`QUANT_BINS`) and the q8 value plane.
fn stored(v: &Vindex) -> BTreeMap<(String, String), Stored> {
    let mut out = BTreeMap::new();
    for k in v.keys() {
        let (file, e) = v.entry(k).unwrap();
        let bytes = v.mapped_bytes(file).unwrap()[e.offset..e.offset + e.length].to_vec();
        out.insert(
            (file.to_string(), k.to_string()),
            (e.shape.clone(), e.format.name().to_string(), bytes),
        );
    }
    for &(bin, _) in files::QUANT_BINS {
        for e in v.quant_entries(bin) {
            let (bytes, _) = v.quant_tensor(bin, &e.key).unwrap();
            out.insert(
                (bin.to_string(), e.key.clone()),
                (e.shape.clone(), e.format.name().to_string(), bytes.to_vec()),
            );
        }
    }
    for e in v.q8_value_entries() {
        let (values, _) = v.q8_tensor(&e.key).unwrap();
        out.insert(
            (files::ATTN_Q8_BIN.to_string(), e.key.clone()),
            (e.shape.clone(), "I8".into(), values.to_vec()),
        );
    }
    out
}

fn open(p: &Path) -> Vindex {
    Vindex::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The tensors of a safetensors file by name: (dtype, shape, bytes).
fn st_tensors(path: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                (
                    format!("{:?}", t.dtype()),
                    t.shape().to_vec(),
                    t.data().to_vec(),
                ),
            )
        })
        .collect()
}

/// The archrefs case folders, then those of archrefs-next (Qwen3-MoE, gpt-oss, Cohere-2).
fn archref_dirs() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for folder in ["archrefs", "archrefs-next"] {
        let mut v: Vec<PathBuf> = std::fs::read_dir(shared_dir().join(folder))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("config.json").is_file())
            .collect();
        v.sort();
        all.extend(v);
    }
    all
}

/// An archrefs case folder: `archrefs/CASE`, else `archrefs-next/CASE`.
fn case_dir(case: &str) -> PathBuf {
    let first = shared_dir().join("archrefs").join(case);
    if first.is_dir() {
        first
    } else {
        shared_dir().join("archrefs-next").join(case)
    }
}

/// Every archrefs case (19 families and variants, and the 3 of archrefs-next): f32 vindex → HF
/// folder whose tensors are the original model.safetensors byte for byte (names, dtypes,
/// shapes, data: fused q/k/v and gate/up joined again, GPT-2 Conv1D transposed back, gpt-oss's
/// per-expert matrices and biases fused again) and whose config.json parses to the
/// same config; `infer extract` of the folder stores every tensor of the first vindex
/// bit for bit.
#[test]
fn archrefs_safetensors_round_trip_bit_exact() {
    let root = tempfile::tempdir().unwrap();
    let cases = archref_dirs();
    assert!(cases.len() >= 22, "{} archrefs cases", cases.len());
    for src in cases {
        let name = src.file_name().unwrap().to_string_lossy().into_owned();
        let v1 = root.path().join(format!("{name}.vindex"));
        let hf = root.path().join(format!("{name}.hf"));
        let v2 = root.path().join(format!("{name}.2.vindex"));
        ok(&[
            "extract",
            s(&src),
            "-o",
            s(&v1),
            "--quant",
            "none",
            "--no-tokenizer",
        ]);
        let out = ok(&["export", s(&v1), "-o", s(&hf), "--safetensors"]);
        assert!(out.contains("Hugging Face folder"), "{out}");
        assert_eq!(
            st_tensors(&hf.join("model.safetensors")),
            st_tensors(&src.join("model.safetensors")),
            "{name}: exported tensors differ from the checkpoint's"
        );
        let cfg =
            |p: &Path| infer_models::ModelConfig::from_hf_file(&p.join("config.json")).unwrap();
        assert_eq!(cfg(&hf), cfg(&src), "{name}: config.json");
        assert_eq!(entries(&hf), ["config.json", "model.safetensors"], "{name}");
        ok(&[
            "extract",
            s(&hf),
            "-o",
            s(&v2),
            "--quant",
            "none",
            "--no-tokenizer",
        ]);
        let (a, b) = (open(&v1), open(&v2));
        assert_eq!(a.config(), b.config(), "{name}");
        let (sa, sb) = (stored(&a), stored(&b));
        assert!(!sa.is_empty());
        assert_eq!(sa, sb, "{name}: re-extracted float tier differs");
    }
}

/// An f16 float tier goes out as f16 matrices (f32 1-D tensors) and comes back bit for bit,
/// here split into shards (`--shard-size`) with transformers' index file; a vindex without a
/// float tier is written from its quantized tier, dequantized exactly.
#[test]
fn f16_sharded_and_quantized_only_round_trips() {
    let root = tempfile::tempdir().unwrap();
    for case in ["llama", "phi3-partial", "gpt2"] {
        let src = shared_dir().join("archrefs").join(case);
        let v1 = root.path().join(format!("{case}.vindex"));
        let hf = root.path().join(format!("{case}.hf"));
        let v2 = root.path().join(format!("{case}.2.vindex"));
        let common = ["--quant", "none", "--float", "f16", "--no-tokenizer"];
        let mut args = vec!["extract", s(&src), "-o", s(&v1)];
        args.extend(common);
        ok(&args);
        ok(&[
            "export",
            s(&v1),
            "-o",
            s(&hf),
            "--safetensors",
            "--shard-size",
            "30000",
        ]);
        let files = entries(&hf);
        assert!(
            files.contains(&"model.safetensors.index.json".to_string()),
            "{files:?}"
        );
        assert!(
            !files.contains(&"model.safetensors".to_string()),
            "{files:?}"
        );
        let index: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(hf.join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let map = index["weight_map"].as_object().unwrap();
        let shards: std::collections::BTreeSet<&str> =
            map.values().map(|f| f.as_str().unwrap()).collect();
        assert!(shards.len() > 1, "{case}: {shards:?}");
        let mut total = 0;
        for sh in &shards {
            assert!(
                sh.starts_with("model-000") && sh.contains("-of-000"),
                "{sh}"
            );
            let t = st_tensors(&hf.join(sh));
            for (n, (dtype, shape, bytes)) in &t {
                assert_eq!(map[n].as_str(), Some(*sh), "{n}");
                let want = if shape.len() == 2 { "F16" } else { "F32" };
                assert_eq!(dtype, want, "{case} {n}");
                total += bytes.len();
            }
            // Each shard is at most the limit unless it holds one tensor.
            let len = std::fs::metadata(hf.join(sh)).unwrap().len();
            assert!(len <= 30000 + 4096 || t.len() == 1, "{sh}: {len} bytes");
        }
        assert_eq!(index["metadata"]["total_size"], total, "{case}");
        assert_eq!(map.len(), st_tensors(&src.join("model.safetensors")).len());
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["torch_dtype"], "float16");
        let mut args = vec!["extract", s(&hf), "-o", s(&v2)];
        args.extend(common);
        ok(&args);
        assert_eq!(stored(&open(&v1)), stored(&open(&v2)), "{case}: f16 tier");
    }

    // No float tier: the q4k blocks dequantized (exactly) are what the folder stores.
    let src = shared_dir().join("archrefs/qwen3");
    let q = root.path().join("q.vindex");
    let hf = root.path().join("q.hf");
    let back = root.path().join("q.2.vindex");
    ok(&["extract", s(&src), "-o", s(&q), "--no-tokenizer"]);
    let qv = open(&q);
    assert!(
        qv.tiers().iter().all(|t| t.name() == "q4k"),
        "{:?}",
        qv.tiers()
    );
    ok(&["export", s(&q), "-o", s(&hf), "--safetensors"]);
    ok(&[
        "extract",
        s(&hf),
        "-o",
        s(&back),
        "--quant",
        "none",
        "--no-tokenizer",
    ]);
    let bv = open(&back);
    let (bytes, e) = qv
        .quant_tensor(
            files::ATTN_Q4K_BIN,
            "model.layers.1.self_attn.q_proj.weight",
        )
        .unwrap();
    let want = infer_quant::dequantize_to_vec(e.format, bytes, e.numel()).unwrap();
    let (got, _) = bv.tensor("model.layers.1.self_attn.q_proj.weight").unwrap();
    assert_eq!(got.as_f32().unwrap(), &want[..]);
    let (bytes, e) = qv
        .quant_tensor(
            files::INTERLEAVED_Q4K_BIN,
            "model.layers.2.mlp.down_proj.weight",
        )
        .unwrap();
    let want = infer_quant::dequantize_to_vec(e.format, bytes, e.numel()).unwrap();
    let (h, i) = (e.shape[0], e.shape[1]);
    let got = bv.down_layer(2).unwrap().to_f32_vec(); // feature-major [i, h]
    for r in 0..h {
        for c in 0..i {
            assert_eq!(got[c * h + r].to_bits(), want[r * i + c].to_bits());
        }
    }
}

/// Float-tier GGUF round trip for every archrefs family infer reads from GGUF: the values come
/// back exactly (Q/K rows through llama.cpp's order and back; phi3's q/k/v and gate/up fused
/// and split again; Gemma-3's sliding pattern and local RoPE base, Cohere-2's window and
/// `logit_scale` through their keys), except
/// Gemma's norms, stored as `1 + w` in f32, within one f32 step of `1 + w`. Families and
/// features llama.cpp cannot run as the vindex does are refused, naming why, writing nothing.
#[test]
fn archrefs_gguf_float_round_trip_and_refusals() {
    let root = tempfile::tempdir().unwrap();
    let cases = [
        "llama",
        "llama-tied-gqa1",
        "qwen2",
        "qwen3",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3-ropescale",
        "starcoder2",
        "phi3-partial",
        "cohere2",
    ];
    for case in cases {
        let src = case_dir(case);
        let v1 = root.path().join(format!("{case}.vindex"));
        let g = root.path().join(format!("{case}.gguf"));
        let v2 = root.path().join(format!("{case}.2.vindex"));
        ok(&[
            "extract",
            s(&src),
            "-o",
            s(&v1),
            "--quant",
            "none",
            "--no-tokenizer",
        ]);
        ok(&["export", s(&v1), "-o", s(&g)]);
        ok(&[
            "extract",
            s(&g),
            "-o",
            s(&v2),
            "--quant",
            "none",
            "--no-tokenizer",
        ]);
        let (a, b) = (open(&v1), open(&v2));
        let mut want = a.config().clone();
        let got = b.config().clone();
        // Without a tokenizer the GGUF has no token ids (fields that do not change the
        // forward pass).
        want.max_position_embeddings = got.max_position_embeddings;
        want.bos_token_id = got.bos_token_id;
        want.eos_token_ids = got.eos_token_ids.clone();
        want.pad_token_id = got.pad_token_id;
        assert_eq!(want, got, "{case}: config");
        let gemma = case.starts_with("gemma");
        let (sa, sb) = (stored(&a), stored(&b));
        let by_key = |m: &BTreeMap<(String, String), Stored>| -> BTreeMap<String, Stored> {
            m.iter().map(|((_, k), v)| (k.clone(), v.clone())).collect()
        };
        let (ka, kb) = (by_key(&sa), by_key(&sb));
        assert_eq!(
            ka.keys().collect::<Vec<_>>(),
            kb.keys().collect::<Vec<_>>(),
            "{case}"
        );
        for (k, (shape, fmt, bytes)) in &ka {
            let (shape2, fmt2, bytes2) = &kb[k];
            assert_eq!((shape, fmt), (shape2, fmt2), "{case} {k}");
            if gemma && k.ends_with("norm.weight") {
                let f = |b: &[u8]| -> Vec<f32> {
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect()
                };
                for (x, y) in f(bytes).iter().zip(f(bytes2)) {
                    assert!(
                        (x - y).abs() <= f32::EPSILON * (1.0 + x.abs()),
                        "{case} {k}: {x} → {y}"
                    );
                }
            } else {
                assert_eq!(bytes, bytes2, "{case} {k}");
            }
        }
    }

    let refused = [
        ("llama3-rope", "Llama-3 RoPE scaling"),
        ("mistral-swa", "sliding-window attention (window 8)"),
        ("gpt2", "model_type 'gpt2' has no GGUF export"),
        ("mixtral", "has no GGUF export"),
        ("gpt-oss", "has no GGUF export"),
    ];
    for (case, why) in refused {
        let src = case_dir(case);
        let v = root.path().join(format!("r-{case}.vindex"));
        let g = root.path().join(format!("r-{case}.gguf"));
        ok(&[
            "extract",
            s(&src),
            "-o",
            s(&v),
            "--quant",
            "none",
            "--no-tokenizer",
        ]);
        fails(&["export", s(&v), "-o", s(&g)], &[why, "--safetensors"]);
        assert!(!g.exists(), "{case}: {} written", g.display());
    }
    let left: Vec<String> = entries(root.path())
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
}

/// Build the default (q4k, no float tier) vindex of a real GGUF, export it, extract the export.
fn real_round_trip(model: &str, root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let gguf = model_file(model);
    let v1 = root.join("a.vindex");
    let g = root.join("a.gguf");
    let v2 = root.join("b.vindex");
    ok(&["extract", s(&gguf), "-o", s(&v1)]);
    let out = ok(&["export", s(&v1), "-o", s(&g)]);
    assert!(
        out.contains("GGUF") && out.contains("attention Q4K, FFN Q4K"),
        "{out}"
    );
    // The output projection's stored format, never "Float" for a vindex without a float tier
    // (both models tie it to their quantized embeddings).
    let emb = open(&v1).embeddings().0.format();
    assert!(
        out.contains(&format!("output tied to the embeddings ({emb})")) && !out.contains("Float"),
        "{out}"
    );
    ok(&["extract", s(&g), "-o", s(&v2)]);
    (v1, g, v2)
}

/// Every stored tensor of the two vindexes is byte-identical, and the second one's
/// passthrough record lists all `n_quantized` block tensors.
fn assert_same_vindex_tensors(v1: &Path, v2: &Path, n_quantized: usize) {
    let (a, b) = (open(v1), open(v2));
    let (sa, sb) = (stored(&a), stored(&b));
    let quantized = sa.iter().filter(|(_, (_, f, _))| f != "F32").count();
    assert_eq!(quantized, n_quantized);
    assert_eq!(sa, sb);
    assert_eq!(b.index().passthrough.len(), n_quantized);
}

/// Every stored tensor of the two vindexes is byte-identical (quantized blocks, embeddings,
/// norms), both record every quantized tensor as passed through from their GGUF, and the
/// tokenizer, chat template and config come back; logits on a prompt are identical.
fn assert_same_vindex(v1: &Path, v2: &Path, n_quantized: usize) {
    assert_same_vindex_tensors(v1, v2, n_quantized);
    let (a, b) = (open(v1), open(v2));
    assert_eq!(a.config(), b.config());
    assert_eq!(a.tiers(), b.tiers());
    assert_eq!(a.tokenizer_json().unwrap(), b.tokenizer_json().unwrap());
    assert_eq!(a.chat_template(), b.chat_template());
    let root = v1.parent().unwrap();
    let prompt = "The quick brown fox jumps over the lazy dog because";
    for (v, out) in [(v1, "l1.safetensors"), (v2, "l2.safetensors")] {
        ok(&[
            "logits",
            s(v),
            "--prompt",
            prompt,
            "--out",
            s(&root.join(out)),
        ]);
    }
    let l1 = st_tensors(&root.join("l1.safetensors"));
    assert!(l1["logits"].1[0] >= 10, "{:?}", l1["logits"].1);
    assert_eq!(
        l1,
        st_tensors(&root.join("l2.safetensors")),
        "logits differ"
    );
}

/// The real SmolLM2 q4k vindex (requantized from its Q4_1 GGUF: Q5_0/Q8_0/Q6_K blocks) → GGUF →
/// infer: every block byte-identical (Q/K rows through llama.cpp's order and back), the same
/// tokenizer.json (byte-level BPE, pre `smollm`), chat template and config, identical logits.
#[test]
fn smollm2_q4k_gguf_round_trip_is_byte_identical() {
    let root = tempfile::tempdir().unwrap();
    let (v1, g, v2) = real_round_trip(SMOL, root.path());
    // 30 layers × (4 attention + 3 FFN) + the Q8_0 embeddings.
    assert_same_vindex(&v1, &v2, 30 * 7 + 1);
    assert_eq!(open(&v1).embeddings().0.format().to_string(), "Q8_0");
    let h = infer_models::gguf::GgufHeader::read(&g).unwrap();
    let md: BTreeMap<&str, &infer_models::gguf::GgufValue> =
        h.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    use infer_models::gguf::GgufValue as V;
    assert_eq!(md["general.architecture"], &V::String("llama".into()));
    assert_eq!(md["tokenizer.ggml.model"], &V::String("gpt2".into()));
    assert_eq!(md["tokenizer.ggml.pre"], &V::String("smollm".into()));
    assert_eq!(md["tokenizer.ggml.bos_token_id"], &V::U32(1));
    assert_eq!(md["tokenizer.ggml.eos_token_id"], &V::U32(2));
    assert!(md.contains_key("tokenizer.chat_template"));
    assert!(h.tensors.iter().all(|t| t.name != "output.weight"), "tied");
}

/// The real Gemma-3 q4k vindex (the GGUF's own Q4_K/Q5_0/Q6_K/Q8_0 blocks) → GGUF → infer: the
/// same bytes everywhere (norms through `1 + w` and back included), the SentencePiece
/// vocabulary (scores, types, flags) and config, identical logits.
#[test]
fn gemma3_q4k_gguf_round_trip_is_byte_identical() {
    let root = tempfile::tempdir().unwrap();
    let (v1, g, v2) = real_round_trip(GEMMA, root.path());
    assert_same_vindex(&v1, &v2, 18 * 7 + 1);
    // The same tensor table (names, types, shapes) as the GGUF the vindex was built from.
    let table = |p: &Path| -> BTreeMap<String, (Vec<usize>, String)> {
        infer_models::gguf::GgufHeader::read(p)
            .unwrap()
            .tensors
            .into_iter()
            .map(|t| (t.name, (t.dims, t.format.name().to_string())))
            .collect()
    };
    assert_eq!(table(&g), table(&model_file(GEMMA)));
}

/// The q8 tier (int8 + f32 scales) goes out as Q8_0 blocks and comes back byte-identical (a
/// scale that is not an f16 value is refused: Q8_0 cannot hold it); the q4 tier's Q4_0 FFN and
/// output likewise; refusals name the problem and write nothing.
#[test]
fn q8_q4_tiers_and_refusals() {
    let root = tempfile::tempdir().unwrap();
    let src = shared_dir().join("archrefs/llama");
    let v = root.path().join("all.vindex");
    ok(&[
        "extract",
        s(&src),
        "-o",
        s(&v),
        "--quant",
        "all",
        "--float",
        "f32",
        "--no-tokenizer",
    ]);
    let a = stored(&open(&v));
    // q8: 3 layers × 4 projections, values and scales; q4: 3 × 3 FFN matrices and lm_head.
    for (tier, quant, file_set, n) in [
        (
            "q8",
            "q8",
            vec![files::ATTN_Q8_BIN, files::ATTN_Q8_SCALES_BIN],
            24,
        ),
        (
            "q4",
            "q4",
            vec![files::INTERLEAVED_Q4_BIN, files::LM_HEAD_Q4_BIN],
            10,
        ),
    ] {
        let g = root.path().join(format!("{tier}.gguf"));
        let back = root.path().join(format!("{tier}.vindex"));
        ok(&["export", s(&v), "-o", s(&g), "--tier", tier]);
        ok(&[
            "extract",
            s(&g),
            "-o",
            s(&back),
            "--quant",
            quant,
            "--no-tokenizer",
        ]);
        let b = stored(&open(&back));
        let pick = |m: &BTreeMap<(String, String), Stored>| -> BTreeMap<(String, String), Stored> {
            m.iter()
                .filter(|((f, _), _)| file_set.contains(&f.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let (pa, pb) = (pick(&a), pick(&b));
        assert_eq!(pa.len(), n, "{tier}");
        assert_eq!(pa, pb, "{tier}: tier data differs after the round trip");
    }

    // Refusals: nothing is written, the message says why.
    let out = root.path().join("x.gguf");
    let q4k_only = root.path().join("q4k.vindex");
    ok(&["extract", s(&src), "-o", s(&q4k_only), "--no-tokenizer"]);
    // Untied and without a float tier: the q4k tier's output matrix is the only one, and it
    // goes out as `output.weight` with every other block.
    let g = root.path().join("q4k.gguf");
    let back = root.path().join("q4k.2.vindex");
    ok(&["export", s(&q4k_only), "-o", s(&g)]);
    let h = infer_models::gguf::GgufHeader::read(&g).unwrap();
    assert!(h.tensors.iter().any(|t| t.name == "output.weight"));
    ok(&["extract", s(&g), "-o", s(&back), "--no-tokenizer"]);
    assert_same_vindex_tensors(&q4k_only, &back, 3 * 7 + 2);
    fails(
        &["export", s(&q4k_only), "-o", s(&out), "--tier", "q8"],
        &["no 'q8' tier (it has q4k)"],
    );
    fails(
        &["export", s(&v), "-o", s(&out), "--tier", "f16"],
        &["no 'f16' tier", "its float tier is f32"],
    );
    fails(
        &["export", s(&v), "-o", s(&out), "--tier", "q5"],
        &["unknown tier 'q5'"],
    );
    fails(
        &["export", s(&v), "-o", "/nonexistent-dir/x.gguf"],
        &["output directory /nonexistent-dir does not exist"],
    );
    std::fs::write(&out, b"keep").unwrap();
    fails(
        &["export", s(&v), "-o", s(&out)],
        &["exists; infer export does not replace files or folders"],
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");
    let dir = root.path().join("folder");
    std::fs::create_dir(&dir).unwrap();
    fails(
        &["export", s(&v), "-o", s(&dir), "--safetensors"],
        &["exists; infer export does not replace"],
    );
    assert!(entries(&dir).is_empty());
    fails(
        &["export", s(&v), "-o", s(&v.join("x.gguf"))],
        &["lies inside the vindex"],
    );
    fails(
        &[
            "export",
            s(&root.path().join("none.vindex")),
            "-o",
            s(&root.path().join("y.gguf")),
        ],
        &["none.vindex"],
    );
    fails(
        &[
            "export",
            s(&v),
            "-o",
            s(&root.path().join("z.gguf")),
            "--shard-size",
            "10",
        ],
        &["--safetensors"],
    );
    // A q8 scale that is not an f16 value: Q8_0 cannot hold it.
    let scales = v.join(files::ATTN_Q8_SCALES_BIN);
    let mut bytes = std::fs::read(&scales).unwrap();
    bytes[0..4].copy_from_slice(&(1.0f32 + f32::EPSILON).to_le_bytes());
    std::fs::write(&scales, bytes).unwrap();
    let g = root.path().join("bad-q8.gguf");
    fails(
        &["export", s(&v), "-o", s(&g), "--tier", "q8"],
        &["is not an f16 value", "Q8_0"],
    );
    assert!(!g.exists());
    let left: Vec<String> = entries(root.path())
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
}

/// SIGTERM while the GGUF is being written: the staged temp file is removed, nothing at OUT,
/// exit status 143.
#[test]
fn sigterm_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    let v = root.path().join("g.vindex");
    ok(&[
        "extract",
        s(&model_file(GEMMA)),
        "-o",
        s(&v),
        "--no-tokenizer",
    ]);
    let out_dir = root.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("g.gguf");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["export", s(&v), "-o", s(&out)])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while entries(&out_dir).is_empty() {
        assert!(t0.elapsed().as_secs() < 60, "no temp file appeared");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let tmp = entries(&out_dir);
    assert!(tmp[0].starts_with(".g.gguf.tmp-"), "{tmp:?}");
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", text(&o));
    assert!(
        entries(&out_dir).is_empty(),
        "left: {:?}",
        entries(&out_dir)
    );
}
