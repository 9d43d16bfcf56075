//! Q4_0x16 (Q4_0 re-laid sixteen rows per group) through the CPU backend: every output equals
//! the plain Q4_0 product's bit for bit, on every instruction set this CPU has (the scalar
//! kernels, and AVX2 or AVX-512 VNNI), for `linear` and `linear_many`, for one to many
//! activation rows and for rows that are not a multiple of 16 (the tail stored plain); and a
//! mis-sized matrix is an error, not a panic.

use infer_compute::vec_dot::Isa;
use infer_compute::{ComputeBackend, ComputeError, CpuBackend, Matrix, Proj, QuantFormat};
use infer_quant::interleave;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn backends() -> Vec<CpuBackend> {
    let mut v = vec![CpuBackend::with_isa(Isa::Generic).unwrap()];
    if Isa::best() != Isa::Generic {
        v.push(CpuBackend::new());
    }
    v
}

/// A Q4_0 `[rows, cols]` matrix quantized from random values, and the same re-laid.
fn matrices(rng: &mut StdRng, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let plain = infer_quant::quantize(QuantFormat::Q4_0, &w, cols, None).unwrap();
    let x = interleave::from_rows(QuantFormat::Q4_0x16, &plain, rows, cols).unwrap();
    (plain, x)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn linear_equals_plain_q4_0_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(18);
    for (rows, cols) in [
        (16, 32),
        (48, 576),
        (35, 96),
        (7, 64),
        (130, 1536),
        (64, 4096),
    ] {
        let (plain, x16) = matrices(&mut rng, rows, cols);
        for m in [1usize, 2, 3, 4, 5, 17, 40] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            for be in backends() {
                let mut want = vec![f32::NAN; m * rows];
                let mut got = vec![f32::NAN; m * rows];
                be.linear(
                    &Matrix::blocks(QuantFormat::Q4_0, &plain, rows, cols),
                    &x,
                    m,
                    &mut want,
                )
                .unwrap();
                be.linear(
                    &Matrix::blocks(QuantFormat::Q4_0x16, &x16, rows, cols),
                    &x,
                    m,
                    &mut got,
                )
                .unwrap();
                assert!(want.iter().all(|v| v.is_finite()));
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{rows}x{cols} m={m} {:?}",
                    be.isa()
                );
            }
        }
    }
}

#[test]
fn linear_many_equals_plain_q4_0_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(19);
    let cols = 576;
    let (pa, xa) = matrices(&mut rng, 1536, cols);
    let (pb, xb) = matrices(&mut rng, 40, cols);
    for m in [1usize, 6] {
        let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        for be in backends() {
            let run = |f: QuantFormat, a: &[u8], b: &[u8]| {
                let (mut ya, mut yb) = (vec![f32::NAN; m * 1536], vec![f32::NAN; m * 40]);
                let mut projs = [
                    Proj {
                        w: Matrix::blocks(f, a, 1536, cols),
                        y: &mut ya,
                    },
                    Proj {
                        w: Matrix::blocks(f, b, 40, cols),
                        y: &mut yb,
                    },
                ];
                be.linear_many(&x, m, &mut projs).unwrap();
                (bits(&ya), bits(&yb))
            };
            assert_eq!(
                run(QuantFormat::Q4_0x16, &xa, &xb),
                run(QuantFormat::Q4_0, &pa, &pb),
                "m={m} {:?}",
                be.isa()
            );
        }
    }
}

#[test]
fn mis_sized_interleaved_matrix_is_an_error() {
    let mut rng = StdRng::seed_from_u64(20);
    let (_, x16) = matrices(&mut rng, 32, 64);
    let x = vec![0.5f32; 64];
    let mut y = vec![0f32; 32];
    for be in backends() {
        for len in [x16.len() - 1, x16.len() - 18] {
            let err = be
                .linear(
                    &Matrix::blocks(QuantFormat::Q4_0x16, &x16[..len], 32, 64),
                    &x,
                    1,
                    &mut y,
                )
                .unwrap_err();
            assert!(
                matches!(err, ComputeError::ShapeMismatch { expected: 1152, got, .. } if got == len),
                "{err}"
            );
        }
        // 48 values per row: not whole Q4_0 blocks.
        let err = be
            .linear(
                &Matrix::blocks(QuantFormat::Q4_0x16, &x16[..1080], 30, 48),
                &x[..48],
                1,
                &mut y[..30],
            )
            .unwrap_err();
        assert!(matches!(err, ComputeError::Quant(_)), "{err}");
    }
}
