//! Device-side timings for benchmarks (CUDA events around many launches, median of several
//! repetitions): quantized mat-vec bandwidth, device copy bandwidth (the memory floor) and the
//! empty-launch time (the launch-overhead floor).

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use super::device::{capture_graph, dev_err, drv, int, launch_pdl, Device};
use super::{blas, quant, CudaBackend};
use crate::{ComputeError, MatData, Matrix};

/// Median time of one repetition of a timed operation and the device bytes it moves.
#[derive(Clone, Copy, Debug)]
pub struct KernelTime {
    /// Seconds per operation (median over repetitions of the mean over `iters` launches).
    pub seconds: f64,
    /// Device-memory bytes the operation must move (what a bandwidth is computed from).
    pub bytes: usize,
}

impl KernelTime {
    /// `bytes / seconds` in GB/s (10⁹ bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
}

const REPS: usize = 7;

/// Median over [`REPS`] repetitions of `iters` calls of `f(i)` on `stream`, timed with CUDA
/// events (after up to 16 untimed warm-up calls).
fn time_events(
    dev: &Device,
    stream: &CudaStream,
    iters: usize,
    mut f: impl FnMut(usize) -> Result<(), ComputeError>,
) -> Result<f64, ComputeError> {
    let iters = iters.max(1);
    for i in 0..iters.min(16) {
        f(i)?;
    }
    let mut times = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = drv("create event", dev.ctx.new_event(flags))?;
        let end = drv("create event", dev.ctx.new_event(flags))?;
        drv("record event", start.record(stream))?;
        for i in 0..iters {
            f(i)?;
        }
        drv("record event", end.record(stream))?;
        drv("synchronize", end.synchronize())?;
        let ms = drv("elapsed time", start.elapsed_ms(&end))?;
        times.push(ms as f64 * 1e-3 / iters as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[REPS / 2])
}

/// Device copies of weights `bytes`, enough to exceed the L2 cache (512 MiB in all, 1 to 64),
/// for timed launches that rotate among them and so read device memory.
fn weight_copies(dev: &Device, bytes: &[u8]) -> Result<Vec<CudaSlice<u8>>, ComputeError> {
    let copies = (512usize << 20).div_ceil(bytes.len().max(1)).clamp(1, 64);
    (0..copies)
        .map(|_| super::cache::upload_padded(&dev.stream, bytes))
        .collect()
}

/// Launch a `dequant.cu` kernel (`(src, bf16 out, groups of 8 values)`) over `groups` groups.
fn launch_flat(
    dev: &Device,
    func: &CudaFunction,
    src: u64,
    out: u64,
    groups: usize,
) -> Result<(), ComputeError> {
    let cfg = LaunchConfig {
        grid_dim: (groups.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let g = groups as i64;
    let mut b = dev.stream.launch_builder(func);
    b.arg(&src).arg(&out).arg(&g);
    // SAFETY: the dequant.cu kernels take (const void*, u16*, long long); callers size the
    // buffers for `groups` × 8 values.
    drv("launch a bf16 conversion", unsafe { b.launch(cfg) }).map(|_| ())
}

/// One block of 32 threads: the empty kernels' launch shape.
const ONE_WARP: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (32, 1, 1),
    shared_mem_bytes: 0,
};

impl CudaBackend {
    /// Device time of one one-row mat-vec kernel on weights `bytes` (`rows × cols` of
    /// `format`) and activations `x` (`cols`, quantized once before the timing: in a decode
    /// step the norm or activation kernel before the product quantizes them): the single
    /// product's kernel ([`quant_matvec`](crate::ComputeBackend::quant_matvec) for one row,
    /// `fused == false`) or the decode step's `dec_mv_multi` with this one matrix as its job
    /// (`fused == true`, rows per warp as `mv_job` picks them). The weights are copied on
    /// the device (enough copies to exceed the L2 cache: 512 MiB in all, at most 64) and the
    /// launches rotate among them, so the time is that of reads from device memory. `bytes`
    /// of the result: one weight matrix.
    ///
    /// Errors as `quant_matvec`, and [`ComputeError::Device`] for allocation or launch
    /// failures. Panics if `x.len() != cols`.
    pub fn time_quant_matvec(
        &self,
        w: &Matrix<'_>,
        x: &[f32],
        fused: bool,
        iters: usize,
    ) -> Result<KernelTime, ComputeError> {
        let (rows, cols) = (w.rows, w.cols);
        let MatData::Blocks { format, bytes } = w.data else {
            return Err(dev_err(
                "time_quant_matvec: the weights are not quantized blocks",
            ));
        };
        assert_eq!(x.len(), cols, "time_quant_matvec: x is not cols long");
        let mut st = self.lock();
        quant::check(&st.dev, format, bytes, rows, cols)?;
        let super::State { dev, s, .. } = &mut *st;
        let ws = weight_copies(dev, bytes)?;
        let copies = ws.len();
        quant::upload_x(dev, s, x)?;
        s.y.at_least(&dev.stream, rows)?;
        quant::quantize_acts(dev, s, Some(format), 1, cols)?;
        let shape = quant::MvShape {
            m: 1,
            rows,
            cols,
            y_off: 0,
        };
        let secs = if fused {
            let st_ = &dev.stream;
            let yp = s.y.get().device_ptr(st_).0;
            let tables = ws
                .iter()
                .map(|w| {
                    let wp = w.device_ptr(st_).0;
                    let (job, n) = quant::mv_job(format, wp, yp, 0, rows, cols, 0)?;
                    let t = drv("upload a mat-vec job", st_.clone_htod(&job))?;
                    Ok((t, n))
                })
                .collect::<Result<Vec<_>, ComputeError>>()?;
            let (kq, b32) = (&s.kq, &s.b32);
            let a = [
                b32.aq.get().device_ptr(st_).0,
                b32.ad.get().device_ptr(st_).0,
                kq.aq.get().device_ptr(st_).0,
                kq.ad.get().device_ptr(st_).0,
                kq.bsums.get().device_ptr(st_).0,
            ];
            let cols_i = int("cols", cols)?;
            time_events(dev, st_, iters, |i| {
                let (table, blocks) = &tables[i % copies];
                let mut args = vec![table.device_ptr(st_).0, 1];
                args.extend(a);
                args.push(cols_i as u32 as u64);
                let cfg = LaunchConfig {
                    grid_dim: (int("mat-vec blocks", *blocks)? as u32, 1, 1),
                    block_dim: (32 * super::device::ROWS_PER_BLOCK as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: `dec_mv_multi(jobs, njobs, aq32, ad32, aqk, adk, bsk, cols)`; the job
                // table addresses a weight copy of rows × cols and `s.y` of rows values, the
                // activation buffers hold the quantized `x`.
                unsafe { launch_pdl(st_, &dev.k.dec_mv_multi, cfg, &mut args) }
            })?
        } else {
            time_events(dev, &dev.stream, iters, |i| {
                quant::launch_mv(dev, s, format, &ws[i % copies], shape)
            })?
        };
        Ok(KernelTime {
            seconds: secs,
            bytes: bytes.len(),
        })
    }

    /// Device time of one many-row quantized product `y[m × rows] = x[m × cols] · Wᵀ` on
    /// weights `w` (quantized blocks, rotated among copies as in
    /// [`CudaBackend::time_quant_matvec`]) by `m` rows of activations `x`, either on the
    /// tensor-core tile kernels (activation quantization + `mmq_*`, `gemm == false`) or as the
    /// forward pass's dequantize + cuBLAS path (bf16 activations, weights dequantized per chunk
    /// of rows, `cublasGemmEx`; `gemm == true`), whatever the forward pass would choose for
    /// `m`. `bytes` of the result: one weight matrix.
    ///
    /// Errors as `quant_matvec`, and [`ComputeError::Device`] when `w` is
    /// not quantized blocks, or when `gemm` is asked for without cuBLAS or a dequantization
    /// kernel for the format. Panics if `x.len() != m · cols`.
    pub fn time_quant_product(
        &self,
        w: &Matrix<'_>,
        x: &[f32],
        m: usize,
        gemm: bool,
        iters: usize,
    ) -> Result<KernelTime, ComputeError> {
        let (rows, cols) = (w.rows, w.cols);
        let MatData::Blocks { format, bytes } = w.data else {
            return Err(dev_err(
                "time_quant_product: the weights are not quantized blocks",
            ));
        };
        if rows == 0 || cols == 0 || m == 0 {
            return Err(dev_err(format!(
                "time_quant_product: an empty product ({m} × {cols} by {rows} × {cols})"
            )));
        }
        assert_eq!(x.len(), m * cols, "time_quant_product: x is not m × cols");
        let mut st = self.lock();
        quant::check(&st.dev, format, bytes, rows, cols)?;
        let super::State { dev, s, .. } = &mut *st;
        let ws = weight_copies(dev, bytes)?;
        let copies = ws.len();
        quant::upload_x(dev, s, x)?;
        s.y.at_least(&dev.stream, m * rows)?;
        let secs = if gemm {
            let blas = dev
                .blas
                .as_deref()
                .ok_or_else(|| dev_err("no cuBLAS on this machine"))?;
            let dq = blas::dequant_kernel(dev, format)
                .ok_or_else(|| dev_err(format!("no bf16 dequantization for {format:?}")))?;
            let chunk = blas::chunk_rows(rows, cols);
            s.xb.at_least(&dev.stream, m * cols)?;
            s.wb.at_least(&dev.stream, chunk * cols)?;
            let row_bytes = bytes.len() / rows;
            let st = &dev.stream;
            let (xp, xb, wb, yp) = (
                s.x.get().device_ptr(st).0,
                s.xb.get().device_ptr(st).0,
                s.wb.get().device_ptr(st).0,
                s.y.get().device_ptr(st).0,
            );
            let (mi, ci, ri) = (int("m", m)?, int("cols", cols)?, int("rows", rows)?);
            time_events(dev, st, iters, |i| {
                let wp = ws[i % copies].device_ptr(st).0;
                launch_flat(dev, &dev.k.to_bf16, xp, xb, m * cols / 8)?;
                for r0 in (0..rows).step_by(chunk) {
                    let n = chunk.min(rows - r0);
                    launch_flat(dev, dq, wp + (r0 * row_bytes) as u64, wb, n * cols / 8)?;
                    let g = blas::Gemm {
                        w: wb,
                        x: xb,
                        y: yp + (r0 * 4) as u64,
                        rows: n as i32,
                        m: mi,
                        cols: ci,
                        ldy: ri,
                    };
                    // SAFETY: wb holds chunk × cols, xb m × cols bf16 values, y m × rows f32.
                    unsafe { blas.gemm(&g)? };
                }
                Ok(())
            })?
        } else {
            time_events(dev, &dev.stream, iters, |i| {
                quant::quantize_acts(dev, s, Some(format), m, cols)?;
                let shape = quant::MvShape {
                    m,
                    rows,
                    cols,
                    y_off: 0,
                };
                quant::launch_mv(dev, s, format, &ws[i % copies], shape)
            })?
        };
        Ok(KernelTime {
            seconds: secs,
            bytes: bytes.len(),
        })
    }

    /// Device-to-device copy of `n` bytes, `bytes` of the result = `2n` (read + written):
    /// the device memory bandwidth floor.
    pub fn time_copy(&self, n: usize, iters: usize) -> Result<KernelTime, ComputeError> {
        let st = self.lock();
        let dev = &st.dev;
        let src = drv("allocate", dev.stream.alloc_zeros::<u8>(n.max(1)))?;
        let mut dst = drv("allocate", dev.stream.alloc_zeros::<u8>(n.max(1)))?;
        let secs = time_events(dev, &dev.stream, iters, |_| {
            drv("copy", dev.stream.memcpy_dtod(&src, &mut dst))
        })?;
        Ok(KernelTime {
            seconds: secs,
            bytes: 2 * n,
        })
    }

    /// Seconds per kernel of a CUDA graph of `n` empty kernels (one block of 32 threads each)
    /// launched with programmatic dependent launch, as the decode step's graph is (median of
    /// repetitions of 10 replays): the per-kernel launch floor of a device decode step.
    pub fn time_graph_launch(&self, n: usize) -> Result<f64, ComputeError> {
        let st = self.lock();
        let dev = &st.dev;
        let n = n.max(1);
        let stream = drv("create a stream", dev.ctx.new_stream())?;
        let graph = capture_graph(&stream, || {
            // SAFETY: `noop` takes no arguments.
            (0..n).try_for_each(|_| unsafe { launch_pdl(&stream, &dev.k.noop, ONE_WARP, &mut []) })
        })?;
        let replays = 10;
        let per_replay = time_events(dev, &stream, replays, |_| drv("replay", graph.launch()))?;
        Ok(per_replay / n as f64)
    }

    /// Seconds per launch of an empty kernel (one block of 32 threads): the launch-overhead
    /// floor of a kernel sequence launched one by one (no graph).
    pub fn time_empty_launch(&self, iters: usize) -> Result<f64, ComputeError> {
        let st = self.lock();
        let dev = &st.dev;
        time_events(dev, &dev.stream, iters, |_| {
            let mut b = dev.stream.launch_builder(&dev.k.noop);
            // SAFETY: `noop` takes no arguments.
            drv("launch noop", unsafe { b.launch(ONE_WARP) }).map(|_| ())
        })
    }
}
