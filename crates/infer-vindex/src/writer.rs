//! [`BinWriter`]: appends tensors to one `.bin` file at [`TENSOR_ALIGN`]-aligned offsets,
//! converting `f32` to the stored format (little-endian) and hashing every byte as it goes.
//! The writing and hashing run on a thread of their own, so that the builder quantizes the next
//! tensor meanwhile.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;

use infer_quant::QuantFormat;
use sha2::{Digest, Sha256};

use crate::hash::hex;
use crate::index::FileHash;
use crate::manifest::{TensorEntry, TENSOR_ALIGN};
use crate::VindexError;

/// Values converted per write call (bounds the conversion buffer to 256 KiB).
const CHUNK: usize = 64 * 1024;

/// Buffers queued for the writing thread before the builder waits for it.
const QUEUE: usize = 4;

/// What the writing thread hands back: the file and the sha256 of every byte written.
type Written = std::io::Result<(File, [u8; 32])>;

/// One output `.bin` file being written.
pub struct BinWriter {
    name: &'static str,
    path: PathBuf,
    /// Buffers for the writing thread (`None` once finished).
    tx: Option<SyncSender<Vec<u8>>>,
    thread: Option<JoinHandle<Written>>,
    pos: usize,
    entries: Vec<TensorEntry>,
}

impl BinWriter {
    /// Create `dir/name` (truncating). Errors: [`VindexError::Io`] naming the file.
    pub fn create(dir: &Path, name: &'static str) -> Result<Self, VindexError> {
        let path = dir.join(name);
        let file = File::create(&path).map_err(|e| VindexError::io(&path, e))?;
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let thread = std::thread::Builder::new()
            .name(format!("write {name}"))
            .spawn(move || {
                let mut out = BufWriter::with_capacity(1 << 20, file);
                let mut hasher = Sha256::new();
                for buf in rx {
                    out.write_all(&buf)?;
                    hasher.update(&buf);
                }
                out.flush()?;
                let file = out.into_inner().map_err(|e| e.into_error())?;
                Ok((file, hasher.finalize().into()))
            })
            .map_err(|e| VindexError::io(&path, e))?;
        Ok(BinWriter {
            name,
            path,
            tx: Some(tx),
            thread: Some(thread),
            pos: 0,
            entries: Vec::new(),
        })
    }

    /// Queue `bytes` for the writing thread. Errors: the thread's I/O error, naming the file.
    fn write_bytes(&mut self, bytes: Vec<u8>) -> Result<(), VindexError> {
        let n = bytes.len();
        let sent = self.tx.as_ref().map(|tx| tx.send(bytes).is_ok());
        if sent != Some(true) {
            // The thread stopped (an I/O error): report it.
            return Err(self.join().err().unwrap_or_else(|| {
                VindexError::io(&self.path, std::io::Error::other("the file was finished"))
            }));
        }
        self.pos += n;
        Ok(())
    }

    /// Stop the writing thread and take the file and its digest.
    fn join(&mut self) -> Result<(File, [u8; 32]), VindexError> {
        self.tx = None;
        let thread = self.thread.take().ok_or_else(|| {
            VindexError::io(&self.path, std::io::Error::other("the file was finished"))
        })?;
        match thread.join() {
            Ok(r) => r.map_err(|e| VindexError::io(&self.path, e)),
            Err(_) => Err(VindexError::io(
                &self.path,
                std::io::Error::other("the writing thread panicked"),
            )),
        }
    }

    /// Pad with zeros to the next [`TENSOR_ALIGN`] boundary.
    fn align(&mut self) -> Result<(), VindexError> {
        let pad = (TENSOR_ALIGN - self.pos % TENSOR_ALIGN) % TENSOR_ALIGN;
        if pad > 0 {
            self.write_bytes(vec![0u8; pad])?;
        }
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
        self.align()?;
        let offset = self.pos;
        for chunk in data.chunks(CHUNK) {
            let mut buf: Vec<u8> = Vec::with_capacity(chunk.len() * format.block_bytes());
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
            self.write_bytes(buf)?;
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
    pub fn append_aligned(&mut self, bytes: Vec<u8>) -> Result<usize, VindexError> {
        self.align()?;
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
        bytes: Vec<u8>,
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
        let length = bytes.len();
        let offset = self.append_aligned(bytes)?;
        let entry = TensorEntry {
            key: key.to_string(),
            shape: shape.to_vec(),
            format,
            offset,
            length,
        };
        self.entries.push(entry.clone());
        Ok(entry)
    }

    /// True when no tensor was written.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Wait for the writing thread, flush and sync to disk; returns the file's name, size and
    /// sha256. Errors: the first I/O error of the file, naming it.
    pub fn finish(mut self) -> Result<(FileHash, Vec<TensorEntry>), VindexError> {
        let (file, digest) = self.join()?;
        file.sync_all()
            .map_err(|e| VindexError::io(&self.path, e))?;
        Ok((
            FileHash {
                name: self.name.to_string(),
                bytes: self.pos as u64,
                sha256: hex(&digest),
            },
            std::mem::take(&mut self.entries),
        ))
    }

    /// Remove the (unused) file.
    pub fn discard(mut self) -> Result<(), VindexError> {
        let joined = self.join();
        std::fs::remove_file(&self.path).map_err(|e| VindexError::io(&self.path, e))?;
        joined.map(|_| ())
    }
}

impl Drop for BinWriter {
    /// A writer dropped unfinished (the build failed) stops its thread; the temp directory
    /// holding the file is removed by the builder.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
