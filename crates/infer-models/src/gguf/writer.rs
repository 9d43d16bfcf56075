//! GGUF v2/v3 writer: [`encode_header`] serialises a [`GgufHeader`]; [`GgufWriter`] streams the
//! tensor data after it.
//!
//! Layout as ggml `gguf_write_to_buf` (`ggml/src/gguf.cpp`, `docs/gguf.md`), little-endian:
//! `"GGUF"` · u32 version · u64 tensor_count · u64 kv_count · kv pairs (u64-length string key,
//! u32 value type, value; arrays: u32 element type, u64 count, elements) · tensor infos (string
//! name, u32 n_dims, u64 dims fastest-first, u32 ggml type, u64 offset) · zero padding to the
//! alignment · data, each tensor at `data_start + offset` and zero-padded to the alignment.
//! Re-encoding a header read by [`GgufHeader::read`] gives the original header bytes.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{GgufArray, GgufHeader, GgufTensorInfo, GgufValue};
use crate::ModelError;

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => b.push(*x),
        GgufValue::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => b.push(u8::from(*x)),
        GgufValue::String(s) => put_str(b, s),
        GgufValue::Array(a) => put_array(b, a),
        GgufValue::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Element type, count, elements (a nested array element repeats the same layout).
fn put_array(b: &mut Vec<u8>, a: &GgufArray) {
    b.extend_from_slice(&a.type_id().to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T>(b: &mut Vec<u8>, v: &[T], f: impl Fn(&mut Vec<u8>, &T)) {
        for x in v {
            f(b, x);
        }
    }
    match a {
        GgufArray::U8(v) => b.extend_from_slice(v),
        GgufArray::I8(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::U16(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I16(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::U32(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I32(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F32(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::Bool(v) => each(b, v, |b, x| b.push(u8::from(*x))),
        GgufArray::String(v) => each(b, v, |b, s| put_str(b, s)),
        GgufArray::Array(v) => each(b, v, put_array),
        GgufArray::U64(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I64(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F64(v) => each(b, v, |b, x| b.extend_from_slice(&x.to_le_bytes())),
    }
}

/// Check what the encoder relies on: version 2/3, a power-of-two alignment that matches
/// `general.alignment` when present, dims whose product is the tensor's byte count, and each
/// tensor's offset equal to the sum of the previous tensors' sizes padded to the alignment
/// (what llama.cpp's `gguf_init_from_file` requires; so the data section is exactly as long as
/// its tensors and a corrupt offset cannot ask for terabytes of padding).
fn validate(h: &GgufHeader, path: &Path) -> Result<(), ModelError> {
    let bad = |msg: String| ModelError::BadGguf {
        path: path.to_path_buf(),
        msg,
    };
    if !matches!(h.version, 2 | 3) {
        return Err(bad(format!("cannot write GGUF version {}", h.version)));
    }
    if !h.alignment.is_power_of_two() {
        return Err(bad(format!(
            "alignment {} is not a power of two",
            h.alignment
        )));
    }
    match h.metadata.iter().find(|(k, _)| k == "general.alignment") {
        Some((_, GgufValue::U32(a))) if *a as usize == h.alignment => {}
        None if h.alignment == super::DEFAULT_ALIGNMENT => {}
        other => {
            return Err(bad(format!(
                "alignment {} disagrees with general.alignment {:?}",
                h.alignment,
                other.map(|(_, v)| v)
            )))
        }
    }
    for t in &h.tensors {
        let n = t.dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let expected = n.and_then(|n| t.format.bytes_for(n).ok());
        if t.format.ggml_type_id().is_none() {
            return Err(bad(format!(
                "tensor '{}': {} is infer's own layout, not a ggml type (write its row format)",
                t.name, t.format
            )));
        }
        if expected != Some(t.n_bytes) || t.dims.is_empty() {
            return Err(bad(format!(
                "tensor '{}': dims {:?} of {} do not give its {} bytes",
                t.name, t.dims, t.format, t.n_bytes
            )));
        }
    }
    super::file::check_offsets(path, &h.tensors, h.alignment)?;
    Ok(())
}

/// The header bytes of `h` (magic through the last tensor info, without the padding to the
/// alignment). `path` names the file in errors.
///
/// Errors: [`ModelError::BadGguf`] when `h` is inconsistent (version not 2/3, alignment not a
/// power of two or different from `general.alignment`, a tensor whose dims do not give its
/// byte count or whose format has no ggml type id (Q4_0x16), a tensor whose offset is not the previous tensors' padded sizes: "tensor 'NAME'
/// has offset X, expected Y").
pub fn encode_header(h: &GgufHeader, path: &Path) -> Result<Vec<u8>, ModelError> {
    validate(h, path)?;
    let mut b = Vec::with_capacity(1 << 20);
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&h.version.to_le_bytes());
    b.extend_from_slice(&(h.tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(h.metadata.len() as u64).to_le_bytes());
    for (k, v) in &h.metadata {
        put_str(&mut b, k);
        b.extend_from_slice(&v.type_id().to_le_bytes());
        put_value(&mut b, v);
    }
    for t in &h.tensors {
        put_str(&mut b, &t.name);
        b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for &d in &t.dims {
            b.extend_from_slice(&(d as u64).to_le_bytes());
        }
        // Checked by `validate`: every format written has a ggml type id.
        let id = t.format.ggml_type_id().unwrap_or(u32::MAX);
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&(t.offset as u64).to_le_bytes());
    }
    Ok(b)
}

/// Streams a GGUF file: the header at [`GgufWriter::new`], then the tensors' data in table
/// order through [`GgufWriter::write_data`] (any chunking), then [`GgufWriter::finish`].
/// Padding between tensors and after the last one is written here (zeros, as ggml).
pub struct GgufWriter<W: Write> {
    out: W,
    path: PathBuf,
    tensors: Vec<GgufTensorInfo>,
    alignment: usize,
    /// Index of the tensor being written.
    next: usize,
    /// Bytes of the current tensor written so far.
    done: usize,
    /// Bytes of the data section written so far (padding included).
    pos: usize,
}

fn io_err(path: &Path, e: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

impl<W: Write> GgufWriter<W> {
    /// Write `h`'s header and the padding to the data section into `out`; `path` names the
    /// output in errors. Errors: those of [`encode_header`], [`ModelError::Io`] on write failure.
    pub fn new(mut out: W, h: &GgufHeader, path: &Path) -> Result<Self, ModelError> {
        let mut head = encode_header(h, path)?;
        head.resize(head.len().div_ceil(h.alignment) * h.alignment, 0);
        out.write_all(&head).map_err(|e| io_err(path, e))?;
        Ok(GgufWriter {
            out,
            path: path.to_path_buf(),
            tensors: h.tensors.clone(),
            alignment: h.alignment,
            next: 0,
            done: 0,
            pos: 0,
        })
    }

    /// The tensor whose data [`GgufWriter::write_data`] expects next, `None` when all are written.
    pub fn next_tensor(&self) -> Option<&GgufTensorInfo> {
        self.tensors.get(self.next)
    }

    fn pad_to(&mut self, target: usize) -> Result<(), ModelError> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while self.pos < target {
            let n = (target - self.pos).min(ZEROS.len());
            self.out
                .write_all(&ZEROS[..n])
                .map_err(|e| io_err(&self.path, e))?;
            self.pos += n;
        }
        Ok(())
    }

    /// Append `bytes` (ggml blocks of the format in the tensor table) to the current tensor; a
    /// tensor is complete after exactly its `n_bytes`, and the next call continues with the next
    /// tensor. Errors: [`ModelError::BadGguf`] when `bytes` runs past the current tensor or all
    /// tensors are written; [`ModelError::Io`] on write failure.
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<(), ModelError> {
        while !bytes.is_empty() {
            let Some(t) = self.tensors.get(self.next) else {
                return Err(ModelError::BadGguf {
                    path: self.path.clone(),
                    msg: format!("{} bytes of data after the last tensor", bytes.len()),
                });
            };
            let (offset, size) = (t.offset, t.n_bytes);
            if self.done == 0 {
                self.pad_to(offset)?;
            }
            let n = bytes.len().min(size - self.done);
            self.out
                .write_all(&bytes[..n])
                .map_err(|e| io_err(&self.path, e))?;
            self.pos += n;
            self.done += n;
            bytes = &bytes[n..];
            if self.done == size {
                self.next += 1;
                self.done = 0;
            }
        }
        // Zero-sized tensors are complete without data.
        while self
            .tensors
            .get(self.next)
            .is_some_and(|t| t.n_bytes == 0 && self.done == 0)
        {
            self.next += 1;
        }
        Ok(())
    }

    /// Pad the data section to the alignment, flush and return the output.
    /// Errors: [`ModelError::BadGguf`] naming the first tensor whose data is missing or short;
    /// [`ModelError::Io`] on write failure.
    pub fn finish(mut self) -> Result<W, ModelError> {
        if let Some(t) = self.tensors.get(self.next) {
            return Err(ModelError::BadGguf {
                path: self.path.clone(),
                msg: format!(
                    "tensor '{}': {} of {} bytes written",
                    t.name, self.done, t.n_bytes
                ),
            });
        }
        let end = self.pos.div_ceil(self.alignment) * self.alignment;
        self.pad_to(end)?;
        self.out.flush().map_err(|e| io_err(&self.path, e))?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use infer_quant::QuantFormat;

    fn info(name: &str, dims: &[usize], format: QuantFormat, offset: usize) -> GgufTensorInfo {
        let n: usize = dims.iter().product();
        GgufTensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            format,
            offset,
            n_bytes: format.bytes_for(n).unwrap(),
        }
    }

    /// Every value type (nested arrays included) and a non-default alignment.
    fn header() -> GgufHeader {
        GgufHeader {
            version: 3,
            metadata: vec![
                (
                    "general.architecture".into(),
                    GgufValue::String("llama".into()),
                ),
                ("general.alignment".into(), GgufValue::U32(64)),
                ("a.u8".into(), GgufValue::U8(7)),
                ("a.i8".into(), GgufValue::I8(-7)),
                ("a.u16".into(), GgufValue::U16(65535)),
                ("a.i16".into(), GgufValue::I16(-300)),
                ("a.i32".into(), GgufValue::I32(-70000)),
                ("a.f32".into(), GgufValue::F32(1.5e-5)),
                ("a.bool".into(), GgufValue::Bool(true)),
                ("a.u64".into(), GgufValue::U64(1 << 40)),
                ("a.i64".into(), GgufValue::I64(-(1 << 40))),
                ("a.f64".into(), GgufValue::F64(-2.25)),
                (
                    "a.strs".into(),
                    GgufValue::Array(GgufArray::String(vec!["x".into(), "".into(), "é".into()])),
                ),
                (
                    "a.nested".into(),
                    GgufValue::Array(GgufArray::Array(vec![
                        GgufArray::I32(vec![1, -2]),
                        GgufArray::F32(vec![]),
                        GgufArray::Bool(vec![false, true]),
                    ])),
                ),
            ],
            tensors: vec![
                info("blk.0.attn_norm.weight", &[64], QuantFormat::F32, 0),
                info("blk.0.attn_q.weight", &[256, 3], QuantFormat::Q4_K, 256),
                info("token_embd.weight", &[32, 5], QuantFormat::Q8_0, 704),
            ],
            alignment: 64,
        }
    }

    fn write_all(h: &GgufHeader, path: &Path, chunk: usize) -> Vec<Vec<u8>> {
        let f = std::fs::File::create(path).unwrap();
        let mut w = GgufWriter::new(f, h, path).unwrap();
        let mut datas = Vec::new();
        for (i, t) in h.tensors.iter().enumerate() {
            let d: Vec<u8> = (0..t.n_bytes).map(|j| (i * 31 + j * 7) as u8).collect();
            for c in d.chunks(chunk) {
                w.write_data(c).unwrap();
            }
            datas.push(d);
        }
        w.finish().unwrap();
        datas
    }

    /// Written file reads back (header, metadata with types, tensor bytes), with ggml padding;
    /// the header re-encodes to the same bytes; a header-only cut reads back equal.
    #[test]
    fn round_trip_through_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let h = header();
        let datas = write_all(&h, &path, 100);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(GgufHeader::from_file(&f), h);
        for (t, d) in h.tensors.iter().zip(&datas) {
            assert_eq!(f.tensor_bytes(&t.name).unwrap(), &d[..], "{}", t.name);
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(f.data_start() % 64, 0);
        assert_eq!(bytes.len(), f.data_start() + h.data_len());
        assert_eq!(h.data_len(), 896); // 704 + 170 bytes, padded to 64
        let head = encode_header(&h, &path).unwrap();
        assert_eq!(&bytes[..head.len()], &head[..]);
        assert!(bytes[head.len()..f.data_start()].iter().all(|&b| b == 0));

        let cut = dir.path().join("head.gguf");
        std::fs::write(&cut, &head).unwrap();
        assert_eq!(GgufHeader::read(&cut).unwrap(), h);
        let e = GgufFile::open(&cut).unwrap_err().to_string();
        assert!(e.contains("runs past the end"), "{e}");
        let short = dir.path().join("short.gguf");
        std::fs::write(&short, &head[..head.len() - 3]).unwrap();
        let e = GgufHeader::read(&short).unwrap_err().to_string();
        assert!(e.contains("short.gguf") && e.contains("truncated"), "{e}");
    }

    #[test]
    fn rejects_inconsistent_headers_and_wrong_data_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.gguf");
        let mut h = header();
        h.tensors[2].offset = 256; // overlaps the Q4_K tensor
        let e = encode_header(&h, &path).unwrap_err().to_string();
        assert!(
            e.contains("tensor 'token_embd.weight' has offset 256, expected 704"),
            "{e}"
        );
        // Aligned but past the end of the previous tensor (a hole of 2^40 bytes of padding).
        let mut h = header();
        h.tensors[2].offset = 1 << 40;
        let e = encode_header(&h, &path).unwrap_err().to_string();
        assert!(
            e.contains("has offset 1099511627776, expected 704") && e.contains("bad.gguf"),
            "{e}"
        );
        let mut h = header();
        h.tensors[0].offset = 64; // aligned, but the first tensor starts at 0
        let e = encode_header(&h, &path).unwrap_err().to_string();
        assert!(
            e.contains("attn_norm.weight' has offset 64, expected 0"),
            "{e}"
        );
        let mut h = header();
        h.alignment = 32; // general.alignment says 64
        assert!(encode_header(&h, &path).is_err());
        let mut h = header();
        h.tensors[1].n_bytes += 1;
        let e = encode_header(&h, &path).unwrap_err().to_string();
        assert!(e.contains("attn_q"), "{e}");

        let h = header();
        let mut w = GgufWriter::new(Vec::new(), &h, &path).unwrap();
        w.write_data(&[0u8; 256]).unwrap();
        assert_eq!(w.next_tensor().unwrap().name, "blk.0.attn_q.weight");
        w.write_data(&[0u8; 10]).unwrap();
        let e = w.finish().err().unwrap().to_string();
        assert!(e.contains("attn_q") && e.contains("10 of 432"), "{e}");
        let mut w = GgufWriter::new(Vec::new(), &h, &path).unwrap();
        let total: usize = h.tensors.iter().map(|t| t.n_bytes).sum();
        let e = w.write_data(&vec![0u8; total + 1]).unwrap_err().to_string();
        assert!(e.contains("after the last tensor"), "{e}");
    }
}
