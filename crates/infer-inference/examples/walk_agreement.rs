//! Top-1 agreement of the sparse walk FFN with the exact one over the reference prompts (issue 8's
//! acceptance table).
//!
//! Usage: `walk_agreement VINDEX REFERENCE_DIR [SPEC ...]` where REFERENCE_DIR is one model's
//! folder of `../shared/reference` (its `index.json` lists the prompts and their token ids) and
//! each SPEC is a `--walk-k` value (default: all 0.75 0.5 0.25 0.1). For every spec and both
//! selections (f32, q4) it runs each prompt once as a batch (`Logits::All`) and prints one
//! markdown row: positions whose argmax equals the exact model's, over all prompt positions, and
//! the largest |Δ| of the last position's logits.

use std::path::PathBuf;

use infer_compute::CpuBackend;
use infer_inference::forward::Logits;
use infer_inference::sampling::argmax;
use infer_inference::{FfnChoice, FormatRequest, Model, Selection, WalkK};
use infer_vindex::Vindex;

fn prompts(dir: &std::path::Path) -> Result<Vec<(String, Vec<u32>)>, String> {
    let path = dir.join("index.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let index: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let list = index["prompts"]
        .as_array()
        .ok_or_else(|| format!("{}: no 'prompts' array", path.display()))?;
    list.iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or("?").to_string();
            let ids = p["input_ids"]
                .as_array()
                .ok_or_else(|| format!("{}: prompt {name} has no input_ids", path.display()))?
                .iter()
                .map(|v| v.as_u64().map(|x| x as u32))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| format!("{}: prompt {name}: bad id", path.display()))?;
            Ok((name, ids))
        })
        .collect()
}

fn run_all(model: &Model<'_>, prompts: &[(String, Vec<u32>)]) -> Result<Vec<Vec<f32>>, String> {
    let backend = CpuBackend::new();
    prompts
        .iter()
        .map(|(name, ids)| {
            let mut cache = model.new_cache(ids.len());
            model
                .forward(&backend, ids, &mut cache, Logits::All)
                .map_err(|e| format!("prompt {name}: {e}"))
        })
        .collect()
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        return Err("usage: walk_agreement VINDEX REFERENCE_DIR [SPEC ...]".into());
    }
    let vpath = PathBuf::from(&args[0]);
    let prompts = prompts(std::path::Path::new(&args[1]))?;
    let specs: Vec<String> = if args.len() > 2 {
        args[2..].to_vec()
    } else {
        ["all", "0.75", "0.5", "0.25", "0.1"]
            .map(String::from)
            .to_vec()
    };
    let v = Vindex::open(&vpath).map_err(|e| e.to_string())?;
    let request = FormatRequest {
        ffn: FfnChoice::Walk,
        ..FormatRequest::default()
    };
    let exact = Model::from_vindex_with(&v, &request).map_err(|e| e.to_string())?;
    let vocab = exact.vocab_size;
    let reference = run_all(&exact, &prompts)?;
    let positions: usize = prompts.iter().map(|(_, ids)| ids.len()).sum();
    println!(
        "{}: {} prompts, {positions} positions",
        vpath.display(),
        prompts.len()
    );
    println!("| --walk-k | --walk-select | top-1 agree | max abs diff last logits |");
    println!("|---|---|---|---|");
    for spec in &specs {
        let k = WalkK::parse(spec)?;
        for select in [Selection::F32, Selection::Q4] {
            let mut model = Model::from_vindex_with(&v, &request).map_err(|e| e.to_string())?;
            model
                .set_walk_k(&v, &k, select)
                .map_err(|e| e.to_string())?;
            let got = run_all(&model, &prompts)?;
            let (mut agree, mut max_diff) = (0usize, 0f32);
            for (a, b) in got.iter().zip(&reference) {
                let rows = a.len() / vocab;
                for r in 0..rows {
                    let row = r * vocab..(r + 1) * vocab;
                    agree += (argmax(&a[row.clone()]) == argmax(&b[row])) as usize;
                }
                let last = (rows - 1) * vocab..rows * vocab;
                for (x, y) in a[last.clone()].iter().zip(&b[last]) {
                    max_diff = max_diff.max((x - y).abs());
                }
            }
            let sel = match select {
                Selection::F32 => "f32",
                Selection::Q4 => "q4",
            };
            println!(
                "| {spec} | {sel} | {agree}/{positions} ({:.1}%) | {max_diff:.4} |",
                100.0 * agree as f64 / positions as f64
            );
        }
    }
    Ok(())
}
