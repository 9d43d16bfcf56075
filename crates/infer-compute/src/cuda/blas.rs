//! Many-row quantized products through cuBLAS: the weights of a product dequantized to bf16
//! (`dequant.cu`, ggml's `dequantize_row_*` rounded to nearest-even bf16), the activations
//! converted to bf16, then one `cublasGemmEx` per chunk of weight rows with f32 accumulation
//! and f32 output. From [`GEMM_MIN_M`] activation rows this beats the int8 tile kernels
//! (`mmq.cu`): dequantizing costs ~4.6 bytes of device traffic per weight, once per product,
//! while the GEMM runs at bf16 tensor-core rate (measured per shape by `cuda_bench`'s
//! "quantized products, tiles vs dequantize + cuBLAS" table; BENCHMARKS.md).
//!
//! Numerics: every weight and activation is rounded once to bf16 (relative error ≤ 2⁻⁹ each),
//! so `|y − y_exact| ≤ (2⁻⁸ + 2⁻¹⁸)·Σ|wᵢxᵢ|` plus the f32 accumulation error; the int8 path's
//! activation error (≤ max|x|/254 per block) is of the same order. bf16 keeps f32's range: no
//! overflow on large activations, where f16 would.
//!
//! cuBLAS (`libcublas`) is loaded at run time like the driver; without it the products stay
//! on the tile kernels.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr};
use infer_quant::QuantFormat;

use super::device::{dev_err, Device};
use crate::ComputeError;

/// Activation rows from which a quantized product of the forward pass runs as dequantize +
/// cuBLAS GEMM instead of the tile kernels (see the module docs).
pub(super) const GEMM_MIN_M: usize = 128;
/// Below [`GEMM_MIN_M`], from this many rows, matrices of [`MID_GEMM_VALUES`] values run as
/// GEMMs too: beyond the 32-token tile their 64-token tiles are too few to fill the device
/// even split along K (H100, 8 B q/o/k/v at m = 64: 1.2–1.8× faster as GEMMs), while the
/// 16- and 32-token tiles beat the GEMM (m = 8–32: the GEMM 1.1–1.6× slower; `cuda_bench`),
/// and taller matrices (8 B gate/up/down) and small ones (SmolLM2, Gemma-3 270M) stay on
/// the tiles.
pub(super) const MID_GEMM_MIN_M: usize = 33;
/// Weight values (rows × cols) of the matrices that run as GEMMs from [`MID_GEMM_MIN_M`] rows.
const MID_GEMM_VALUES: std::ops::RangeInclusive<usize> = (1 << 22)..=(1 << 24);

/// Most weight values dequantized at once (bf16, 128 MiB): taller matrices (a vocabulary's
/// lm_head) run as several GEMMs over chunks of rows.
pub(super) const DEQUANT_MAX_VALUES: usize = 64 << 20;

/// The cuBLAS workspace (bytes), set explicitly so that GEMMs captured into a CUDA graph
/// allocate nothing.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to the backend's stream, with its workspace.
#[derive(Debug)]
pub(super) struct Blas {
    handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

/// One GEMM of the products: `y[m × ldy]`'s first `rows` columns (row-major, f32) =
/// `x[m × cols] · w[rows × cols]ᵀ`, `x` and `w` row-major bf16; all pointers on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Gemm {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub rows: i32,
    pub m: i32,
    pub cols: i32,
    pub ldy: i32,
}

/// One batched f32 GEMM in cuBLAS's column-major terms (the long prompt chunks' attention):
/// for each of `batch` problems `i`, `C_i (m × n, ld ldc) = alpha · op(A_i) · op(B_i)` with
/// `op` the transpose when `trans_*`; `a`, `b`, `c` are device arrays of `batch` pointers.
/// f32 in, out and accumulation (no TF32: the results are those of an f32 product up to the
/// order of the sums).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BatchedGemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: u64,
    pub lda: i32,
    pub b: u64,
    pub ldb: i32,
    pub c: u64,
    pub ldc: i32,
    pub batch: i32,
    /// `alpha` as f32 bits.
    pub alpha: u32,
}

impl Blas {
    /// cuBLAS on `stream`, or `None` when `libcublas` is not on the loader path. Errors: the
    /// library loads but a handle or the workspace cannot be made.
    pub(super) fn open(stream: &Arc<CudaStream>) -> Result<Option<Blas>, ComputeError> {
        // SAFETY: only tries to dlopen the library (cudarc panics on first use when missing).
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Ok(None);
        }
        let handle = CudaBlas::new(stream.clone())
            .map_err(|e| dev_err(format!("create a cuBLAS handle: {e}")))?;
        let workspace = stream
            .alloc_zeros::<u8>(WORKSPACE_BYTES)
            .map_err(|e| dev_err(format!("allocate the cuBLAS workspace: {e}")))?;
        let (ptr, _) = workspace.device_ptr(stream);
        // SAFETY: the workspace lives as long as the handle (both in `Blas`).
        let status = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *handle.handle(),
                ptr as *mut c_void,
                WORKSPACE_BYTES,
            )
        };
        status
            .result()
            .map_err(|e| dev_err(format!("set the cuBLAS workspace: {e}")))?;
        Ok(Some(Blas {
            handle,
            _workspace: workspace,
        }))
    }

    /// Enqueue `g` on the handle's stream. Errors: cuBLAS refuses it (named with its shape).
    ///
    /// # Safety
    /// `g.w` holds `rows × cols` and `g.x` `m × cols` bf16 values, `g.y` `m × ldy` f32 values
    /// (`ldy ≥ rows`), all alive until the GEMM has run.
    pub(super) unsafe fn gemm(&self, g: &Gemm) -> Result<(), ComputeError> {
        let (alpha, beta) = (1f32, 0f32);
        // Column-major view: Yᵀ (rows × m, ld ldy) = W (rows × cols, stored as its transpose
        // with ld cols) · Xᵀ (cols × m, ld cols).
        cudarc::cublas::result::gemm_ex(
            *self.handle.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            g.rows,
            g.m,
            g.cols,
            &alpha as *const f32 as *const c_void,
            g.w as *const c_void,
            cudaDataType_t::CUDA_R_16BF,
            g.cols,
            g.x as *const c_void,
            cudaDataType_t::CUDA_R_16BF,
            g.cols,
            &beta as *const f32 as *const c_void,
            g.y as *mut c_void,
            cudaDataType_t::CUDA_R_32F,
            g.ldy,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
        )
        .map_err(|e| {
            dev_err(format!(
                "cuBLAS GEMM of {} × {} weights by {} rows: {e}",
                g.rows, g.cols, g.m
            ))
        })
    }

    /// Enqueue `g` on the handle's stream. Errors: cuBLAS refuses it (named with its shape).
    ///
    /// # Safety
    /// The pointer arrays hold `g.batch` device pointers each, to matrices of the sizes the
    /// shapes and leading dimensions give, all alive until the GEMM has run.
    pub(super) unsafe fn batched(&self, g: &BatchedGemm) -> Result<(), ComputeError> {
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (f32::from_bits(g.alpha), 0f32);
        let f32t = cudaDataType_t::CUDA_R_32F;
        cudarc::cublas::sys::cublasGemmBatchedEx(
            *self.handle.handle(),
            op(g.trans_a),
            op(g.trans_b),
            g.m,
            g.n,
            g.k,
            &alpha as *const f32 as *const c_void,
            g.a as *const *const c_void,
            f32t,
            g.lda,
            g.b as *const *const c_void,
            f32t,
            g.ldb,
            &beta as *const f32 as *const c_void,
            g.c as *const *mut c_void,
            f32t,
            g.ldc,
            g.batch,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
        )
        .result()
        .map_err(|e| {
            dev_err(format!(
                "cuBLAS batched GEMM ({} × {} × {}, {} problems): {e}",
                g.m, g.n, g.k, g.batch
            ))
        })
    }
}

/// The dequantize-to-bf16 kernel of `format`, or `None` when it has none (the product then
/// stays on the tile kernels).
pub(super) fn dequant_kernel(dev: &Device, format: QuantFormat) -> Option<&CudaFunction> {
    let k = &dev.k;
    Some(match format {
        QuantFormat::Q4_0 => &k.dq_q4_0,
        QuantFormat::Q5_0 => &k.dq_q5_0,
        QuantFormat::Q8_0 => &k.dq_q8_0,
        QuantFormat::Q4_K => &k.dq_q4_k,
        QuantFormat::Q6_K => &k.dq_q6_k,
        _ => return None,
    })
}

/// Whether a product of `m` activation rows by `rows × cols` weights of `format` runs as
/// dequantize + GEMM (from [`GEMM_MIN_M`] rows, or [`MID_GEMM_MIN_M`] for mid-sized matrices;
/// the measurements are `cuda_bench`'s table, in BENCHMARKS.md).
pub(super) fn uses_gemm(
    dev: &Device,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    m: usize,
) -> bool {
    gemm_shape(rows, cols, m) && dev.blas.is_some() && dequant_kernel(dev, format).is_some()
}

/// The shape half of [`uses_gemm`].
fn gemm_shape(rows: usize, cols: usize, m: usize) -> bool {
    m >= GEMM_MIN_M || (m >= MID_GEMM_MIN_M && MID_GEMM_VALUES.contains(&(rows * cols)))
}

/// Weight rows per GEMM for a `rows × cols` product: all of them up to
/// [`DEQUANT_MAX_VALUES`] values, else the most that fit (at least one).
pub(super) fn chunk_rows(rows: usize, cols: usize) -> usize {
    (DEQUANT_MAX_VALUES / cols.max(1)).clamp(1, rows.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_from_128_rows_and_from_33_for_mid_sized_matrices() {
        // 8 B q/o (4096 × 4096) and k/v (1024 × 4096): past the 32-token tile; gate/up and
        // down, and SmolLM2's matrices: from 128.
        assert!(gemm_shape(4096, 4096, 33) && gemm_shape(1024, 4096, 64));
        assert!(!gemm_shape(4096, 4096, 32) && !gemm_shape(1024, 4096, 16));
        assert!(!gemm_shape(14336, 4096, 64) && gemm_shape(14336, 4096, 128));
        assert!(!gemm_shape(4096, 14336, 127));
        assert!(!gemm_shape(1536, 576, 64) && gemm_shape(1536, 576, 128));
    }

    #[test]
    fn row_chunks_cover_tall_matrices_within_the_scratch() {
        // 8 B FFN: one chunk; a 128256-row vocabulary: chunks of 16384 rows (the last shorter).
        assert_eq!(chunk_rows(14336, 4096), 14336);
        assert_eq!(chunk_rows(128256, 4096), 16384);
        assert!(chunk_rows(128256, 4096) * 4096 <= DEQUANT_MAX_VALUES);
        assert_eq!(chunk_rows(3, 1 << 30), 1);
    }
}
