//! GGUF parsing of synthetic files: every value type, and every kind of corruption yields a
//! specific `ModelError::BadGguf` naming the file (never a panic).

mod gguf_common;

use gguf_common::{model_path, Writer, SMOLLM2};
use infer_models::gguf::{GgufArray, GgufFile, GgufValue};
use infer_models::ModelError;
use infer_quant::QuantFormat;

/// Open `bytes` as a GGUF and return the BadGguf message, asserting it names the file.
fn bad_msg(bytes: &[u8]) -> String {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
    match GgufFile::open(f.path()) {
        Err(ModelError::BadGguf { path, msg }) => {
            assert_eq!(path, f.path());
            msg
        }
        Err(e) => panic!("expected BadGguf, got {e}"),
        Ok(_) => panic!("corrupt file parsed"),
    }
}

fn assert_bad(bytes: &[u8], want: &str) {
    let msg = bad_msg(bytes);
    assert!(msg.contains(want), "message {msg:?} lacks {want:?}");
}

/// A valid file with one F32 tensor `t` of 8 values at offset 0.
fn one_tensor(offset: u64, ty: u32, dims: &[u64]) -> Writer {
    let mut w = Writer::new(3, 1, 1);
    w.kv_str("general.architecture", "llama");
    w.tensor("t", dims, ty, offset).pad(32);
    w.bytes(
        &(0..8)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect::<Vec<_>>(),
    );
    w
}

#[test]
fn every_value_type_parses() {
    let mut w = Writer::new(2, 1, 15);
    w.str("u8").u32(0).bytes(&[200]);
    w.str("i8").u32(1).bytes(&[0xFF]);
    w.str("u16").u32(2).bytes(&513u16.to_le_bytes());
    w.str("i16").u32(3).bytes(&(-2i16).to_le_bytes());
    w.kv_u32("u32", 70_000);
    w.str("i32").u32(5).bytes(&(-5i32).to_le_bytes());
    w.str("f32").u32(6).bytes(&1.5f32.to_le_bytes());
    w.str("bool").u32(7).bytes(&[1]);
    w.kv_str("str", "héllo");
    w.str("u64").u32(10).u64(1 << 40);
    w.str("i64").u32(11).bytes(&(-7i64).to_le_bytes());
    w.str("f64").u32(12).bytes(&0.25f64.to_le_bytes());
    w.str("arr").u32(9).u32(8).u64(2).str("a").str("bc");
    // Array of two arrays of i32: [[1, 2], [3]].
    w.str("nested").u32(9).u32(9).u64(2);
    w.u32(5)
        .u64(2)
        .bytes(&1i32.to_le_bytes())
        .bytes(&2i32.to_le_bytes());
    w.u32(5).u64(1).bytes(&3i32.to_le_bytes());
    w.kv_u32("general.alignment", 64);
    w.tensor("w", &[32, 2], 2, 0).pad(64);
    let data: Vec<u8> = (0..36).map(|i| i as u8).collect();
    w.bytes(&data);
    let f = w.file();
    let g = GgufFile::open(f.path()).unwrap();
    assert_eq!(g.version(), 2);
    assert_eq!(g.metadata("u8"), Some(&GgufValue::U8(200)));
    assert_eq!(g.metadata("i8"), Some(&GgufValue::I8(-1)));
    assert_eq!(g.metadata("u16"), Some(&GgufValue::U16(513)));
    assert_eq!(g.metadata("i16"), Some(&GgufValue::I16(-2)));
    assert_eq!(g.get_u32("u32"), Some(70_000));
    assert_eq!(g.get_i64("i32"), Some(-5));
    assert_eq!(g.get_u32("i32"), None, "negative is not a u32");
    assert_eq!(g.get_f32("f32"), Some(1.5));
    assert_eq!(g.get_bool("bool"), Some(true));
    assert_eq!(g.get_str("str"), Some("héllo"));
    assert_eq!(g.get_u64("u64"), Some(1 << 40));
    assert_eq!(g.get_u32("u64"), None, "too large for u32");
    assert_eq!(g.get_i64("i64"), Some(-7));
    assert_eq!(g.get_f64("f64"), Some(0.25));
    assert_eq!(g.get_str_array("arr").unwrap(), ["a", "bc"]);
    assert_eq!(
        g.get_array("nested"),
        Some(&GgufArray::Array(vec![
            GgufArray::I32(vec![1, 2]),
            GgufArray::I32(vec![3])
        ]))
    );
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_start() % 64, 0);
    let t = g.tensor_info("w").unwrap();
    assert_eq!(
        (t.format, t.hf_shape(), t.n_bytes),
        (QuantFormat::Q4_0, vec![2, 32], 36)
    );
    assert_eq!(g.tensor_bytes("w").unwrap(), &data[..]);
    assert!(matches!(
        g.tensor_bytes("nope"),
        Err(ModelError::NoSuchTensor { .. })
    ));
}

#[test]
fn bad_magic_and_versions() {
    let mut w = one_tensor(0, 0, &[8]);
    w.buf[0] = b'X';
    assert_bad(&w.buf, "bad magic");
    let mut w = one_tensor(0, 0, &[8]);
    w.buf[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_bad(&w.buf, "version 1");
    w.buf[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_bad(&w.buf, "big-endian");
    w.buf[4..8].copy_from_slice(&9u32.to_le_bytes());
    assert_bad(&w.buf, "unsupported GGUF version 9");
}

#[test]
fn absurd_counts() {
    let mut w = one_tensor(0, 0, &[8]);
    w.buf[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert_bad(&w.buf, "metadata kv count");
    let mut w = one_tensor(0, 0, &[8]);
    w.buf[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert_bad(&w.buf, "tensor count");
    // An array claiming 2^40 u32 elements.
    let mut w = Writer::new(3, 0, 1);
    w.str("a").u32(9).u32(4).u64(1 << 40).u32(1);
    assert_bad(&w.buf, "array count 1099511627776");
    // Nesting deeper than 8.
    let mut w = Writer::new(3, 0, 1);
    w.str("deep").u32(9);
    for _ in 0..10 {
        w.u32(9).u64(1);
    }
    assert_bad(&w.buf, "nested deeper");
}

#[test]
fn strings_past_eof() {
    let mut w = Writer::new(3, 0, 1);
    w.u64(1 << 40).bytes(b"key-and-some-more-bytes");
    assert_bad(&w.buf, "string length 1099511627776");
    let mut w = Writer::new(3, 0, 1);
    w.str("k").u32(8).u64(100).bytes(b"short");
    assert_bad(&w.buf, "runs past the end");
    let mut w = Writer::new(3, 0, 1);
    w.str("k").u32(8).u64(2).bytes(&[0xC3, 0x28]);
    assert_bad(&w.buf, "not UTF-8");
}

#[test]
fn bad_values_and_tensor_infos() {
    let mut w = Writer::new(3, 0, 1);
    w.str("k").u32(42).u32(0);
    assert_bad(&w.buf, "unknown value type 42");
    let mut w = Writer::new(3, 0, 1);
    w.str("b").u32(7).bytes(&[2]);
    assert_bad(&w.buf, "bool byte is 2");
    let mut w = Writer::new(3, 0, 2);
    w.kv_u32("k", 1).kv_u32("k", 2);
    assert_bad(&w.buf, "duplicate metadata key 'k'");
    let mut w = Writer::new(3, 0, 1);
    w.kv_u32("general.alignment", 24);
    assert_bad(&w.buf, "general.alignment");
    assert_bad(&one_tensor(0, 99, &[8]).buf, "unknown ggml type 99");
    assert_bad(
        &one_tensor(0, 39, &[32]).buf,
        "unknown ggml type 39 (MXFP4, gpt-oss's expert format",
    );
    assert_bad(
        &one_tensor(4, 0, &[8]).buf,
        "not a multiple of the alignment 32",
    );
    assert_bad(&one_tensor(0, 0, &[1, 1, 1, 1, 8]).buf, "5 dimensions");
    assert_bad(
        &one_tensor(0, 2, &[8]).buf,
        "row length 8 is not a multiple",
    );
    assert_bad(&one_tensor(0, 0, &[1 << 40, 1 << 40]).buf, "overflow");
}

#[test]
fn tensor_data_past_eof() {
    // Valid at offset 0 (32 bytes of data present) …
    let w = one_tensor(0, 0, &[8]);
    let f = w.file();
    assert_eq!(
        GgufFile::open(f.path())
            .unwrap()
            .tensor_bytes("t")
            .unwrap()
            .len(),
        32
    );
    // … but not at offset 32 (the first tensor starts the data section), nor with 9 values.
    assert_bad(
        &one_tensor(32, 0, &[8]).buf,
        "tensor 't' has offset 32, expected 0",
    );
    assert_bad(&one_tensor(0, 0, &[9]).buf, "runs past the end of the file");
}

/// Prefixes of the real SmolLM2 GGUF: each cut point fails with its own message.
#[test]
fn truncated_real_gguf() {
    let bytes = std::fs::read(model_path(SMOLLM2)).unwrap();
    let g = GgufFile::open(&model_path(SMOLLM2)).unwrap();
    let ds = g.data_start();
    assert_bad(&bytes[..0], "shorter than the 24-byte GGUF header");
    assert_bad(&bytes[..20], "shorter than the 24-byte GGUF header");
    assert_bad(&bytes[..30], "metadata kv count 33 is impossible");
    assert_bad(&bytes[..1_000], "tensor count 272 is impossible");
    assert_bad(
        &bytes[..200_000],
        "'tokenizer.ggml.tokens': array count 49152",
    );
    assert_bad(&bytes[..1_500_000], "truncated: tokenizer.ggml.merges");
    assert_bad(&bytes[..ds - 100], "runs past the end of the file");
    for cut in (24..ds).step_by(9973) {
        let msg = bad_msg(&bytes[..cut]);
        assert!(
            ["truncated", "past the end of the file"]
                .iter()
                .any(|w| msg.contains(w)),
            "cut at {cut}: {msg}"
        );
    }
    // Header complete, data cut short: the last tensors run past the end.
    let msg = bad_msg(&bytes[..ds + 1000]);
    assert!(msg.contains("runs past the end of the file"), "{msg}");
    assert!(msg.contains("tensor '"), "{msg}");
    // Patch the last tensor info's offset to point past the file end.
    let last = g.tensor_infos().iter().max_by_key(|t| t.offset).unwrap();
    let off = (last.offset as u64).to_le_bytes();
    let pos = bytes[..ds]
        .windows(8)
        .rposition(|w| w == off)
        .expect("offset field of the last tensor");
    let mut patched = bytes.clone();
    patched[pos..pos + 8].copy_from_slice(&(bytes.len() as u64).next_multiple_of(32).to_le_bytes());
    // (Past the previous tensors' end, so the layout check names it first.)
    assert_bad(
        &patched,
        &format!(
            "tensor '{}' has offset {}",
            last.name,
            bytes.len().next_multiple_of(32)
        ),
    );
}

/// Issue 15 bug 6: a tensor whose data overlaps the one before it was accepted by
/// `GgufFile::open` (so by inspect and extract) although the writer (`synth`) refused the same
/// layout. Every reader now applies the one layout check (llama.cpp's running offsets).
#[test]
fn overlapping_gguf_tensor_data_is_refused_by_every_reader() {
    // Two F32 tensors of 8 values (32 bytes each): `b` at offset 0 shares `a`'s bytes.
    let two = |b_offset: u64| {
        let mut w = Writer::new(3, 2, 1);
        w.kv_str("general.architecture", "llama");
        w.tensor("a", &[8], 0, 0);
        w.tensor("b", &[8], 0, b_offset).pad(32);
        w.bytes(&[0u8; 96]);
        w
    };
    let overlap = two(0).file();
    let gap = two(64).file();
    let fine = two(32).file();
    for (f, want) in [
        (&overlap, "tensor 'b' has offset 0, expected 32"),
        (&overlap, "overlaps the tensors before it"),
        (&gap, "tensor 'b' has offset 64, expected 32"),
    ] {
        for e in [
            GgufFile::open(f.path()).unwrap_err(),
            infer_models::gguf::GgufHeader::read(f.path()).unwrap_err(),
        ] {
            let ModelError::BadGguf { path, msg } = e else {
                panic!("expected BadGguf, got {e}")
            };
            assert_eq!(path, f.path());
            assert!(msg.contains(want), "message {msg:?} lacks {want:?}");
        }
    }
    let g = GgufFile::open(fine.path()).unwrap();
    assert_eq!(g.tensor_infos()[1].offset, 32);
}
