//! Regression tests of issue 15 ("bugs found trying infer as a new user would") that run the
//! `infer` binary, one per bug, named after it.

mod common;

use std::path::{Path, PathBuf};

use common::{infer, shared_dir, text};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The archrefs `llama` case (tiny, f32) extracted into `dir` without a tokenizer.
fn tiny_vindex(dir: &Path) -> PathBuf {
    let vx = dir.join("llama.vindex");
    let src = shared_dir().join("archrefs/llama");
    let o = infer(&[
        "extract",
        s(&src),
        "-o",
        s(&vx),
        "--no-tokenizer",
        "--quant",
        "none",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    vx
}

/// The real SmolLM2 GGUF extracted into `dir` (float tier only).
fn smol_vindex(dir: &Path) -> PathBuf {
    let vx = dir.join("smol.vindex");
    let gguf = common::model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
    let o = infer(&["extract", s(&gguf), "-o", s(&vx), "--quant", "none"]);
    assert!(o.status.success(), "{}", text(&o));
    vx
}

/// `--json` output: one JSON object per line (one per test for `bench`).
fn json_lines(o: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `infer chat VINDEX ARGS` on the float path with piped stdin, stdout and stderr.
fn float_chat(vx: &Path, args: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["chat", s(vx)])
        .args(args)
        .args(["--attn", "f32", "--ffn", "walk", "--lm-head", "f32"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Bug 2: `logits --out` renamed over devices, FIFOs and symlinks and silently overwrote
/// files; now only a new path, or an existing regular file with `--force`, is written.
#[test]
fn logits_out_refuses_special_files_and_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let vx = tiny_vindex(dir.path());
    let logits = |out: &Path, force: bool| {
        let mut args = vec!["logits", s(&vx), "--ids", "1,2,3", "--out", s(out)];
        if force {
            args.push("--force");
        }
        infer(&args)
    };
    let out = dir.path().join("l.safetensors");
    let o = logits(&out, false);
    assert!(o.status.success(), "{}", text(&o));
    let first = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&first).unwrap();
    assert_eq!(st.tensor("logits").unwrap().shape(), &[3, 256]);

    // An existing file: refused without --force (left as it was), replaced with it.
    std::fs::write(&out, b"keep me").unwrap();
    let o = logits(&out, false);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("already exists (use --force"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let o = logits(&out, true);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&out).unwrap(), first);

    // A symlink (even with --force) stays a symlink to an untouched file.
    let target = dir.path().join("target.txt");
    std::fs::write(&target, b"target").unwrap();
    let link = dir.path().join("link.safetensors");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = logits(&link, true);
    assert!(!o.status.success());
    assert!(text(&o).contains("symbolic link"), "{}", text(&o));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), b"target");

    // A FIFO (as a device node would be) is refused and left in place.
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file system node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = logits(&fifo, true);
    assert!(!o.status.success());
    assert!(text(&o).contains("not a regular file"), "{}", text(&o));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    // A folder that takes no files (/proc), or one that does not exist: refused before the
    // model runs (no top-10 printed), naming --out's path and never the temp file.
    for (out, want) in [
        ("/proc/l.safetensors", "--out /proc/l.safetensors: cannot create a file in /proc"),
        (
            "/nonexistent-dir/l.safetensors",
            "--out /nonexistent-dir/l.safetensors: output directory /nonexistent-dir does not exist",
        ),
    ] {
        let o = logits(Path::new(out), false);
        assert!(!o.status.success());
        let t = text(&o);
        assert!(t.contains(want) && !t.contains(".tmp-"), "{t}");
        assert!(o.stdout.is_empty(), "{t}");
    }
    // Nothing else was left in the folder (no temp files).
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "fifo",
            "l.safetensors",
            "link.safetensors",
            "llama.vindex",
            "target.txt"
        ]
    );
}

/// Newcomer review: `verify` counted a deleted data file as a checksum mismatch ("1
/// mismatched"), and a flipped byte in a key of index.json came out as "corrupt JSON". Now a
/// missing file is reported as missing, by name, and a changed index.json (it records its own
/// sha256) as changed since it was written — by verify and by the commands that open it.
#[test]
fn verify_names_a_missing_file_and_a_changed_index_json() {
    let dir = tempfile::tempdir().unwrap();
    let vx = tiny_vindex(dir.path());
    let norms = vx.join("norms.bin");
    let bytes = std::fs::read(&norms).unwrap();
    std::fs::remove_file(&norms).unwrap();
    let o = infer(&["verify", s(&vx)]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("MISSING  norms.bin") && t.contains("1 missing (norms.bin)"),
        "{t}"
    );
    assert!(!t.to_lowercase().contains("mismatch"), "{t}");
    std::fs::write(&norms, bytes).unwrap();

    let index_path = vx.join("index.json");
    let index = std::fs::read_to_string(&index_path).unwrap();
    assert!(index.contains("\"model_name\""));
    std::fs::write(
        &index_path,
        index.replace("\"model_name\"", "\"model_nbme\""),
    )
    .unwrap();
    for args in [vec!["verify", s(&vx)], vec!["inspect", s(&vx)]] {
        let o = infer(&args);
        let t = text(&o);
        assert!(!o.status.success(), "{t}");
        assert!(
            t.contains("index.json: changed after it was written (sha256 mismatch")
                && t.contains("model_name")
                && !t.contains("corrupt JSON"),
            "{args:?}: {t}"
        );
    }
}

/// Bug 8: `verify` passed a vindex whose index.json lacked `embeddings.bin` in `files[]`
/// (only listed files were hashed), while opening it failed. Now verify reports the unlisted
/// file and exits non-zero, and opening names the real problem.
#[test]
fn verify_reports_a_needed_file_missing_from_index_files() {
    let dir = tempfile::tempdir().unwrap();
    let vx = tiny_vindex(dir.path());
    let o = infer(&["verify", s(&vx)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("all match"), "{}", text(&o));

    let index_path = vx.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let files = index["files"].as_array_mut().unwrap();
    let before = files.len();
    files.retain(|f| f["name"] != "embeddings.bin");
    assert_eq!(files.len(), before - 1);
    std::fs::write(&index_path, serde_json::to_string_pretty(&index).unwrap()).unwrap();

    let o = infer(&["verify", s(&vx)]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("UNLISTED embeddings.bin") && text(&o).contains("1 unlisted"),
        "{}",
        text(&o)
    );
    let o = infer(&["logits", s(&vx), "--ids", "1,2"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("embeddings.bin: needed by index.json but not listed in its files[]"),
        "{}",
        text(&o)
    );

    // A vindex file lying in the folder unlisted (here the norms manifest) is reported too.
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let files = index["files"].as_array_mut().unwrap();
    files.retain(|f| f["name"] != "norms_manifest.json" && f["name"] != "norms.bin");
    std::fs::write(&index_path, serde_json::to_string_pretty(&index).unwrap()).unwrap();
    let o = infer(&["verify", s(&vx)]);
    assert!(!o.status.success());
    for f in ["embeddings.bin", "norms.bin", "norms_manifest.json"] {
        assert!(
            text(&o).contains(&format!("UNLISTED {f}")),
            "{f}: {}",
            text(&o)
        );
    }
}

/// Logits `[T, vocab]` of `infer logits VINDEX --ids IDS --out …` with `extra` flags.
fn logits_of(vx: &Path, ids: &str, extra: &[&str], out: &Path) -> Vec<f32> {
    let mut args = vec!["logits", s(vx), "--ids", ids, "--out", s(out), "--force"];
    args.extend_from_slice(extra);
    let o = infer(&args);
    assert!(o.status.success(), "{}", text(&o));
    let bytes = std::fs::read(out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Bug 3: the default extract (q4k tier) failed on a valid model whose hidden size (144) is
/// not a multiple of 32 ("lm_head_q6k.bin: rows of 144 values are not a multiple of Q8_0's
/// block"). Each tensor now falls back to a format whose block divides its rows, down to F16,
/// recorded in the manifest, and the quantized tiers run.
#[test]
fn default_extract_of_hidden_144_falls_back_per_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 144,
            "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 36, "vocab_size": 256,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2}"#,
    )
    .unwrap();
    let hf = dir.path().join("hf");
    let o = infer(&["synth", "--like", s(&config), "-o", s(&hf)]);
    assert!(o.status.success(), "{}", text(&o));
    let vx = dir.path().join("h144.vindex");
    let o = infer(&[
        "extract",
        s(&hf),
        "-o",
        s(&vx),
        "--no-tokenizer",
        "--float",
        "f32",
    ]);
    assert!(o.status.success(), "{}", text(&o));

    // The manifests record each tensor's fallback: rows of 144 in F16, down's rows of 160
    // (Q6_K does not divide them, Q8_0 does) in Q8_0.
    let formats = |manifest: &str| -> Vec<(String, String)> {
        let text = std::fs::read_to_string(vx.join(manifest)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["key"].as_str().unwrap().to_string(),
                    e["format"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(
        formats("lm_head_q6k_manifest.json"),
        [("lm_head.weight".to_string(), "F16".to_string())]
    );
    for (key, format) in formats("interleaved_q4k_manifest.json") {
        let want = if key.contains("down_proj") {
            "Q8_0"
        } else {
            "F16"
        };
        assert_eq!(format, want, "{key}");
    }
    for (key, format) in formats("attn_weights_q4k_manifest.json") {
        assert_eq!(format, "F16", "{key}");
    }
    let o = infer(&["verify", s(&vx)]);
    assert!(o.status.success(), "{}", text(&o));

    // The quantized tiers run and agree with the float path (F16 rounding, Q8_0 down).
    let out = dir.path().join("l.safetensors");
    let ids = "1,5,9,200,17";
    let quant = logits_of(
        &vx,
        ids,
        &["--attn", "q4k", "--ffn", "q4k", "--lm-head", "q6k"],
        &out,
    );
    let float = logits_of(
        &vx,
        ids,
        &["--attn", "f32", "--ffn", "walk", "--lm-head", "f32"],
        &out,
    );
    assert_eq!(quant.len(), 5 * 256);
    let scale = float.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = quant
        .iter()
        .zip(&float)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        scale > 0.0 && diff <= 0.01 * scale,
        "max |Δ| {diff}, max |logit| {scale}"
    );
}

/// Bug 1 end to end, the issue's command: two chat turns in a context of 90 positions (the
/// same two-turn text through `run` needs 59) failed with "KV cache full: 103 positions
/// needed" because the kept prefix was fed again.
#[test]
fn chat_two_turns_fit_the_context_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let vx = smol_vindex(dir.path());
    let mut child = float_chat(&vx, &["-n", "24", "-c", "90"]);
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\nAnd of Germany?\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Paris") && out.contains("Berlin"),
        "{}",
        text(&o)
    );
    // Turn 2 feeds only its own 15 tokens (the user turn and the assistant opener).
    let err = String::from_utf8_lossy(&o.stderr);
    let prompts: Vec<&str> = err.matches("[prompt: ").collect();
    assert_eq!(prompts.len(), 2, "{err}");
    assert!(err.contains("[prompt: 15 tokens"), "{err}");
}

/// Rough edges of interactive chat: Ctrl-C during a reply stops it and returns to the prompt
/// (the next message is answered, exit 0); a full context drops the oldest exchange and says
/// so; a line of invalid UTF-8 is ignored with a note; `/clear` starts over.
#[test]
fn chat_survives_ctrl_c_a_full_context_and_invalid_utf8() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let vx = smol_vindex(dir.path());
    let mut child = float_chat(&vx, &["-n", "400", "-c", "70"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin
        .write_all(b"Write a very long story about a dragon and a knight.\n")
        .unwrap();
    stdin.flush().unwrap();
    // Once the reply has started, Ctrl-C.
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    // SAFETY: kill(2) on the child's pid with SIGINT.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    stdin
        .write_all(b"\xff\xfe\nWhat is the capital of France?\nAnd of Germany?\n/clear\nWhat is the capital of Italy?\n")
        .unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("[reply stopped]"), "{err}");
    assert!(err.contains("stop: Interrupted"), "{err}");
    assert!(err.contains("not valid UTF-8; it was ignored"), "{err}");
    assert!(err.contains("dropped the oldest exchange"), "{err}");
    assert!(err.contains("[conversation cleared]"), "{err}");
    // Four replies (the interrupted one included), the last one fed from scratch: as many
    // prompt tokens as a one-shot chat with the same message.
    let prompts: Vec<&str> = err.split("[prompt: ").skip(1).collect();
    assert_eq!(prompts.len(), 4, "{err}");
    assert!(!rest.is_empty());
    let o = infer(&[
        "chat",
        s(&vx),
        "-n",
        "1",
        "-p",
        "What is the capital of Italy?",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let one_shot = String::from_utf8_lossy(&o.stderr).into_owned();
    let tokens = |p: &str| p.split(" tokens").next().unwrap().to_string();
    let fresh = tokens(one_shot.split("[prompt: ").nth(1).unwrap());
    assert_eq!(tokens(prompts[3]), fresh, "{err}");
}

/// `-t/--threads` works on every command (it was `bench`'s alone): the thread count is what
/// bench reports, logits are the same with 1 and 3 threads, and 0 is refused.
#[test]
fn threads_flag_works_on_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let vx = tiny_vindex(dir.path());
    let o = infer(&[
        "bench",
        s(&vx),
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "--json",
        "-t",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // One object per test: pp4 and tg2.
    let tests = json_lines(&o);
    assert_eq!(tests.len(), 2, "{}", text(&o));
    for j in tests {
        assert_eq!(j["threads"], 1, "{j}");
    }
    let out = dir.path().join("l.safetensors");
    let one = logits_of(&vx, "1,2,3,4", &["-t", "1"], &out);
    let three = logits_of(&vx, "1,2,3,4", &["--threads", "3"], &out);
    assert_eq!(one, three);
    for args in [
        vec!["verify", s(&vx), "-t", "2"],
        vec!["-t", "2", "inspect", s(&vx)],
    ] {
        let o = infer(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
    let o = infer(&["logits", s(&vx), "--ids", "1", "-t", "0"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("0 is not in 1..=256"), "{}", text(&o));
}

/// SIGTERM exits 143 (128 + 15, the shell convention; it was 130 as for Ctrl-C): an extract
/// still removes its temp directory, a chat waiting at its prompt ends at once.
#[test]
fn sigterm_exits_143() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let gguf = common::model_file("gemma-3-270m-q4_k_m.gguf");
    let target = dir.path().join("g.vindex");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["extract", s(&gguf), "-o", s(&target), "--no-tokenizer"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let temp_exists = || {
        std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".g.vindex.tmp-")
        })
    };
    while !temp_exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no temp dir appeared"
        );
        assert!(child.try_wait().unwrap().is_none(), "extract ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    assert!(!temp_exists() && !target.exists());

    let vx = smol_vindex(dir.path());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["chat", s(&vx)])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    // Held open past `wait` (which would close it): end of input would race the signal and
    // end the chat normally, with 0.
    let _stdin = child.stdin.take().unwrap();
    let mut prompt = [0u8; 2];
    err.read_exact(&mut prompt).unwrap();
    assert_eq!(&prompt, b"> ");
    // SAFETY: kill(2) on the child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(child.wait().unwrap().code(), Some(143));
}

/// `inspect` groups equal layers (Gemma-3's 18 layers are two kinds: 5 sliding then 1 global)
/// and shows the header of a header-only GGUF (`synth --header-only`), which it refused.
#[test]
fn inspect_groups_equal_layers_and_reads_header_only_ggufs() {
    let gemma = common::model_file("gemma-3-270m-q4_k_m.gguf");
    let o = infer(&["inspect", s(&gemma)]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let plan: Vec<&str> = out
        .lines()
        .skip_while(|l| *l != "per-layer plan:")
        .skip(1)
        .take_while(|l| l.starts_with("layer"))
        .collect();
    assert_eq!(plan.len(), 2, "{out}");
    assert!(
        plan[0].starts_with("layers 0-4, 6-10, 12-16: sliding window 512"),
        "{out}"
    );
    assert!(
        plan[1].starts_with("layers 5, 11, 17: global attention"),
        "{out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let skel = dir.path().join("skel.gguf");
    let o = infer(&[
        "synth",
        "--like",
        s(&gemma),
        "--header-only",
        "-o",
        s(&skel),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = infer(&["inspect", s(&skel)]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("GGUF header only"), "{out}");
    assert!(out.contains("gemma3.block_count"), "{out}");
    assert!(out.contains("u32     18"), "{out}");
    assert!(
        out.contains("token_embd.weight") && out.contains("[262144, 640]"),
        "{out}"
    );
}

/// `inspect` of the gpt-oss and Cohere-2 checkpoints (`../shared/archrefs-next`) names each
/// family's block: gpt-oss's sinks, YaRN and clamped SwiGLU on alternating sliding/global
/// layers; Cohere-2's interleaved RoPE on its sliding layers, the global layer without RoPE,
/// the parallel residual and `logit_scale`.
#[test]
fn inspect_describes_gpt_oss_and_cohere2() {
    let next = common::shared_dir().join("archrefs-next");
    let plan = |case: &str| -> (String, Vec<String>) {
        let o = infer(&["inspect", s(&next.join(case))]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let plan = out
            .lines()
            .skip_while(|l| *l != "per-layer plan:")
            .skip(1)
            .take_while(|l| l.starts_with("layer"))
            .map(str::to_string)
            .collect();
        (out, plan)
    };
    let (out, p) = plan("gpt-oss");
    assert!(out.contains("architecture:  gpt_oss"), "{out}");
    assert_eq!(p.len(), 2, "{out}");
    assert!(p[0].starts_with("layers 0, 2: sliding window 8"), "{out}");
    assert!(p[1].starts_with("layers 1, 3: global attention"), "{out}");
    for l in &p {
        for needle in [
            "YaRN scaling ×32 (cos/sin ×1.3466)",
            "attention sinks",
            "clamped SwiGLU (limit 7, alpha 1.702)",
        ] {
            assert!(l.contains(needle), "{needle}: {l}");
        }
    }
    let (out, p) = plan("cohere2");
    assert!(out.contains("architecture:  cohere2"), "{out}");
    assert!(out.contains("logit scale:   0.25"), "{out}");
    assert_eq!(p.len(), 2, "{out}");
    assert!(
        p[0].starts_with("layers 0-2: sliding window 8")
            && p[0].contains("(interleaved pairs)")
            && p[0].contains("LayerNorm; gated FFN (Silu), parallel residual"),
        "{out}"
    );
    assert!(
        p[1].starts_with("layer 3: global attention") && p[1].contains("no RoPE"),
        "{out}"
    );
}

/// `logits` shows each top token's text (`" Paris"`), not its byte-level vocabulary string
/// (`ĠParis`).
#[test]
fn logits_shows_decoded_token_text() {
    let dir = tempfile::tempdir().unwrap();
    let vx = smol_vindex(dir.path());
    let o = infer(&["logits", s(&vx), "--prompt", "The capital of France is"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let top = out.lines().nth(1).unwrap();
    assert!(top.ends_with("\" Paris\""), "{out}");
    assert!(!out.contains('Ġ'), "{out}");
}

/// Newcomer findings (2026-12-03): `bench -B 4096 -p 8000 -n 100` (1.4 TiB of KV cache for
/// SmolLM2) started and grew until the OOM killer, and `-p 8190 -n 2` was said to "exceed"
/// the maximum context 8192 it equals. The first is refused before any allocation, as
/// `serve` refuses such slots; the second names the context it needs.
#[test]
fn bench_refuses_a_kv_cache_larger_than_memory_and_names_the_context_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let vx = smol_vindex(dir.path());
    let o = infer(&["bench", s(&vx), "-p", "8190", "-n", "2", "-r", "1"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "-p 8190 + -n 2 needs a context of 8193 positions (one more for the last token), \
             more than the model's maximum context 8192"
        ),
        "{}",
        text(&o)
    );
    // 30 layers × 3 KV heads × 64 × 8 bytes (f32 K and V) per position.
    let need = 4096.0 * 8101.0 * 46080.0;
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| -> f64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l[key.len()..].split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::INFINITY)
    };
    let available = (kib("MemAvailable:") + kib("SwapFree:")) * 1024.0;
    assert!(
        need > available,
        "this test needs less than 1424 GiB of memory available ({available} bytes)"
    );
    let o = infer(&[
        "bench",
        s(&vx),
        "-B",
        "4096",
        "-p",
        "8000",
        "-n",
        "100",
        "-r",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o)
            .contains("KV cache: 4096 sequences × 8101 positions (-p + -n + 1) need 1424.0 GiB")
            && text(&o).contains("lower -B, -p or -n"),
        "{}",
        text(&o)
    );
}

/// `bench -d N` (llama-bench's `-d`): pp and tg after an untimed context of N tokens, reported
/// as `pp4 @ d8` (and `"depth"` in JSON); the context it needs counts the depth, and `-d` with
/// `--batch` is refused.
#[test]
fn bench_measures_at_depth_and_counts_it_in_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let vx = smol_vindex(dir.path());
    let o = infer(&["bench", s(&vx), "-d", "8", "-p", "4", "-n", "2", "-r", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for test in ["| pp4 @ d8 |", "| tg2 @ d8 |"] {
        assert!(out.contains(test), "{out}");
    }
    // The memory line: mapped weights, the f32 KV cache of -d + -p + -n + 1 positions.
    assert!(
        out.contains("\nmemory: weights ")
            && out.contains(
                " (mapped from the vindex), KV cache 0.7 MiB (f32, 15 positions × 1 sequence), \
                 scratch ~"
            ),
        "{out}"
    );
    let o = infer(&[
        "bench",
        s(&vx),
        "-d",
        "8",
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // One object per test: pp4 @ d8, then tg2 @ d8.
    let tests = json_lines(&o);
    assert_eq!(tests.len(), 2, "{}", text(&o));
    assert!(tests.iter().all(|j| j["depth"] == 8), "{}", text(&o));
    let j = &tests[1];
    assert_eq!(j["test"], "tg2 @ d8", "{j}");
    // 30 layers × 3 KV heads × 64 × 8 bytes (f32 K and V) per position; a dense model with
    // tied embeddings stores the weights one token reads.
    let m = &j["memory"];
    assert_eq!(m["kv_cache_bytes"], 15 * 46080, "{j}");
    assert_eq!(m["kv_type"], "f32", "{j}");
    assert_eq!(
        m["weights_bytes"].as_f64(),
        j["weight_bytes_per_token"].as_f64(),
        "{j}"
    );
    assert!(j["tg_tokens_per_s"].as_f64().unwrap() > 0.0, "{j}");
    let o = infer(&[
        "bench",
        s(&vx),
        "-d",
        "8190",
        "-p",
        "1",
        "-n",
        "1",
        "-r",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("-d 8190 + -p 1 + -n 1 needs a context of 8193 positions"),
        "{}",
        text(&o)
    );
    let o = infer(&["bench", s(&vx), "-d", "8", "-B", "2", "-p", "4", "-n", "2"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--depth is for the single-sequence protocol"),
        "{}",
        text(&o)
    );
}

/// `bench -p 4,8 -n 2,3 -d 0,5` (llama-bench's lists): every -p value is a pp test and every -n
/// value a tg test, each after every -d context, in llama-bench's order (per depth: pp, then
/// tg); one table row and one JSON object per test; one memory check for the largest context
/// (-d 5 + -p 8 + -n 3 + 1 = 17 positions); a 0 in a list is skipped.
#[test]
fn bench_runs_every_listed_size_at_every_depth() {
    let dir = tempfile::tempdir().unwrap();
    let vx = tiny_vindex(dir.path());
    let lists = ["-p", "4,8", "-n", "2,3", "-d", "0,5", "-r", "1"];
    let expected = [
        ("pp4", 4, 0, 0),
        ("pp8", 8, 0, 0),
        ("tg2", 0, 2, 0),
        ("tg3", 0, 3, 0),
        ("pp4 @ d5", 4, 0, 5),
        ("pp8 @ d5", 8, 0, 5),
        ("tg2 @ d5", 0, 2, 5),
        ("tg3 @ d5", 0, 3, 5),
    ];
    let o = infer(&[&["bench", s(&vx)][..], &lists].concat());
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // Rows `| vindex | threads | test | tokens/s |`, the header and its rule left out.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| vindex "))
        .map(|l| l.split(" | ").collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r[2]).collect();
    let want: Vec<&str> = expected.iter().map(|e| e.0).collect();
    assert_eq!(names, want, "{out}");
    for r in &rows {
        let rate: f64 = r[3].trim_end_matches(" |").parse().unwrap();
        assert!(rate > 0.0, "{out}");
    }
    assert!(out.contains("(f32, 17 positions × 1 sequence)"), "{out}");
    // Several tg tests: their decode figures are named.
    assert!(out.contains("\ntg3 @ d5: decode reads "), "{out}");

    let o = infer(&[&["bench", s(&vx), "--json"][..], &lists].concat());
    assert!(o.status.success(), "{}", text(&o));
    let tests = json_lines(&o);
    assert_eq!(tests.len(), expected.len(), "{}", text(&o));
    for (j, &(name, n_prompt, n_gen, depth)) in tests.iter().zip(&expected) {
        assert_eq!(j["test"], name, "{j}");
        assert_eq!(j["n_prompt"], n_prompt, "{j}");
        assert_eq!(j["n_gen"], n_gen, "{j}");
        assert_eq!(j["depth"], depth, "{j}");
        let (rate, other) = if n_gen > 0 {
            ("tg_tokens_per_s", "pp_tokens_per_s")
        } else {
            ("pp_tokens_per_s", "tg_tokens_per_s")
        };
        assert!(j[rate].as_f64().unwrap() > 0.0, "{j}");
        assert!(j[other].is_null(), "{j}");
        assert_eq!(j["memory"], tests[0]["memory"], "{j}");
    }

    // 0 skips a size, in a list as alone.
    let o = infer(&["bench", s(&vx), "-p", "0,4", "-n", "0", "-r", "1", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let tests = json_lines(&o);
    assert_eq!(tests.len(), 1, "{}", text(&o));
    assert_eq!(tests[0]["test"], "pp4", "{}", text(&o));
}

/// Bad `bench` lists: an empty item or a non-number is a usage error naming the flag; the
/// context check names the largest sizes; `--batch` takes one -p and one -n value.
#[test]
fn bench_refuses_bad_lists() {
    let dir = tempfile::tempdir().unwrap();
    let vx = tiny_vindex(dir.path());
    for (args, flag, why) in [
        (
            ["-p", "4,,8"],
            "'--n-prompt <N[,N...]>'",
            "an empty list item",
        ),
        (
            ["-n", "2,x"],
            "'--n-gen <N[,N...]>'",
            "not a number of tokens",
        ),
        (["-d", "5,"], "'--depth <N[,N...]>'", "an empty list item"),
    ] {
        let o = infer(&[&["bench", s(&vx), "-r", "1"][..], &args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(flag) && err.contains(why), "{args:?}: {err}");
    }
    // The archrefs llama's maximum context is 256.
    let o = infer(&["bench", s(&vx), "-p", "4,300", "-n", "2,1", "-r", "1"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("-p 300 + -n 2 needs a context of 303 positions"),
        "{}",
        text(&o)
    );
    let o = infer(&["bench", s(&vx), "-p", "0,0", "-n", "0"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("nothing to measure"), "{}", text(&o));
    let o = infer(&["bench", s(&vx), "-B", "2", "-p", "4,8", "-n", "2"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--batch takes one -p and one -n value"),
        "{}",
        text(&o)
    );
}
