//! [`GgufFile`]: header, metadata and tensor infos of a GGUF v2/v3 file over a memory map.
//!
//! Layout (ggml `docs/gguf.md`, `ggml/src/gguf.cpp`), all little-endian:
//! `"GGUF"` · u32 version · u64 tensor_count · u64 kv_count · kv pairs (string key, u32 type,
//! value) · tensor infos (string name, u32 n_dims, u64 × n_dims dims fastest-first, u32 ggml
//! type, u64 offset relative to the data section) · padding to `general.alignment` (default 32) ·
//! data section.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use infer_quant::QuantFormat;

use super::reader::Cursor;
use super::value::{GgufArray, GgufValue};
use crate::text::shown;
use crate::ModelError;

/// `"GGUF"` read as a little-endian u32.
const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor offset when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml `GGML_MAX_DIMS`.
const MAX_DIMS: usize = 4;
/// Smallest on-disk size of one kv pair (empty key, type, 1-byte value) and one tensor info
/// (empty name, n_dims, type, offset); used to reject absurd counts before reading.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;
/// Largest `general.alignment` accepted (real files use 32): a huge power of two would make
/// every tensor's padding, and the data section start, absurd (ggml-org/ggml#1516).
const MAX_ALIGNMENT: usize = 1 << 20;
/// Reserve room for at most this many kv pairs / tensor infos up front; more grow as they are
/// read. The counts are already bounded by the file size, but a multi-GB file with a corrupt
/// count would otherwise reserve tens of GB (each entry is ~50–100 bytes in memory against the
/// 13–24 bytes of its smallest encoding) before the first entry fails to parse.
const MAX_PREALLOC: usize = 1 << 12;

/// One tensor as the GGUF stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    /// GGUF (llama.cpp) name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order, fastest-varying first (`dims[0]` = row length).
    pub dims: Vec<usize>,
    /// Storage format (ggml type).
    pub format: QuantFormat,
    /// Byte offset of the data from the start of the data section (a multiple of the alignment).
    pub offset: usize,
    /// Bytes of data: `format` blocks for `n_elements()` values.
    pub n_bytes: usize,
}

impl GgufTensorInfo {
    /// Number of values (product of `dims`).
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Row-major (PyTorch/HF) shape: `dims` reversed, e.g. a Linear `[out, in]`.
    pub fn hf_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed GGUF v2/v3 file: metadata, tensor infos, and the memory map its tensor bytes are
/// borrowed from. Everything is validated at [`GgufFile::open`]: afterwards every tensor's byte
/// range lies inside the file.
pub struct GgufFile {
    path: PathBuf,
    mmap: memmap2::Mmap,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: usize,
    data_start: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Everything parsed from the header, before it is tied to a memory map.
pub(super) struct Parsed {
    pub(super) version: u32,
    pub(super) metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    pub(super) tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    pub(super) alignment: usize,
    pub(super) data_start: usize,
}

fn bad(path: &Path, msg: impl Into<String>) -> ModelError {
    ModelError::BadGguf {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Parse and validate the header, metadata and tensor infos of `bytes` (a whole GGUF file).
fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed, ModelError> {
    let p = parse_header(path, bytes)?;
    check_data_ranges(path, bytes.len(), &p)?;
    Ok(p)
}

/// Parse and validate the header, metadata and tensor infos at the start of `bytes`, without
/// requiring the data section to be present (a file may end right after the tensor table).
pub(super) fn parse_header(path: &Path, bytes: &[u8]) -> Result<Parsed, ModelError> {
    let mut c = Cursor::new(bytes, path);
    let magic = c.take(4, "magic")?;
    if magic != MAGIC {
        return Err(bad(
            path,
            format!("bad magic {magic:02x?}, expected \"GGUF\" (47 47 55 46)"),
        ));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(bad(
                path,
                "GGUF version 1 is not supported (only v2 and v3)",
            ))
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(bad(path, "big-endian GGUF is not supported"))
        }
        v => {
            return Err(bad(
                path,
                format!("unsupported GGUF version {v} (only v2 and v3)"),
            ))
        }
    }
    let n_tensors = c.len("tensor count")?;
    let n_kv = c.len("metadata kv count")?;
    if n_kv > c.remaining() / MIN_KV_BYTES {
        return Err(bad(
            path,
            format!(
                "metadata kv count {n_kv} is impossible for a file of {} bytes (truncated or corrupt)",
                bytes.len()
            ),
        ));
    }
    if n_tensors > c.remaining() / MIN_TENSOR_INFO_BYTES {
        return Err(bad(
            path,
            format!(
                "tensor count {n_tensors} is impossible for a file of {} bytes (truncated or corrupt)",
                bytes.len()
            ),
        ));
    }

    let mut metadata = Vec::with_capacity(n_kv.min(MAX_PREALLOC));
    let mut meta_index = HashMap::with_capacity(n_kv.min(MAX_PREALLOC));
    for i in 0..n_kv {
        let at = c.pos();
        let key = c.string(&format!("key of metadata entry {i}"))?;
        if key.is_empty() {
            // gguf.cpp asserts a non-empty key (llama.cpp#24263): nothing can look it up.
            return Err(bad(
                path,
                format!("metadata entry {i} at offset {at} has an empty key"),
            ));
        }
        // Keys and names come from the file: escaped and cut in every message.
        let key_shown = shown(&key);
        let t = c.u32(&format!("type of metadata '{key_shown}'"))?;
        let v = GgufValue::read(&mut c, t, &key_shown)?;
        if meta_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(bad(path, format!("duplicate metadata key '{key_shown}'")));
        }
        metadata.push((key, v));
    }

    let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) if a.is_power_of_two() && *a as usize <= MAX_ALIGNMENT => {
            *a as usize
        }
        Some(v) => {
            return Err(bad(
                path,
                format!(
                    "general.alignment must be a power-of-two u32 of at most {MAX_ALIGNMENT}, got {v:?}"
                ),
            ))
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(MAX_PREALLOC));
    let mut tensor_index = HashMap::with_capacity(n_tensors.min(MAX_PREALLOC));
    for i in 0..n_tensors {
        let name = c.string(&format!("name of tensor info {i}"))?;
        let t = read_tensor_info(&mut c, path, name, alignment)?;
        if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(bad(
                path,
                format!("duplicate tensor name '{}'", shown(&t.name)),
            ));
        }
        tensors.push(t);
    }

    check_offsets(path, &tensors, alignment)?;
    let header_end = c.pos();
    let data_start = header_end.div_ceil(alignment) * alignment;
    Ok(Parsed {
        version,
        metadata,
        meta_index,
        tensors,
        tensor_index,
        alignment,
        data_start,
    })
}

/// The one GGUF layout check of every reader and the writer (llama.cpp
/// `gguf_init_from_file`): each tensor's offset is the running total of the previous tensors'
/// sizes, each padded to the alignment ("tensor '%s' has offset %zu, expected %zu"). So no two
/// tensors share bytes, the data section is exactly as long as its tensors, and a corrupt
/// offset cannot ask for terabytes of padding.
///
/// Errors: [`ModelError::BadGguf`] naming `path` and the first tensor out of place.
pub(super) fn check_offsets(
    path: &Path,
    tensors: &[GgufTensorInfo],
    alignment: usize,
) -> Result<(), ModelError> {
    let mut expected_offset = 0usize;
    for t in tensors {
        if t.offset != expected_offset {
            let what = if t.offset < expected_offset {
                "overlaps the tensors before it"
            } else {
                "leaves a gap after the tensors before it"
            };
            return Err(bad(
                path,
                format!(
                    "tensor '{}' has offset {}, expected {expected_offset} (the previous tensors' \
                     sizes, each padded to the alignment {alignment}, as llama.cpp requires): \
                     its data {what}",
                    shown(&t.name),
                    t.offset
                ),
            ));
        }
        expected_offset = t
            .n_bytes
            .checked_next_multiple_of(alignment)
            .and_then(|n| expected_offset.checked_add(n))
            .ok_or_else(|| {
                bad(
                    path,
                    format!("tensor '{}': offset overflows", shown(&t.name)),
                )
            })?;
    }
    Ok(())
}

/// Every tensor's data range lies inside a file of `file_len` bytes.
fn check_data_ranges(path: &Path, file_len: usize, p: &Parsed) -> Result<(), ModelError> {
    let data_start = p.data_start;
    for t in &p.tensors {
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(bad(
                    path,
                    format!(
                        "tensor '{}': data at offset {} (+{} data start) with {} bytes runs past the end of the file ({} bytes)",
                        shown(&t.name), t.offset, data_start, t.n_bytes, file_len
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Read the rest of one tensor info (after its name) and check dims (1..=4, none zero), type
/// and offset.
fn read_tensor_info(
    c: &mut Cursor<'_>,
    path: &Path,
    name: String,
    alignment: usize,
) -> Result<GgufTensorInfo, ModelError> {
    let what = format!("tensor '{}'", shown(&name));
    let n_dims = c.u32(&what)? as usize;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(bad(
            path,
            format!("{what}: {n_dims} dimensions (must be 1..={MAX_DIMS})"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        dims.push(c.len(&what)?);
    }
    if dims.contains(&0) {
        // llama.cpp reads these as zero-byte tensors; no model has one, and accepting it only
        // moved the error to the next tensor's offset.
        return Err(bad(
            path,
            format!(
                "{what}: shape {dims:?} has a zero dimension (a tensor needs at least one element)"
            ),
        ));
    }
    let n_elements = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(path, format!("{what}: dims {dims:?} overflow")))?;
    let type_id = c.u32(&what)?;
    let format = QuantFormat::from_ggml_type_id(type_id).map_err(|_| {
        // ggml's MXFP4 (`GGML_TYPE_MXFP4`): the expert weights of every released gpt-oss GGUF.
        let known = if type_id == 39 {
            " (MXFP4, gpt-oss's expert format, which infer does not read)"
        } else {
            ""
        };
        bad(path, format!("{what}: unknown ggml type {type_id}{known}"))
    })?;
    if dims[0] % format.block_elems() != 0 {
        return Err(bad(
            path,
            format!(
                "{what}: row length {} is not a multiple of the {format} block size {}",
                dims[0],
                format.block_elems()
            ),
        ));
    }
    // Checked before `bytes_for`, whose arithmetic is unchecked.
    if n_elements.checked_mul(format.block_bytes()).is_none() {
        return Err(bad(
            path,
            format!("{what}: size of {dims:?} {format} overflows"),
        ));
    }
    let n_bytes = format
        .bytes_for(n_elements)
        .map_err(|e| bad(path, format!("{what}: {e}")))?;
    let offset = c.len(&what)?;
    if offset % alignment != 0 {
        return Err(bad(
            path,
            format!("{what}: data offset {offset} is not a multiple of the alignment {alignment}"),
        ));
    }
    Ok(GgufTensorInfo {
        name,
        dims,
        format,
        offset,
        n_bytes,
    })
}

/// Memory-map the file at `path`, refusing one shorter than the 24-byte GGUF header. Errors:
/// [`ModelError::Io`] when it cannot be opened or mapped, [`ModelError::BadGguf`] when too short.
pub(super) fn map_gguf(path: &Path) -> Result<memmap2::Mmap, ModelError> {
    let io = |e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len < 24 {
        return Err(bad(
            path,
            format!("truncated: {len} bytes is shorter than the 24-byte GGUF header"),
        ));
    }
    // SAFETY: the map is read-only; like every mmap reader we rely on the file not being
    // truncated by another process while it is open.
    unsafe { memmap2::Mmap::map(&file) }.map_err(io)
}

impl GgufFile {
    /// Memory-map and parse a GGUF v2/v3 file.
    ///
    /// Errors: [`ModelError::Io`] when the file cannot be opened or mapped;
    /// [`ModelError::BadGguf`] (naming the file, the field and the offset) when it is truncated,
    /// has a bad magic or version, absurd counts, a string/array running past the end, an
    /// unknown value or ggml type, a misaligned tensor offset or a tensor past the end.
    pub fn open(path: &Path) -> Result<GgufFile, ModelError> {
        let mmap = map_gguf(path)?;
        let p = parse(path, &mmap)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: p.version,
            metadata: p.metadata,
            meta_index: p.meta_index,
            tensors: p.tensors,
            tensor_index: p.tensor_index,
            alignment: p.alignment,
            data_start: p.data_start,
        })
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment` (default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Byte offset of the data section from the start of the file.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// All metadata, in file order.
    pub fn metadata_entries(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn metadata(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Integer metadata (any integer type) that fits in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key).and_then(|v| u32::try_from(v).ok())
    }

    /// Non-negative integer metadata of any integer type.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.metadata(key)?.as_u64()
    }

    /// Non-negative integer metadata that fits in usize.
    pub fn get_usize(&self, key: &str) -> Option<usize> {
        self.get_u64(key).and_then(|v| usize::try_from(v).ok())
    }

    /// Integer metadata of any integer type, as i64.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.metadata(key)?.as_i64()
    }

    /// `f32`/`f64` metadata as f32 (an f64 is rounded).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get_f64(key).map(|v| v as f32)
    }

    /// `f32`/`f64` metadata as f64.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.metadata(key)?.as_f64()
    }

    /// A `bool` metadata value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.metadata(key)?.as_bool()
    }

    /// A `string` metadata value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.metadata(key)?.as_str()
    }

    /// An array metadata value.
    pub fn get_array(&self, key: &str) -> Option<&GgufArray> {
        self.metadata(key)?.as_array()
    }

    /// A string-array metadata value (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// An f32-array metadata value (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Option<&[f32]> {
        match self.get_array(key)? {
            GgufArray::F32(v) => Some(v),
            _ => None,
        }
    }

    /// An integer-array metadata value widened to i64 (e.g. `tokenizer.ggml.token_type`, i32).
    pub fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.get_array(key)?.to_i64_vec()
    }

    /// Tensor infos, in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// Tensor info by GGUF name.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (ggml blocks of its format), borrowed from the memory map.
    /// Errors: [`ModelError::NoSuchTensor`] for an unknown GGUF name.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], ModelError> {
        let no = || ModelError::NoSuchTensor {
            path: self.path.clone(),
            name: name.to_string(),
        };
        let t = self.tensor_info(name).ok_or_else(no)?;
        // Ranges were checked against the file length in `parse`; `get` keeps this panic-free.
        let start = self.data_start + t.offset;
        self.mmap.get(start..start + t.n_bytes).ok_or_else(no)
    }
}
