//! `infer extract` / `infer verify` end to end: interrupted builds leave nothing at the target,
//! existing targets need --force, verify exits non-zero on a changed file.

use std::path::Path;
use std::process::Command;

mod common;
use common::{infer, model_file, text};
use std::time::{Duration, Instant};

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
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

    // Existing target: refused without --force, replaced with it. --no-tokenizer stores no
    // tokenizer files even though the GGUF has a tokenizer and a chat template.
    let o = infer(&["extract", gguf.to_str().unwrap(), "-o", t]);
    assert!(!o.status.success());
    assert!(text(&o).contains("already exists"), "{}", text(&o));
    let o = infer(&[
        "extract",
        gguf.to_str().unwrap(),
        "-o",
        t,
        "--force",
        "--no-tokenizer",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let index = std::fs::read_to_string(target.join("index.json")).unwrap();
    assert!(index.contains("\"dtype\": \"f32\""));
    assert!(index.contains("\"has_tokenizer\": false"), "has_tokenizer");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        assert!(!target.join(f).exists(), "--no-tokenizer wrote {f}");
    }
    assert_eq!(names(root.path()), vec!["smol.vindex"]);

    let o = infer(&["verify", t]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("all match"), "{}", text(&o));

    // `--device`: a bad name is refused; `cuda` in a build without the feature names the fix.
    let o = infer(&["bench", t, "-p", "2", "-n", "2", "--device", "tpu"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("expected cpu, cuda or cuda:N"),
        "{}",
        text(&o)
    );
    if cfg!(not(feature = "cuda")) {
        let o = infer(&["bench", t, "-p", "2", "-n", "2", "--device", "cuda"]);
        assert!(!o.status.success());
        assert!(text(&o).contains("--features cuda"), "{}", text(&o));
    }

    // Change one byte of interleaved_q4k.bin: verify names it and exits non-zero.
    let p = target.join("interleaved_q4k.bin");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[12345] ^= 1;
    std::fs::write(&p, bytes).unwrap();
    let o = infer(&["verify", t]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("MISMATCH interleaved_q4k.bin"),
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
    // quant-stats compares with the float tier (--quant all alone writes none).
    let o = infer(&["extract", g, "-o", t, "--quant", "all", "--float", "f32"]);
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
    // 30 layers × (4 q4k attn + 4 q8 attn + 3 q4k FFN + 3 q4 FFN + 1 gate q4) + lm_head in
    // lm_head_q4.bin (q4 tier) and in lm_head_q6k.bin (q4k tier).
    assert_eq!(stats.len(), 30 * 15 + 2);
    // The tied output matrix in the q4k tier: token_embd is Q8_0 in this GGUF and its rows
    // (576) are not a multiple of 256, so Q6_K falls back to Q8_0 and the blocks are copied.
    let head: Vec<_> = stats
        .iter()
        .filter(|s| s["file"] == "lm_head_q6k.bin")
        .collect();
    assert_eq!(head.len(), 1, "{head:?}");
    assert_eq!(head[0]["key"], "lm_head.weight");
    assert_eq!(head[0]["format"], "Q8_0");
    assert_eq!(head[0]["passthrough"], true, "{}", head[0]);
    let mut requantized = 0;
    for s in stats {
        let (fmt, rel, max_abs) = (
            s["format"].as_str().unwrap(),
            s["rel_rmse"].as_f64().unwrap(),
            s["max_abs_err"].as_f64().unwrap(),
        );
        if s["passthrough"].as_bool().unwrap() {
            // Copied GGUF blocks against the f32 float tier (the exact dequantized GGUF):
            // dequantizing them again gives the same f32 values, so the error is exactly 0.
            assert!(rel == 0.0 && max_abs == 0.0, "{s}");
            continue;
        }
        let bound = match fmt {
            "Q8_0" => 0.01,
            "Q6_K" => 0.03,
            "Q5_0" | "Q4_K" => 0.1,
            "Q4_0" => 0.15,
            other => panic!("format {other}"),
        };
        // Requantized from the dequantized Q4_1 source: never lossless, within the bound.
        assert!(rel > 0.0 && rel < bound, "{s}");
        requantized += 1;
    }
    assert!(requantized >= 30 * 15, "{requantized} requantized tensors");
    let o = infer(&["quant-stats", t]);
    assert!(text(&o).contains("summary"), "{}", text(&o));

    // Default: the q4k tier.
    let t2 = root.path().join("d.vindex");
    let o = infer(&["extract", g, "-o", t2.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let index = std::fs::read_to_string(t2.join("index.json")).unwrap();
    assert!(index.contains("\"q4k\""), "default tiers");
    assert!(!t2.join("interleaved_q4.bin").exists());
    // ... and no float tier: no float FFN rows, embeddings in the GGUF's own Q8_0 blocks.
    assert!(!t2.join("gate_vectors.bin").exists());
    let parsed: serde_json::Value = serde_json::from_str(&index).unwrap();
    assert_eq!(
        parsed["tiers"],
        serde_json::json!(["q4k"]),
        "no float tier listed"
    );
    let o = infer(&["quant-stats", t2.to_str().unwrap()]);
    assert!(!o.status.success(), "quant-stats needs the float tier");

    let o = infer(&["extract", g, "-o", "y.vindex", "--quant", "q3"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("q3"), "{}", text(&o));
}

/// `--force` never deletes user data: a non-vindex directory or a regular file at the target is
/// refused up front (nothing written, nothing parked); `verify` / `quant-stats` on something that
/// is not a vindex say so plainly.
#[test]
fn force_refuses_non_vindex_targets_and_not_a_vindex_errors() {
    let gguf = model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
    let g = gguf.to_str().unwrap();
    let root = tempfile::tempdir().unwrap();

    let important = root.path().join("important");
    std::fs::create_dir(&important).unwrap();
    std::fs::write(important.join("thesis.tex"), "years of work").unwrap();
    let o = infer(&["extract", g, "-o", important.to_str().unwrap(), "--force"]);
    assert!(!o.status.success());
    let want = format!("{} exists and is not a vindex", important.display());
    assert!(text(&o).contains(&want), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(important.join("thesis.tex")).unwrap(),
        "years of work"
    );

    let file = root.path().join("existing.txt");
    std::fs::write(&file, "keep").unwrap();
    let o = infer(&["extract", g, "-o", file.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let want = format!("{} exists and is not a directory", file.display());
    assert!(text(&o).contains(&want), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    assert_eq!(
        names(root.path()),
        vec!["existing.txt", "important"],
        "temp or parked dirs left"
    );

    for cmd in ["verify", "quant-stats"] {
        let o = infer(&[cmd, important.to_str().unwrap()]);
        assert!(!o.status.success());
        let want = format!(
            "{} is not a vindex (no index.json); build one with `infer extract`",
            important.display()
        );
        assert!(text(&o).contains(&want), "{cmd}: {}", text(&o));
        let o = infer(&[cmd, g]);
        assert!(!o.status.success());
        let want = format!("{g} is a file, not a vindex directory");
        assert!(text(&o).contains(&want), "{cmd}: {}", text(&o));
    }
}

/// Newcomer finding: README documents `--dtype f32|f16` as the older name of `--float`, but
/// `infer extract --help` hid it; help and README now agree.
#[test]
fn extract_help_lists_dtype_as_the_older_name_of_float() {
    let o = infer(&["extract", "--help"]);
    assert!(o.status.success(), "{}", text(&o));
    let help = text(&o);
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("--dtype"))
        .unwrap_or_else(|| panic!("no --dtype in help: {help}"));
    assert!(
        line.contains("--dtype <f32|f16>") && line.contains("Same as --float f32|f16"),
        "{line}"
    );
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    assert!(
        readme.contains("`--dtype f32|f16` is the same flag under its older name"),
        "README and help agree"
    );
}
