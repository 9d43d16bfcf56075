//! The data-provider API: zero-copy views into the mapped files.
//!
//! Float data is little-endian and every tensor starts at a 64-byte aligned offset of a
//! page-aligned map (checked at open), so `&[f32]` / `&[f16]` views are taken in place.

use std::ops::Range;
use std::path::{Path, PathBuf};

use half::f16;
use infer_models::ModelConfig;
use infer_quant::QuantFormat;
use ndarray::ArrayView2;

use crate::files;
use crate::index::{Dtype, VindexIndex};
use crate::load::{Kind, Vindex};
use crate::manifest::TensorEntry;
use crate::VindexError;

/// A tensor's values in their stored format, borrowed from the mmap: f32 or f16 (the float
/// tier, and every 1-D tensor), or ggml blocks (the embeddings of a vindex without a float
/// tier, e.g. a GGUF's own `token_embd` blocks; rows are whole blocks).
#[derive(Clone, Copy, Debug)]
pub enum FloatSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Blocks {
        format: QuantFormat,
        bytes: &'a [u8],
    },
}

impl<'a> FloatSlice<'a> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            FloatSlice::F32(s) => s.len(),
            FloatSlice::F16(s) => s.len(),
            FloatSlice::Blocks { format, bytes } => {
                bytes.len() / format.block_bytes().max(1) * format.block_elems()
            }
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The storage format tag (`F32`, `F16`, or the block format).
    pub fn format(&self) -> QuantFormat {
        match self {
            FloatSlice::F32(_) => QuantFormat::F32,
            FloatSlice::F16(_) => QuantFormat::F16,
            FloatSlice::Blocks { format, .. } => *format,
        }
    }

    /// The values widened (or dequantized, bit-exact with ggml) to `f32` (a copy).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            FloatSlice::F32(s) => s.to_vec(),
            FloatSlice::F16(s) => s.iter().map(|v| v.to_f32()).collect(),
            FloatSlice::Blocks { format, bytes } => {
                // Entries were validated at open (length = whole blocks of the shape).
                infer_quant::dequantize_to_vec(*format, bytes, self.len()).unwrap_or_default()
            }
        }
    }

    /// The `f32` view, if stored as f32.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        match self {
            FloatSlice::F32(s) => Some(s),
            _ => None,
        }
    }

    /// The `f16` view, if stored as f16.
    pub fn as_f16(&self) -> Option<&'a [f16]> {
        match self {
            FloatSlice::F16(s) => Some(s),
            _ => None,
        }
    }

    /// Address range of the values (to check they lie inside a mapped file).
    pub fn addr_range(&self) -> Range<usize> {
        let (ptr, bytes) = match self {
            FloatSlice::F32(s) => (s.as_ptr() as usize, std::mem::size_of_val(*s)),
            FloatSlice::F16(s) => (s.as_ptr() as usize, std::mem::size_of_val(*s)),
            FloatSlice::Blocks { bytes, .. } => (bytes.as_ptr() as usize, bytes.len()),
        };
        ptr..ptr + bytes
    }
}

/// Which FFN matrix of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ffn {
    Gate,
    Up,
    Down,
}

impl Ffn {
    fn name(self) -> &'static str {
        match self {
            Ffn::Gate => "gate",
            Ffn::Up => "up",
            Ffn::Down => "down",
        }
    }
}

impl Vindex {
    /// The vindex directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed `index.json`.
    pub fn index(&self) -> &VindexIndex {
        &self.index
    }

    /// The model config persisted at build time.
    pub fn config(&self) -> &ModelConfig {
        &self.index.config
    }

    /// Dtype of the stored matrices (1-D tensors are always f32).
    pub fn dtype(&self) -> Dtype {
        self.index.dtype
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.index.shapes.num_layers
    }

    /// Address range of the memory map of `file` (one of [`files::BIN_FILES`]), `None` when the
    /// vindex has no such file. For tests that check views point into the map.
    pub fn mapped_range(&self, file: &str) -> Option<Range<usize>> {
        self.maps.get(file).map(|m| {
            let p = m.as_ptr() as usize;
            p..p + m.len()
        })
    }

    /// The whole mapped bytes of `file`, `None` when absent.
    pub fn mapped_bytes(&self, file: &str) -> Option<&[u8]> {
        self.maps.get(file).map(|m| &m[..])
    }

    /// Every stored tensor key (embeddings, norms, attention, FFN, lm_head, other), unordered.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The file and entry of a stored key.
    pub fn entry(&self, key: &str) -> Option<(&'static str, &TensorEntry)> {
        self.entries.get(key).map(|(f, e, _)| (*f, e))
    }

    /// View an entry's bytes in its format. The entry was validated at open (bounds, format
    /// allowed in its file, 64-byte aligned offset in a page-aligned map), which makes the
    /// float casts sound.
    fn view(&self, file: &'static str, e: &TensorEntry) -> FloatSlice<'_> {
        let map = &self.maps[file];
        let bytes = &map[e.offset..e.offset + e.length];
        match e.format {
            QuantFormat::F16 => {
                debug_assert_eq!(bytes.as_ptr() as usize % std::mem::align_of::<f16>(), 0);
                // SAFETY: aligned (see above), length = numel × 2, f16 is a plain u16 wrapper and
                // every bit pattern is valid; the map lives as long as `self`.
                FloatSlice::F16(unsafe {
                    std::slice::from_raw_parts(bytes.as_ptr() as *const f16, bytes.len() / 2)
                })
            }
            QuantFormat::F32 => {
                debug_assert_eq!(bytes.as_ptr() as usize % std::mem::align_of::<f32>(), 0);
                // SAFETY: as above for f32 (length = numel × 4; every bit pattern is a valid f32).
                FloatSlice::F32(unsafe {
                    std::slice::from_raw_parts(bytes.as_ptr() as *const f32, bytes.len() / 4)
                })
            }
            format => FloatSlice::Blocks { format, bytes },
        }
    }

    /// Token embeddings and their shape `[vocab, hidden]` in their stored format (ggml blocks
    /// in a vindex without a float tier).
    pub fn embeddings(&self) -> (FloatSlice<'_>, [usize; 2]) {
        let e = &self.index.embeddings;
        (
            self.view(files::EMBEDDINGS_BIN, e),
            [e.shape[0], e.shape[1]],
        )
    }

    /// The untied output projection `[vocab, hidden]`, `None` when the model ties it to the
    /// embeddings (use [`Vindex::embeddings`] then).
    pub fn lm_head(&self) -> Option<(FloatSlice<'_>, [usize; 2])> {
        self.index
            .lm_head
            .as_ref()
            .map(|e| (self.view(files::LM_HEAD_BIN, e), [e.shape[0], e.shape[1]]))
    }

    /// Any embedding, norm, attention, lm_head or other tensor by canonical key, with its shape.
    /// 1-D tensors are f32 in both tiers.
    /// Errors: [`VindexError::NoSuchTensor`]; FFN gate/up/down keys give
    /// [`VindexError::WrongDtype`]-style guidance to the per-layer accessors (down is stored
    /// transposed).
    pub fn tensor(&self, key: &str) -> Result<(FloatSlice<'_>, &[usize]), VindexError> {
        match self.entries.get(key) {
            Some((file, e, Kind::Plain)) => Ok((self.view(file, e), &e.shape)),
            Some((_, _, Kind::Ffn)) => Err(VindexError::WrongDtype {
                path: self.path.clone(),
                what: format!("'{key}'"),
                stored: "a feature-major [intermediate, hidden] FFN matrix".into(),
                hint: "use gate_layer/up_layer/down_layer(layer) (down_proj is stored transposed)"
                    .into(),
            }),
            None => Err(VindexError::NoSuchTensor {
                path: self.path.clone(),
                key: key.to_string(),
            }),
        }
    }

    /// True when [`Vindex::tensor`] finds `key` (any stored tensor except the feature-major FFN
    /// matrices, which the per-layer accessors serve).
    pub fn has_tensor(&self, key: &str) -> bool {
        matches!(self.entries.get(key), Some((_, _, Kind::Plain)))
    }

    pub(crate) fn check_layer(&self, layer: usize) -> Result<(), VindexError> {
        if layer >= self.num_layers() {
            return Err(VindexError::LayerOutOfRange {
                layer,
                num_layers: self.num_layers(),
            });
        }
        Ok(())
    }

    fn ffn_entry(
        &self,
        layer: usize,
        which: Ffn,
    ) -> Result<(&'static str, &TensorEntry), VindexError> {
        self.check_layer(layer)?;
        let l = &self.index.layers[layer];
        let (file, e) = match which {
            Ffn::Gate => (files::GATE_VECTORS_BIN, &l.gate),
            Ffn::Up => (files::UP_FEATURES_BIN, &l.up),
            Ffn::Down => (files::DOWN_FEATURES_BIN, &l.down),
        };
        let e = e.as_ref().ok_or_else(|| VindexError::Absent {
            path: self.path.join(file),
            what: format!("layer {layer}'s dense FFN {} matrix", which.name()),
        })?;
        Ok((file, e))
    }

    fn ffn(&self, layer: usize, which: Ffn) -> Result<(FloatSlice<'_>, [usize; 2]), VindexError> {
        let (file, e) = self.ffn_entry(layer, which)?;
        Ok((self.view(file, e), [e.shape[0], e.shape[1]]))
    }

    fn ffn_f32(
        &self,
        layer: usize,
        which: Ffn,
        accessor: &str,
    ) -> Result<(&[f32], [usize; 2]), VindexError> {
        let (s, shape) = self.ffn(layer, which)?;
        match s {
            FloatSlice::F32(v) => Ok((v, shape)),
            _ => Err(VindexError::WrongDtype {
                path: self.path.clone(),
                what: format!("layer {layer}'s FFN {} matrix", which.name()),
                stored: s.format().name().into(),
                hint: format!(
                    "{accessor} needs the f32 tier; use {}_layer(layer) (FloatSlice) or gate_vectors_f16",
                    which.name()
                ),
            }),
        }
    }

    /// FFN width of `layer` (rows of its feature-major matrices).
    /// Errors: layer out of range, or no dense FFN in that layer.
    pub fn intermediate_size(&self, layer: usize) -> Result<usize, VindexError> {
        Ok(self
            .ffn_entry(layer, Ffn::Gate)
            .or_else(|_| self.ffn_entry(layer, Ffn::Up))?
            .1
            .shape[0])
    }

    /// Gate rows of `layer`, `[intermediate, hidden]` row-major, f32, straight from the mmap: the
    /// gate KNN index. Errors: layer out of range; absent FFN; [`VindexError::WrongDtype`] for an
    /// f16 vindex (use [`Vindex::gate_vectors_f16`] or [`Vindex::gate_layer`]).
    pub fn gate_vectors(&self, layer: usize) -> Result<&[f32], VindexError> {
        Ok(self.ffn_f32(layer, Ffn::Gate, "gate_vectors")?.0)
    }

    /// Gate rows of `layer` of an f16 vindex, `[intermediate, hidden]`, from the mmap.
    /// Errors: as [`Vindex::gate_vectors`], with f32 storage as the wrong dtype.
    pub fn gate_vectors_f16(&self, layer: usize) -> Result<&[f16], VindexError> {
        let (s, _) = self.ffn(layer, Ffn::Gate)?;
        s.as_f16().ok_or_else(|| VindexError::WrongDtype {
            path: self.path.clone(),
            what: format!("layer {layer}'s FFN gate matrix"),
            stored: "f32".into(),
            hint: "use gate_vectors(layer)".into(),
        })
    }

    /// Gate matrix of `layer` in its stored dtype, `[intermediate, hidden]`.
    pub fn gate_layer(&self, layer: usize) -> Result<FloatSlice<'_>, VindexError> {
        Ok(self.ffn(layer, Ffn::Gate)?.0)
    }

    /// Up matrix of `layer` in its stored dtype, `[intermediate, hidden]`.
    pub fn up_layer(&self, layer: usize) -> Result<FloatSlice<'_>, VindexError> {
        Ok(self.ffn(layer, Ffn::Up)?.0)
    }

    /// Down matrix of `layer` in its stored dtype, transposed to feature-major
    /// `[intermediate, hidden]` (row i = feature i's output vector; HF's `down_proj.weight` is
    /// `[hidden, intermediate]`).
    pub fn down_layer(&self, layer: usize) -> Result<FloatSlice<'_>, VindexError> {
        Ok(self.ffn(layer, Ffn::Down)?.0)
    }

    fn matrix<'a>(
        &self,
        layer: usize,
        which: Ffn,
        r: usize,
        c: usize,
        s: &'a [f32],
    ) -> Result<ArrayView2<'a, f32>, VindexError> {
        ArrayView2::from_shape((r, c), s).map_err(|e| VindexError::BadEntry {
            path: self.path.clone(),
            key: format!("layer {layer} {}", which.name()),
            msg: e.to_string(),
        })
    }

    /// Up matrix of `layer` as a zero-copy `[intermediate, hidden]` f32 view (f32 tier only).
    pub fn up_layer_matrix(&self, layer: usize) -> Result<ArrayView2<'_, f32>, VindexError> {
        let (s, [r, c]) = self.ffn_f32(layer, Ffn::Up, "up_layer_matrix")?;
        self.matrix(layer, Ffn::Up, r, c, s)
    }

    /// Down matrix of `layer` as a zero-copy feature-major `[intermediate, hidden]` f32 view
    /// (f32 tier only).
    pub fn down_layer_matrix(&self, layer: usize) -> Result<ArrayView2<'_, f32>, VindexError> {
        let (s, [r, c]) = self.ffn_f32(layer, Ffn::Down, "down_layer_matrix")?;
        self.matrix(layer, Ffn::Down, r, c, s)
    }

    /// Path of the stored `tokenizer.json`, `None` for a weights-only vindex.
    pub fn tokenizer_json_path(&self) -> Option<PathBuf> {
        self.index
            .has_tokenizer
            .then(|| self.path.join(files::TOKENIZER_JSON))
    }

    /// The stored `tokenizer.json` text (read on demand: it can be tens of MB).
    /// Errors: [`VindexError::Absent`] for a weights-only vindex; I/O naming the file.
    pub fn tokenizer_json(&self) -> Result<String, VindexError> {
        let p = self
            .tokenizer_json_path()
            .ok_or_else(|| VindexError::Absent {
                path: self.path.join(files::TOKENIZER_JSON),
                what: "tokenizer.json".into(),
            })?;
        infer_models::text::read_utf8(&p).map_err(|e| VindexError::io(&p, e))
    }

    /// The stored `tokenizer_config.json` text, when the source had one.
    pub fn tokenizer_config_json(&self) -> Option<&str> {
        self.tokenizer_config.as_deref()
    }

    /// The stored Jinja chat template, when the source had one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}
