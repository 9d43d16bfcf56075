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
    let written = ok(&[
        &[
            "perplexity",
            vs,
            ts,
            "-c",
            "128",
            "--kl-divergence-base",
            bs,
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
    assert!(e.contains("f32.kld") && e.contains("token 0"), "{e}");
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
    assert!(e.contains("x.kld"), "{e}");
    // Neither a text nor a base: a usage error.
    let e = fails(&["perplexity", vs]);
    assert!(e.contains("FILE") || e.contains("file"), "{e}");
}
