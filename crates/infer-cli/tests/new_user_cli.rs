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
