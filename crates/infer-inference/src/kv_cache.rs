//! KV cache: per layer, K and V rows `[capacity, kv_dim]` f32, allocated once.

use crate::scratch::Scratch;
use crate::InferenceError;

/// Keys and values of every layer for positions `0..len()`, with a fixed capacity (the context
/// size). Appending past capacity is an error, never a write past the end.
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    kv_dims: Vec<usize>,
    len: usize,
    capacity: usize,
    /// Activation buffers reused by every forward pass on this cache (no allocation per token).
    pub(crate) scratch: Scratch,
}

impl KvCache {
    /// A cache for `capacity` positions; `kv_dims[l]` = `num_kv_heads · head_dim` of layer `l`.
    pub fn new(kv_dims: &[usize], capacity: usize) -> Self {
        KvCache {
            k: kv_dims.iter().map(|d| vec![0.0; d * capacity]).collect(),
            v: kv_dims.iter().map(|d| vec![0.0; d * capacity]).collect(),
            kv_dims: kv_dims.to_vec(),
            len: 0,
            capacity,
            scratch: Scratch::default(),
        }
    }

    /// Positions stored so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
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

    /// Write `k`, `v` (`[n, kv_dim]`) of layer `layer` at positions `len..len+n` (not yet
    /// committed: call [`KvCache::advance`] after the last layer). Returns the layer's K and V
    /// for positions `0..len+n`.
    pub fn write(
        &mut self,
        layer: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(&[f32], &[f32]), InferenceError> {
        let d = self.kv_dims[layer];
        let n = k.len() / d;
        self.check_room(n)?;
        let start = self.len * d;
        let end = start + k.len();
        self.k[layer][start..end].copy_from_slice(k);
        self.v[layer][start..end].copy_from_slice(v);
        Ok((&self.k[layer][..end], &self.v[layer][..end]))
    }

    /// K and V rows of `layer` for positions `start..end` (`[end − start, kv_dim]` each).
    /// Panics if `start > end` or `end` exceeds the capacity.
    pub fn rows(&self, layer: usize, start: usize, end: usize) -> (&[f32], &[f32]) {
        let d = self.kv_dims[layer];
        (
            &self.k[layer][start * d..end * d],
            &self.v[layer][start * d..end * d],
        )
    }

    /// [`KvCache::rows`], writable (to copy rows in from a device cache).
    pub fn rows_mut(&mut self, layer: usize, start: usize, end: usize) -> (&mut [f32], &mut [f32]) {
        let d = self.kv_dims[layer];
        (
            &mut self.k[layer][start * d..end * d],
            &mut self.v[layer][start * d..end * d],
        )
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
