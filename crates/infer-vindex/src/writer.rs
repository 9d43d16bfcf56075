//! [`BinWriter`]: appends tensors to one `.bin` file at [`TENSOR_ALIGN`]-aligned offsets,
//! converting `f32` to the stored format (little-endian) and hashing every byte as it goes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use infer_quant::QuantFormat;
use sha2::{Digest, Sha256};

use crate::hash::hex;
use crate::index::FileHash;
use crate::manifest::{TensorEntry, TENSOR_ALIGN};
use crate::VindexError;

/// Values converted per write call (bounds the conversion buffer to 256 KiB).
const CHUNK: usize = 64 * 1024;

/// One output `.bin` file being written.
pub struct BinWriter {
    name: &'static str,
    path: PathBuf,
    out: BufWriter<File>,
    hasher: Sha256,
    pos: usize,
    entries: Vec<TensorEntry>,
}

impl BinWriter {
    /// Create `dir/name` (truncating). Errors: [`VindexError::Io`] naming the file.
    pub fn create(dir: &Path, name: &'static str) -> Result<Self, VindexError> {
        let path = dir.join(name);
        let file = File::create(&path).map_err(|e| VindexError::io(&path, e))?;
        Ok(BinWriter {
            name,
            path,
            out: BufWriter::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            pos: 0,
            entries: Vec::new(),
        })
    }

    fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), VindexError> {
        self.out
            .write_all(bytes)
            .map_err(|e| VindexError::io(&self.path, e))?;
        self.hasher.update(bytes);
        self.pos += bytes.len();
        Ok(())
    }

    /// Append `data` (row-major, `shape`) as `format` (F32 or F16, little-endian; f16 by
    /// round-to-nearest-even `half::f16::from_f32`) at the next aligned offset, and record the entry.
    /// Errors: I/O naming the file; [`VindexError::BadEntry`] for a format other than F32/F16 or
    /// a `data` length that disagrees with `shape`.
    pub fn write_tensor(
        &mut self,
        key: &str,
        shape: &[usize],
        format: QuantFormat,
        data: &[f32],
    ) -> Result<TensorEntry, VindexError> {
        let numel: usize = shape.iter().product();
        if numel != data.len() || !matches!(format, QuantFormat::F32 | QuantFormat::F16) {
            return Err(VindexError::BadEntry {
                path: self.path.clone(),
                key: key.to_string(),
                msg: format!(
                    "cannot write {} values of shape {shape:?} as {format}",
                    data.len()
                ),
            });
        }
        let pad = (TENSOR_ALIGN - self.pos % TENSOR_ALIGN) % TENSOR_ALIGN;
        self.write_bytes(&[0u8; TENSOR_ALIGN][..pad])?;
        let offset = self.pos;
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK * 4);
        for chunk in data.chunks(CHUNK) {
            buf.clear();
            match format {
                QuantFormat::F16 => {
                    for &v in chunk {
                        buf.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
                    }
                }
                _ => {
                    for &v in chunk {
                        buf.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            self.write_bytes(&buf)?;
        }
        let entry = TensorEntry {
            key: key.to_string(),
            shape: shape.to_vec(),
            format,
            offset,
            length: self.pos - offset,
        };
        self.entries.push(entry.clone());
        Ok(entry)
    }

    /// Pad to the next [`TENSOR_ALIGN`] boundary, append `bytes` unchanged, and return the
    /// offset they start at (records no entry: for planes whose entries the caller keeps).
    pub fn append_aligned(&mut self, bytes: &[u8]) -> Result<usize, VindexError> {
        let pad = (TENSOR_ALIGN - self.pos % TENSOR_ALIGN) % TENSOR_ALIGN;
        self.write_bytes(&[0u8; TENSOR_ALIGN][..pad])?;
        let offset = self.pos;
        self.write_bytes(bytes)?;
        Ok(offset)
    }

    /// Append already-encoded `bytes` (ggml blocks of `format`, rows concatenated, `shape`
    /// row-major) at the next aligned offset and record the entry.
    /// Errors: [`VindexError::BadEntry`] when `bytes.len()` differs from
    /// `format.expected_bytes(shape)`; I/O naming the file.
    pub fn write_raw(
        &mut self,
        key: &str,
        shape: &[usize],
        format: QuantFormat,
        bytes: &[u8],
    ) -> Result<TensorEntry, VindexError> {
        let expected = format.expected_bytes(shape).map_err(|e| e.to_string());
        if expected.as_ref() != Ok(&bytes.len()) {
            return Err(VindexError::BadEntry {
                path: self.path.clone(),
                key: key.to_string(),
                msg: format!(
                    "{} bytes for shape {shape:?} in {format} (expected {expected:?})",
                    bytes.len()
                ),
            });
        }
        let offset = self.append_aligned(bytes)?;
        let entry = TensorEntry {
            key: key.to_string(),
            shape: shape.to_vec(),
            format,
            offset,
            length: bytes.len(),
        };
        self.entries.push(entry.clone());
        Ok(entry)
    }

    /// True when no tensor was written.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Flush and sync to disk; returns the file's name, size and sha256.
    pub fn finish(mut self) -> Result<(FileHash, Vec<TensorEntry>), VindexError> {
        self.out
            .flush()
            .map_err(|e| VindexError::io(&self.path, e))?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| VindexError::io(&self.path, e.into_error()))?;
        file.sync_all()
            .map_err(|e| VindexError::io(&self.path, e))?;
        Ok((
            FileHash {
                name: self.name.to_string(),
                bytes: self.pos as u64,
                sha256: hex(&self.hasher.finalize()),
            },
            self.entries,
        ))
    }

    /// Remove the (unused) file.
    pub fn discard(self) -> Result<(), VindexError> {
        let path = self.path.clone();
        drop(self.out);
        std::fs::remove_file(&path).map_err(|e| VindexError::io(&path, e))
    }
}

/// Write a small text file into the build directory and return its hash entry.
pub fn write_text(dir: &Path, name: &str, text: &str) -> Result<FileHash, VindexError> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| VindexError::io(&path, e))?;
    Ok(FileHash {
        name: name.to_string(),
        bytes: text.len() as u64,
        sha256: hex(&Sha256::digest(text.as_bytes())),
    })
}
