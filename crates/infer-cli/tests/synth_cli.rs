//! `infer synth`: random weights of a real model's shapes and formats.
//!
//! GGUF: the real SmolLM2 and Gemma-3 GGUFs (`INFER_MODELS`); HF: archrefs configs
//! (`INFER_SHARED`). Both must be present (CI has them); a missing one fails with the fix.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

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

    // Same seed (with --force over an existing file): same bytes; another seed: different data.
    ok(&[
        "synth",
        "--like",
        s(&model),
        "-o",
        s(&again),
        "--seed",
        "1",
        "--force",
    ]);
    assert!(std::fs::read(&again).unwrap() == a, "same seed differs");
    ok(&[
        "synth",
        "--like",
        s(&model),
        "-o",
        s(&again),
        "--seed",
        "2",
        "--force",
    ]);
    let b = std::fs::read(&again).unwrap();
    assert_eq!(a.len(), b.len());
    let ds = GgufFile::open(&again).unwrap().data_start();
    assert_eq!(&a[..ds], &b[..ds]);
    let same = a[ds..].iter().zip(&b[ds..]).filter(|(x, y)| x == y).count();
    assert!(
        same < (a.len() - ds) / 2,
        "seed 2 shares {same} of {} data bytes with seed 1",
        a.len() - ds
    );
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
    assert!(text(&o).contains("--force"), "{}", text(&o));
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
