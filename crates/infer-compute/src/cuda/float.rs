//! f32 and f16-weight products on the device (`kernels.cu`: `rowdot_*` for few activation rows,
//! one block per weight row; `gemm_*` 64 × 64 shared-memory tiles otherwise). f16 weights are
//! widened exactly to f32 in the kernel; all products and sums are f32.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::cache::as_bytes;
use super::device::{drv, int, GT, ROWDOT_MAX_M};
use super::quant::{download_y, rowdot_grid, upload_x};
use super::State;
use crate::backend::empty_product;
use crate::ComputeError;

/// The weight element type of a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WType {
    F32,
    F16,
}

/// One float product `C[m×n] = A[m×k] · op(B)`: the weight type and whether `B` is `[n, k]`
/// (`trans`, a Linear weight) or `[k, n]` (a feature-major table).
#[derive(Clone, Copy, Debug)]
pub(super) struct FloatOp {
    pub wt: WType,
    pub trans: bool,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl FloatOp {
    pub(super) fn new(wt: WType, trans: bool, m: usize, k: usize, n: usize) -> Self {
        FloatOp { wt, trans, m, k, n }
    }
}

/// `C[m×n] = A[m×k] · op(B)` per `op`; `b` the weight bytes (f32 or f16 per `op.wt`). Shapes
/// were checked by the caller.
pub(super) fn product(
    st: &mut State,
    op: FloatOp,
    a: &[f32],
    b: &[u8],
    c: &mut [f32],
) -> Result<(), ComputeError> {
    let FloatOp { wt, trans, m, k, n } = op;
    if empty_product(m, n, k, c) {
        return Ok(());
    }
    let State { dev, cache, s, .. } = st;
    let w = cache.get(&dev.stream, b)?;
    upload_x(dev, s, a)?;
    s.y.at_least(&dev.stream, m * n)?;
    let (m_i, n_i, k_i) = (int("m", m)?, int("n", n)?, int("k", k)?);
    let (f, cfg) = if trans && m <= ROWDOT_MAX_M {
        let f = match wt {
            WType::F32 => &dev.k.rowdot_f32,
            WType::F16 => &dev.k.rowdot_f16,
        };
        (f, rowdot_grid(n, m))
    } else {
        let f = match (wt, trans) {
            (WType::F32, true) => &dev.k.gemm_nt_f32,
            (WType::F32, false) => &dev.k.gemm_nn_f32,
            (WType::F16, true) => &dev.k.gemm_nt_f16,
            (WType::F16, false) => &dev.k.gemm_nn_f16,
        };
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(GT) as u32, m.div_ceil(GT) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        (f, cfg)
    };
    let mut l = dev.stream.launch_builder(f);
    l.arg(s.x.get())
        .arg(w)
        .arg(s.y.get())
        .arg(&m_i)
        .arg(&n_i)
        .arg(&k_i);
    // SAFETY: argument list (A, B, C, m, n, k) matches `rowdot_*` / `gemm_*`; A holds m·k,
    // B n·k, C m·n values.
    drv("launch f32 product", unsafe { l.launch(cfg) })?;
    download_y(dev, s, c)
}

/// [`product`] on typed weights.
pub(super) fn product_typed<T: Copy>(
    st: &mut State,
    op: FloatOp,
    a: &[f32],
    b: &[T],
    c: &mut [f32],
) -> Result<(), ComputeError> {
    product(st, op, a, as_bytes(b), c)
}
