//! `infer extract --down-meta` + `infer walk` end to end on SmolLM2-135M-Instruct (f32 tier):
//! for "The capital of France is", a late-layer feature that fires on the last token writes
//! " capitals" (through −dᵢ: negative activation), the model's next token is " Paris"; a
//! vindex without down_meta.bin still lists features and says how to add tokens.

use std::path::Path;
use std::process::Output;

mod common;
use common::{infer, model_file, text};

fn ok(o: Output) -> String {
    assert!(o.status.success(), "infer failed:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A copy of `src` (hard links; index.json rewritten) without down_meta.bin.
fn without_down_meta(src: &Path, dst: &Path) {
    std::fs::create_dir(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let name = e.file_name();
        if name != "index.json" && name != "down_meta.bin" {
            std::fs::hard_link(e.path(), dst.join(&name)).unwrap();
        }
    }
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("index.json")).unwrap()).unwrap();
    j["files"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != "down_meta.bin");
    std::fs::write(dst.join("index.json"), j.to_string()).unwrap();
}

#[test]
fn walk_smollm2_capital_of_france_finds_capital_city_features() {
    let gguf = model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
    let root = tempfile::tempdir().unwrap();
    let vx = root.path().join("smol.vindex");
    let vs = vx.to_str().unwrap();
    let o = infer(&[
        "extract",
        gguf.to_str().unwrap(),
        "-o",
        vs,
        "--quant",
        "none",
        "--down-meta",
    ]);
    assert!(o.status.success(), "extract:\n{}", text(&o));
    // N = 10 by default: 30 layers × 1536 features × (10 top + 10 bottom) × 8 bytes + 152
    // bytes of header.
    let size = std::fs::metadata(vx.join("down_meta.bin")).unwrap().len();
    assert_eq!(size, 32 + 4 * 30 + 30 * 1536 * 20 * 8);
    assert!(ok(infer(&["verify", vs])).contains("all match"));

    let prompt = "The capital of France is";
    let out = ok(infer(&[
        "walk", vs, prompt, "--json", "--top", "20", "--tokens", "10",
    ]));
    let j: serde_json::Value = serde_json::from_str(&out).expect("walk --json is one document");
    assert_eq!(j["down_meta"], true);
    let layers = j["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 30);
    // Features ranked by |activation|, 20 per layer, each with 10 tokens sorted by score.
    for l in layers {
        let f = l["features"].as_array().unwrap();
        assert_eq!(f.len(), 20);
        let acts: Vec<f64> = f
            .iter()
            .map(|f| f["activation"].as_f64().unwrap().abs())
            .collect();
        assert!(acts.windows(2).all(|w| w[0] >= w[1]), "{acts:?}");
        for feat in f {
            let g = feat["gate"].as_f64().unwrap();
            let u = feat["up"].as_f64().unwrap();
            let silu = g / (1.0 + (-g).exp());
            let a = feat["activation"].as_f64().unwrap();
            assert!(
                (a - silu * u).abs() <= 1e-4 * (1.0 + a.abs()),
                "act {a} vs silu(g)·u"
            );
            assert_eq!(feat["tokens"].as_array().unwrap().len(), 10);
        }
    }
    // Late layers: features writing capital-city tokens. For SmolLM2 this is layer 24's
    // strongest feature (1005, activation about -19: it writes -d, whose tokens are
    // " capitals", " metropolis", ...). No single feature's 10 tokens hold " Paris" itself
    // (only 2 of the model's 46080 features list it at all, neither active in that
    // direction): the answer is assembled from many features.
    // Layer 23's third strongest feature (604) writes European cities (" Zurich", " Basel",
    // " Oslo", …).
    let cities = [
        " Paris",
        " London",
        " Rome",
        " Berlin",
        " Madrid",
        " Oslo",
        " Vienna",
        " Brussels",
        " Lisbon",
        " Athens",
        " Amsterdam",
        " Dublin",
        " Prague",
        " Warsaw",
        " Stockholm",
        " Copenhagen",
        " Helsinki",
        " Budapest",
        " Bern",
        " Moscow",
        " Tokyo",
        " Beijing",
    ];
    let capital = [
        [" capitals", " capital", " metropolis"].as_slice(),
        cities.as_slice(),
    ]
    .concat();
    let capital = capital.as_slice();
    let hits: Vec<(u64, u64, f64, String)> = layers
        .iter()
        .filter(|l| l["layer"].as_u64().unwrap() >= 20)
        .flat_map(|l| {
            let layer = l["layer"].as_u64().unwrap();
            l["features"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(move |f| {
                    f["tokens"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(|t| t["text"].as_str())
                        .filter(|t| capital.contains(t))
                        .map(|t| {
                            (
                                layer,
                                f["feature"].as_u64().unwrap(),
                                f["activation"].as_f64().unwrap(),
                                t.to_string(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    eprintln!("late-layer features writing capital-city tokens: {hits:?}");
    assert!(
        hits.iter()
            .any(|h| h.3 == " capitals" && h.2 < 0.0 && h.0 >= 20),
        "no feature of layers 20-29 (top 20 by |activation|) writes \" capitals\" through -d:\n{out}"
    );
    assert!(
        hits.iter().any(|h| cities.contains(&h.3.as_str())),
        "no feature of layers 20-29 (top 20 by |activation|) lists a capital city among its \
         10 tokens:\n{out}"
    );
    // The model itself continues with " Paris".
    assert_eq!(
        j["next_tokens"][0]["text"], " Paris",
        "{}",
        j["next_tokens"]
    );

    // Text output of one layer.
    let out = ok(infer(&["walk", vs, prompt, "--layer", "29", "--top", "5"]));
    assert!(out.contains("layer 29 (|x| = "), "{out}");
    assert!(!out.contains("layer 28"), "{out}");
    // Header, scores-source line, layer line, column line, 5 features, next-token line.
    assert_eq!(out.lines().count(), 10, "{out}");
    assert!(
        out.contains("(gate/up scores from the float tier)"),
        "{out}"
    );

    // A vindex without a float tier (the default extract) walks the q4k tier's rows: it says
    // so, and its strongest features are mostly the float tier's (quantization noise only).
    let q = root.path().join("q.vindex");
    let o = infer(&["extract", gguf.to_str().unwrap(), "-o", q.to_str().unwrap()]);
    assert!(o.status.success(), "extract:\n{}", text(&o));
    let top = |v: &str| -> (Vec<u64>, String) {
        let out = ok(infer(&[
            "walk", v, prompt, "--layer", "29", "--top", "5", "--json",
        ]));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        let f = j["layers"][0]["features"].as_array().unwrap();
        (
            f.iter().map(|f| f["feature"].as_u64().unwrap()).collect(),
            j["scores_from"].as_str().unwrap().to_string(),
        )
    };
    let (float_top, float_from) = top(vs);
    let (quant_top, quant_from) = top(q.to_str().unwrap());
    assert_eq!(float_from, "the float tier");
    assert!(quant_from.contains("no float tier"), "{quant_from}");
    let shared = quant_top.iter().filter(|i| float_top.contains(i)).count();
    assert!(
        shared >= 3,
        "top features {quant_top:?} vs float {float_top:?}"
    );

    // Without down_meta.bin: features and scores, plus the hint.
    let bare = root.path().join("bare.vindex");
    without_down_meta(&vx, &bare);
    let out = ok(infer(&[
        "walk",
        bare.to_str().unwrap(),
        prompt,
        "--layer",
        "25",
    ]));
    assert!(out.contains("infer extract"), "{out}");
    assert!(out.contains("--down-meta"), "{out}");
    assert!(out.contains("layer 25 (|x| = "), "{out}");

    // Errors: a layer past the last.
    let o = infer(&["walk", vs, prompt, "--layer", "30"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--layer 30"), "{}", text(&o));
}
