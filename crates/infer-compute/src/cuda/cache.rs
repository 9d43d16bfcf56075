//! Device copies of weights, uploaded once and found again by the host slice's address and
//! length (the vindex mmap never moves), plus the growable scratch buffers of one call.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};

use super::device::drv;
use crate::ComputeError;

/// One cached weight: its fingerprint and its device copy.
#[derive(Debug)]
struct Entry {
    fp: u64,
    buf: CudaSlice<u8>,
}

/// Weights resident on the device, keyed by `(host address, byte length)`.
///
/// A key hit is checked against a fingerprint of the bytes (FNV-1a of the length, the first and
/// last 64 bytes and 16 evenly spaced 16-byte windows), so a freed host buffer whose address is
/// reused for other data of the same length is uploaded again. Data changed in place only
/// outside the sampled bytes is not detected: call [`super::CudaBackend::clear_weight_cache`]
/// after rewriting a weight buffer. Nothing is evicted.
#[derive(Debug, Default)]
pub(super) struct WeightCache {
    map: HashMap<(usize, usize), Entry>,
    bytes: usize,
    /// Device arrays of the device addresses of an MoE layer's experts (one role), keyed by
    /// the first and last expert's host address and length and the count ([`Self::table`]).
    tables: HashMap<(usize, usize, usize, usize), CudaSlice<u64>>,
    /// Replaced weight copies and the expert tables dropped with them since the last
    /// [`Self::take_retired`]: launches recorded but not yet enqueued may still read them, so
    /// they are freed only after those launches are enqueued.
    retired: Vec<Box<dyn std::any::Any + Send>>,
}

impl WeightCache {
    /// The device copy of `bytes` (uploaded on first use or when the fingerprint changed).
    /// `bytes` must not be empty. Errors: allocation or copy failures.
    pub fn get(
        &mut self,
        stream: &Arc<CudaStream>,
        bytes: &[u8],
    ) -> Result<&CudaSlice<u8>, ComputeError> {
        let key = (bytes.as_ptr() as usize, bytes.len());
        let fp = fingerprint(bytes);
        let stale = match self.map.get(&key) {
            Some(e) => e.fp != fp,
            None => true,
        };
        if stale {
            let buf = upload_padded(stream, bytes)?;
            if let Some(old) = self.map.insert(key, Entry { fp, buf }) {
                self.bytes -= old.buf.len();
                // Retired, not freed: a recorded launch may read the old copy, or an expert
                // table holding its address.
                self.retired.push(Box::new(old.buf));
                for (_, t) in self.tables.drain() {
                    self.retired.push(Box::new(t));
                }
            }
            self.bytes += bytes.len();
        }
        match self.map.get(&key) {
            Some(e) => Ok(&e.buf),
            None => unreachable!("weight cache entry inserted above"),
        }
    }

    /// The device copy of `bytes` if it is cached under its address and length (no fingerprint
    /// check: call right after [`WeightCache::get`]).
    pub fn peek(&self, bytes: &[u8]) -> Option<&CudaSlice<u8>> {
        self.map
            .get(&(bytes.as_ptr() as usize, bytes.len()))
            .map(|e| &e.buf)
    }

    /// The device address of a device array holding the device addresses of `experts`' copies
    /// (each uploaded as by [`WeightCache::get`] when the table is first made; the experts
    /// of a vindex never move), for kernels that pick an expert on the device. Found again by
    /// the first and last expert's address and length and the count. `experts` must not be
    /// empty. Errors: allocation or copy failures.
    pub fn table(
        &mut self,
        stream: &Arc<CudaStream>,
        experts: &[&[u8]],
    ) -> Result<u64, ComputeError> {
        let (Some(first), Some(last)) = (experts.first(), experts.last()) else {
            return Err(super::device::dev_err("an expert table of no experts"));
        };
        let key = (
            first.as_ptr() as usize,
            last.as_ptr() as usize,
            first.len(),
            experts.len(),
        );
        // A changed first or last expert (a freed buffer's address reused) is uploaded again,
        // which drops every table (above); the table is then made anew.
        self.get(stream, first)?;
        self.get(stream, last)?;
        if !self.tables.contains_key(&key) {
            let mut ptrs = Vec::with_capacity(experts.len());
            for e in experts {
                ptrs.push(self.get(stream, e)?.device_ptr(stream).0);
            }
            let mut t = drv(
                "allocate an expert table",
                stream.alloc_zeros::<u64>(ptrs.len()),
            )?;
            drv("upload an expert table", stream.memcpy_htod(&ptrs, &mut t))?;
            self.tables.insert(key, t);
        }
        match self.tables.get(&key) {
            Some(t) => Ok(t.device_ptr(stream).0),
            None => unreachable!("expert table inserted above"),
        }
    }

    /// The weight copies and expert tables replaced since the last call, for the caller to
    /// keep alive until the launches recorded so far are enqueued.
    pub fn take_retired(&mut self) -> Vec<Box<dyn std::any::Any + Send>> {
        std::mem::take(&mut self.retired)
    }

    /// Drop every device copy (the caller has enqueued every recorded launch first).
    pub fn clear(&mut self) {
        self.retired.clear();
        self.map.clear();
        self.tables.clear();
        self.bytes = 0;
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Bytes past the end of every weight buffer on the device (zeros): the mat-vec kernels stage
/// weights with 16-byte loads from 16-byte aligned addresses, so the last load of a row may
/// reach up to 15 bytes past the matrix.
pub(super) const WEIGHT_PAD: usize = 16;

/// A device copy of `bytes` followed by [`WEIGHT_PAD`] zero bytes. Errors: allocation or copy
/// failure.
pub(super) fn upload_padded(
    stream: &Arc<CudaStream>,
    bytes: &[u8],
) -> Result<CudaSlice<u8>, ComputeError> {
    let mut buf = drv(
        "allocate weights",
        stream.alloc_zeros::<u8>(bytes.len() + WEIGHT_PAD),
    )?;
    let mut view = buf.slice_mut(0..bytes.len());
    drv("upload weights", stream.memcpy_htod(bytes, &mut view))?;
    Ok(buf)
}

/// FNV-1a (over 64-bit words) of the length and a sample of `b`: its first and last 64
/// bytes and 16 evenly spaced 16-byte windows (see [`WeightCache`]). About 50 ns: it runs
/// for every weight of every forward step.
fn fingerprint(b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |s: &[u8]| {
        for c in s.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&(b.len() as u64).to_le_bytes());
    let n = b.len();
    eat(&b[..n.min(64)]);
    eat(&b[n.saturating_sub(64)..]);
    if n > 16 {
        for i in 0..16 {
            let o = (n - 16) / 15 * i;
            eat(&b[o..o + 16]);
        }
    }
    h
}

/// View any plain-number slice as bytes (for uploading f32 / f16 weights through the cache).
pub(super) fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: callers pass f32 or half::f16 (plain data, no padding, any bit pattern is a
    // valid u8); the byte view covers exactly the same memory and lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// A device buffer that only grows.
#[derive(Debug)]
pub(super) struct Grow<T>(CudaSlice<T>);

impl<T: DeviceRepr + ValidAsZeroBits> Grow<T> {
    /// A one-element buffer. Errors: allocation failure.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, ComputeError> {
        Ok(Grow(drv("allocate scratch", stream.alloc_zeros::<T>(1))?))
    }

    /// Make the buffer at least `n` elements long (contents are not kept).
    /// Errors: allocation failure.
    pub fn at_least(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<(), ComputeError> {
        if self.0.len() < n {
            self.0 = drv("allocate scratch", stream.alloc_zeros::<T>(n))?;
        }
        Ok(())
    }

    /// [`Grow::at_least`], returning the replaced buffer (to be dropped once no pending
    /// launch uses it) when it grew. Errors: allocation failure.
    pub fn at_least_keep(
        &mut self,
        stream: &Arc<CudaStream>,
        n: usize,
    ) -> Result<Option<Box<dyn std::any::Any + Send>>, ComputeError>
    where
        T: Send + 'static,
    {
        if self.0.len() < n {
            let new = drv("allocate scratch", stream.alloc_zeros::<T>(n))?;
            return Ok(Some(Box::new(std::mem::replace(&mut self.0, new))));
        }
        Ok(None)
    }

    /// The buffer.
    pub fn get(&self) -> &CudaSlice<T> {
        &self.0
    }

    /// The buffer, mutably.
    pub fn get_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.0
    }
}

/// Quantized activations of one format family: int8 values, one f32 scale per block, and
/// (Q8_K only) the sixteen 16-value group sums per block.
#[derive(Debug)]
pub(super) struct ActQ {
    pub aq: Grow<i8>,
    pub ad: Grow<f32>,
    pub bsums: Grow<i32>,
}

impl ActQ {
    fn new(stream: &Arc<CudaStream>) -> Result<Self, ComputeError> {
        Ok(ActQ {
            aq: Grow::new(stream)?,
            ad: Grow::new(stream)?,
            bsums: Grow::new(stream)?,
        })
    }
}

/// Scratch buffers of one call: input, output, and the quantized activations per activation
/// family (`kq`: Q8_K for Q4_K/Q6_K weights; `b32`: 32-value blocks for Q4_0/Q5_0/Q8_0 and the
/// seed's Q8 format), so a fused call quantizes each family once.
#[derive(Debug)]
pub(super) struct Scratch {
    pub x: Grow<f32>,
    pub y: Grow<f32>,
    pub kq: ActQ,
    pub b32: ActQ,
    /// bf16 activations and dequantized weight rows of the many-row products (`blas.rs`).
    pub xb: Grow<u16>,
    pub wb: Grow<u16>,
    /// Attention scores / probabilities of the long prompt chunks (`tensor_ops::attend_gemm`).
    pub att: Grow<f32>,
    /// The keys and values of a long prompt chunk widened to f32 from a cache stored as f16 or
    /// q8_0 (`tensor_ops::widen_kv`).
    pub kvw: Grow<f32>,
}

impl Scratch {
    /// One-element buffers. Errors: allocation failure.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, ComputeError> {
        Ok(Scratch {
            x: Grow::new(stream)?,
            y: Grow::new(stream)?,
            kq: ActQ::new(stream)?,
            b32: ActQ::new(stream)?,
            xb: Grow::new(stream)?,
            wb: Grow::new(stream)?,
            att: Grow::new(stream)?,
            kvw: Grow::new(stream)?,
        })
    }
}
