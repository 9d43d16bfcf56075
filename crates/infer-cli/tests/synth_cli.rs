//! `infer synth`: random weights of a real model's shapes and formats.
//!
//! GGUF: the real SmolLM2 and Gemma-3 GGUFs (`INFER_MODELS`); HF: archrefs configs
//! (`INFER_SHARED`). Both must be present (CI has them); a missing one fails with the fix.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{infer, model_file, shared_dir, text};
use infer_models::gguf::{GgufFile, GgufHeader};

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

fn ok(args: &[&str]) -> String {
    let o = infer(args);
    assert!(o.status.success(), "infer {args:?} failed:\n{}", text(&o));
    text(&o)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Names of the entries of `dir` (to check nothing, not even a temp file, is left behind).
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// OUT has the model's metadata (every key, type, value, in order), version, alignment and
/// tensor table (names, dims, types, offsets), byte-identical header bytes, and data that
/// dequantizes to finite values: matrices with standard deviation within 0.02 ± 0.004 (N(0,
/// 0.02) plus quantization error), norm weights within 1 ± 0.06, other 1-D tensors within ±0.03.
fn check_like(model: &Path, out: &Path) {
    let m = GgufHeader::read(model).unwrap();
    let f = GgufFile::open(out).unwrap();
    let o = GgufHeader::from_file(&f);
    assert_eq!(o.version, m.version);
    assert_eq!(o.alignment, m.alignment);
    assert_eq!(o.metadata.len(), m.metadata.len());
    for (a, b) in o.metadata.iter().zip(&m.metadata) {
        assert_eq!(a, b, "metadata {}", b.0);
    }
    assert_eq!(o.tensors, m.tensors);
    let ds = f.data_start();
    let mb = std::fs::read(model).unwrap();
    let ob = std::fs::read(out).unwrap();
    assert_eq!(&ob[..ds], &mb[..ds], "header bytes");
    assert_eq!(ob.len(), ds + m.data_len());
    for t in &o.tensors {
        let v = infer_quant::dequantize_to_vec(
            t.format,
            f.tensor_bytes(&t.name).unwrap(),
            t.n_elements(),
        )
        .unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{} not finite", t.name);
        if t.dims.len() >= 2 {
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
            let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
            assert!(
                (sd - 0.02).abs() < 0.004 && mean.abs() < 0.002,
                "{} ({}): mean {mean} std {sd}",
                t.name,
                t.format
            );
        } else if t.name.contains("norm") {
            assert!(v.iter().all(|x| (x - 1.0).abs() < 0.06), "{}", t.name);
        } else {
            assert!(v.iter().all(|x| x.abs() < 0.03), "{}", t.name);
        }
    }
}

/// `infer synth --like model --header-only -o skel`.
fn header_only(model: &Path, skel: &Path) {
    ok(&["synth", "--like", s(model), "--header-only", "-o", s(skel)]);
}

#[test]
fn smollm2_synth_same_header_seeded_data_and_runs() {
    let model = model_file(SMOL);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smol.gguf");
    ok(&["synth", "--like", s(&model), "-o", s(&out), "--seed", "1"]);
    check_like(&model, &out);

    // Header only: small, not openable as a model, but synth from it gives the same bytes.
    let skel = dir.path().join("skel.gguf");
    header_only(&model, &skel);
    let skel_len = std::fs::metadata(&skel).unwrap().len();
    assert!(skel_len < 4 << 20, "header-only file is {skel_len} bytes");
    assert!(GgufFile::open(&skel).is_err());
    let again = dir.path().join("again.gguf");
    ok(&["synth", "--like", s(&skel), "-o", s(&again), "--seed", "1"]);
    let a = std::fs::read(&out).unwrap();
    assert!(
        std::fs::read(&again).unwrap() == a,
        "header-only round trip differs"
    );

    // An existing file is never replaced, not even with --force (it stays byte-identical).
    fails(
        &[
            "synth",
            "--like",
            s(&model),
            "-o",
            s(&again),
            "--seed",
            "2",
            "--force",
        ],
        &[s(&again), "does not replace files"],
    );
    assert!(std::fs::read(&again).unwrap() == a, "existing file changed");
    // Same seed: same bytes; another seed: different data.
    let same_out = dir.path().join("same.gguf");
    ok(&[
        "synth",
        "--like",
        s(&model),
        "-o",
        s(&same_out),
        "--seed",
        "1",
    ]);
    assert!(std::fs::read(&same_out).unwrap() == a, "same seed differs");
    let other = dir.path().join("other.gguf");
    ok(&["synth", "--like", s(&model), "-o", s(&other), "--seed", "2"]);
    let b = std::fs::read(&other).unwrap();
    assert_eq!(a.len(), b.len());
    let ds = GgufFile::open(&other).unwrap().data_start();
    assert_eq!(&a[..ds], &b[..ds]);
    let same = a[ds..].iter().zip(&b[ds..]).filter(|(x, y)| x == y).count();
    assert!(
        same < (a.len() - ds) / 2,
        "seed 2 shares {same} of {} data bytes with seed 1",
        a.len() - ds
    );
    std::fs::remove_file(&same_out).unwrap();
    std::fs::remove_file(&other).unwrap();
    assert_eq!(
        entries(dir.path()),
        ["again.gguf", "skel.gguf", "smol.gguf"]
    );

    // The synthesised GGUF extracts and runs (tokens out, finite logits).
    let vx = dir.path().join("smol.vindex");
    ok(&["extract", s(&out), "-o", s(&vx)]);
    let run = infer(&["run", s(&vx), "Hello", "-n", "8"]);
    assert!(run.status.success(), "{}", text(&run));
    assert!(!run.stdout.is_empty(), "no tokens: {}", text(&run));
    assert!(!text(&run).to_lowercase().contains("nan"), "{}", text(&run));
    ok(&["logits", s(&vx), "--ids", "1,2,3,4"]);
}

#[test]
fn gemma3_synth_same_header_and_header_only_round_trip() {
    let model = model_file(GEMMA);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gemma.gguf");
    let t0 = std::time::Instant::now();
    ok(&["synth", "--like", s(&model), "-o", s(&out), "--seed", "7"]);
    eprintln!("gemma synth: {:.1} s", t0.elapsed().as_secs_f64());
    check_like(&model, &out);
    let skel = dir.path().join("skel.gguf");
    header_only(&model, &skel);
    let again = dir.path().join("again.gguf");
    ok(&["synth", "--like", s(&skel), "-o", s(&again), "--seed", "7"]);
    assert!(
        std::fs::read(&again).unwrap() == std::fs::read(&out).unwrap(),
        "header-only round trip differs"
    );
}

/// Names and shapes of a safetensors file.
fn st_shapes(path: &Path) -> BTreeMap<String, Vec<usize>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec()))
        .collect()
}

/// For archrefs cases covering the canonical names, renamed families (StarCoder2, Mixtral),
/// biases, tied embeddings, q/k norms, post-norms and MoE: exactly the real checkpoint's names
/// and shapes; extract (all tiers) and a forward with finite logits.
#[test]
fn config_json_synth_matches_archrefs_and_runs() {
    let shared = shared_dir();
    let dir = tempfile::tempdir().unwrap();
    for case in [
        "llama",
        "qwen2",
        "gemma3",
        "olmo2",
        "qwen2-moe",
        "starcoder2",
        "mixtral",
        "phi",
    ] {
        let src = shared.join("archrefs").join(case);
        let out = dir.path().join(case);
        let msg = ok(&[
            "synth",
            "--like",
            s(&src.join("config.json")),
            "-o",
            s(&out),
            "--seed",
            "3",
        ]);
        assert_eq!(
            st_shapes(&out.join("model.safetensors")),
            st_shapes(&src.join("model.safetensors")),
            "{case}: {msg}"
        );
        assert_eq!(
            std::fs::read(out.join("config.json")).unwrap(),
            std::fs::read(src.join("config.json")).unwrap()
        );
        let vx = dir.path().join(format!("{case}.vindex"));
        ok(&[
            "extract",
            s(&out),
            "-o",
            s(&vx),
            "--quant",
            "all",
            "--no-tokenizer",
        ]);
        let logits = dir.path().join(format!("{case}.logits.safetensors"));
        ok(&["logits", s(&vx), "--ids", "1,2,3,4,5", "--out", s(&logits)]);
        let bytes = std::fs::read(&logits).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let l = st.tensor("logits").unwrap();
        let vals: Vec<f32> = l
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert!(
            !vals.is_empty() && vals.iter().all(|v| v.is_finite()),
            "{case}"
        );
        assert!(
            vals.iter().any(|&v| v != vals[0]),
            "{case}: constant logits"
        );
        if case == "llama" {
            // More ids than max_position_embeddings (256): refused as run/bench do.
            let ids = vec!["1"; 257].join(",");
            let o = infer(&["logits", s(&vx), "--ids", &ids]);
            let t = text(&o);
            assert_eq!(o.status.code(), Some(1), "{t}");
            assert!(
                t.contains("257 tokens exceed the model's maximum context 256"),
                "{t}"
            );
        }
    }
    // bf16 weights.
    let out = dir.path().join("llama-bf16");
    let cfg = shared.join("archrefs/llama/config.json");
    ok(&["synth", "--like", s(&cfg), "-o", s(&out), "--dtype", "bf16"]);
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        st.tensor("lm_head.weight").unwrap().dtype(),
        safetensors::Dtype::BF16
    );
    // Fused-tensor families are refused with the reason.
    let e = infer(&[
        "synth",
        "--like",
        s(&shared.join("archrefs/gpt2/config.json")),
        "-o",
        s(&dir.path().join("gpt2")),
    ]);
    assert!(
        !e.status.success() && text(&e).contains("gpt2"),
        "{}",
        text(&e)
    );
    assert!(!dir.path().join("gpt2").exists());
}

/// Missing file, non-GGUF file, truncated header, unknown extension, existing output: non-zero
/// exit, a message naming the file, nothing at OUT (no temp file either).
#[test]
fn errors_name_the_file_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out.gguf");
    let fail = |like: &Path, needle: &str| {
        let o = infer(&["synth", "--like", s(like), "-o", s(&out)]);
        let t = text(&o);
        assert!(!o.status.success(), "{t}");
        assert!(
            t.contains(s(like)),
            "message does not name {}: {t}",
            like.display()
        );
        assert!(t.contains(needle), "expected '{needle}': {t}");
        assert!(!out.exists());
    };
    fail(&d.join("missing.gguf"), "no such file");
    let text_file = d.join("notes.gguf");
    std::fs::write(&text_file, "this is not a gguf file, just some text").unwrap();
    fail(&text_file, "bad magic");
    let model = model_file(SMOL);
    let head = std::fs::read(&model).unwrap();
    let cut = d.join("cut.gguf");
    std::fs::write(&cut, &head[..200_000]).unwrap();
    fail(&cut, "truncated");
    let bin = d.join("model.bin");
    std::fs::write(&bin, "x").unwrap();
    fail(&bin, "unknown kind");

    std::fs::write(&out, "keep me").unwrap();
    let o = infer(&["synth", "--like", s(&model), "--header-only", "-o", s(&out)]);
    assert!(
        !o.status.success() && text(&o).contains(s(&out)),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("does not replace files"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
    assert_eq!(
        entries(d),
        ["cut.gguf", "model.bin", "notes.gguf", "out.gguf"]
    );
}

/// SIGTERM while writing (as Ctrl-C): the staged temp file is removed, nothing at OUT.
#[test]
fn sigterm_removes_the_temp_file() {
    let model = model_file(GEMMA);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g.gguf");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["synth", "--like", s(&model), "-o", s(&out)])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while entries(dir.path()).is_empty() {
        assert!(t0.elapsed().as_secs() < 60, "no temp file appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let tmp = entries(dir.path());
    assert!(tmp[0].starts_with(".g.gguf.tmp-"), "{tmp:?}");
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        entries(dir.path()).is_empty(),
        "left behind: {:?}",
        entries(dir.path())
    );
}

/// `infer synth ARGS` fails; its output names `needles`; returns the output.
fn fails(args: &[&str], needles: &[&str]) -> String {
    let o = infer(args);
    let t = text(&o);
    assert!(!o.status.success(), "infer {args:?} succeeded:\n{t}");
    assert_eq!(o.status.code(), Some(1), "not a clean error exit: {t}");
    for n in needles {
        assert!(t.contains(n), "infer {args:?}: expected '{n}' in:\n{t}");
    }
    t
}

/// A folder holding `config.json` (the archrefs llama config) and a `model.safetensors` that
/// stands for real weights.
fn real_hf_folder(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    let cfg = shared_dir().join("archrefs/llama/config.json");
    std::fs::copy(cfg, dir.join("config.json")).unwrap();
    std::fs::write(dir.join("model.safetensors"), "real weights").unwrap();
}

/// `--force` never deletes a real HF folder (one holding config.json but no synth marker), nor
/// the folder of the `--like` config, nor the `--like` GGUF itself, nor a directory where a GGUF
/// file goes; it replaces a synth-written folder (marker `.infer-synth`) and an empty one.
#[test]
fn force_replaces_only_what_synth_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let real = d.join("real");
    real_hf_folder(&real);
    let real_cfg = real.join("config.json");
    let t = fails(
        &["synth", "--like", s(&real_cfg), "-o", s(&real), "--force"],
        &[s(&real), "refusing"],
    );
    assert!(t.contains("folder of the --like config"), "{t}");
    // A real folder that is not the --like one: refused, not even with --force.
    let other = d.join("other");
    real_hf_folder(&other);
    fails(
        &["synth", "--like", s(&real_cfg), "-o", s(&other), "--force"],
        &[s(&other), "not written by infer synth", ".infer-synth"],
    );
    for f in [&real, &other] {
        assert_eq!(
            std::fs::read_to_string(f.join("model.safetensors")).unwrap(),
            "real weights"
        );
        assert_eq!(entries(f), ["config.json", "model.safetensors"]);
    }
    // Synth's own folder (marker present) and an empty folder are replaced.
    let out = d.join("out");
    ok(&["synth", "--like", s(&real_cfg), "-o", s(&out)]);
    assert_eq!(
        entries(&out),
        [".infer-synth", "config.json", "model.safetensors"]
    );
    ok(&[
        "synth",
        "--like",
        s(&real_cfg),
        "-o",
        s(&out),
        "--force",
        "--seed",
        "4",
    ]);
    assert!(out.join(".infer-synth").is_file());
    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    ok(&["synth", "--like", s(&real_cfg), "-o", s(&empty), "--force"]);
    // The synth folder's own config as --like, written over itself: refused.
    fails(
        &[
            "synth",
            "--like",
            s(&out.join("config.json")),
            "-o",
            s(&out),
            "--force",
        ],
        &["folder of the --like config"],
    );

    // GGUF: --force replaces nothing: never the --like file, never a directory.
    let skel = d.join("skel.gguf");
    header_only(&model_file(SMOL), &skel);
    let skel_bytes = std::fs::read(&skel).unwrap();
    fails(
        &["synth", "--like", s(&skel), "-o", s(&skel), "--force"],
        &["is the --like file", "refusing"],
    );
    assert!(std::fs::read(&skel).unwrap() == skel_bytes);
    fails(
        &[
            "synth",
            "--like",
            s(&skel),
            "--header-only",
            "-o",
            s(&empty),
            "--force",
        ],
        &[s(&empty), "exists; infer synth does not replace files"],
    );
    assert!(empty.join("model.safetensors").is_file());
    assert_eq!(entries(d), ["empty", "other", "out", "real", "skel.gguf"]);
}

/// A GGUF output never replaces an existing file, with or without `--force`: a copy of the real
/// SmolLM2 GGUF at OUT (the same size and header as what synth would write) and a HF
/// `config.json` at OUT are refused with "exists; infer synth does not replace files", stay
/// byte-identical, and no temp file is left behind.
#[test]
fn gguf_output_never_replaces_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = model_file(SMOL);
    let skel = d.join("fake.gguf");
    header_only(&model, &skel);
    let real = d.join("real.gguf");
    std::fs::copy(&model, &real).unwrap();
    let real_bytes = std::fs::read(&model).unwrap();
    for extra in [&[][..], &["--force"][..], &["--header-only", "--force"][..]] {
        let mut args = vec!["synth", "--like", s(&skel), "-o", s(&real)];
        args.extend_from_slice(extra);
        fails(
            &args,
            &[
                s(&real),
                "exists; infer synth does not replace files (remove it first)",
            ],
        );
        assert!(
            std::fs::read(&real).unwrap() == real_bytes,
            "{extra:?}: the real model changed"
        );
    }
    let hf = d.join("hf");
    real_hf_folder(&hf);
    let cfg = hf.join("config.json");
    let cfg_bytes = std::fs::read(&cfg).unwrap();
    fails(
        &["synth", "--like", s(&skel), "-o", s(&cfg), "--force"],
        &[s(&cfg), "does not replace files"],
    );
    assert_eq!(std::fs::read(&cfg).unwrap(), cfg_bytes);
    assert_eq!(entries(&hf), ["config.json", "model.safetensors"]);
    assert_eq!(entries(d), ["fake.gguf", "hf", "real.gguf"]);
}

/// A GGUF header with `tensors` (and general.architecture only) written to `path`.
fn write_header(path: &Path, tensors: Vec<infer_models::gguf::GgufTensorInfo>) {
    let h = GgufHeader {
        version: 3,
        metadata: vec![(
            "general.architecture".into(),
            infer_models::gguf::GgufValue::String("llama".into()),
        )],
        tensors,
        alignment: 32,
    };
    std::fs::write(path, infer_models::gguf::encode_header(&h, path).unwrap()).unwrap();
}

fn f32_tensor(name: &str, dims: &[usize]) -> infer_models::gguf::GgufTensorInfo {
    infer_models::gguf::GgufTensorInfo {
        name: name.into(),
        dims: dims.to_vec(),
        format: infer_quant::QuantFormat::F32,
        offset: 0,
        n_bytes: dims.iter().product::<usize>() * 4,
    }
}

/// Headers that would fill the disk or exhaust memory are refused before anything is written
/// (clean exit 1, nothing left behind): a tensor offset of 2^40 (llama.cpp's offset rule), a
/// 1-D tensor of 2^42 values (more than any free space), a config.json with
/// `"hidden_size": 1e12` (absurd field) or 2^24 (more than the free space: both numbers
/// named); also a header without tensors and a zero-sized dimension.
#[test]
fn oversized_or_inconsistent_shapes_are_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out.gguf");
    // Last tensor's offset (the last 8 bytes of a header-only file) set to 2^40.
    let skel = d.join("skel.gguf");
    header_only(&model_file(SMOL), &skel);
    let mut b = std::fs::read(&skel).unwrap();
    let n = b.len();
    b[n - 8..].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let far = d.join("far.gguf");
    std::fs::write(&far, &b).unwrap();
    std::fs::remove_file(&skel).unwrap();
    fails(
        &["synth", "--like", s(&far), "-o", s(&out)],
        &[s(&far), "has offset 1099511627776, expected"],
    );

    let huge = d.join("huge.gguf");
    write_header(&huge, vec![f32_tensor("output_norm.weight", &[1 << 42])]);
    let t = fails(
        &["synth", "--like", s(&huge), "-o", s(&out)],
        &[s(&huge), "needs 175921860445", "free"],
    );
    assert!(!t.contains("memory allocation"), "{t}");

    let none = d.join("none.gguf");
    write_header(&none, vec![]);
    fails(
        &["synth", "--like", s(&none), "-o", s(&out)],
        &[s(&none), "has no tensors"],
    );
    let zero = d.join("zero.gguf");
    write_header(&zero, vec![f32_tensor("blk.0.attn_q.weight", &[32, 0])]);
    fails(
        &["synth", "--like", s(&zero), "-o", s(&out)],
        &[s(&zero), "'blk.0.attn_q.weight'", "has a zero dimension"],
    );

    let src = shared_dir().join("archrefs/llama/config.json");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&src).unwrap()).unwrap();
    let hf_out = d.join("hf");
    for (hidden, needles) in [
        (serde_json::json!(1e12), vec!["\"hidden_size\"", "absurd"]),
        (
            serde_json::json!(1u64 << 24),
            vec!["needs", "bytes", "free"],
        ),
    ] {
        let mut c = cfg.clone();
        c["hidden_size"] = hidden.clone();
        c["intermediate_size"] = hidden;
        let p = d.join("big.json");
        std::fs::write(&p, c.to_string()).unwrap();
        let mut needles = needles;
        needles.push(s(&p));
        fails(&["synth", "--like", s(&p), "-o", s(&hf_out)], &needles);
    }
    assert_eq!(
        entries(d),
        [
            "big.json",
            "far.gguf",
            "huge.gguf",
            "none.gguf",
            "zero.gguf"
        ]
    );
}

/// The kind of `--like` comes from the content: a GGUF named `*.bin` is a GGUF; a HF folder
/// works like its config.json; a folder without config.json is refused naming the three kinds.
#[test]
fn like_kind_is_recognised_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let skel = d.join("skel.gguf");
    header_only(&model_file(SMOL), &skel);
    let renamed = d.join("skel.bin");
    std::fs::copy(&skel, &renamed).unwrap();
    let again = d.join("again.gguf");
    header_only(&renamed, &again);
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&skel).unwrap());

    let hf_dir = shared_dir().join("archrefs/llama");
    let out = d.join("llama");
    ok(&["synth", "--like", s(&hf_dir), "-o", s(&out), "--seed", "3"]);
    assert_eq!(
        st_shapes(&out.join("model.safetensors")),
        st_shapes(&hf_dir.join("model.safetensors"))
    );
    let empty = d.join("nothing");
    std::fs::create_dir(&empty).unwrap();
    fails(
        &["synth", "--like", s(&empty), "-o", s(&d.join("x"))],
        &[s(&empty), "unknown kind", "GGUF", "config.json", "folder"],
    );
}

/// A missing output directory, or one that is a file, is named as such (not the temp file).
#[test]
fn missing_output_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = model_file(SMOL);
    let missing = d.join("missing/dir");
    let t = fails(
        &[
            "synth",
            "--like",
            s(&model),
            "-o",
            s(&missing.join("x.gguf")),
        ],
        &[&format!(
            "output directory {} does not exist",
            missing.display()
        )],
    );
    assert!(!t.contains(".tmp-"), "{t}");
    let file = d.join("file");
    std::fs::write(&file, "x").unwrap();
    fails(
        &["synth", "--like", s(&model), "-o", s(&file.join("x.gguf"))],
        &[&format!(
            "output directory {} is not a directory",
            file.display()
        )],
    );
    assert_eq!(entries(d), ["file"]);
}

/// llama.cpp's vocabulary-only GGUFs (`INFER_VOCABS`, default `~/.cache/infer/vocabs`;
/// `scripts/fetch-vocabs.sh`, run by `scripts/test.sh`, fetches them).
fn vocab_gguf(name: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("INFER_VOCABS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME or INFER_VOCABS must be set");
            std::path::PathBuf::from(home).join(".cache/infer/vocabs")
        });
    let p = dir.join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-vocabs.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

/// `synth --like config.json --gguf Q4_K_M --vocab ggml-vocab-llama-bpe.gguf`: a GGUF our
/// reader accepts with llama.cpp's tensor names and the Q4_K_M type mix (Q6_K tied output /
/// token_embd, Q6_K attn_v and ffn_down on the layers `use_more_bits` picks — 2 and 3 of 4 —,
/// Q4_K elsewhere, F32 norms), the vocabulary's tokenizer metadata; it round-trips through
/// `infer extract` (every matrix passed through byte for byte, a vindex within 1.05× the
/// GGUF) and runs with the GGUF's own tokenizer. Q8_0 gives Q8_0 everywhere.
#[test]
fn synth_gguf_from_config_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        r#"{"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true,
            "hidden_act": "silu"}"#,
    )
    .unwrap();
    let vocab = vocab_gguf("llama-bpe");
    let out = dir.path().join("m.gguf");
    ok(&[
        "synth",
        "--like",
        s(&cfg),
        "--gguf",
        "Q4_K_M",
        "--vocab",
        s(&vocab),
        "-o",
        s(&out),
    ]);
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.get_str("tokenizer.ggml.model"), Some("gpt2"));
    let types: BTreeMap<String, String> = g
        .tensor_infos()
        .iter()
        .map(|t| (t.name.clone(), t.format.name().to_string()))
        .collect();
    assert_eq!(types.len(), 1 + 1 + 4 * 9, "{types:?}");
    assert_eq!(types["token_embd.weight"], "Q6_K");
    assert!(!types.contains_key("output.weight"));
    for l in 0..4 {
        let more = if l >= 2 { "Q6_K" } else { "Q4_K" };
        let t = |n: &str| types[&format!("blk.{l}.{n}.weight")].as_str();
        assert_eq!(t("attn_v"), more, "layer {l}");
        assert_eq!(t("ffn_down"), more, "layer {l}");
        for n in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            assert_eq!(t(n), "Q4_K", "layer {l} {n}");
        }
        for n in ["attn_norm", "ffn_norm"] {
            assert_eq!(t(n), "F32", "layer {l} {n}");
        }
    }
    // Extract (the default: no float tier) and run with the GGUF's tokenizer.
    let vx = dir.path().join("m.vindex");
    ok(&["extract", s(&out), "-o", s(&vx)]);
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(vx.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["passthrough"].as_array().unwrap().len(), 1 + 4 * 7);
    let vx_bytes: u64 = index["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["bytes"].as_u64().unwrap())
        .sum();
    let gguf_bytes = std::fs::metadata(&out).unwrap().len();
    assert!(
        vx_bytes as f64 <= 1.05 * gguf_bytes as f64,
        "vindex {vx_bytes} B vs GGUF {gguf_bytes} B"
    );
    let run = ok(&["run", s(&vx), "Hello world", "-n", "4"]);
    assert!(!run.to_lowercase().contains("nan"), "{run}");
    let toks = ok(&["tokenize", s(&vx), "Hello world", "--ids"]);
    assert!(
        toks.contains("128000"),
        "BOS of the llama-bpe vocabulary: {toks}"
    );

    let q8 = dir.path().join("q8.gguf");
    ok(&[
        "synth",
        "--like",
        s(&cfg),
        "--gguf",
        "Q8_0",
        "-o",
        s(&q8),
        "--header-only",
    ]);
    let h = GgufHeader::read(&q8).unwrap();
    for t in &h.tensors {
        let want = if t.dims.len() == 1 { "F32" } else { "Q8_0" };
        assert_eq!(t.format.name(), want, "{}", t.name);
    }
}

/// A small llama config.json in `dir`: `hidden` wide with `heads` heads of 32 and one KV head,
/// 4 layers, `vocab` tokens, untied (a Q6_K-type output and a Q4_K-type token embedding).
fn small_config(dir: &Path, name: &str, hidden: usize, heads: usize, vocab: usize) -> PathBuf {
    let cfg = dir.join(name);
    std::fs::write(
        &cfg,
        format!(
            r#"{{"model_type": "llama", "hidden_size": {hidden}, "intermediate_size": 512,
            "num_hidden_layers": 4, "num_attention_heads": {heads}, "num_key_value_heads": 1,
            "head_dim": 32, "vocab_size": {vocab}, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
            "hidden_act": "silu"}}"#
        ),
    )
    .unwrap();
    cfg
}

/// `infer synth --like CFG --gguf PRESET -o OUT --seed SEED [extra...]`; the file's bytes.
fn synth_preset(cfg: &Path, preset: &str, out: &Path, seed: &str, extra: &[&str]) -> Vec<u8> {
    let mut args = vec![
        "synth",
        "--like",
        s(cfg),
        "--gguf",
        preset,
        "-o",
        s(out),
        "--seed",
        seed,
    ];
    args.extend_from_slice(extra);
    ok(&args);
    std::fs::read(out).unwrap()
}

/// `--random-blocks`, for the Q4_K_M, Q4_0 and Q8_0 presets of a config whose rows K-quant
/// blocks divide (256) and of one they do not (160: llama.cpp's Q5_0 / Q8_0 fallbacks):
/// (1) the header bytes (metadata, tensor table) and file size are the default mode's, and the
/// F32 norms the default's bytes; (2) the same seed gives the same bytes, another seed shares
/// under a quarter of the data bytes; (3) every quantized matrix dequantizes to finite values
/// with mean within ±0.003 and standard deviation within 10% of 0.02 (uniform-ish values of
/// the default's spread) — each of Q4_K, Q6_K, Q5_0, Q8_0 and Q4_0 checked.
#[test]
fn random_blocks_keep_the_header_and_the_spread() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut checked = std::collections::BTreeSet::new();
    for (cfg, preset) in [
        (small_config(d, "wide.json", 256, 8, 1024), "Q4_K_M"),
        (small_config(d, "odd.json", 160, 5, 1024), "Q4_K_M"),
        (small_config(d, "wide0.json", 256, 8, 1024), "Q4_0"),
        (small_config(d, "wide8.json", 256, 8, 1024), "Q8_0"),
    ] {
        let case = format!("{} {preset}", cfg.display());
        let default = synth_preset(&cfg, preset, &d.join("default.gguf"), "1", &[]);
        let drawn_path = d.join("drawn.gguf");
        let drawn = synth_preset(&cfg, preset, &drawn_path, "1", &["--random-blocks"]);
        let f = GgufFile::open(&drawn_path).unwrap();
        let ds = f.data_start();
        assert_eq!(drawn.len(), default.len(), "{case}");
        assert!(drawn[..ds] == default[..ds], "{case}: header bytes differ");
        assert!(
            drawn[ds..] != default[ds..],
            "{case}: data is the default's"
        );
        let default_file = GgufFile::open(&d.join("default.gguf")).unwrap();
        for t in f.tensor_infos() {
            let bytes = f.tensor_bytes(&t.name).unwrap();
            if !t.format.is_quantized() {
                assert_eq!(t.dims.len(), 1, "{case}: {} is a float matrix", t.name);
                assert!(
                    bytes == default_file.tensor_bytes(&t.name).unwrap(),
                    "{case}: {} differs from the default",
                    t.name
                );
                continue;
            }
            let v = infer_quant::dequantize_to_vec(t.format, bytes, t.n_elements()).unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{case}: {}", t.name);
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
            let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
            assert!(
                (sd / 0.02 - 1.0).abs() < 0.1 && mean.abs() < 0.003,
                "{case}: {} ({}): mean {mean} std {sd}",
                t.name,
                t.format
            );
            checked.insert(t.format.name());
        }
        let again = synth_preset(
            &cfg,
            preset,
            &d.join("again.gguf"),
            "1",
            &["--random-blocks"],
        );
        assert!(again == drawn, "{case}: same seed, other bytes");
        let other = synth_preset(
            &cfg,
            preset,
            &d.join("other.gguf"),
            "2",
            &["--random-blocks"],
        );
        assert!(
            other[..ds] == drawn[..ds],
            "{case}: seed changed the header"
        );
        let same = drawn[ds..]
            .iter()
            .zip(&other[ds..])
            .filter(|(a, b)| a == b)
            .count();
        assert!(
            same < (drawn.len() - ds) / 4,
            "{case}: seed 2 shares {same} of {} data bytes",
            drawn.len() - ds
        );
        for n in ["default", "drawn", "again", "other"] {
            std::fs::remove_file(d.join(format!("{n}.gguf"))).unwrap();
        }
    }
    assert_eq!(
        checked.into_iter().collect::<Vec<_>>(),
        ["Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    );
    // Not for a HF folder (float weights) nor a header-only file (no data).
    let cfg = d.join("wide.json");
    fails(
        &[
            "synth",
            "--like",
            s(&cfg),
            "-o",
            s(&d.join("hf")),
            "--random-blocks",
        ],
        &["--random-blocks applies to a GGUF output"],
    );
    fails(
        &[
            "synth",
            "--like",
            s(&cfg),
            "--gguf",
            "Q4_0",
            "--header-only",
            "-o",
            s(&d.join("h.gguf")),
            "--random-blocks",
        ],
        &["--random-blocks applies to a GGUF output with data"],
    );
    assert!(!d.join("hf").exists() && !d.join("h.gguf").exists());
}

/// A `--random-blocks` Q4_K_M GGUF with llama.cpp's llama-bpe vocabulary extracts (its 30
/// Q4_K / Q6_K matrices passed through byte for byte) and runs on the CPU: `infer bench -p 8
/// -n 4 -r 1` reports positive finite prompt and decode speeds, and `infer run` generates
/// without NaN. So does a GGUF `--like` of the real SmolLM2 (Q4_1 among its types) with drawn
/// blocks.
#[test]
fn random_blocks_model_extracts_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = small_config(d, "config.json", 256, 8, 128256);
    let out = d.join("m.gguf");
    synth_preset(
        &cfg,
        "Q4_K_M",
        &out,
        "4",
        &["--random-blocks", "--vocab", s(&vocab_gguf("llama-bpe"))],
    );
    let smol = d.join("smol.gguf");
    ok(&[
        "synth",
        "--like",
        s(&model_file(SMOL)),
        "-o",
        s(&smol),
        "--random-blocks",
    ]);
    let smol_types: std::collections::BTreeSet<&str> = GgufFile::open(&smol)
        .unwrap()
        .tensor_infos()
        .iter()
        .map(|t| t.format.name())
        .collect();
    assert!(smol_types.contains("Q4_1"), "{smol_types:?}");
    for gguf in [&out, &smol] {
        let vx = gguf.with_extension("vindex");
        ok(&["extract", s(gguf), "-o", s(&vx)]);
        if gguf == &out {
            // Q4_K / Q6_K matrices: every one passed through byte for byte.
            let index: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(vx.join("index.json")).unwrap())
                    .unwrap();
            assert_eq!(index["passthrough"].as_array().unwrap().len(), 2 + 4 * 7);
        }
        bench_pp8_tg4(&vx, gguf);
        let run = ok(&["run", s(&vx), "Hello world", "-n", "4"]);
        assert!(!run.to_lowercase().contains("nan"), "{run}");
    }
}

/// A shrunk Mixtral-8x7B config.json (`../shared/configs/mixtral-8x7b`) in `dir`: 8 experts
/// top-2 (llama-quantize's 8-expert rules apply), 4 layers, hidden 256, experts 512 wide,
/// 4 heads of 64 and 2 KV heads, `vocab` tokens.
fn mixtral_config(dir: &Path, vocab: usize) -> PathBuf {
    let cfg = dir.join(format!("mixtral-{vocab}.json"));
    std::fs::write(
        &cfg,
        format!(
            r#"{{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": {vocab},
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
            "hidden_act": "silu", "num_local_experts": 8, "num_experts_per_tok": 2,
            "sliding_window": null, "tie_word_embeddings": false}}"#
        ),
    )
    .unwrap();
    cfg
}

/// A shrunk Qwen3-30B-A3B config.json (`../shared/configs/qwen3-30b-a3b`) in `dir`: 16
/// experts top-4, 256 wide (`moe_intermediate_size`; the dense `intermediate_size` 768), 4
/// layers, hidden 256, 4 heads of 128 (q 512 wide) and 2 KV heads, `vocab` tokens.
fn qwen3_moe_config(dir: &Path, vocab: usize) -> PathBuf {
    let cfg = dir.join(format!("qwen3-moe-{vocab}.json"));
    std::fs::write(
        &cfg,
        format!(
            r#"{{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 256, "intermediate_size": 768, "moe_intermediate_size": 256,
            "num_experts": 16, "num_experts_per_tok": 4, "norm_topk_prob": true,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
            "vocab_size": {vocab}, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "hidden_act": "silu", "attention_bias": false,
            "tie_word_embeddings": false}}"#
        ),
    )
    .unwrap();
    cfg
}

/// `synth --like MoE-config --gguf PRESET`: the layout llama.cpp's converter + llama-quantize
/// write (checked by hand against llama-quantize from the synth F16 file: the same tensor
/// types and dims for every preset). Architecture `llama` (Mixtral) / `qwen3moe`;
/// `{arch}.expert_count`, `expert_used_count`, qwen3moe's `expert_feed_forward_length`,
/// `feed_forward_length` and `attention.key_length`; per layer `ffn_gate_inp` `[hidden, E]`
/// and `ffn_{gate,up}_exps` `[hidden, width, E]`, `ffn_down_exps` `[width, hidden, E]` instead of
/// the dense FFN, q/k norms for qwen3moe. Types: the router F32 in every preset, 1-D F32;
/// Q4_K_M: `attn_v` and `ffn_down_exps` Q6_K on the `use_more_bits` layers (2 and 3 of 4),
/// output Q6_K, else Q4_K — except with Mixtral's 8 experts `attn_k` / `attn_v` Q8_0 and
/// `attn_output` Q5_K; Q4_0: Q4_0, output Q6_K, Mixtral's `attn_k` / `attn_v` Q8_0; Q8_0 and
/// F16 every matrix in that type. The full-size configs give a header too (the size check of
/// a 26.5 GiB Mixtral without writing it).
#[test]
fn moe_gguf_has_llama_cpp_layout() {
    use infer_models::gguf::GgufValue;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (cfg, arch) in [
        (mixtral_config(d, 1024), "llama"),
        (qwen3_moe_config(d, 1024), "qwen3moe"),
    ] {
        let mixtral = arch == "llama";
        let (experts, used, width, hd) = if mixtral {
            (8, 2, 512, 64)
        } else {
            (16, 4, 256, 128)
        };
        for preset in ["Q4_K_M", "Q4_0", "Q8_0", "F16"] {
            let case = format!("{arch} {preset}");
            let out = d.join(format!("{arch}-{preset}.gguf"));
            ok(&[
                "synth",
                "--like",
                s(&cfg),
                "--gguf",
                preset,
                "--header-only",
                "-o",
                s(&out),
            ]);
            let h = GgufHeader::read(&out).unwrap();
            let md = |k: &str| {
                h.metadata
                    .iter()
                    .find(|(key, _)| key == &format!("{arch}.{k}"))
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(
                h.metadata[0],
                (
                    "general.architecture".to_string(),
                    GgufValue::String(arch.into())
                )
            );
            assert_eq!(md("expert_count"), Some(GgufValue::U32(experts)), "{case}");
            assert_eq!(
                md("expert_used_count"),
                Some(GgufValue::U32(used)),
                "{case}"
            );
            assert_eq!(
                md("expert_feed_forward_length"),
                (!mixtral).then_some(GgufValue::U32(256)),
                "{case}"
            );
            let ff = if mixtral { 512 } else { 768 };
            assert_eq!(md("feed_forward_length"), Some(GgufValue::U32(ff)));
            assert_eq!(md("attention.key_length"), Some(GgufValue::U32(hd)));
            assert_eq!(md("block_count"), Some(GgufValue::U32(4)));

            let (w, e, q) = (width as usize, experts as usize, 4 * hd as usize);
            let mut want: BTreeMap<String, (Vec<usize>, &str)> = BTreeMap::new();
            let mat = |p: &'static str| -> &'static str {
                match preset {
                    "Q8_0" | "F16" => preset,
                    _ => p,
                }
            };
            let q4 = if preset == "Q4_0" { "Q4_0" } else { "Q4_K" };
            want.insert("token_embd.weight".into(), (vec![256, 1024], mat(q4)));
            want.insert("output.weight".into(), (vec![256, 1024], mat("Q6_K")));
            want.insert("output_norm.weight".into(), (vec![256], "F32"));
            for l in 0..4 {
                let more = l >= 2 && preset == "Q4_K_M";
                let kv = if mixtral {
                    "Q8_0"
                } else if more {
                    "Q6_K"
                } else {
                    q4
                };
                let attn_o = if mixtral && preset == "Q4_K_M" {
                    "Q5_K"
                } else {
                    q4
                };
                let down = if more { "Q6_K" } else { q4 };
                let kvd = 2 * hd as usize;
                let mut t = |n: &str, dims: Vec<usize>, ty: &'static str| {
                    want.insert(format!("blk.{l}.{n}.weight"), (dims, ty));
                };
                t("attn_norm", vec![256], "F32");
                t("ffn_norm", vec![256], "F32");
                t("attn_q", vec![256, q], mat(q4));
                t(
                    "attn_k",
                    vec![256, kvd],
                    mat(if mixtral { "Q8_0" } else { q4 }),
                );
                t("attn_v", vec![256, kvd], mat(kv));
                t("attn_output", vec![q, 256], mat(attn_o));
                t("ffn_gate_inp", vec![256, e], "F32");
                t("ffn_gate_exps", vec![256, w, e], mat(q4));
                t("ffn_up_exps", vec![256, w, e], mat(q4));
                t("ffn_down_exps", vec![w, 256, e], mat(down));
                if !mixtral {
                    t("attn_q_norm", vec![hd as usize], "F32");
                    t("attn_k_norm", vec![hd as usize], "F32");
                }
            }
            let got: BTreeMap<String, (Vec<usize>, &str)> = h
                .tensors
                .iter()
                .map(|t| (t.name.clone(), (t.dims.clone(), t.format.name())))
                .collect();
            assert_eq!(got, want, "{case}");
        }
    }
    // Full size: only the header is written; the size is the whole file's.
    for (name, tensors) in [("mixtral-8x7b", 323), ("qwen3-30b-a3b", 579)] {
        let cfg = shared_dir().join("configs").join(name).join("config.json");
        let out = d.join(format!("{name}.gguf"));
        let msg = ok(&[
            "synth",
            "--like",
            s(&cfg),
            "--gguf",
            "Q4_K_M",
            "--header-only",
            "-o",
            s(&out),
        ]);
        let h = GgufHeader::read(&out).unwrap();
        assert_eq!(h.tensors.len(), tensors, "{name}: {msg}");
        let gib = h.data_len() as f64 / (1u64 << 30) as f64;
        let (lo, hi) = if name == "mixtral-8x7b" {
            (26.0, 27.0)
        } else {
            (17.0, 17.6)
        };
        assert!(lo < gib && gib < hi, "{name}: {gib} GiB of data");
    }
}

/// Shrunk Mixtral and Qwen3-MoE GGUFs (Q4_K_M, quantized by ggml's quantizers and with
/// `--random-blocks`) extract with `--no-tokenizer` as HF `mixtral` / `qwen3_moe` with their
/// experts — each expert's Q4_K / Q6_K blocks passed through, byte for byte its slice of the
/// stacked `ffn_*_exps` tensor —, give finite, non-constant logits, and `infer bench -p 8 -n 4 -r 1` reports positive
/// finite speeds on the CPU. A Qwen3-MoE with llama.cpp's qwen2 vocabulary (151936 tokens, as
/// the real model) generates text with `infer run`.
#[test]
fn moe_gguf_extracts_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cases = Vec::new();
    for (cfg, family, experts) in [
        (mixtral_config(d, 1024), "mixtral", 8),
        (qwen3_moe_config(d, 1024), "qwen3_moe", 16),
    ] {
        for extra in [&[][..], &["--random-blocks"][..]] {
            let out = d.join(format!("{family}{}.gguf", extra.len()));
            synth_preset(&cfg, "Q4_K_M", &out, "5", extra);
            cases.push((out, family, experts, false));
        }
    }
    let out = d.join("qwen3-moe-vocab.gguf");
    let vocab = vocab_gguf("qwen2");
    synth_preset(
        &qwen3_moe_config(d, 151936),
        "Q4_K_M",
        &out,
        "6",
        &["--random-blocks", "--vocab", s(&vocab)],
    );
    cases.push((out, "qwen3_moe", 16, true));
    for (gguf, family, experts, tokenizer) in cases {
        let vx = gguf.with_extension("vindex");
        let mut args = vec!["extract", s(&gguf), "-o", s(&vx)];
        if !tokenizer {
            args.push("--no-tokenizer");
        }
        ok(&args);
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(vx.join("index.json")).unwrap()).unwrap();
        let cfg = &index["config"];
        assert_eq!(cfg["model_type"], family, "{}", gguf.display());
        assert_eq!(cfg["num_experts"], experts, "{}", gguf.display());
        // Every expert's blocks are its slice of the stacked GGUF tensor, byte for byte.
        let passed = index["passthrough"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["key"].as_str().unwrap().contains(".mlp.experts."))
            .count();
        assert_eq!(passed, 4 * 3 * experts, "{}", gguf.display());
        let g = GgufFile::open(&gguf).unwrap();
        let bin = std::fs::read(vx.join("interleaved_q4k.bin")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(vx.join("interleaved_q4k_manifest.json")).unwrap(),
        )
        .unwrap();
        let mut checked = 0;
        for m in manifest.as_array().unwrap() {
            let key = m["key"].as_str().unwrap();
            let Some((layer, rest)) = key
                .strip_prefix("model.layers.")
                .and_then(|r| r.split_once(".mlp.experts."))
            else {
                continue;
            };
            let (e, proj) = rest.split_once('.').unwrap();
            let proj = proj.strip_suffix("_proj.weight").unwrap();
            let stacked = g
                .tensor_bytes(&format!("blk.{layer}.ffn_{proj}_exps.weight"))
                .unwrap();
            let n = stacked.len() / experts;
            let e: usize = e.parse().unwrap();
            let (off, len) = (m["offset"].as_u64().unwrap() as usize, n);
            assert_eq!(m["length"].as_u64(), Some(n as u64), "{key}");
            assert!(
                bin[off..off + len] == stacked[e * n..(e + 1) * n],
                "{}: {key}",
                gguf.display()
            );
            checked += 1;
        }
        assert_eq!(checked, 4 * 3 * experts, "{}", gguf.display());
        let logits = gguf.with_extension("logits.safetensors");
        ok(&["logits", s(&vx), "--ids", "1,2,3,4,5", "--out", s(&logits)]);
        let bytes = std::fs::read(&logits).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let vals: Vec<f32> = st
            .tensor("logits")
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert!(
            !vals.is_empty() && vals.iter().all(|v| v.is_finite()),
            "{}",
            gguf.display()
        );
        assert!(vals.iter().any(|&v| v != vals[0]), "{}", gguf.display());
        for j in bench_pp8_tg4(&vx, &gguf) {
            assert_eq!(j["model_type"], family);
        }
        if tokenizer {
            let run = ok(&["run", s(&vx), "Hello world", "-n", "4"]);
            assert!(!run.to_lowercase().contains("nan"), "{run}");
        }
    }
}

/// `infer bench VX -p 8 -n 4 -r 1 --json` on the CPU: its two JSON lines (one per test, pp8
/// then tg4), each with a finite positive speed for its phase. Panics naming `gguf` otherwise.
fn bench_pp8_tg4(vx: &Path, gguf: &Path) -> Vec<serde_json::Value> {
    let o = infer(&["bench", s(vx), "-p", "8", "-n", "4", "-r", "1", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(rows.len(), 2, "{}: {rows:?}", gguf.display());
    for (j, key) in rows.iter().zip(["pp_tokens_per_s", "tg_tokens_per_s"]) {
        let v = j[key].as_f64().unwrap_or(f64::NAN);
        assert!(v.is_finite() && v > 0.0, "{}: {key} {j}", gguf.display());
    }
    rows
}

/// A vocabulary shorter than the config's `vocab_size` is padded as convert_hf_to_gguf.py pads
/// it (`[PAD{id}]`, type UNUSED = 5, score -10000 where the vocabulary has scores): a
/// Qwen2.5-7B-like config (152064) with llama.cpp's qwen2 vocabulary (151936 tokens, no
/// scores) and a Gemma-3-4B-like config (262208) with the header-only copy of the Gemma-3-270M
/// GGUF (262144 tokens with scores) as --vocab. The first tokens, the merges and the special
/// ids are the vocabulary's; the embedding and output have `vocab_size` rows; the Qwen file
/// extracts with its tokenizer and generates. A vocabulary longer than vocab_size is refused.
#[test]
fn short_vocab_is_padded_to_vocab_size() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let qwen = d.join("qwen2.json");
    std::fs::write(
        &qwen,
        r#"{"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 152064, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "hidden_act": "silu", "tie_word_embeddings": false}"#,
    )
    .unwrap();
    let gemma = d.join("gemma3.json");
    std::fs::write(
        &gemma,
        r#"{"model_type": "gemma3_text", "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "sliding_window": 1024, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true}"#,
    )
    .unwrap();
    let gemma_vocab = d.join("gemma-skel.gguf");
    ok(&[
        "synth",
        "--like",
        s(&model_file(GEMMA)),
        "--header-only",
        "-o",
        s(&gemma_vocab),
    ]);
    for (cfg, vocab, have, want, scores) in [
        (&qwen, vocab_gguf("qwen2"), 151936usize, 152064usize, false),
        (&gemma, gemma_vocab.clone(), 262144, 262208, true),
    ] {
        let out = cfg.with_extension("gguf");
        synth_preset(
            cfg,
            "Q4_K_M",
            &out,
            "3",
            &["--random-blocks", "--vocab", s(&vocab)],
        );
        use infer_models::gguf::{GgufArray, GgufValue};
        let v = GgufHeader::read(&vocab).unwrap().metadata;
        let g = GgufHeader::read(&out).unwrap();
        let get = |md: &[(String, GgufValue)], k: &str| {
            md.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
        };
        let arr = |md: &[(String, GgufValue)], k: &str| match get(md, k) {
            Some(GgufValue::Array(a)) => Some(a),
            None => None,
            Some(other) => panic!("{k}: {other:?}"),
        };
        let (Some(GgufArray::String(vt)), Some(GgufArray::String(gt))) = (
            arr(&v, "tokenizer.ggml.tokens"),
            arr(&g.metadata, "tokenizer.ggml.tokens"),
        ) else {
            panic!("tokens")
        };
        assert_eq!((vt.len(), gt.len()), (have, want), "{}", cfg.display());
        assert_eq!(gt[..have], vt[..]);
        for (i, t) in gt.iter().enumerate().skip(have) {
            assert_eq!(*t, format!("[PAD{i}]"));
        }
        let (Some(GgufArray::I32(vty)), Some(GgufArray::I32(gty))) = (
            arr(&v, "tokenizer.ggml.token_type"),
            arr(&g.metadata, "tokenizer.ggml.token_type"),
        ) else {
            panic!("token_type")
        };
        assert_eq!(gty[..have], vty[..]);
        assert!(gty[have..].iter().all(|&t| t == 5), "UNUSED");
        match (
            arr(&v, "tokenizer.ggml.scores"),
            arr(&g.metadata, "tokenizer.ggml.scores"),
        ) {
            (Some(GgufArray::F32(a)), Some(GgufArray::F32(b))) => {
                assert!(scores);
                assert_eq!((a.len(), b.len()), (have, want));
                assert_eq!(b[..have], a[..]);
                assert!(b[have..].iter().all(|&x| x == -10000.0));
            }
            (None, None) => assert!(!scores),
            other => panic!("scores {other:?}"),
        }
        // Every other tokenizer key is the vocabulary's, in its order.
        let keys = |md: &[(String, GgufValue)]| -> Vec<String> {
            md.iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k.starts_with("tokenizer."))
                .collect()
        };
        assert_eq!(keys(&g.metadata), keys(&v));
        for key in keys(&v) {
            if ![
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.token_type",
                "tokenizer.ggml.scores",
            ]
            .contains(&key.as_str())
            {
                assert_eq!(get(&g.metadata, &key), get(&v, &key), "{key}");
            }
        }
        assert_eq!(
            std::fs::metadata(&out).unwrap().len(),
            GgufFile::open(&out).unwrap().data_start() as u64 + g.data_len() as u64
        );
        let embd = g
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .unwrap();
        assert_eq!(embd.dims, [256, want]);
        if cfg == &qwen {
            let vx = out.with_extension("vindex");
            ok(&["extract", s(&out), "-o", s(&vx)]);
            let run = ok(&["run", s(&vx), "Hello world", "-n", "4"]);
            assert!(!run.to_lowercase().contains("nan"), "{run}");
        }
        // The config with fewer tokens than the vocabulary: refused.
        let small = d.join("small.json");
        let mut c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(cfg).unwrap()).unwrap();
        c["vocab_size"] = (have - 1).into();
        std::fs::write(&small, c.to_string()).unwrap();
        let o = infer(&[
            "synth",
            "--like",
            s(&small),
            "--gguf",
            "Q4_K_M",
            "--vocab",
            s(&vocab),
            "--header-only",
            "-o",
            s(&d.join("small.gguf")),
        ]);
        assert!(!o.status.success());
        assert!(
            text(&o).contains(&format!("{have} tokens, more than vocab_size {}", have - 1)),
            "{}",
            text(&o)
        );
    }
}
