//! ggml block formats: the one table of formats, f16/bf16 conversion, and ggml-exact
//! quantize / dequantize reference code. Depends on no other crate of this workspace.
//!
//! Everything is ported from llama.cpp `ggml/src/ggml-quants.c` (verified against
//! `shared/vectors/quant`, ggml commit 0253fb2): dequantization is bit-exact, quantization is
//! byte-exact with ggml's reference (`_ref`) and importance-matrix (`_impl`) quantizers built
//! without FMA contraction (plain f32 `+ - * / sqrt`, same operation order, no `mul_add`).
//!
//! Entry points: [`dequantize`], [`quantize`], [`QuantFormat`]; one module per block format with
//! its layout constants (`BLOCK_ELEMS`, `BLOCK_BYTES`, field offsets), e.g. [`q4_k`].

// The ports keep ggml's indexed loops (several arrays indexed together) so they can be checked
// line by line against the C source.
#![allow(clippy::needless_range_loop)]

mod dequant;
pub mod float16;
mod format;
pub mod interleave;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_k;
mod quant;
mod search;
mod util;

pub use dequant::{dequantize, dequantize_to_vec};
pub use format::QuantFormat;
pub use quant::{quantize, quantize_into};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("unknown quantization format '{0}'")]
    UnknownFormat(String),
    #[error("unknown ggml type id {0}")]
    UnknownGgmlType(u32),
    #[error("{n_elems} values are not a multiple of the {format} block size {block_elems}")]
    NotBlockAligned {
        format: QuantFormat,
        n_elems: usize,
        block_elems: usize,
    },
    #[error("{format}: expected {expected} bytes, got {got}")]
    WrongByteCount {
        format: QuantFormat,
        expected: usize,
        got: usize,
    },
    #[error("{0} is not supported by this operation")]
    Unsupported(QuantFormat),
    /// A row-blind operation was given an interleaved layout, whose rows it cannot find.
    #[error(
        "{0} interleaves several rows per group: read it as a matrix (infer_quant::interleave)"
    )]
    Interleaved(QuantFormat),
    /// The input is not a whole number of rows (or the row length is 0); says what was given.
    #[error("bad shape: {0}")]
    BadShape(String),
    /// The importance matrix does not have one value per column (`n_per_row`).
    #[error("importance matrix has {got} values, expected one per column ({expected})")]
    BadImatrix { expected: usize, got: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-module layout constants agree with the single format table.
    #[test]
    fn module_constants_match_format_table() {
        let mods: [(QuantFormat, usize, usize); 11] = [
            (QuantFormat::Q4_0, q4_0::BLOCK_ELEMS, q4_0::BLOCK_BYTES),
            (QuantFormat::Q4_1, q4_1::BLOCK_ELEMS, q4_1::BLOCK_BYTES),
            (QuantFormat::Q5_0, q5_0::BLOCK_ELEMS, q5_0::BLOCK_BYTES),
            (QuantFormat::Q5_1, q5_1::BLOCK_ELEMS, q5_1::BLOCK_BYTES),
            (QuantFormat::Q8_0, q8_0::BLOCK_ELEMS, q8_0::BLOCK_BYTES),
            (QuantFormat::Q2_K, q2_k::BLOCK_ELEMS, q2_k::BLOCK_BYTES),
            (QuantFormat::Q3_K, q3_k::BLOCK_ELEMS, q3_k::BLOCK_BYTES),
            (QuantFormat::Q4_K, q4_k::BLOCK_ELEMS, q4_k::BLOCK_BYTES),
            (QuantFormat::Q5_K, q5_k::BLOCK_ELEMS, q5_k::BLOCK_BYTES),
            (QuantFormat::Q6_K, q6_k::BLOCK_ELEMS, q6_k::BLOCK_BYTES),
            (QuantFormat::Q8_K, q8_k::BLOCK_ELEMS, q8_k::BLOCK_BYTES),
        ];
        for (f, elems, bytes) in mods {
            assert_eq!(f.block_elems(), elems, "{f} block elems");
            assert_eq!(f.block_bytes(), bytes, "{f} block bytes");
        }
    }

    #[test]
    fn dequantize_rejects_bad_lengths() {
        let mut out = vec![0.0f32; 256];
        assert!(matches!(
            dequantize(QuantFormat::Q4_K, &[0u8; 143], &mut out),
            Err(QuantError::WrongByteCount {
                expected: 144,
                got: 143,
                ..
            })
        ));
        let mut out = vec![0.0f32; 100];
        assert!(matches!(
            dequantize(QuantFormat::Q4_0, &[0u8; 100], &mut out),
            Err(QuantError::NotBlockAligned { .. })
        ));
        assert!(matches!(
            dequantize(QuantFormat::Q8_1, &[0u8; 36], &mut [0.0; 32]),
            Err(QuantError::Unsupported(QuantFormat::Q8_1))
        ));
    }

    #[test]
    fn quantize_rejects_bad_shapes() {
        let x = vec![0.5f32; 512];
        assert!(matches!(
            quantize(QuantFormat::Q4_0, &x, 300, None),
            Err(QuantError::BadShape(_))
        ));
        assert!(matches!(
            quantize(QuantFormat::Q4_K, &x, 128, None),
            Err(QuantError::NotBlockAligned { .. })
        ));
        assert!(matches!(
            quantize(QuantFormat::Q4_K, &x, 256, Some(&[1.0; 10])),
            Err(QuantError::BadImatrix {
                expected: 256,
                got: 10
            })
        ));
        let q = quantize(QuantFormat::Q4_K, &x, 256, None).unwrap();
        assert_eq!(q.len(), 288);
        let back = dequantize_to_vec(QuantFormat::Q4_K, &q, 512).unwrap();
        assert!(
            back.iter().all(|v| (v - 0.5).abs() < 0.01),
            "{:?}",
            &back[..4]
        );
    }
}
