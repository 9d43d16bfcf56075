//! [`Tensor`]: an f32 activation buffer in a backend's memory — host memory for the CPU
//! backend, a device allocation for a GPU backend — so that the forward pass keeps its
//! activations and KV cache where the backend computes (candle's `BackendStorage`, ggml's
//! backend buffers). A CPU KV cache may hold its values as f16 instead ([`Tensor::host_f16`]).
//!
//! A tensor has a logical length (values, row-major `[rows, width]` as the operation says) and
//! is only read or written through its backend's operations
//! ([`crate::ComputeBackend::fit`], [`upload`](crate::ComputeBackend::upload),
//! [`download`](crate::ComputeBackend::download) and the whole operations). Host code that
//! needs the values of a host tensor may borrow them with [`Tensor::host`].

use std::any::Any;
use std::fmt;

use half::f16;

/// Device memory behind a [`Tensor`], owned by the backend that allocated it.
pub trait DeviceBuffer: Any + Send + Sync + fmt::Debug {
    /// Values the allocation can hold.
    fn capacity(&self) -> usize;
    /// `self` as [`Any`], for the backend to downcast to its own type.
    fn as_any(&self) -> &dyn Any;
    /// `self` as mutable [`Any`].
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

#[derive(Debug)]
enum Store {
    Host(Vec<f32>),
    /// IEEE half values in host memory (a CPU KV cache stored as f16).
    HostF16(Vec<f16>),
    Device(Box<dyn DeviceBuffer>),
}

/// An f32 buffer of `len()` values in host or device memory (see the [module docs](self)).
/// The default is an empty host tensor.
#[derive(Debug)]
pub struct Tensor {
    store: Store,
    len: usize,
}

impl Default for Tensor {
    fn default() -> Self {
        Tensor::host_from(Vec::new())
    }
}

impl Tensor {
    /// A host tensor holding `values`.
    pub fn host_from(values: Vec<f32>) -> Self {
        let len = values.len();
        Tensor {
            store: Store::Host(values),
            len,
        }
    }

    /// A host tensor of `len` f16 values, all zero (a CPU KV cache stored as
    /// [`crate::KvType::F16`]; [`Tensor::host`] is `None` for it, [`Tensor::host_f16`] gives
    /// the values).
    pub fn host_f16_zeros(len: usize) -> Self {
        Tensor {
            store: Store::HostF16(vec![f16::ZERO; len]),
            len,
        }
    }

    /// A device tensor of `len` values in `buf` (`len <= buf.capacity()`). For backends.
    pub fn device_from(buf: Box<dyn DeviceBuffer>, len: usize) -> Self {
        debug_assert!(len <= buf.capacity());
        Tensor {
            store: Store::Device(buf),
            len,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the tensor holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the values live in host memory as f32 ([`Tensor::host`] gives them).
    pub fn is_host(&self) -> bool {
        matches!(self.store, Store::Host(_))
    }

    /// The values of a host f32 tensor (`None` for a device tensor or a host f16 one).
    pub fn host(&self) -> Option<&[f32]> {
        match &self.store {
            Store::Host(v) => Some(&v[..self.len]),
            Store::HostF16(_) | Store::Device(_) => None,
        }
    }

    /// The values of a host f32 tensor, writable (`None` otherwise).
    pub fn host_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.store {
            Store::Host(v) => Some(&mut v[..self.len]),
            Store::HostF16(_) | Store::Device(_) => None,
        }
    }

    /// The values of a host f16 tensor ([`Tensor::host_f16_zeros`]; `None` otherwise).
    pub fn host_f16(&self) -> Option<&[f16]> {
        match &self.store {
            Store::HostF16(v) => Some(&v[..self.len]),
            Store::Host(_) | Store::Device(_) => None,
        }
    }

    /// The values of a host f16 tensor, writable (`None` otherwise).
    pub fn host_f16_mut(&mut self) -> Option<&mut [f16]> {
        match &mut self.store {
            Store::HostF16(v) => Some(&mut v[..self.len]),
            Store::Host(_) | Store::Device(_) => None,
        }
    }

    /// The vector of a host tensor (`None` for a device tensor); its length is the tensor's
    /// after the borrow ends (host code may resize it).
    pub fn host_vec_mut(&mut self) -> Option<HostVec<'_>> {
        match &mut self.store {
            Store::Host(v) => Some(HostVec {
                v,
                len: &mut self.len,
            }),
            Store::HostF16(_) | Store::Device(_) => None,
        }
    }

    /// The device allocation of a device tensor (`None` for a host tensor).
    pub fn device(&self) -> Option<&dyn DeviceBuffer> {
        match &self.store {
            Store::Device(b) => Some(&**b),
            Store::Host(_) | Store::HostF16(_) => None,
        }
    }

    /// The device allocation, writable.
    pub fn device_mut(&mut self) -> Option<&mut dyn DeviceBuffer> {
        match &mut self.store {
            Store::Device(b) => Some(&mut **b),
            Store::Host(_) | Store::HostF16(_) => None,
        }
    }

    /// Host tensors (f32 or f16): resize to `len` values (new values zero, capacity kept). Device tensors:
    /// set the length when the allocation holds `len` values and return false otherwise (the
    /// backend then allocates anew).
    pub fn set_len(&mut self, len: usize) -> bool {
        match &mut self.store {
            Store::Host(v) => {
                v.resize(len, 0.0);
                self.len = len;
                true
            }
            Store::HostF16(v) => {
                v.resize(len, f16::ZERO);
                self.len = len;
                true
            }
            Store::Device(b) if b.capacity() >= len => {
                self.len = len;
                true
            }
            Store::Device(_) => false,
        }
    }
}

/// A host tensor's vector borrowed for host code ([`Tensor::host_vec_mut`]); the tensor takes
/// the vector's length when the borrow ends.
pub struct HostVec<'t> {
    v: &'t mut Vec<f32>,
    len: &'t mut usize,
}

impl std::ops::Deref for HostVec<'_> {
    type Target = Vec<f32>;
    fn deref(&self) -> &Vec<f32> {
        self.v
    }
}

impl std::ops::DerefMut for HostVec<'_> {
    fn deref_mut(&mut self) -> &mut Vec<f32> {
        self.v
    }
}

impl Drop for HostVec<'_> {
    fn drop(&mut self) {
        *self.len = self.v.len();
    }
}
