//! Dequantization against ggml's `to_float` output in `shared/vectors/quant` (bit-exact).

mod common;

use common::{compare_bits, load};
use infer_quant::{dequantize, QuantFormat};

const QUANT_TYPES: [&str; 10] = [
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
];

/// Dequantize every row of `blocks_tensor` and compare with `dequant_tensor`, bit for bit;
/// NaN is accepted for NaN only in rows listed in `rows_nonfinite_dequant`.
fn check(file: &str, fmt: QuantFormat, blocks_tensor: &str, dequant_tensor: &str) -> usize {
    let v = load(file);
    let (blocks, bshape) = v.raw(blocks_tensor);
    let (want, wshape) = v.f32s(dequant_tensor);
    let rows = bshape[0];
    assert_eq!(wshape[0], rows, "{file}: row counts differ");
    let row_bytes = bshape[1];
    let cols = wshape[1];
    let labels = v.row_labels();
    let nonfinite = v.meta_list("rows_nonfinite_dequant");
    let mut bad_rows = Vec::new();
    for r in 0..rows {
        let mut out = vec![0.0f32; cols];
        dequantize(fmt, &blocks[r * row_bytes..(r + 1) * row_bytes], &mut out)
            .unwrap_or_else(|e| panic!("{file} row {r}: {e}"));
        let label = labels.get(r).cloned().unwrap_or_default();
        let nan_ok = nonfinite.contains(&label);
        let (n, first) = compare_bits(&out, &want[r * cols..(r + 1) * cols], nan_ok);
        if n > 0 {
            bad_rows.push(format!(
                "row {r} ({label}): {n} mismatches, first {first:?}"
            ));
        }
    }
    assert!(
        bad_rows.is_empty(),
        "{file} {blocks_tensor}: {} bad rows:\n{}",
        bad_rows.len(),
        bad_rows.join("\n")
    );
    rows * cols
}

#[test]
fn dequant_files_blocks_and_random_blocks() {
    for t in QUANT_TYPES {
        let fmt = QuantFormat::from_name(t).unwrap();
        let file = format!("dequant_{t}.safetensors");
        let n = check(&file, fmt, "blocks", "dequant");
        let m = check(&file, fmt, "blocks_random", "dequant_random");
        assert_eq!(n, 32 * 1024);
        assert_eq!(m, 32 * 1024);
    }
}

#[test]
fn dequant_f16_bf16_all_patterns() {
    for (t, fmt) in [("f16", QuantFormat::F16), ("bf16", QuantFormat::BF16)] {
        let n = check(
            &format!("dequant_{t}.safetensors"),
            fmt,
            "blocks",
            "dequant",
        );
        assert_eq!(n, 65536);
    }
}

#[test]
fn dequant_of_quantized_rows() {
    for t in QUANT_TYPES {
        let fmt = QuantFormat::from_name(t).unwrap();
        check(&format!("{t}.safetensors"), fmt, "expected", "dequant");
        if t != "q8_0" {
            // Q8_0 ignores the imatrix, so there is no imatrix_q8_0 file.
            check(
                &format!("imatrix_{t}.safetensors"),
                fmt,
                "expected",
                "dequant",
            );
        }
    }
    check("q8k.safetensors", QuantFormat::Q8_K, "expected", "dequant");
    check("f16.safetensors", QuantFormat::F16, "expected", "dequant");
    check("bf16.safetensors", QuantFormat::BF16, "expected", "dequant");
}
