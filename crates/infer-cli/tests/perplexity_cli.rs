//! `infer perplexity --kl-divergence-base / --kl-divergence` on SmolLM2: the base file of the
//! f32 path read back by the same plan gives zero divergence and the same PPL, a quantized plan
//! compared with it diverges a little (and reports the PPL its own plain run prints), and bad
//! base files or mismatched runs are refused by name with nothing left behind.

mod common;
use common::{infer, model_file, shared_dir, text};

const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const F32: [&str; 6] = ["--attn", "f32", "--ffn", "walk", "--lm-head", "f32"];
const Q4K: [&str; 6] = ["--attn", "q4k", "--ffn", "q4k", "--lm-head", "q6k"];

fn ok(args: &[&str]) -> String {
    let o = infer(args);
    assert!(o.status.success(), "infer {args:?}: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let o = infer(args);
    assert!(
        !o.status.success(),
        "infer {args:?} succeeded: {}",
        text(&o)
    );
    let t = text(&o);
    assert!(!t.contains("panicked"), "{t}");
    t
}

/// The value after `label` on its line of the report.
fn value(report: &str, label: &str) -> f64 {
    let line = report
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no '{label}' in:\n{report}"));
    let rest = line[label.len()..].trim_start_matches([' ', ':', '=']);
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn kl_divergence_base_round_trip_and_refusals() {
    let root = tempfile::tempdir().unwrap();
    let v = root.path().join("smol.vindex");
    let vs = v.to_str().unwrap();
    let gguf = model_file(SMOLLM);
    ok(&[
        "extract",
        gguf.to_str().unwrap(),
        "-o",
        vs,
        "--float",
        "f32",
    ]);
    // A few windows of 128 tokens of the reference text.
    let full = std::fs::read_to_string(shared_dir().join("reference/perplexity.txt")).unwrap();
    let txt = root.path().join("ppl.txt");
    std::fs::write(&txt, full.chars().take(2400).collect::<String>()).unwrap();
    let ts = txt.to_str().unwrap();
    let base = root.path().join("f32.kld");
    let bs = base.to_str().unwrap();

    let plain_f32 = ok(&[&["perplexity", vs, ts, "-c", "128"][..], &F32].concat());
    // An existing file (here the text itself) is refused before anything runs, and left as
    // it was; --force replaces one (as `logits --out`).
    let e = fails(&["perplexity", vs, ts, "--kl-divergence-base", ts]);
    assert!(
        e.contains("--kl-divergence-base")
            && e.contains("ppl.txt: already exists (use --force to replace it)"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&txt).unwrap().chars().count(), 2400);
    std::fs::write(&base, b"an older base").unwrap();
    let written = ok(&[
        &[
            "perplexity",
            vs,
            ts,
            "-c",
            "128",
            "--kl-divergence-base",
            bs,
            "--force",
        ][..],
        &F32,
    ]
    .concat());
    assert_eq!(
        plain_f32, written,
        "writing the base changes nothing printed"
    );
    // Per window: 128 token ids, 63 positions × (2·⌈49152/2⌉ + 4) u16; and the header.
    let windows: usize = plain_f32
        .split('(')
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(windows >= 3, "{plain_f32}");
    let expected = 20 + windows * (128 * 4 + 63 * (49152 + 4) * 2);
    assert_eq!(std::fs::metadata(&base).unwrap().len(), expected as u64);

    // The same plan against its own base: no divergence (16-bit log-probabilities).
    let same = ok(&[&["perplexity", vs, "--kl-divergence", bs][..], &F32].concat());
    assert!(value(&same, "Mean    KLD") < 1e-5, "{same}");
    assert_eq!(value(&same, "Same top p"), 100.0, "{same}");
    // PPL(base) is read from 16-bit log-probabilities floored 16 nats below the top one (the
    // format's), so it only approximates the exact PPL(Q).
    let (q, b) = (value(&same, "Mean PPL(Q)"), value(&same, "Mean PPL(base)"));
    assert!((q / b - 1.0).abs() < 1e-2, "{same}");
    assert!((q / value(&plain_f32, "PPL") - 1.0).abs() < 1e-4, "{same}");

    // A quantized plan: its own PPL, a small divergence from the f32 path.
    let plain_q = ok(&[&["perplexity", vs, ts, "-c", "128"][..], &Q4K].concat());
    let quant = ok(&[&["perplexity", vs, ts, "--kl-divergence", bs][..], &Q4K].concat());
    assert!(
        (value(&quant, "Mean PPL(Q)") / value(&plain_q, "PPL") - 1.0).abs() < 1e-4,
        "{quant}\n{plain_q}"
    );
    let kld = value(&quant, "Mean    KLD");
    assert!(kld > 1e-4 && kld < 0.2, "{quant}");
    assert!(value(&quant, "Same top p") > 80.0, "{quant}");

    // Refusals, each naming what is wrong.
    let e = fails(
        &[
            &["perplexity", vs, "-c", "64", "--kl-divergence", bs][..],
            &F32,
        ]
        .concat(),
    );
    assert!(
        e.contains("--ctx 64") && e.contains("128") && e.contains("f32.kld"),
        "{e}"
    );
    let other = root.path().join("other.txt");
    std::fs::write(
        &other,
        full.chars().skip(5000).take(2400).collect::<String>(),
    )
    .unwrap();
    let os = other.to_str().unwrap();
    let e = fails(&[&["perplexity", vs, os, "--kl-divergence", bs][..], &F32].concat());
    assert!(
        e.contains("f32.kld: the text's token 0 is ") && e.contains(" in the base file"),
        "{e}"
    );
    assert!(!e.contains("Some(") && !e.contains("None"), "{e}");
    // A text whose tokens are a strict prefix of the base file's: the two lengths, no `None`.
    let short = root.path().join("short.txt");
    let lines: String = std::fs::read_to_string(&txt)
        .unwrap()
        .split_inclusive('\n')
        .take(5)
        .collect();
    std::fs::write(&short, lines).unwrap();
    let e = fails(&[
        "perplexity",
        vs,
        short.to_str().unwrap(),
        "--kl-divergence",
        bs,
    ]);
    assert!(
        e.contains("f32.kld: the text has ") && e.contains(" tokens, the base file "),
        "{e}"
    );
    assert!(!e.contains("None"), "{e}");
    // A folder as the base to read: said so.
    let e = fails(&[
        "perplexity",
        vs,
        "--kl-divergence",
        root.path().to_str().unwrap(),
    ]);
    assert!(e.contains("is a folder, not a file"), "{e}");
    let cut = root.path().join("cut.kld");
    let bytes = std::fs::read(&base).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let e = fails(&["perplexity", vs, "--kl-divergence", cut.to_str().unwrap()]);
    assert!(e.contains("cut.kld") && e.contains("truncated"), "{e}");
    let e = fails(&["perplexity", vs, "--kl-divergence", ts]);
    assert!(e.contains("ppl.txt") && e.contains("_logits_"), "{e}");
    // A base that cannot be written: refused, nothing left in the folder.
    let missing = root.path().join("no/such/dir/x.kld");
    let e = fails(&[
        "perplexity",
        vs,
        ts,
        "-c",
        "128",
        "--kl-divergence-base",
        missing.to_str().unwrap(),
    ]);
    assert!(
        e.contains("x.kld: output directory") && e.contains("no/such/dir does not exist"),
        "{e}"
    );
    assert!(!e.contains(".tmp-"), "{e}");
    // A folder that takes no files (/proc): refused before the model runs, naming the path.
    let e = fails(&["perplexity", vs, ts, "--kl-divergence-base", "/proc/b.kld"]);
    assert!(
        e.contains("--kl-divergence-base /proc/b.kld: cannot create a file in /proc"),
        "{e}"
    );
    assert!(!e.contains(".tmp-") && !e.contains("running PPL"), "{e}");

    // SIGTERM while the base is written: the temp file is removed and said so, exit 143,
    // nothing at the target.
    let long = root.path().join("long.txt");
    std::fs::write(&long, &full).unwrap();
    let killed = root.path().join("killed.kld");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["perplexity", vs, long.to_str().unwrap(), "-c", "128"])
        .args(["--kl-divergence-base", killed.to_str().unwrap()])
        .args(F32)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let temp_exists = || {
        std::fs::read_dir(root.path()).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".killed.kld.tmp-")
        })
    };
    let start = std::time::Instant::now();
    while !temp_exists() {
        assert!(start.elapsed().as_secs() < 60, "no temp file appeared");
        assert!(
            child.try_wait().unwrap().is_none(),
            "perplexity ended early"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: kill(2) on the child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(
        err.contains("interrupted; removed ") && err.contains(".killed.kld.tmp-"),
        "{err}"
    );
    assert!(!temp_exists() && !killed.exists());
    // Neither a text nor a base: a usage error.
    let e = fails(&["perplexity", vs]);
    assert!(e.contains("FILE") || e.contains("file"), "{e}");
}
