//! Quantization against ggml's `ggml_quantize_chunk` / `quantize_row_q8_K_ref` bytes in
//! `shared/vectors/quant` (byte-exact, every row, including the C-undefined-behaviour rows, whose
//! x86 result we emulate).

mod common;

use common::load;
use infer_quant::{quantize, QuantFormat};

/// Quantize every row of `file`'s `input` (with its `imatrix` when `with_imatrix`) and compare
/// with `expected`. Returns the number of rows checked.
fn check(file: &str, fmt: QuantFormat, with_imatrix: bool) -> usize {
    let v = load(file);
    let (input, ishape) = v.f32s("input");
    let (expected, eshape) = v.raw("expected");
    let (rows, cols) = (ishape[0], ishape[1]);
    let row_bytes = eshape[1];
    let imatrix = with_imatrix.then(|| v.f32s("imatrix").0);
    let labels = v.row_labels();
    let mut bad = Vec::new();
    for r in 0..rows {
        let x = &input[r * cols..(r + 1) * cols];
        let got = quantize(fmt, x, cols, imatrix.as_deref())
            .unwrap_or_else(|e| panic!("{file} row {r}: {e}"));
        let want = &expected[r * row_bytes..(r + 1) * row_bytes];
        assert_eq!(got.len(), want.len(), "{file} row {r}: length");
        let diffs: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
        if !diffs.is_empty() {
            let i = diffs[0];
            bad.push(format!(
                "row {r} ({}): {} bytes differ, first at byte {i} (block {}): got {:#04x} want {:#04x}",
                labels.get(r).map(String::as_str).unwrap_or("?"),
                diffs.len(),
                i / fmt.block_bytes(),
                got[i],
                want[i]
            ));
        }
    }
    // Whole-matrix call must equal the per-row calls.
    let all = quantize(fmt, &input, cols, imatrix.as_deref()).unwrap();
    assert_eq!(all.len(), expected.len());
    assert!(
        bad.is_empty(),
        "{file}: {} of {rows} rows differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert_eq!(all, expected, "{file}: multi-row call differs");
    rows
}

#[test]
fn quantize_q8_0() {
    assert_eq!(check("q8_0.safetensors", QuantFormat::Q8_0, false), 87);
}

#[test]
fn quantize_legacy_ref() {
    for t in ["q4_0", "q4_1", "q5_0", "q5_1"] {
        let fmt = QuantFormat::from_name(t).unwrap();
        assert_eq!(check(&format!("{t}.safetensors"), fmt, false), 87);
    }
}

#[test]
fn quantize_k_ref() {
    for t in ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"] {
        let fmt = QuantFormat::from_name(t).unwrap();
        assert_eq!(check(&format!("{t}.safetensors"), fmt, false), 87);
    }
}

#[test]
fn quantize_q8_k_activations() {
    assert_eq!(check("q8k.safetensors", QuantFormat::Q8_K, false), 87);
}

#[test]
fn quantize_imatrix() {
    for t in [
        "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
    ] {
        let fmt = QuantFormat::from_name(t).unwrap();
        assert_eq!(check(&format!("imatrix_{t}.safetensors"), fmt, true), 87);
    }
}

#[test]
fn quantize_f16_bf16() {
    assert_eq!(check("f16.safetensors", QuantFormat::F16, false), 89);
    assert_eq!(check("bf16.safetensors", QuantFormat::BF16, false), 89);
}
