//! The step recorder: the forward pass's tensor operations are not launched one by one but
//! recorded as a list of kernel launches, and launched together when the host next needs a
//! result (a download, a host-slice product, an upload into a tensor). A list equal to the
//! one launched before — a decode step of the same batch shape: the same kernels, grids and
//! pointers — is captured into a CUDA graph, and from then on that list is one graph launch.
//!
//! A step that downloads midway (the walk FFN and MoE run on the host) is several lists, each
//! captured on its own once seen twice.
//!
//! What changes from step to step (token ids, positions, the attention rows' cache pointers)
//! is not in the kernels' arguments: every such array is staged in the step's *arena*, a host
//! buffer copied to a fixed device buffer in one copy right before the launch, and the kernels
//! get pointers into that device buffer. So the recorded list of a decode step is the same at
//! every position, and the graph replayed for it reads that step's values. This is what lets
//! the one forward pass (`infer-inference`'s `forward_batch`) run a decode step as one graph.
//!
//! While profiling ([`Recorder::start_profile`], `infer bench --profile`) every list is
//! launched kernel by kernel instead, with a CUDA event recorded after each command, and
//! [`Recorder::take_profile`] adds up the device time between consecutive events per kernel
//! name.
//!
//! Buffers a recorded launch uses stay alive until it was launched: tensors are reference
//! counted and every pointer taken for a launch keeps a reference ([`Recorder::keep`]), and a
//! scratch buffer replaced while launches are pending is kept the same way (device memory is
//! freed in stream order, so once the launches are enqueued dropping is safe).

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{sys, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, LaunchConfig};

use super::blas::{BatchedGemm, Blas, Gemm};
use super::device::{capture_graph, dev_err, drv, launch_raw};
use crate::ComputeError;

/// Captured graphs kept (one per list seen twice: a batch shape, or one segment of a step that
/// downloads midway; least recently used out). An MoE decode step is two segments per layer
/// (before and after the router logits' download): 97 for Qwen3-30B-A3B's 48 layers.
const MAX_GRAPHS: usize = 160;
/// Lists launched kernel by kernel remembered as candidates for capture.
const MAX_CANDIDATES: usize = 160;
/// Alignment of each array staged in the arena (bytes).
const ARENA_ALIGN: usize = 16;
/// The arena's first device capacity (bytes); it doubles when a step needs more.
const ARENA_START: usize = 64 << 10;
/// One recorded operation: a kernel launch or a cuBLAS GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmd {
    Kernel(Launch),
    Gemm(Gemm),
    Batched(BatchedGemm),
}

/// One recorded kernel launch; its arguments are `args[arg0..arg0 + nargs]` of the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Launch {
    /// The kernel's `CUfunction` handle (valid while the backend's module is loaded).
    func: usize,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    arg0: u32,
    nargs: u32,
    /// Launched with programmatic dependent launch (the kernel `pdl_wait`s before it reads).
    pdl: bool,
}

/// A list of launches: the commands and their argument slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct List {
    cmds: Vec<Cmd>,
    args: Vec<u64>,
}

impl List {
    fn clear(&mut self) {
        self.cmds.clear();
        self.args.clear();
    }
}

/// A captured graph and the list it was captured from.
struct Captured {
    list: List,
    graph: CudaGraph,
}

/// The timing state of [`Recorder::start_profile`].
struct Profiling {
    /// Kernel names by `CUfunction` handle ([`super::device::Device::names`]).
    names: Arc<HashMap<usize, &'static str>>,
    /// Per timed list: an event recorded before its first command, then each command's name
    /// and the event recorded after it.
    lists: Vec<(CudaEvent, Vec<(&'static str, CudaEvent)>)>,
}

impl Cmd {
    /// The name of a command in a profile: its kernel's (`names`), or the cuBLAS call's.
    fn name(&self, names: &HashMap<usize, &'static str>) -> &'static str {
        match self {
            Cmd::Kernel(l) => names.get(&l.func).copied().unwrap_or("(unnamed kernel)"),
            Cmd::Gemm(_) => "cuBLAS bf16 GEMM",
            Cmd::Batched(_) => "cuBLAS batched f32 GEMM",
        }
    }
}

/// Pending launches, the step's arena and the captured graphs of one backend stream.
pub(super) struct Recorder {
    pending: List,
    /// Lists launched kernel by kernel lately (captured when launched again), newest first.
    candidates: Vec<List>,
    graphs: Vec<Captured>,
    /// References that keep what pending launches use alive.
    keep: Vec<Arc<CudaSlice<f32>>>,
    keep_any: Vec<Box<dyn Any + Send>>,
    arena: Vec<u8>,
    arena_used: usize,
    arena_dev: CudaSlice<u8>,
    /// Runs the recorded GEMMs (on the same stream).
    blas: Option<Arc<Blas>>,
    /// When the host last launched a list or finished waiting for the device.
    idle_since: std::time::Instant,
    /// Set while profiling: lists are launched kernel by kernel and timed.
    profile: Option<Profiling>,
    /// Launches and graph replays so far (for tests and `--explain`).
    pub stats: StepStats,
}

/// Counts of how recorded lists were launched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Lists launched kernel by kernel.
    pub eager: u64,
    /// Lists captured into a new graph.
    pub captured: u64,
    /// Lists launched as a replay of a captured graph.
    pub replayed: u64,
    /// Host time spent recording the lists launched as replays (from the end of the previous
    /// launch or wait to the launch), nanoseconds.
    pub record_ns: u64,
    /// Host time spent launching the replays (the arena copy and the graph launch), ns.
    pub launch_ns: u64,
    /// Host time spent waiting for the device's results (downloads), nanoseconds.
    pub wait_ns: u64,
}

impl StepStats {
    /// Lists launched in all.
    pub fn lists(&self) -> u64 {
        self.eager + self.captured + self.replayed
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("pending", &self.pending.cmds.len())
            .field("graphs", &self.graphs.len())
            .field("stats", &self.stats)
            .finish()
    }
}

// SAFETY: the raw graph handles inside `CudaGraph` are only used under the backend's mutex
// (the recorder lives in its `State`); the CUDA driver API is thread-safe for such use.
unsafe impl Send for Recorder {}

impl Recorder {
    /// An empty recorder with a [`ARENA_START`]-byte device arena. Errors: allocation.
    pub(super) fn new(
        stream: &Arc<CudaStream>,
        blas: Option<Arc<Blas>>,
    ) -> Result<Self, ComputeError> {
        Ok(Recorder {
            blas,
            pending: List::default(),
            candidates: Vec::new(),
            graphs: Vec::new(),
            keep: Vec::new(),
            keep_any: Vec::new(),
            arena: Vec::new(),
            arena_used: 0,
            arena_dev: drv(
                "allocate the step arena",
                stream.alloc_zeros::<u8>(ARENA_START),
            )?,
            idle_since: std::time::Instant::now(),
            profile: None,
            stats: StepStats::default(),
        })
    }

    /// Record a launch of `func` with `args` (one 8-byte slot per parameter), with
    /// programmatic dependent launch when `pdl` (only for kernels that `pdl_wait` before they
    /// touch memory an earlier kernel writes or reads).
    pub(super) fn push(
        &mut self,
        func: &cudarc::driver::CudaFunction,
        cfg: LaunchConfig,
        args: &[u64],
        pdl: bool,
    ) {
        let p = &mut self.pending;
        p.cmds.push(Cmd::Kernel(Launch {
            func: func.cu_function() as usize,
            grid: cfg.grid_dim,
            block: cfg.block_dim,
            smem: cfg.shared_mem_bytes,
            arg0: p.args.len() as u32,
            nargs: args.len() as u32,
            pdl,
        }));
        p.args.extend_from_slice(args);
    }

    /// Record a cuBLAS GEMM (run on the device's [`Blas`] handle, which is on the same
    /// stream); the buffers it reads and writes must be alive until the list is launched, as
    /// for [`Recorder::push`].
    pub(super) fn push_gemm(&mut self, g: Gemm) {
        self.pending.cmds.push(Cmd::Gemm(g));
    }

    /// Record a batched f32 GEMM, as [`Recorder::push_gemm`] (its pointer arrays staged in the
    /// arena).
    pub(super) fn push_batched(&mut self, g: BatchedGemm) {
        self.pending.cmds.push(Cmd::Batched(g));
    }

    /// Keep `buf` alive until the pending launches are enqueued.
    pub(super) fn keep(&mut self, buf: &Arc<CudaSlice<f32>>) {
        self.keep.push(buf.clone());
    }

    /// Keep any device buffer alive until the pending launches are enqueued (a replaced
    /// scratch buffer).
    pub(super) fn keep_any(&mut self, buf: Box<dyn Any + Send>) {
        self.keep_any.push(buf);
    }

    /// Drop the pending launches unlaunched (after an operation failed mid-step).
    pub(super) fn discard(&mut self) {
        self.pending.clear();
        self.arena_used = 0;
        self.keep.clear();
        self.keep_any.clear();
    }

    /// Stage `bytes` in the arena; the device address they will have when the pending
    /// launches run. When the arena is full, the pending launches are launched first and the
    /// arena grows. Errors: device failures.
    pub(super) fn stage(
        &mut self,
        stream: &Arc<CudaStream>,
        bytes: &[u8],
    ) -> Result<u64, ComputeError> {
        let need = bytes.len().div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
        if self.arena_used + need > self.arena_dev.len() {
            self.flush(stream)?;
            let cap = (self.arena_dev.len() * 2).max(need.next_power_of_two());
            let old = std::mem::replace(
                &mut self.arena_dev,
                drv("grow the step arena", stream.alloc_zeros::<u8>(cap))?,
            );
            // An array the current operation staged before this one is in the old arena
            // (copied there by the flush): keep it until the next flush.
            self.keep_any.push(Box::new(old));
        }
        let at = self.arena_used;
        if self.arena.len() < at + need {
            self.arena.resize(at + need, 0);
        }
        self.arena[at..at + bytes.len()].copy_from_slice(bytes);
        self.arena_used += need;
        Ok(self.arena_dev.device_ptr(stream).0 + at as u64)
    }

    /// Launch everything pending: copy the arena to the device, then replay the captured
    /// graph of an equal list, capture one when the list was launched recently, or
    /// launch kernel by kernel (always, timed, while profiling). Errors: device failures (the
    /// pending list is dropped).
    pub(super) fn flush(&mut self, stream: &Arc<CudaStream>) -> Result<(), ComputeError> {
        let t0 = std::time::Instant::now();
        let replayed = self.stats.replayed;
        let r = self.launch_pending(stream);
        let t1 = std::time::Instant::now();
        if self.stats.replayed > replayed {
            self.stats.record_ns += (t0 - self.idle_since).as_nanos() as u64;
            self.stats.launch_ns += (t1 - t0).as_nanos() as u64;
        }
        self.idle_since = t1;
        self.arena_used = 0;
        self.keep.clear();
        self.keep_any.clear();
        self.pending.clear();
        r
    }

    fn launch_pending(&mut self, stream: &Arc<CudaStream>) -> Result<(), ComputeError> {
        if self.pending.cmds.is_empty() {
            return Ok(());
        }
        if self.arena_used > 0 {
            let mut view = self.arena_dev.slice_mut(0..self.arena_used);
            drv(
                "copy the step's indices to the device",
                stream.memcpy_htod(&self.arena[..self.arena_used], &mut view),
            )?;
        }
        if self.profile.is_some() {
            self.stats.eager += 1;
            return self.launch_timed(stream);
        }
        if let Some(k) = self.graphs.iter().position(|g| g.list == self.pending) {
            let g = self.graphs.remove(k);
            let r = drv("replay a step graph", g.graph.launch());
            self.graphs.insert(0, g);
            self.stats.replayed += 1;
            return r;
        }
        if let Some(k) = self.candidates.iter().position(|c| *c == self.pending) {
            self.candidates.remove(k);
            let graph = capture_graph(stream, || {
                launch_all(stream, self.blas.as_deref(), &self.pending)
            })?;
            drv("replay a step graph", graph.launch())?;
            self.graphs.insert(
                0,
                Captured {
                    list: std::mem::take(&mut self.pending),
                    graph,
                },
            );
            self.graphs.truncate(MAX_GRAPHS);
            self.stats.captured += 1;
            return Ok(());
        }
        self.stats.eager += 1;
        launch_all(stream, self.blas.as_deref(), &self.pending)?;
        self.candidates.insert(0, self.pending.clone());
        self.candidates.truncate(MAX_CANDIDATES);
        Ok(())
    }
}

impl Recorder {
    /// Launch the pending list kernel by kernel with an event before it and after each command
    /// (profiling). Errors: device failures.
    fn launch_timed(&mut self, stream: &Arc<CudaStream>) -> Result<(), ComputeError> {
        let Recorder {
            pending,
            blas,
            profile: Some(p),
            ..
        } = self
        else {
            return Ok(());
        };
        drv("bind the CUDA context", stream.context().bind_to_thread())?;
        let event = || {
            drv(
                "record a profiling event",
                stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
            )
        };
        let start = event()?;
        let mut timed = Vec::with_capacity(pending.cmds.len());
        let mut args = Vec::with_capacity(32);
        for cmd in &pending.cmds {
            launch_one(stream, blas.as_deref(), pending, cmd, &mut args)?;
            timed.push((cmd.name(&p.names), event()?));
        }
        p.lists.push((start, timed));
        Ok(())
    }

    /// Start profiling: what is pending now is launched first (untimed), then every list until
    /// [`Recorder::take_profile`] runs kernel by kernel with timing events; `names` names the
    /// kernels. Errors: a failed launch of what was pending.
    pub(super) fn start_profile(
        &mut self,
        stream: &Arc<CudaStream>,
        names: Arc<HashMap<usize, &'static str>>,
    ) -> Result<(), ComputeError> {
        self.profile = None;
        self.flush(stream)?;
        self.profile = Some(Profiling {
            names,
            lists: Vec::new(),
        });
        Ok(())
    }

    /// Stop profiling: launch what is pending (timed), wait for the device, and return per
    /// kernel name (name, launches, µs between the event before the launch and the one after
    /// it), in first-launch order; empty when not profiling. Errors: device failures.
    pub(super) fn take_profile(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<Vec<(String, usize, f64)>, ComputeError> {
        let flushed = self.flush(stream);
        let Some(p) = self.profile.take() else {
            return flushed.map(|()| Vec::new());
        };
        flushed?;
        drv("synchronize", stream.synchronize())?;
        let mut out: Vec<(String, usize, f64)> = Vec::new();
        for (start, timed) in &p.lists {
            let mut prev = start;
            for (name, e) in timed {
                let us = drv("event time", prev.elapsed_ms(e))? as f64 * 1e3;
                match out.iter_mut().find(|o| o.0 == *name) {
                    Some(o) => {
                        o.1 += 1;
                        o.2 += us;
                    }
                    None => out.push((name.to_string(), 1, us)),
                }
                prev = e;
            }
        }
        Ok(out)
    }

    /// Wait for everything enqueued on `stream` (timed into [`StepStats::wait_ns`]). Errors: a
    /// device failure of anything enqueued.
    pub(super) fn wait(&mut self, stream: &Arc<CudaStream>) -> Result<(), ComputeError> {
        self.timed_wait(|| drv("synchronize", stream.synchronize()))
    }

    /// Run `f`, a call that blocks until the device is done (a copy to the host, a
    /// synchronisation), timed into [`StepStats::wait_ns`].
    pub(super) fn timed_wait<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let t0 = std::time::Instant::now();
        let r = f();
        self.idle_since = std::time::Instant::now();
        self.stats.wait_ns += (self.idle_since - t0).as_nanos() as u64;
        r
    }
}

/// Launch every command of `list` on `stream`, in order (the GEMMs on `blas`, whose handle
/// is bound to `stream`).
fn launch_all(stream: &CudaStream, blas: Option<&Blas>, list: &List) -> Result<(), ComputeError> {
    let mut args = Vec::with_capacity(32);
    // cuBLAS enqueues on the thread's current context (the kernels bind it per launch).
    drv("bind the CUDA context", stream.context().bind_to_thread())?;
    for cmd in &list.cmds {
        launch_one(stream, blas, list, cmd, &mut args)?;
    }
    Ok(())
}

/// Launch `cmd`, a command of `list`, on `stream` (`args`: scratch for its argument slots; the
/// thread's context bound to `stream`'s, for cuBLAS).
fn launch_one(
    stream: &CudaStream,
    blas: Option<&Blas>,
    list: &List,
    cmd: &Cmd,
    args: &mut Vec<u64>,
) -> Result<(), ComputeError> {
    let c = match cmd {
        Cmd::Kernel(c) => c,
        Cmd::Gemm(g) => {
            let blas = blas.ok_or_else(|| dev_err("a GEMM was recorded without cuBLAS"))?;
            // SAFETY: recorded by `tensor_ops` with pointers to buffers of the sizes the
            // GEMM reads and writes, kept alive until after this launch.
            unsafe { blas.gemm(g)? };
            return Ok(());
        }
        Cmd::Batched(g) => {
            let blas = blas.ok_or_else(|| dev_err("a GEMM was recorded without cuBLAS"))?;
            // SAFETY: as for `Cmd::Gemm`; the pointer arrays are in the arena, copied to
            // the device before the list is launched.
            unsafe { blas.batched(g)? };
            return Ok(());
        }
    };
    args.clear();
    let a0 = c.arg0 as usize;
    args.extend_from_slice(&list.args[a0..a0 + c.nargs as usize]);
    let cfg = LaunchConfig {
        grid_dim: c.grid,
        block_dim: c.block,
        shared_mem_bytes: c.smem,
    };
    // SAFETY: the command was recorded by `Recorder::push` from a kernel of the backend's
    // loaded module with the argument list of that kernel (see `tensor_ops::go`), and
    // every buffer its pointers address is kept alive until after this launch.
    unsafe { launch_raw(stream, c.func as sys::CUfunction, cfg, args, c.pdl) }
}
