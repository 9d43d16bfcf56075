//! KV cache: per layer, K and V rows `[capacity, kv_dim]` in the memory of the backend that
//! runs the forward pass (allocated on its first pass), stored as the backend's
//! [`infer_compute::KvType`] (f32 or f16 on the CPU; f32, f16 or q8_0 on CUDA).

use infer_compute::{ComputeBackend, Tensor};

use crate::scratch::Scratch;
use crate::InferenceError;

/// Keys and values of every layer for positions `0..len()`, with a fixed capacity (the context
/// size). Appending past capacity is an error, never a write past the end. The rows live in
/// [`Tensor`]s of the backend of the first forward pass (host memory for the CPU, device
/// memory for a GPU backend), allocated then.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    kv_dims: Vec<usize>,
    head_dims: Vec<usize>,
    len: usize,
    capacity: usize,
    /// Activation buffers reused by every forward pass on this cache (no allocation per token).
    pub(crate) scratch: Scratch,
}

impl KvCache {
    /// A cache for `capacity` positions; `kv_dims[l]` = `num_kv_heads · head_dim` of layer `l`,
    /// `head_dims[l]` its head_dim (a q8_0 cache needs multiples of 32). Allocates nothing until
    /// the first forward pass.
    pub fn new(kv_dims: &[usize], head_dims: &[usize], capacity: usize) -> Self {
        KvCache {
            k: kv_dims.iter().map(|_| Tensor::default()).collect(),
            v: kv_dims.iter().map(|_| Tensor::default()).collect(),
            kv_dims: kv_dims.to_vec(),
            head_dims: head_dims.to_vec(),
            len: 0,
            capacity,
            scratch: Scratch::default(),
        }
    }

    /// Allocate the rows in `backend`'s memory unless they are there already (the first
    /// forward pass does it; call it to reserve the memory up front). Errors: the cache holds
    /// positions in another backend's memory (a cache belongs to one backend), a head_dim the
    /// backend's KV type cannot store, allocation failure.
    pub fn ensure(&mut self, backend: &dyn ComputeBackend) -> Result<(), InferenceError> {
        let dims = self.kv_dims.iter().zip(&self.head_dims);
        for (t, (&d, &hd)) in self
            .k
            .iter_mut()
            .chain(self.v.iter_mut())
            .zip(dims.clone().chain(dims))
        {
            let want = d * self.capacity;
            if t.len() == want {
                continue;
            }
            if self.len > 0 {
                return Err(InferenceError::Compute(
                    infer_compute::ComputeError::NotOnHost {
                        op: "KV cache (filled by another backend)",
                    },
                ));
            }
            backend.fit_kv(t, want, hd)?;
        }
        Ok(())
    }

    /// Layer `layer`'s K and V tensors, writable (for the attention step).
    pub(crate) fn layer_mut(&mut self, layer: usize) -> (&mut Tensor, &mut Tensor) {
        (&mut self.k[layer], &mut self.v[layer])
    }

    /// Positions stored so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `num_kv_heads · head_dim` of layer `layer` (values per row).
    pub fn kv_dim(&self, layer: usize) -> usize {
        self.kv_dims[layer]
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.kv_dims.len()
    }

    /// Maximum positions (context size).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Error unless `n` more positions fit.
    pub fn check_room(&self, n: usize) -> Result<(), InferenceError> {
        if self.len + n > self.capacity {
            return Err(InferenceError::ContextFull {
                needed: self.len + n,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Copy K and V rows of `layer` for positions `start..start + k.len() / kv_dim` out of the
    /// backend's memory into `k` and `v`. Errors: rows past the capacity (or a cache not yet
    /// allocated, [`InferenceError::ContextFull`]), lengths that are not whole rows or differ,
    /// copy failures.
    pub fn read_rows(
        &self,
        backend: &dyn ComputeBackend,
        layer: usize,
        start: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), InferenceError> {
        let r = self.rows_of(layer, start, k.len(), v.len())?;
        backend.read_at(&self.k[layer], r.start, k)?;
        backend.read_at(&self.v[layer], r.start, v)?;
        Ok(())
    }

    /// Copy `k` and `v` (whole rows of `layer`'s kv_dim) into the rows of positions `start..`
    /// (as [`KvCache::copy_prefix_from`] does). Errors as [`KvCache::read_rows`].
    pub fn write_rows(
        &mut self,
        backend: &dyn ComputeBackend,
        layer: usize,
        start: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), InferenceError> {
        let r = self.rows_of(layer, start, k.len(), v.len())?;
        backend.write_at(k, &mut self.k[layer], r.start)?;
        backend.write_at(v, &mut self.v[layer], r.start)?;
        Ok(())
    }

    /// Make this cache hold `src`'s first `len` positions (K and V of every layer), e.g. to
    /// start several sequences from one prefilled prompt; positions past `len` are forgotten.
    /// Both caches belong to `backend` (host or device memory); the rows travel through a host
    /// buffer of `len · kv_dim` values per layer, one layer at a time. Errors:
    /// [`InferenceError::ContextFull`] when `src` holds fewer than `len` positions or `len`
    /// exceeds this cache's capacity; a shape mismatch when the caches' layers or kv_dims
    /// differ; allocation and copy failures. On an error this cache is left empty.
    pub fn copy_prefix_from(
        &mut self,
        backend: &dyn ComputeBackend,
        src: &KvCache,
        len: usize,
    ) -> Result<(), InferenceError> {
        self.len = 0;
        if src.kv_dims != self.kv_dims {
            return Err(InferenceError::Compute(
                infer_compute::ComputeError::ShapeMismatch {
                    what: "KV cache copy (layers × kv_dim of source and destination)",
                    expected: self.kv_dims.iter().sum(),
                    got: src.kv_dims.iter().sum(),
                    unit: "values per position",
                },
            ));
        }
        if len > src.len || len > self.capacity {
            return Err(InferenceError::ContextFull {
                needed: len,
                capacity: src.len.min(self.capacity),
            });
        }
        self.ensure(backend)?;
        let mut k = Vec::new();
        let mut v = Vec::new();
        for layer in 0..self.layers() {
            let n = len * self.kv_dims[layer];
            k.resize(n, 0.0);
            v.resize(n, 0.0);
            src.read_rows(backend, layer, 0, &mut k, &mut v)?;
            self.write_rows(backend, layer, 0, &k, &v)?;
        }
        self.len = len;
        Ok(())
    }

    /// The value range of rows `start..` holding `nk` (= `nv`) values of `layer`.
    fn rows_of(
        &self,
        layer: usize,
        start: usize,
        nk: usize,
        nv: usize,
    ) -> Result<std::ops::Range<usize>, InferenceError> {
        let d = self.kv_dims[layer];
        if nk != nv || nk % d.max(1) != 0 {
            return Err(InferenceError::Compute(
                infer_compute::ComputeError::ShapeMismatch {
                    what: "KV rows (K and V whole rows of kv_dim)",
                    expected: nk.div_ceil(d.max(1)) * d,
                    got: nv,
                    unit: "values",
                },
            ));
        }
        self.range(layer, start, start + nk / d.max(1))
    }

    fn range(
        &self,
        layer: usize,
        start: usize,
        end: usize,
    ) -> Result<std::ops::Range<usize>, InferenceError> {
        if start > end || end > self.capacity || self.k[layer].len() < end * self.kv_dims[layer] {
            return Err(InferenceError::ContextFull {
                needed: end,
                capacity: self
                    .capacity
                    .min(self.k[layer].len() / self.kv_dims[layer].max(1)),
            });
        }
        let d = self.kv_dims[layer];
        Ok(start * d..end * d)
    }

    /// Commit `n` positions written to every layer.
    pub fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.capacity);
    }

    /// Forget everything (a new conversation).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Keep only the first `len` positions (e.g. to re-run from a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_compute::CpuBackend;

    /// The copy holds the source's first positions value for value, and nothing after them.
    #[test]
    fn copy_prefix_from_copies_the_first_rows() {
        let b = CpuBackend::new();
        let dims = [4, 2];
        let mut src = KvCache::new(&dims, &dims, 8);
        src.ensure(&b).unwrap();
        for (l, &d) in dims.iter().enumerate() {
            let k: Vec<f32> = (0..5 * d).map(|i| (l * 100 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            src.write_rows(&b, l, 0, &k, &v).unwrap();
        }
        src.advance(5);
        let mut dst = KvCache::new(&dims, &dims, 8);
        dst.copy_prefix_from(&b, &src, 3).unwrap();
        assert_eq!(dst.len(), 3);
        for (l, &d) in dims.iter().enumerate() {
            let (mut k, mut v) = (vec![0.0; 3 * d], vec![0.0; 3 * d]);
            dst.read_rows(&b, l, 0, &mut k, &mut v).unwrap();
            let want: Vec<f32> = (0..3 * d).map(|i| (l * 100 + i) as f32).collect();
            assert_eq!(k, want);
            assert_eq!(v, want.iter().map(|x| -x).collect::<Vec<_>>());
        }
        // More than the source holds, or other kv_dims: an error, and the copy is empty.
        assert!(dst.copy_prefix_from(&b, &src, 6).is_err());
        assert_eq!(dst.len(), 0);
        let mut other = KvCache::new(&[4, 4], &[4, 4], 8);
        assert!(other.copy_prefix_from(&b, &src, 2).is_err());
    }
}
