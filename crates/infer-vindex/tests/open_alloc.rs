//! `Vindex::open` maps the weight files and allocates no weight-sized buffers: a counting global
//! allocator records the largest single allocation made while opening.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{mock_source, MockDims};
use infer_vindex::{build, BuildOptions, Vindex};

struct Counting;

static TRACK: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's arguments; the
// bookkeeping is atomics only (no allocation, no recursion).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if TRACK.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
            TOTAL.fetch_add(layout.size(), Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if TRACK.load(Ordering::Relaxed) {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
            TOTAL.fetch_add(new_size, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn open_allocates_no_weight_sized_buffers() {
    let d = MockDims {
        vocab: 8192,
        hidden: 128,
        inter: 1024,
        layers: 4,
        tied: false,
    };
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("a.vindex");
    build(&mock_source(&d), &target, &BuildOptions::default()).unwrap();
    let weights: u64 = std::fs::read_dir(&target)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "bin"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let smallest_matrix = d.inter * d.hidden * 4; // one FFN matrix: 512 KiB

    TRACK.store(true, Ordering::SeqCst);
    let v = Vindex::open(&target).unwrap();
    let g = v.gate_vectors(3).unwrap();
    let dm = v.down_layer_matrix(2).unwrap();
    let (e, _) = v.embeddings();
    TRACK.store(false, Ordering::SeqCst);
    assert_eq!(
        g.len() + dm.len() + e.len(),
        2 * d.inter * d.hidden + d.vocab * d.hidden
    );

    let largest = LARGEST.load(Ordering::SeqCst);
    let total = TOTAL.load(Ordering::SeqCst);
    eprintln!("open + views: largest allocation {largest} B, total {total} B; weights {weights} B");
    assert!(weights > 10_000_000, "test model too small: {weights} B");
    assert!(
        largest < smallest_matrix / 4,
        "largest allocation {largest} B during open"
    );
    assert!(
        total < (weights / 50) as usize,
        "allocated {total} B in total during open"
    );
}
