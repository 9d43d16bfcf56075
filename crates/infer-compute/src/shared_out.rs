//! [`SharedOut`]: one output buffer written by parallel tasks.

/// A raw `*mut f32` into an output buffer that rayon tasks share. Users promise that concurrent
/// tasks write disjoint elements of a buffer that outlives them; each write site says which
/// elements its task owns.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);

// SAFETY: only a pointer; the type's contract (disjoint writes, buffer outlives the tasks) is
// upheld at every use.
unsafe impl Send for SharedOut {}
// SAFETY: as for `Send`: shared use only ever writes disjoint elements.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the whole `Sync` value, not the raw field).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
