//! [`TensorSource`] over one or more safetensors files, each memory-mapped once.
//!
//! Format: 8-byte little-endian header length `n`, `n` bytes of JSON
//! `{name: {dtype, shape, data_offsets: [begin, end]}}`, then the data section; offsets are
//! relative to the data section (safetensors spec). The `safetensors` crate validates the header
//! (offsets contiguous, sizes = shape × dtype size, data section exactly as long as declared);
//! a header it refuses is checked again here entry by entry, so the error names the tensor.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use infer_quant::QuantFormat;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::text::shown;
use crate::{ModelError, Tensor, TensorInfo, TensorSource};

/// One memory-mapped safetensors file.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
}

/// Where one tensor lives.
struct Loc {
    shard: usize,
    begin: usize,
    end: usize,
}

/// Tensors of one or more safetensors files, by the names stored in them.
pub struct SafetensorsSource {
    shards: Vec<Shard>,
    infos: Vec<TensorInfo>,
    locs: Vec<Loc>,
    by_name: HashMap<String, usize>,
}

/// A safetensors error in words (the crate's `Display` prints the enum's Debug form, e.g.
/// `InvalidHeaderDeserialization` or `IoError(Os { code: 28, … })`).
pub fn safetensors_error_text(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::InvalidHeader => "the header is not valid UTF-8".into(),
        E::InvalidHeaderStart => "the header does not start with '{' (not a safetensors file?)".into(),
        E::InvalidHeaderDeserialization => {
            "the header is not valid safetensors JSON (a name → {dtype, shape, data_offsets} map)".into()
        }
        E::HeaderTooLarge => "the header is larger than 100 MB (corrupt length?)".into(),
        E::HeaderTooSmall => "the file is shorter than the 8-byte header length".into(),
        E::InvalidHeaderLength => "the header length runs past the end of the file".into(),
        E::TensorNotFound(n) => format!("no tensor '{n}'"),
        E::TensorInvalidInfo => {
            "a tensor's data_offsets do not hold its shape × dtype size".into()
        }
        E::InvalidOffset(n) => format!(
            "tensor '{n}': its data_offsets do not start where the tensor before it (in data order) ends: the two overlap or leave a gap"
        ),
        E::IoError(io) => io.to_string(),
        E::JsonError(j) => format!("JSON: {j}"),
        E::InvalidTensorView(dtype, shape, bytes) => {
            format!("{bytes} bytes do not hold a {dtype:?} tensor of shape {shape:?}")
        }
        E::MetadataIncompleteBuffer => {
            "the tensors' data does not cover the data section exactly (bytes after the last tensor or a hole)".into()
        }
        E::ValidationOverflow => "a tensor's shape or size overflows".into(),
    }
}

/// Check each tensor entry of a safetensors header (`name → {dtype, shape, data_offsets}`)
/// that the `safetensors` crate refused, whose errors for a bad entry name no tensor. `bytes`
/// is the whole file; a header that is not a JSON object at all is left to the crate.
///
/// Errors: [`ModelError::BadTensor`] naming the tensor when its entry is not an object, its
/// dtype is not a safetensors dtype (named), its shape or data_offsets are malformed, or its
/// data_offsets do not span shape × dtype size bytes.
fn check_header_entries(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    let header = bytes
        .get(..8)
        .and_then(|n| usize::try_from(u64::from_le_bytes(n.try_into().ok()?)).ok())
        .and_then(|n| bytes.get(8..8usize.checked_add(n)?));
    let Some(Ok(Value::Object(map))) = header.map(serde_json::from_slice::<Value>) else {
        return Ok(());
    };
    for (name, entry) in map.iter().filter(|(k, _)| *k != "__metadata__") {
        let bad = |msg: String| ModelError::BadTensor {
            path: path.to_path_buf(),
            name: shown(name),
            msg,
        };
        let field = |key: &str| {
            entry.get(key).ok_or_else(|| {
                bad(format!(
                    "the entry has no '{key}' (expected {{dtype, shape, data_offsets}}, got {})",
                    shown(&entry.to_string())
                ))
            })
        };
        let (dtype, shape, offsets) = (field("dtype")?, field("shape")?, field("data_offsets")?);
        let dtype: Dtype = serde_json::from_value(dtype.clone()).map_err(|_| {
            bad(format!(
                "dtype {} is not a safetensors dtype (infer reads F32, F16, BF16)",
                shown(&dtype.to_string())
            ))
        })?;
        let shape: Vec<usize> = serde_json::from_value(shape.clone()).map_err(|_| {
            bad(format!(
                "shape {} is not a list of non-negative integers",
                shown(&shape.to_string())
            ))
        })?;
        let (begin, end): (usize, usize) = serde_json::from_value(offsets.clone())
            .ok()
            .filter(|(b, e)| b <= e)
            .ok_or_else(|| {
                bad(format!(
                    "data_offsets {} are not [begin, end] with begin <= end",
                    shown(&offsets.to_string())
                ))
            })?;
        match shape.iter().try_fold(dtype.size(), |n, &d| n.checked_mul(d)) {
            Some(n) if n == end - begin => {}
            Some(n) => {
                return Err(bad(format!(
                    "data_offsets [{begin}, {end}] hold {} bytes, but shape {shape:?} of {dtype:?} needs {n}",
                    end - begin
                )))
            }
            None => return Err(bad(format!("shape {shape:?} of {dtype:?} overflows"))),
        }
    }
    Ok(())
}

fn dtype_format(d: Dtype) -> Option<QuantFormat> {
    match d {
        Dtype::F32 => Some(QuantFormat::F32),
        Dtype::F16 => Some(QuantFormat::F16),
        Dtype::BF16 => Some(QuantFormat::BF16),
        _ => None,
    }
}

impl SafetensorsSource {
    /// Memory-map and validate `files` (each once). Tensors are listed file by file, in data
    /// order. Errors: [`ModelError::Io`] naming a missing/unreadable file,
    /// [`ModelError::BadSafetensors`] for a header that is invalid or lies about sizes,
    /// [`ModelError::BadTensor`] for an entry with a bad dtype, shape or data_offsets, a dtype
    /// other than F32/F16/BF16 or a name found in two files.
    pub fn open(files: &[PathBuf]) -> Result<Self, ModelError> {
        let mut src = SafetensorsSource {
            shards: Vec::new(),
            infos: Vec::new(),
            locs: Vec::new(),
            by_name: HashMap::new(),
        };
        for path in files {
            src.add_file(path)?;
        }
        Ok(src)
    }

    fn add_file(&mut self, path: &Path) -> Result<(), ModelError> {
        let io = |e| ModelError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the file is opened read-only and the map is never written; as with every
        // mmap-based reader, a concurrent truncation by another process is not defended against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        // A header the crate refuses is read again entry by entry, for an error that names
        // the tensor (the crate's does not).
        let (header_len, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            check_header_entries(path, &mmap)
                .err()
                .unwrap_or_else(|| ModelError::BadSafetensors {
                    path: path.to_path_buf(),
                    msg: safetensors_error_text(&e),
                })
        })?;
        let data_start = 8 + header_len;
        let shard = self.shards.len();
        let mut entries: Vec<(String, &safetensors::tensor::TensorInfo)> =
            meta.tensors().into_iter().collect();
        entries.sort_by_key(|(_, info)| info.data_offsets);
        for (name, info) in entries {
            let bad = |msg: String| ModelError::BadTensor {
                path: path.to_path_buf(),
                name: name.clone(),
                msg,
            };
            let dtype = dtype_format(info.dtype).ok_or_else(|| {
                bad(format!(
                    "dtype {:?} is not supported (F32, F16, BF16 only)",
                    info.dtype
                ))
            })?;
            let (begin, end) = info.data_offsets;
            if data_start + end > mmap.len() {
                return Err(ModelError::BadSafetensors {
                    path: path.to_path_buf(),
                    msg: format!("tensor '{name}' data ends past the end of the file"),
                });
            }
            if self.by_name.contains_key(&name) {
                return Err(bad("tensor appears in more than one file".into()));
            }
            self.by_name.insert(name.clone(), self.infos.len());
            self.infos.push(TensorInfo {
                name,
                shape: info.shape.clone(),
                dtype,
                bytes: end - begin,
            });
            self.locs.push(Loc { shard, begin, end });
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            mmap,
            data_start,
        });
        Ok(())
    }

    /// The file holding tensor `name`, if any.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        let i = *self.by_name.get(name)?;
        Some(&self.shards[self.locs[i].shard].path)
    }
}

impl SafetensorsSource {
    /// A tensor's info, its shard and its bytes in the mapped file.
    /// Errors: [`ModelError::NoSuchTensor`]; data outside the file.
    fn stored(&self, name: &str) -> Result<(&TensorInfo, &Shard, &[u8]), ModelError> {
        let i = *self
            .by_name
            .get(name)
            .ok_or_else(|| ModelError::NoSuchTensor {
                path: self
                    .shards
                    .first()
                    .map(|s| s.path.clone())
                    .unwrap_or_default(),
                name: name.to_string(),
            })?;
        let (info, loc) = (&self.infos[i], &self.locs[i]);
        let shard = &self.shards[loc.shard];
        let bytes = shard
            .mmap
            .get(shard.data_start + loc.begin..shard.data_start + loc.end)
            .ok_or_else(|| ModelError::BadSafetensors {
                path: shard.path.clone(),
                msg: format!("tensor '{name}' data lies outside the file"),
            })?;
        Ok((info, shard, bytes))
    }
}

impl TensorSource for SafetensorsSource {
    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.infos[i])
    }

    /// The mapped F32 / F16 / BF16 bytes as they are (safetensors rows are HF rows); `None` when
    /// their length disagrees with the shape (then [`TensorSource::read_f32`] reports it).
    fn encoded_rows(&self, name: &str) -> Result<Option<crate::EncodedRows<'_>>, ModelError> {
        let (info, _, bytes) = self.stored(name)?;
        let numel: usize = info.shape.iter().product();
        let whole = info.dtype.bytes_for(numel).ok() == Some(bytes.len());
        Ok(whole.then_some(crate::EncodedRows {
            format: info.dtype,
            bytes: std::borrow::Cow::Borrowed(bytes),
        }))
    }

    /// Decode F32 / F16 / BF16 (little-endian) to `f32`; F16/BF16 via the `half` crate.
    fn read_f32(&self, name: &str) -> Result<Tensor, ModelError> {
        let (info, shard, bytes) = self.stored(name)?;
        let data: Vec<f32> = match info.dtype {
            QuantFormat::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            QuantFormat::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            QuantFormat::BF16 => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::BadTensor {
                    path: shard.path.clone(),
                    name: name.to_string(),
                    msg: format!("cannot decode dtype {other:?}"),
                })
            }
        };
        let expected: usize = info.shape.iter().product();
        if data.len() != expected {
            return Err(ModelError::BadTensor {
                path: shard.path.clone(),
                name: name.to_string(),
                msg: format!(
                    "{} values for shape {:?} ({expected} values)",
                    data.len(),
                    info.shape
                ),
            });
        }
        Ok(Tensor {
            shape: info.shape.clone(),
            data,
        })
    }
}
