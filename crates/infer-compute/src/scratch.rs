//! Per-thread reusable buffers for kernel temporaries (quantized activations, attention scores,
//! RoPE cos/sin), so that a decode step allocates nothing once every thread has run each kernel
//! at its largest size (issue 6, "no allocation per token").
//!
//! A buffer lives in a `thread_local!` `Cell<Vec<T>>` and is *taken out* for the duration of a
//! call and put back afterwards. Nothing stays borrowed while a kernel runs, so a rayon worker
//! that steals another task needing the same slot (work stealing inside a parallel region) finds
//! the slot empty and allocates a fresh buffer instead of panicking; the larger of the two
//! buffers is kept. Buffers only grow, geometrically (see [`grown_len`]), and are freed when the
//! thread exits.

use std::cell::Cell;
use std::thread::LocalKey;

/// A thread's reusable buffer of `T`.
pub(crate) type Slot<T> = LocalKey<Cell<Vec<T>>>;

/// Smallest size a buffer grows to, in bytes (1024 f32): buffers sized by a growing quantity
/// (the number of attended keys in decode) then reallocate only at powers of two above this.
/// Buffers of large elements (a transposed super-block group is ~6 KiB) are not padded to it.
const MIN_BYTES: usize = 4096;

/// The capacity a buffer of `T` needs for `len` elements: `len` rounded up to a power of two,
/// at least [`MIN_BYTES`] worth of elements (at least one).
pub(crate) fn grown_len<T>(len: usize) -> usize {
    let min = (MIN_BYTES / std::mem::size_of::<T>().max(1)).max(1);
    len.checked_next_power_of_two().unwrap_or(len).max(min)
}

/// Take this thread's buffer out of `slot` (empty if none, or if an outer call on this thread
/// holds it), with at least `len` elements; hand it back with [`give`].
pub(crate) fn take<T: Copy + Default>(slot: &'static Slot<T>, len: usize) -> Vec<T> {
    let mut v = slot.take();
    if v.len() < len {
        let cap = grown_len::<T>(len);
        v.reserve_exact(cap - v.len());
        v.resize(cap, T::default());
    }
    v
}

/// Put a buffer taken with [`take`] back into `slot`, keeping the larger of it and whatever a
/// re-entrant call left there.
pub(crate) fn give<T>(slot: &'static Slot<T>, v: Vec<T>) {
    let other = slot.replace(v);
    if !other.is_empty() {
        let mine = slot.take();
        slot.set(if other.len() > mine.len() {
            other
        } else {
            mine
        });
    }
}

/// Run `f` on this thread's buffer from `slot`, sized to exactly `len` elements (contents left
/// from earlier calls: `f` must overwrite what it reads).
pub(crate) fn with<T: Copy + Default, R>(
    slot: &'static Slot<T>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let mut v = take(slot, len);
    let r = f(&mut v[..len]);
    give(slot, v);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local!(static S: Cell<Vec<u32>> = const { Cell::new(Vec::new()) });

    #[test]
    fn buffers_grow_geometrically_and_survive_reentrant_use() {
        assert_eq!(grown_len::<u32>(1), 1024);
        assert_eq!(grown_len::<u32>(1025), 2048);
        assert_eq!(grown_len::<[u8; 6000]>(1), 1);
        assert_eq!(grown_len::<[u8; 6000]>(3), 4);
        let outer = with(&S, 10, |a| {
            a.fill(7);
            // A re-entrant user of the same slot gets its own buffer.
            let inner = with(&S, 5000, |b| {
                b[0] = 1;
                b.len()
            });
            assert!(a.iter().all(|&x| x == 7), "outer buffer untouched");
            inner + a.len()
        });
        assert_eq!(outer, 5010);
        // The larger (inner) buffer was kept.
        let v = S.take();
        assert_eq!(v.len(), grown_len::<u32>(5000));
    }
}
