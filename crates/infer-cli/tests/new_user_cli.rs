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
