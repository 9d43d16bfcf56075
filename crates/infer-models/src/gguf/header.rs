//! [`GgufHeader`]: version, metadata and tensor table of a GGUF file, read without its data.
//!
//! Unlike [`super::GgufFile::open`], [`GgufHeader::read`] does not require the data section to be
//! present: a file cut right after the tensor table (what `infer synth --header-only` writes)
//! reads the same as the whole model.

use std::path::Path;

use super::file::parse_header;
use super::{GgufFile, GgufTensorInfo, GgufValue};
use crate::ModelError;

/// Everything of a GGUF v2/v3 file except its tensor data, in file order.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata key/value pairs, in file order (types kept, see [`GgufValue`]).
    pub metadata: Vec<(String, GgufValue)>,
    /// Tensor infos (name, ggml dims fastest-first, format, data offset), in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// `general.alignment` (default 32): data section start and every tensor offset are
    /// multiples of it.
    pub alignment: usize,
}

impl GgufHeader {
    /// Read the header, metadata and tensor table of the GGUF file at `path`; the tensor data
    /// need not be in the file. Everything [`GgufFile::open`] checks in the header is checked
    /// here too (magic, version, counts, value and ggml types, dims, offset alignment).
    ///
    /// Errors: [`ModelError::Io`] when the file cannot be opened or mapped,
    /// [`ModelError::BadGguf`] naming the file and what is wrong (not a GGUF file, truncated
    /// header, …).
    pub fn read(path: &Path) -> Result<GgufHeader, ModelError> {
        let mmap = super::file::map_gguf(path)?;
        Self::parse(path, &mmap)
    }

    /// [`GgufHeader::read`] of bytes already in memory (the start of a GGUF file, at least up
    /// to the end of its tensor table); `path` only names the file in errors.
    ///
    /// Errors: [`ModelError::BadGguf`] as for [`GgufHeader::read`].
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<GgufHeader, ModelError> {
        let p = parse_header(path, bytes)?;
        Ok(GgufHeader {
            version: p.version,
            metadata: p.metadata,
            tensors: p.tensors,
            alignment: p.alignment,
        })
    }

    /// The header of an opened file (copies its metadata and tensor table).
    pub fn from_file(f: &GgufFile) -> GgufHeader {
        GgufHeader {
            version: f.version(),
            metadata: f.metadata_entries().to_vec(),
            tensors: f.tensor_infos().to_vec(),
            alignment: f.alignment(),
        }
    }

    /// Bytes of the data section the tensor table needs: the end of the last tensor, rounded up
    /// to the alignment (ggml pads every tensor's data to the alignment).
    pub fn data_len(&self) -> usize {
        let end = self
            .tensors
            .iter()
            .map(|t| t.offset.saturating_add(t.n_bytes))
            .max()
            .unwrap_or(0);
        end.div_ceil(self.alignment) * self.alignment
    }
}
