//! `infer extract` / `infer verify` end to end: interrupted builds leave nothing at the target,
//! existing targets need --force, verify exits non-zero on a changed file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn model_file(name: &str) -> PathBuf {
    let dir = std::env::var_os("INFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/infer/models")
        });
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "model {} not found (set INFER_MODELS; see shared/models/README.md)",
        p.display()
    );
    p
}

fn infer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .output()
        .expect("run infer")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn killed_extract_leaves_no_target_and_next_run_cleans_up() {
    let gguf = model_file("gemma-3-270m-q4_k_m.gguf");
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("gemma.vindex");
    let args = [
        "extract",
        gguf.to_str().unwrap(),
        "-o",
        target.to_str().unwrap(),
        "--no-tokenizer",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .spawn()
        .unwrap();
    // Wait until the build is writing into its temp dir, then kill it mid-way.
    let start = Instant::now();
    while !names(root.path())
        .iter()
        .any(|n| n.starts_with(".gemma.vindex.tmp-"))
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no temp dir appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "extract ended before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        child.try_wait().unwrap().is_none(),
        "extract finished too early to test a kill"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!target.exists(), "a killed build left {}", target.display());

    let o = infer(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        names(root.path()),
        vec!["gemma.vindex"],
        "temp dirs left behind"
    );
    let o = infer(&["verify", target.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn extract_force_and_verify() {
    let gguf = model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("smol.vindex");
    let t = target.to_str().unwrap();
    let o = infer(&["extract", gguf.to_str().unwrap(), "-o", t, "--dtype", "f16"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        target.join("tokenizer.json").is_file() && target.join("chat_template.jinja").is_file()
    );

    // Existing target: refused without --force, replaced with it.
    let o = infer(&["extract", gguf.to_str().unwrap(), "-o", t]);
    assert!(!o.status.success());
    assert!(text(&o).contains("already exists"), "{}", text(&o));
    let o = infer(&["extract", gguf.to_str().unwrap(), "-o", t, "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    let index = std::fs::read_to_string(target.join("index.json")).unwrap();
    assert!(index.contains("\"dtype\": \"f32\""));
    assert_eq!(names(root.path()), vec!["smol.vindex"]);

    let o = infer(&["verify", t]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("all match"), "{}", text(&o));

    // Change one byte of down_features.bin: verify names it and exits non-zero.
    let p = target.join("down_features.bin");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[12345] ^= 1;
    std::fs::write(&p, bytes).unwrap();
    let o = infer(&["verify", t]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("MISMATCH down_features.bin"),
        "{}",
        text(&o)
    );

    let o = infer(&[
        "extract",
        gguf.to_str().unwrap(),
        "-o",
        "x.vindex",
        "--dtype",
        "f8",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("f8"), "{}", text(&o));
}

/// `--quant all` writes every quantized tier; `quant-stats --json` reports every quantized
/// tensor with its relative RMSE; the default is the q4k tier; a bad `--quant` is refused.
#[test]
fn extract_quant_all_and_quant_stats() {
    let gguf = model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
    let g = gguf.to_str().unwrap();
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("q.vindex");
    let t = target.to_str().unwrap();
    let o = infer(&["extract", g, "-o", t, "--quant", "all"]);
    assert!(o.status.success(), "{}", text(&o));
    for f in [
        "attn_weights_q4k.bin",
        "attn_weights_q8.bin",
        "attn_weights_q8_scales.bin",
        "interleaved_q4k.bin",
        "interleaved_q4.bin",
        "gate_vectors_q4.bin",
        "lm_head_q4.bin",
    ] {
        assert!(target.join(f).is_file(), "{f}");
    }
    let o = infer(&["verify", t]);
    assert!(o.status.success(), "{}", text(&o));
    let o = infer(&["quant-stats", t, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let stats: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let stats = stats.as_array().unwrap();
    // 30 layers × (4 q4k attn + 4 q8 attn + 3 q4k FFN + 3 q4 FFN + 1 gate q4) + lm_head.
    assert_eq!(stats.len(), 30 * 15 + 1);
    for s in stats {
        let (fmt, rel) = (
            s["format"].as_str().unwrap(),
            s["rel_rmse"].as_f64().unwrap(),
        );
        let bound = match fmt {
            "Q8_0" => 0.01,
            "Q6_K" => 0.03,
            "Q5_0" | "Q4_K" => 0.1,
            "Q4_0" => 0.15,
            other => panic!("format {other}"),
        };
        assert!(rel > 0.0 && rel < bound, "{s}");
    }
    let o = infer(&["quant-stats", t]);
    assert!(text(&o).contains("summary"), "{}", text(&o));

    // Default: the q4k tier.
    let t2 = root.path().join("d.vindex");
    let o = infer(&["extract", g, "-o", t2.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let index = std::fs::read_to_string(t2.join("index.json")).unwrap();
    assert!(index.contains("\"q4k\""), "default tiers");
    assert!(!t2.join("interleaved_q4.bin").exists());

    let o = infer(&["extract", g, "-o", "y.vindex", "--quant", "q3"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("q3"), "{}", text(&o));
}
