//! The CUDA context of a [`super::CudaBackend`]: driver and NVRTC loaded at run time, the
//! kernels of `kernels.cu` compiled for the device, and the error mapping to
//! [`ComputeError::Device`].

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, LaunchConfig,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::kernel_cache;
use crate::ComputeError;

/// The kernel source (CUDA C++ for NVRTC, no headers): the products (mat-vecs, then the
/// tensor-core tiles of `mmq.cu`, the dequantizers of `dequant.cu`), the decode kernels and
/// device helpers of `decode.cu`, which use the products' helpers, and the forward pass's
/// tensor operations (`ops.cu`), which use both.
pub(super) const KERNELS_CU: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("mmq.cu"),
    include_str!("dequant.cu"),
    include_str!("decode.cu"),
    include_str!("ops.cu")
);

/// Warps (= weight rows) per block of the mat-vec kernels; `ROWS_PER_BLOCK` in `kernels.cu`.
pub(super) const ROWS_PER_BLOCK: usize = 8;
/// Bytes of a row chunk the mat-vec kernels stage per warp; `STAGE` in `kernels.cu`.
pub(super) const STAGE: usize = 2048;
/// Activation rows per warp of the mat-vec kernels; `MT` in `kernels.cu`.
pub(super) const MT: usize = 4;
/// Weight rows (one mma tile), activation rows of a token group (one mma's columns) and warps
/// (splitting K) of one block of the few-row tensor-core products `mvq_*` (`mvq_*_n16`: two
/// token groups); `MVQ_WARPS` in `mmq.cu`.
pub(super) const MVQ_ROWS: usize = 16;
pub(super) const MVQ_TOKENS: usize = 8;
pub(super) const MVQ_WARPS: usize = 8;
/// Threads per block of the float mat-vecs (one block per weight row); `ROWDOT_THREADS` in
/// `kernels.cu`.
pub(super) const ROWDOT_THREADS: usize = 128;
/// At most this many activation rows take the float mat-vecs (`rowdot_*`); more take the
/// tiled `gemm_*`.
pub(super) const ROWDOT_MAX_M: usize = 8;
/// Weight rows × activation rows of one block of the tensor-core products (the widest token
/// tile; the grouped products' tiles); `MMQ_BM`, `MMQ_BN` in `mmq.cu`.
pub(super) const MMQ_BM: usize = 128;
pub(super) const MMQ_BN: usize = 64;
/// The token tiles of the plain tensor-core products, in the order of their kernels
/// (`mmq_<format>`, `mmq_<format>_n32`, `mmq_<format>_n16` in `mmq.cu`).
pub(super) const MMQ_WIDTHS: [usize; 3] = [MMQ_BN, 32, 16];
/// Dynamic shared memory of `mmq_q4_k` with a token tile of `bn` rows (bytes; `IqSmem` and
/// `IqStage` in `mmq.cu`): the f16 mins operands (24 halves per weight row and per token),
/// (d, dmin) per weight row and d per token; then the stages of raw K steps (6 for 64-token
/// tiles, 4 for 32 and 16), each 80 bytes per weight row and 144 + 4 + 64 per token.
pub(super) const fn mmq_q4k_smem(bn: usize) -> usize {
    let mins = (MMQ_BM + bn) * 24 * 2 + MMQ_BM * 8 + bn * 4;
    let stage = MMQ_BM * 80 + bn * (144 + 4 + 64);
    let stages = if bn == 64 { 6 } else { 4 };
    mins + stages * stage
}
/// Output tile side of the tiled f32 kernels; `GT` in `kernels.cu`.
pub(super) const GT: usize = 64;

/// A [`ComputeError::Device`] from a message.
pub(super) fn dev_err(message: impl Into<String>) -> ComputeError {
    ComputeError::Device {
        backend: "cuda",
        message: message.into(),
    }
}

/// Map a driver error of step `what` to [`ComputeError::Device`].
pub(super) fn drv<T>(
    what: &str,
    r: Result<T, cudarc::driver::DriverError>,
) -> Result<T, ComputeError> {
    r.map_err(|e| dev_err(format!("{what}: {e}")))
}

/// Every kernel of `kernels.cu`, loaded.
#[derive(Debug)]
pub(super) struct Kernels {
    pub quantize_q8_32: CudaFunction,
    pub quantize_q8_k: CudaFunction,
    pub mv_q4_0: CudaFunction,
    pub mv_q5_0: CudaFunction,
    pub mv_q8_0: CudaFunction,
    pub mv_q8s: CudaFunction,
    pub mv_q4_k: CudaFunction,
    pub mv_q6_k: CudaFunction,
    pub mv1_q4_k: CudaFunction,
    pub mv1_q6_k: CudaFunction,
    /// Q4_K × up to 8 and 16 activation rows on the tensor cores from registers.
    pub mvq_q4_k: [CudaFunction; 2],
    /// Q6_K × up to 8 and 16 activation rows, as `mvq_q4_k`.
    pub mvq_q6_k: [CudaFunction; 2],
    /// One kernel per token tile of [`MMQ_WIDTHS`].
    pub mmq_q4_0: [CudaFunction; 3],
    /// One kernel per token tile of [`MMQ_WIDTHS`].
    pub mmq_q5_0: [CudaFunction; 3],
    /// One kernel per token tile of [`MMQ_WIDTHS`].
    pub mmq_q8_0: [CudaFunction; 3],
    /// One kernel per token tile of [`MMQ_WIDTHS`].
    pub mmq_q8s: [CudaFunction; 3],
    /// One kernel per token tile of [`MMQ_WIDTHS`].
    pub mmq_q4_k: [CudaFunction; 3],
    /// One kernel per token tile of [`MMQ_WIDTHS`].
    pub mmq_q6_k: [CudaFunction; 3],
    pub mmq_ids_q4_0: CudaFunction,
    pub mmq_ids_q5_0: CudaFunction,
    pub mmq_ids_q8_0: CudaFunction,
    pub mmq_ids_q4_k: CudaFunction,
    pub mmq_ids_q6_k: CudaFunction,
    pub dq_q4_0: CudaFunction,
    pub dq_q5_0: CudaFunction,
    pub dq_q8_0: CudaFunction,
    pub dq_q4_k: CudaFunction,
    pub dq_q6_k: CudaFunction,
    pub t_embed_q4_0: CudaFunction,
    pub t_embed_q5_0: CudaFunction,
    pub t_embed_q8_0: CudaFunction,
    pub t_embed_q4_k: CudaFunction,
    pub t_embed_q6_k: CudaFunction,
    pub to_bf16: CudaFunction,
    pub rowdot_f32: CudaFunction,
    pub rowdot_f16: CudaFunction,
    pub gemm_nt_f32: CudaFunction,
    pub gemm_nn_f32: CudaFunction,
    pub gemm_nt_f16: CudaFunction,
    pub gemm_nn_f16: CudaFunction,
    pub noop: CudaFunction,
    pub dec_attn_merge: CudaFunction,
    /// `dec_attn_split{64,128,256}` then the same `_g8` (more than 4 query heads per kv head).
    pub dec_attn_split: [CudaFunction; 6],
    pub dec_mv_multi: CudaFunction,
    pub dec_mv_multi_rows: CudaFunction,
    pub t_norm: CudaFunction,
    pub t_rope: CudaFunction,
    pub t_kv_store: CudaFunction,
    pub t_kv_widen: CudaFunction,
    pub t_attention: CudaFunction,
    pub t_attention_tiles: [CudaFunction; 3],
    pub t_attn_softmax: CudaFunction,
    pub t_act: CudaFunction,
    pub t_add_scaled: CudaFunction,
    pub t_add_bias: CudaFunction,
    pub t_scale_softcap: CudaFunction,
    pub t_copy_rows: CudaFunction,
    pub t_add_rows_scaled: CudaFunction,
    pub t_fill: CudaFunction,
    pub t_moe_route: CudaFunction,
    pub t_moe_combine: CudaFunction,
    pub t_moe_combine_rows: CudaFunction,
    pub t_add_gated: CudaFunction,
    pub t_embed: CudaFunction,
    pub t_add_norm: CudaFunction,
    pub t_rope_attend: CudaFunction,
    pub t_act_quant: CudaFunction,
    pub t_argmax_clear: CudaFunction,
    pub t_argmax_rows: CudaFunction,
}

/// One device: its context, the stream every call runs on, and the compiled kernels.
#[derive(Debug)]
pub(super) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub k: Kernels,
    /// The name of every kernel of [`Kernels`] by its `CUfunction` handle (`bench --profile`'s
    /// table: [`super::step::Recorder`] names the launches it times).
    pub names: Arc<HashMap<usize, &'static str>>,
    pub name: String,
    pub cc: (i32, i32),
    /// Streaming multiprocessors.
    pub sms: usize,
    pub split: SplitK,
    /// cuBLAS on the backend's stream, for the many-row products ([`super::blas`]); `None`
    /// when `libcublas` cannot be loaded or the device is older than compute capability 8.0
    /// (the products then stay on the tile kernels).
    pub blas: Option<Arc<super::blas::Blas>>,
}

/// The buffers of the tensor-core products' split-K (`mmq_finish` in `mmq.cu`), allocated
/// once per device so that recorded launches keep their pointers: `slots` partial tiles of
/// [`MMQ_SLOT`] f32 values, and one arrival counter per tile, zero between launches (the last
/// share of a tile resets it).
#[derive(Debug)]
pub(super) struct SplitK {
    pub part: CudaSlice<f32>,
    pub counters: CudaSlice<i32>,
    pub slots: usize,
}

/// f32 values of one share's partial tile: 32 accumulators × 256 threads.
pub(super) const MMQ_SLOT: usize = MMQ_BM * MMQ_BN;

/// Partial tiles per streaming multiprocessor in [`SplitK`]: every tile kernel fits at most
/// this many blocks on one multiprocessor (the shares of a launch never exceed the blocks the
/// device runs at once).
const SPLIT_SLOTS_PER_SM: usize = 4;

/// NVRTC's virtual architecture for compute capability `cc` (PTX, compiled by the driver at
/// load time): the highest one listed here not above `cc`, so that a device newer than the list
/// still gets the sm_80+ code (`mma`, `ldmatrix`) the tile products are chosen for
/// (`quant::product_kernel`: compute capability 8.0 or later). `None` below 8.0: NVRTC's
/// default.
fn arch_for(cc: (i32, i32)) -> Option<&'static str> {
    Some(match cc {
        (major, _) if major >= 12 => "compute_120",
        (major, _) if major >= 10 => "compute_100",
        (9, _) => "compute_90",
        (8, minor) if minor >= 9 => "compute_89",
        (8, minor) if minor >= 6 => "compute_86",
        (8, _) => "compute_80",
        _ => return None,
    })
}

impl Device {
    /// Open GPU `ordinal`, compile and load the kernels.
    ///
    /// Errors ([`ComputeError::Device`]): the CUDA driver library (`libcuda.so`) or NVRTC
    /// (`libnvrtc.so`) cannot be loaded, no device `ordinal`, a compile error (with NVRTC's
    /// log), a module that does not load.
    pub fn open(ordinal: usize) -> Result<Self, ComputeError> {
        // SAFETY: only tries to dlopen the libraries; cudarc panics on first use when they are
        // missing, so check first.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(dev_err(
                "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver on this \
                 machine, or it is not on the loader path (LD_LIBRARY_PATH)",
            ));
        }
        let count = CudaContext::device_count().map_err(|e| {
            dev_err(format!(
                "no usable CUDA device (cuInit/cuDeviceGetCount: {e})"
            ))
        })?;
        if ordinal as i64 >= count as i64 {
            return Err(dev_err(format!(
                "no CUDA device {ordinal}: this machine has {count}"
            )));
        }
        // SAFETY: only probes whether the NVRTC library can be loaded (no arguments, no state).
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(dev_err(
                "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit's NVRTC and put \
                 its folder on LD_LIBRARY_PATH",
            ));
        }
        let ctx = drv("create context", CudaContext::new(ordinal))?;
        // Every stream is synchronised explicitly (each product waits for its result), and
        // cudarc's per-buffer events would be recorded inside CUDA graph captures, where
        // waiting on them is not allowed.
        // SAFETY: called before any buffer or stream of this context exists.
        unsafe { ctx.disable_event_tracking() };
        let name = drv("device name", ctx.name())?;
        let cc = drv("compute capability", ctx.compute_capability())?;
        let load = |ptx| drv("load the kernel module", ctx.load_module(ptx));
        let module = match kernel_cache::real_arch(cc) {
            Some(arch) => kernel_cache::load_cubin(&arch, |cubin| {
                load(cudarc::nvrtc::Ptx::from_binary(cubin))
            })?,
            None => load(compile(arch_for(cc))?)?,
        };
        let mut names = HashMap::new();
        let mut f = |n: &'static str| {
            let func = drv(&format!("kernel {n}"), module.load_function(n))?;
            names.insert(func.cu_function() as usize, n);
            Ok::<_, ComputeError>(func)
        };
        let k = Kernels {
            quantize_q8_32: f("quantize_q8_32")?,
            quantize_q8_k: f("quantize_q8_k")?,
            mv_q4_0: f("mv_q4_0")?,
            mv_q5_0: f("mv_q5_0")?,
            mv_q8_0: f("mv_q8_0")?,
            mv_q8s: f("mv_q8s")?,
            mv_q4_k: f("mv_q4_k")?,
            mv_q6_k: f("mv_q6_k")?,
            mv1_q4_k: f("mv1_q4_k")?,
            mv1_q6_k: f("mv1_q6_k")?,
            mvq_q4_k: [f("mvq_q4_k")?, f("mvq_q4_k_n16")?],
            mvq_q6_k: [f("mvq_q6_k")?, f("mvq_q6_k_n16")?],
            mmq_q4_0: [f("mmq_q4_0")?, f("mmq_q4_0_n32")?, f("mmq_q4_0_n16")?],
            mmq_q5_0: [f("mmq_q5_0")?, f("mmq_q5_0_n32")?, f("mmq_q5_0_n16")?],
            mmq_q8_0: [f("mmq_q8_0")?, f("mmq_q8_0_n32")?, f("mmq_q8_0_n16")?],
            mmq_q8s: [f("mmq_q8s")?, f("mmq_q8s_n32")?, f("mmq_q8s_n16")?],
            mmq_q4_k: [f("mmq_q4_k")?, f("mmq_q4_k_n32")?, f("mmq_q4_k_n16")?],
            mmq_q6_k: [f("mmq_q6_k")?, f("mmq_q6_k_n32")?, f("mmq_q6_k_n16")?],
            mmq_ids_q4_0: f("mmq_ids_q4_0")?,
            mmq_ids_q5_0: f("mmq_ids_q5_0")?,
            mmq_ids_q8_0: f("mmq_ids_q8_0")?,
            mmq_ids_q4_k: f("mmq_ids_q4_k")?,
            mmq_ids_q6_k: f("mmq_ids_q6_k")?,
            dq_q4_0: f("dq_q4_0")?,
            dq_q5_0: f("dq_q5_0")?,
            dq_q8_0: f("dq_q8_0")?,
            dq_q4_k: f("dq_q4_k")?,
            dq_q6_k: f("dq_q6_k")?,
            t_embed_q4_0: f("t_embed_q4_0")?,
            t_embed_q5_0: f("t_embed_q5_0")?,
            t_embed_q8_0: f("t_embed_q8_0")?,
            t_embed_q4_k: f("t_embed_q4_k")?,
            t_embed_q6_k: f("t_embed_q6_k")?,
            to_bf16: f("to_bf16")?,
            rowdot_f32: f("rowdot_f32")?,
            rowdot_f16: f("rowdot_f16")?,
            gemm_nt_f32: f("gemm_nt_f32")?,
            gemm_nn_f32: f("gemm_nn_f32")?,
            gemm_nt_f16: f("gemm_nt_f16")?,
            gemm_nn_f16: f("gemm_nn_f16")?,
            noop: f("noop")?,
            dec_attn_merge: f("dec_attn_merge")?,
            dec_attn_split: [
                f("dec_attn_split64")?,
                f("dec_attn_split128")?,
                f("dec_attn_split256")?,
                f("dec_attn_split64_g8")?,
                f("dec_attn_split128_g8")?,
                f("dec_attn_split256_g8")?,
            ],
            dec_mv_multi: f("dec_mv_multi")?,
            dec_mv_multi_rows: f("dec_mv_multi_rows")?,
            t_norm: f("t_norm")?,
            t_rope: f("t_rope")?,
            t_kv_store: f("t_kv_store")?,
            t_kv_widen: f("t_kv_widen")?,
            t_attention: f("t_attention")?,
            t_attention_tiles: [
                f("t_attention_tiles64")?,
                f("t_attention_tiles128")?,
                f("t_attention_tiles256")?,
            ],
            t_attn_softmax: f("t_attn_softmax")?,
            t_act: f("t_act")?,
            t_add_scaled: f("t_add_scaled")?,
            t_add_bias: f("t_add_bias")?,
            t_scale_softcap: f("t_scale_softcap")?,
            t_copy_rows: f("t_copy_rows")?,
            t_add_rows_scaled: f("t_add_rows_scaled")?,
            t_fill: f("t_fill")?,
            t_moe_route: f("t_moe_route")?,
            t_moe_combine: f("t_moe_combine")?,
            t_moe_combine_rows: f("t_moe_combine_rows")?,
            t_add_gated: f("t_add_gated")?,
            t_embed: f("t_embed")?,
            t_add_norm: f("t_add_norm")?,
            t_rope_attend: f("t_rope_attend")?,
            t_act_quant: f("t_act_quant")?,
            t_argmax_clear: f("t_argmax_clear")?,
            t_argmax_rows: f("t_argmax_rows")?,
        };
        // The tiled attention's shared memory exceeds the default 48 KiB from head_dim 128.
        for (f, hd) in k.t_attention_tiles.iter().zip([64, 128, 256]) {
            drv(
                "allow the tiled attention's shared memory",
                f.set_attribute(
                    sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    super::tensor_ops::att_tile_smem(hd) as i32,
                ),
            )?;
        }
        let q4k_tiles = k.mmq_q4_k.iter().zip(MMQ_WIDTHS);
        for (f, bn) in q4k_tiles.chain([(&k.mmq_ids_q4_k, MMQ_BN)]) {
            drv(
                "allow mmq_q4_k's shared memory",
                f.set_attribute(
                    sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    mmq_q4k_smem(bn) as i32,
                ),
            )?;
        }
        // A stream of its own (not the legacy default stream, which cannot be captured into
        // a CUDA graph: the forward pass's steps are, see `step.rs`).
        let stream = drv("create the backend's stream", ctx.new_stream())?;
        let sms = drv(
            "multiprocessor count",
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        )?
        .max(1) as usize;
        let slots = sms * SPLIT_SLOTS_PER_SM;
        let split = SplitK {
            part: drv(
                "allocate split-K partials",
                stream.alloc_zeros(slots * MMQ_SLOT),
            )?,
            counters: drv("allocate split-K counters", stream.alloc_zeros(slots))?,
            slots,
        };
        let blas = if cc.0 >= 8 {
            super::blas::Blas::open(&stream)?.map(Arc::new)
        } else {
            None
        };
        Ok(Device {
            ctx,
            stream,
            k,
            names: Arc::new(names),
            name,
            cc,
            sms,
            split,
            blas,
        })
    }
}

/// Compile the kernels with NVRTC for virtual architecture `arch` (e.g. `compute_90`; `None`:
/// NVRTC's default). Errors: NVRTC's log on a compile error.
pub(super) fn compile(arch: Option<&'static str>) -> Result<cudarc::nvrtc::Ptx, ComputeError> {
    let opts = CompileOptions {
        arch,
        name: Some("infer_kernels.cu".into()),
        ..Default::default()
    };
    compile_ptx_with_opts(KERNELS_CU, opts)
        .map_err(|e| dev_err(format!("NVRTC failed to compile kernels.cu: {e}")))
}

/// Compile every kernel with NVRTC for the H100/H200 (`sm_90`, through ptxas, so register
/// limits are checked too) without touching a GPU, and store the CUBIN in the kernel cache
/// (`kernel_cache`), where a later start on such a device finds it. Needs only `libnvrtc.so`
/// (e.g. from the `nvidia-cuda-nvrtc` wheel). Returns the cache file (`None`: no cache folder)
/// and the CUBIN's size in bytes. Errors: NVRTC missing, or its compile log.
pub fn check_kernels_compile() -> Result<(Option<std::path::PathBuf>, usize), ComputeError> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(dev_err(
            "NVRTC (libnvrtc.so) was not found: put its folder on LD_LIBRARY_PATH",
        ));
    }
    kernel_cache::prepare((9, 0))
}

/// A dimension as the kernels' `int`. Errors when it does not fit (> 2³¹ − 1).
pub(super) fn int(what: &str, v: usize) -> Result<i32, ComputeError> {
    i32::try_from(v).map_err(|_| dev_err(format!("{what} = {v} exceeds the kernels' int range")))
}

/// Launch `f` on `stream` with programmatic dependent launch allowed (Hopper PDL, the
/// `PROGRAMMATIC_STREAM_SERIALIZATION` attribute; kept in a captured graph): the kernel may
/// start while the one before it on the stream finishes, so it must `pdl_wait` (kernels.cu)
/// before reading anything an earlier kernel writes. `args`: one 8-byte slot per kernel
/// parameter (4-byte ints and floats in the low bytes).
///
/// # Safety
/// `args` must match `f`'s parameter list, with device pointers valid for what it accesses.
pub(super) unsafe fn launch_pdl(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut [u64],
) -> Result<(), ComputeError> {
    // SAFETY: the caller's contract.
    unsafe { launch_raw(stream, f.cu_function(), cfg, args, true) }
}

/// Launch kernel `f` (a loaded kernel's raw handle) on `stream`, with programmatic dependent
/// launch when `pdl` (see [`launch_pdl`]).
///
/// # Safety
/// As [`launch_pdl`]; `f` must be a kernel of a module that is still loaded.
pub(super) unsafe fn launch_raw(
    stream: &CudaStream,
    f: sys::CUfunction,
    cfg: LaunchConfig,
    args: &mut [u64],
    pdl: bool,
) -> Result<(), ComputeError> {
    let mut params: Vec<*mut c_void> = args
        .iter_mut()
        .map(|v| v as *mut u64 as *mut c_void)
        .collect();
    // SAFETY: CUlaunchAttribute is a plain C struct (an id and a union of plain values);
    // all-zero bytes are a valid value.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: pdl as u32,
    };
    drv("bind the CUDA context", stream.context().bind_to_thread())?;
    // SAFETY: the caller's contract for `args`; `params` points into `args` and `attr` lives
    // until the call returns (the driver copies the values at launch).
    let launched =
        unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) };
    drv("launch a kernel", launched.result())
}

/// Record what `record` enqueues on `stream` into a CUDA graph (relaxed capture mode). Errors:
/// `record`'s error (capture is ended first), a capture failure, or an empty capture.
pub(super) fn capture_graph(
    stream: &Arc<CudaStream>,
    record: impl FnOnce() -> Result<(), ComputeError>,
) -> Result<CudaGraph, ComputeError> {
    drv(
        "begin graph capture",
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED),
    )?;
    let recorded = record();
    let graph = drv(
        "end graph capture",
        stream.end_capture(CUgraphInstantiate_flags(0)),
    );
    recorded?;
    graph?.ok_or_else(|| dev_err("graph capture recorded nothing"))
}

#[cfg(test)]
mod tests {
    use super::arch_for;

    #[test]
    fn every_sm80_plus_device_gets_an_sm80_plus_architecture() {
        assert_eq!(arch_for((9, 0)), Some("compute_90"));
        assert_eq!(arch_for((8, 7)), Some("compute_86"));
        assert_eq!(arch_for((8, 9)), Some("compute_89"));
        assert_eq!(arch_for((10, 3)), Some("compute_100"));
        assert_eq!(arch_for((11, 0)), Some("compute_100"));
        assert_eq!(arch_for((12, 1)), Some("compute_120"));
        assert_eq!(arch_for((7, 5)), None);
    }
}
