//! Replay suite: the malformed GGUFs of public llama.cpp / ggml (and other GGUF readers')
//! advisories and issues, crafted byte by byte. Each must be refused by every reader
//! (`GgufFile::open`, `GgufHeader::read`) with a `BadGguf` error naming the file and the problem
//! — never a panic, an out-of-bounds read or an allocation sized by the lie. A counting
//! allocator checks the last: while a crafted file is parsed, no single allocation may exceed
//! [`ALLOC_LIMIT`] (the files here are at most a few hundred bytes, or sparse).
//!
//! Sources are cited per case: CVE ids (NVD / Cisco Talos descriptions), GitHub security
//! advisories (GHSA) and issue / pull-request URLs.

mod gguf_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use gguf_common::Writer;
use infer_models::gguf::{config_from_gguf, tokenizer_json_from_gguf, GgufFile, GgufHeader};
use infer_models::{ModelConfig, ModelError};

/// Largest single allocation allowed while a crafted file is parsed.
const ALLOC_LIMIT: usize = 16 << 20;

/// Records the largest allocation of the current thread (tests run on several threads).
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call forwards to the system allocator unchanged; the thread-local bookkeeping
// is a `Cell<usize>` with a const initialiser, so it never allocates (no recursion).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        // SAFETY: `ptr` came from `System.alloc` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Run `f` and return its result with the largest allocation it made on this thread.
fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let r = f();
    (r, LARGEST.with(Cell::get))
}

/// Write `bytes` to a temp file; both readers must refuse it with a `BadGguf` naming the file
/// whose message contains `want`, allocating at most [`ALLOC_LIMIT`] at once. Returns the message.
fn refused(bytes: &[u8], want: &str) -> String {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    refused_at(f.path(), want)
}

/// As [`refused`] for a lie only the tensor data reveals: `GgufFile::open` must refuse it,
/// while `GgufHeader::read` (which by design accepts a file cut after its tensor table, as
/// `infer synth --header-only` writes) must accept it without reading any data.
fn refused_by_open(bytes: &[u8], want: &str) -> String {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    let (header, big) = largest_alloc(|| GgufHeader::read(f.path()).map(|_| ()));
    assert!(
        big <= ALLOC_LIMIT,
        "GgufHeader::read allocated {big} bytes at once"
    );
    header.expect("the header alone is well-formed");
    let (open, big) = largest_alloc(|| GgufFile::open(f.path()).map(|_| ()));
    assert!(
        big <= ALLOC_LIMIT,
        "GgufFile::open allocated {big} bytes at once"
    );
    match open {
        Err(ModelError::BadGguf { path, msg }) => {
            assert_eq!(path, f.path(), "the error names the file");
            assert!(msg.contains(want), "message {msg:?} lacks {want:?}");
            msg
        }
        Err(e) => panic!("expected BadGguf ({want}), got {e}"),
        Ok(()) => panic!("crafted file accepted (expected: {want})"),
    }
}

fn refused_at(path: &Path, want: &str) -> String {
    let (open, big) = largest_alloc(|| GgufFile::open(path).map(|_| ()));
    assert!(
        big <= ALLOC_LIMIT,
        "GgufFile::open allocated {big} bytes at once"
    );
    let (header, big) = largest_alloc(|| GgufHeader::read(path).map(|_| ()));
    assert!(
        big <= ALLOC_LIMIT,
        "GgufHeader::read allocated {big} bytes at once"
    );
    let mut msgs = Vec::new();
    for r in [open, header] {
        match r {
            Err(ModelError::BadGguf { path: p, msg }) => {
                assert_eq!(p, path, "the error names the file");
                assert!(msg.contains(want), "message {msg:?} lacks {want:?}");
                msgs.push(msg);
            }
            Err(e) => panic!("expected BadGguf ({want}), got {e}"),
            Ok(()) => panic!("crafted file accepted (expected: {want})"),
        }
    }
    msgs.swap_remove(0)
}

/// A header claiming `n_tensors` tensors and `n_kv` kv pairs, followed by `tail`.
fn header(n_tensors: u64, n_kv: u64) -> Writer {
    Writer::new(3, n_tensors, n_kv)
}

/// One well-formed kv pair so later fields are reached.
fn arch(w: &mut Writer) -> &mut Writer {
    w.kv_str("general.architecture", "llama")
}

// --- counts --------------------------------------------------------------------------------

/// CVE-2024-23605 (Talos; "heap-based buffer overflow in the GGUF library header.n_kv
/// functionality", CWE-190): `n_kv` times the kv struct size wrapped around, so a tiny array was
/// allocated and then written past. Also ollama/ollama#17042 (unbounded allocation in the GGUF
/// metadata parser from a tiny file) and gguf-py's hang on a 2^63 count
/// (https://github.com/ggml-org/llama.cpp/pull/27188).
#[test]
fn huge_kv_count_cve_2024_23605() {
    for n in [u64::MAX, u64::MAX / 48 + 1, 1 << 63, 1 << 40] {
        let mut w = header(0, n);
        arch(&mut w);
        refused(&w.buf, "metadata kv count");
    }
}

/// CVE-2024-21836 (Talos; "heap-based buffer overflow in the GGUF library header.n_tensors
/// functionality"): `n_tensors` times the tensor-info size wrapped; also
/// https://github.com/ggml-org/llama.cpp/issues/15711 (`n_tensors * ggml_tensor_overhead()`
/// overflows although `n_tensors` passed its own bound).
#[test]
fn huge_tensor_count_cve_2024_21836() {
    for n in [u64::MAX, 1 << 63, (u64::MAX / 368) + 1, 1 << 40] {
        let mut w = header(n, 1);
        arch(&mut w);
        refused(&w.buf, "tensor count");
    }
}

/// A count that fits the file size still reserves nothing in proportion to it: a 64 MiB
/// sparse file (zeros after the header) claiming 64 MiB / 13 kv pairs used to reserve ~5 M
/// entries (hundreds of MB) before the second (duplicate, empty) key failed
/// (ollama/ollama#17042's class of bug).
#[test]
fn count_bounded_by_a_large_file_reserves_little() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let len: u64 = 64 << 20;
    let w = header(0, (len - 24) / 13);
    std::fs::write(f.path(), &w.buf).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(f.path())
        .unwrap()
        .set_len(len)
        .unwrap();
    refused_at(f.path(), "empty key");
}

// --- strings -------------------------------------------------------------------------------

/// CVE-2024-23496 (Talos; heap-based buffer overflow in `gguf_fread_str`: a string length of
/// 2^64-1 made `len + 1` wrap to 0 before the copy) and the string exhaustion fixed in
/// https://github.com/ggml-org/llama.cpp/pull/19856 ("prevent string exhaustion").
#[test]
fn string_length_overflow_cve_2024_23496() {
    for n in [u64::MAX, u64::MAX - 1, 1 << 63, 1 << 40] {
        let mut w = header(0, 1);
        w.u64(n).bytes(b"general.architecture");
        refused(&w.buf, &format!("string length {n}"));
    }
    // The same lie in a value and in a tensor name.
    let mut w = header(0, 1);
    w.str("general.name").u32(8).u64(u64::MAX).bytes(b"abc");
    refused(&w.buf, "runs past the end of the file");
    let mut w = header(1, 1);
    arch(&mut w).u64(u64::MAX).bytes(b"token_embd.weight");
    refused(&w.buf, "name of tensor info 0");
}

/// CVE-2024-21825 (Talos; heap-based buffer overflow in the GGUF_TYPE_ARRAY / GGUF_TYPE_STRING
/// parsing): an array count times the element size wrapped. Also "prevent array elements
/// exhaustion" (https://github.com/ggml-org/llama.cpp/pull/19856) and gguf-py's 2^63-element
/// array (https://github.com/ggml-org/llama.cpp/pull/27188).
#[test]
fn array_count_overflow_cve_2024_21825() {
    for (elem, n) in [
        (8u32, u64::MAX),       // strings
        (8, u64::MAX / 8 + 1),  // count × 8 wraps to a small number
        (6, 1 << 62),           // f32: count × 4 wraps to 0
        (0, 1 << 63),           // u8
        (9, u64::MAX / 24 + 1), // arrays
        (12, 1 << 61),          // f64: count × 8 wraps to 0
    ] {
        let mut w = header(0, 1);
        w.str("tokenizer.ggml.tokens")
            .u32(9)
            .u32(elem)
            .u64(n)
            .str("a");
        refused(&w.buf, "array count");
    }
    // An array whose element type is unknown.
    let mut w = header(0, 1);
    w.str("a").u32(9).u32(13).u64(1).u32(0);
    refused(&w.buf, "unknown array element type 13");
}

/// Arrays of arrays: ggml's `gguf.cpp` does not read nested arrays at all; infer reads them (a
/// real file uses at most 2 levels) but bounds the depth, so a file of nested one-element
/// arrays cannot recurse without limit, and counts at every level are bounded by the bytes left.
/// (Nested-array element counts: gguf-py https://github.com/ggml-org/llama.cpp/pull/27188,
/// "nested array length 2^62".)
#[test]
fn array_of_arrays_is_bounded() {
    let mut w = header(0, 1);
    w.str("deep").u32(9);
    for _ in 0..10_000 {
        w.u32(9).u64(1);
    }
    refused(&w.buf, "nested deeper than 8");
    let mut w = header(0, 1);
    w.str("nested").u32(9).u32(9).u64(1).u32(4).u64(1 << 62);
    refused(&w.buf, "array count 4611686018427387904");
}

// --- tensor infos --------------------------------------------------------------------------

/// A valid single-tensor file: `name` F32 `[8]` at offset 0, 32 bytes of data.
fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64) -> Writer {
    let mut w = header(1, 1);
    arch(&mut w).tensor(name, dims, ty, offset).pad(32);
    w.bytes(&[0u8; 32]);
    w
}

/// CVE-2024-21802 (Talos; heap-based buffer overflow in the GGUF library `info->ne`
/// functionality) and https://github.com/ggml-org/llama.cpp/issues/27203 (`ne = (INT64_MAX, 2,
/// 1, 1)` of I8 makes `ggml_nelements` negative and bypasses the dimension check; infer has no
/// I8 tensors, so the F32 analogue: the element count fits, its bytes do not); also the
/// `2^42 + 1` rows of https://github.com/ggml-org/llama.cpp/pull/18674 (size in bytes wraps) and
/// the `ne[0] = 2^63 - 3` GGML_PAD overflow reported against the CVE-2025-53630 fix.
#[test]
fn dims_whose_product_overflows_cve_2024_21802() {
    let i64_max = i64::MAX as u64;
    refused(&one_tensor("t", &[i64_max, 2, 1, 1], 0, 0).buf, "overflow");
    refused(&one_tensor("t", &[1 << 32, 1 << 32], 0, 0).buf, "overflow");
    refused(
        &one_tensor("t", &[u64::MAX, u64::MAX, u64::MAX, u64::MAX], 0, 0).buf,
        "overflow",
    );
    // Element count fits, bytes (× 4 for F32) do not.
    refused(&one_tensor("t", &[1 << 62, 2], 0, 0).buf, "overflow");
    refused(&one_tensor("t", &[i64_max - 2], 0, 0).buf, "overflow");
    // Q8_0 (type 8, 34 bytes per 32 values): 2^42 + 1 rows of 1152.
    refused_by_open(
        &one_tensor("t", &[1152, (1 << 42) + 1], 8, 0).buf,
        "past the end",
    );
    // Too many dimensions (ggml GGML_MAX_DIMS = 4) and none.
    refused(&one_tensor("t", &[1, 1, 1, 1, 8], 0, 0).buf, "5 dimensions");
    refused(&one_tensor("t", &[], 0, 0).buf, "0 dimensions");
    let mut w = header(1, 1);
    arch(&mut w).str("t").u32(u32::MAX);
    refused(&w.buf, "4294967295 dimensions");
}

/// GHSA-3p4r-fq3f-q74v / CVE-2026-27940 (integer overflow in `gguf_init_from_file_impl`, a bypass
/// of the CVE-2025-53630 fix: each padded tensor size was checked, their sum was not): two
/// tensors of 2^63 bytes each fit `usize` one by one; the running data offset does not.
#[test]
fn tensor_sizes_whose_sum_overflows_ghsa_3p4r_fq3f_q74v() {
    let mut w = header(2, 1);
    arch(&mut w)
        .tensor("a", &[1 << 61], 0, 0)
        .tensor("b", &[1 << 61], 0, 1 << 63)
        .pad(32);
    let msg = refused(&w.buf, "tensor 'b'");
    assert!(
        msg.contains("overflow") || msg.contains("past the end"),
        "{msg}"
    );
}

/// Unknown ggml types: "ggml : fix negative tensor type oob"
/// (https://github.com/ggml-org/llama.cpp/pull/19856) — a type id indexed the type-traits table
/// unchecked; 0xFFFFFFFF read as -1. Removed types (4, 5 = Q4_2/Q4_3) and ids past the table.
#[test]
fn unknown_ggml_types_pr_19856() {
    for ty in [u32::MAX, 4, 5, 40, 99, 1 << 31] {
        refused(
            &one_tensor("t", &[8], ty, 0).buf,
            &format!("unknown ggml type {ty}"),
        );
    }
}

// --- data offsets --------------------------------------------------------------------------

/// Tensor data past the end of the file: CVE-2025-62609 (mlx) and
/// https://github.com/ml-explore/mlx/pull/4179 ("Bound GGUF tensor data offsets against the file
/// mapping"; a crafted offset pointed outside the mapping, or wrapped back inside it).
#[test]
fn tensor_data_past_the_end_mlx_pr_4179() {
    // 9 F32 values need 36 bytes; 32 are there.
    refused_by_open(
        &one_tensor("t", &[9], 0, 0).buf,
        "runs past the end of the file",
    );
    // Data section cut off entirely.
    let mut w = header(1, 1);
    arch(&mut w).tensor("t", &[8], 0, 0);
    refused_by_open(&w.buf, "runs past the end of the file");
}

/// Offsets that wrap or leave gaps: llama.cpp requires each offset to be the running sum of
/// the previous padded sizes ("tensor '%s' has offset %zu, expected %zu", quoted in
/// https://github.com/ggml-org/llama.cpp/pull/18674); an offset near 2^64 would wrap
/// `data_start + offset` back into the file (mlx#4179).
#[test]
fn tensor_offsets_that_wrap_or_leave_gaps() {
    refused(
        &one_tensor("t", &[8], 0, u64::MAX - 31).buf,
        "has offset 18446744073709551584, expected 0",
    );
    refused(
        &one_tensor("t", &[8], 0, u64::MAX).buf,
        "not a multiple of the alignment",
    );
    refused(&one_tensor("t", &[8], 0, 32).buf, "leaves a gap");
}

/// Overlapping tensors: two tensor infos pointing at the same bytes (infer issue 15, bug 6:
/// `GgufFile::open` accepted what the writer refused); every reader applies llama.cpp's
/// running-offset rule.
#[test]
fn overlapping_tensor_data() {
    let mut w = header(2, 1);
    arch(&mut w)
        .tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 0)
        .pad(32);
    w.bytes(&[0u8; 64]);
    refused(&w.buf, "overlaps the tensors before it");
}

/// Misaligned data and hostile alignments: an offset that is not a multiple of
/// `general.alignment`; an alignment that is 0 or not a power of two; a huge power of two
/// (https://github.com/ggml-org/ggml/pull/1516: `general.alignment = 2^30` made padding absurd;
/// the 2^31 PoC crashed llama.cpp with SIGABRT); an alignment stored as another type
/// (https://github.com/ggml-org/llama.cpp/pull/26318: an INT32 alignment hit an assertion).
#[test]
fn misaligned_data_and_bad_alignments() {
    refused(
        &one_tensor("t", &[8], 0, 4).buf,
        "not a multiple of the alignment 32",
    );
    for a in [0u32, 24, 1 << 30, 1 << 31] {
        let mut w = header(0, 1);
        w.kv_u32("general.alignment", a);
        refused(&w.buf, "general.alignment must be a power-of-two u32");
    }
    let mut w = header(0, 1);
    w.str("general.alignment")
        .u32(5)
        .bytes(&32i32.to_le_bytes());
    refused(&w.buf, "general.alignment");
}

// --- names ---------------------------------------------------------------------------------

/// Duplicate tensor names (https://github.com/ggml-org/llama.cpp/issues/6836: models were
/// distributed with two tensors of one name; readers must refuse them) and duplicate keys
/// ("gguf-py : error on duplicate keys when reading", https://github.com/ggml-org/llama.cpp/pull/19856).
#[test]
fn duplicate_tensor_names_issue_6836() {
    let mut w = header(2, 1);
    arch(&mut w)
        .tensor("token_embd.weight", &[8], 0, 0)
        .tensor("token_embd.weight", &[8], 0, 32)
        .pad(32);
    w.bytes(&[0u8; 64]);
    refused(&w.buf, "duplicate tensor name 'token_embd.weight'");
    let mut w = header(0, 2);
    w.kv_u32("llama.block_count", 1)
        .kv_u32("llama.block_count", 2);
    refused(&w.buf, "duplicate metadata key 'llama.block_count'");
}

/// An empty key (https://github.com/ggml-org/llama.cpp/pull/24263: `GGML_ASSERT(!key.empty())`
/// is compiled out of release builds) is refused; so is a zero dimension (the same PR:
/// `INT64_MAX / 0` raised SIGFPE), naming that tensor and its shape, not the offset of the
/// tensor after it (a newcomer's report: a zeroed `blk.0.attn_norm.weight` was blamed on
/// `blk.0.ffn_down.weight`).
#[test]
fn empty_key_and_zero_dimension_pr_24263() {
    let mut w = header(0, 1);
    w.str("").u32(4).u32(1);
    refused(&w.buf, "metadata entry 0 at offset 24 has an empty key");
    let mut w = header(1, 1);
    arch(&mut w).tensor("t", &[0, 8], 0, 0).pad(32);
    refused(
        &w.buf,
        "tensor 't': shape [0, 8] has a zero dimension (a tensor needs at least one element)",
    );
    let mut w = header(2, 1);
    arch(&mut w)
        .tensor("blk.0.attn_norm.weight", &[0], 0, 0)
        .tensor("blk.0.ffn_down.weight", &[8], 0, 32)
        .pad(32);
    w.bytes(&[0u8; 64]);
    let msg = refused(
        &w.buf,
        "tensor 'blk.0.attn_norm.weight': shape [0] has a zero dimension",
    );
    assert!(!msg.contains("ffn_down"), "{msg}");
}

/// Keys and names are shown escaped and cut in messages: a crafted key cannot print terminal
/// escapes, fake lines or megabytes of text into the error.
#[test]
fn hostile_names_are_escaped_in_messages() {
    let mut w = header(0, 2);
    w.kv_u32("k\u{1b}[2J\nfake: ok", 1)
        .kv_u32("k\u{1b}[2J\nfake: ok", 1);
    let msg = refused(&w.buf, "duplicate metadata key");
    assert!(msg.contains("k\\u{1b}[2J\\nfake: ok"), "{msg}");
    assert!(!msg.contains('\u{1b}') && !msg.contains('\n'), "{msg}");
    let long = "x".repeat(100_000);
    let mut w = header(0, 1);
    w.str(&long).u32(42);
    let msg = refused(&w.buf, "unknown value type 42");
    assert!(msg.len() < 400, "{} bytes", msg.len());
}

// --- what the metadata says ----------------------------------------------------------------

/// A GGUF whose metadata reaches `config_from_gguf`'s size reads, with `block_count` = `layers`.
fn llama_config_gguf(layers: u64) -> Writer {
    let mut w = header(0, 6);
    arch(&mut w)
        .kv_u32("llama.embedding_length", 64)
        .str("llama.block_count")
        .u32(10)
        .u64(layers)
        .kv_u32("llama.attention.head_count", 4)
        .kv_u32("llama.feed_forward_length", 128)
        .kv_u32("llama.context_length", 256);
    w
}

/// `block_count` beyond any model (https://github.com/ggml-org/llama.cpp/pull/25821: a
/// `block_count` above LLAMA_MAX_LAYERS wrote past per-layer arrays): refused naming the key
/// before any per-layer table is sized by it.
#[test]
fn absurd_block_count_pr_25821() {
    let w = llama_config_gguf(1 << 40);
    let f = w.file();
    let g = GgufFile::open(f.path()).unwrap();
    let (r, big) = largest_alloc(|| config_from_gguf(&g));
    assert!(big <= ALLOC_LIMIT, "allocated {big} bytes at once");
    match r {
        Err(ModelError::BadField { field, msg, path }) => {
            assert_eq!(path, f.path());
            assert_eq!(field, "llama.block_count");
            assert!(msg.contains("absurdly large"), "{msg}");
        }
        other => panic!("expected BadField, got {other:?}"),
    }
}

/// Tokenizer arrays of the wrong element type (https://github.com/ggml-org/llama.cpp/pull/26690:
/// `tokenizer.ggml.scores` declared as UINT8 was read as 4-byte floats, 3x past the buffer):
/// refused naming the key.
#[test]
fn tokenizer_scores_of_the_wrong_type_pr_26690() {
    let mut w = header(0, 3);
    w.kv_str("tokenizer.ggml.model", "llama");
    w.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(3);
    w.str("a").str("b").str("c");
    w.str("tokenizer.ggml.scores")
        .u32(9)
        .u32(0)
        .u64(3)
        .bytes(&[1, 2, 3]);
    let f = w.file();
    let g = GgufFile::open(f.path()).unwrap();
    match tokenizer_json_from_gguf(&g) {
        Err(e @ ModelError::MissingField { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("tokenizer.ggml.scores") && msg.contains("wrong type"),
                "{msg}"
            );
        }
        other => panic!("expected MissingField, got {other:?}"),
    }
}

/// The same size limits for a Hugging Face `config.json`: a few bytes saying
/// `"num_hidden_layers": 1e12` are refused naming the field, not sized into a table.
#[test]
fn absurd_config_json_sizes_are_refused_naming_the_field() {
    let base = serde_json::json!({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
    });
    for (field, value) in [
        ("num_hidden_layers", serde_json::json!(1_000_000_000_000u64)),
        ("hidden_size", serde_json::json!(1u64 << 40)),
        ("num_attention_heads", serde_json::json!(1u64 << 40)),
        ("vocab_size", serde_json::json!(1u64 << 40)),
        ("intermediate_size", serde_json::json!(1u64 << 40)),
        ("max_position_embeddings", serde_json::json!(1u64 << 40)),
    ] {
        let mut v = base.clone();
        v[field] = value;
        let (r, big) = largest_alloc(|| ModelConfig::from_hf_json(Path::new("/m/config.json"), &v));
        assert!(big <= ALLOC_LIMIT, "{field}: allocated {big} bytes at once");
        let e = r.expect_err(field).to_string();
        assert!(
            e.starts_with("/m/config.json: config field '") && e.contains("absurdly large"),
            "{field}: {e}"
        );
    }
}
