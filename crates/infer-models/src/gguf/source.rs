//! [`GgufTensors`]: a GGUF's tensors under HF names and shapes, read as f32 with llama.cpp's
//! conventions undone; and [`open_gguf_source`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::family::family;
use super::permute::{unpermute_qk_byte_rows, unpermute_qk_rows};
use super::{config_from_gguf, tokenizer_json_from_gguf, GgufFile};
use crate::names::{gguf_to_hf_name, MappedName};
use crate::{ModelConfig, ModelError, ModelSource, SourceKind, Tensor, TensorInfo, TensorSource};

/// What [`GgufTensors::read_f32`] does after dequantizing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fixup {
    None,
    /// llama.cpp's Q/K row permutation, with this many heads (KV heads for K).
    UnpermuteRows {
        n_head: usize,
    },
    /// Gemma norm weight stored as `1 + w`.
    MinusOne,
}

/// A tensor's raw ggml blocks (borrowed, or owned when rows were reordered) and its info.
pub type RawBlocks<'a> = (std::borrow::Cow<'a, [u8]>, crate::TensorInfo);

/// The tensors of a GGUF file by HF name (see [`crate::names`]), in file order.
pub struct GgufTensors {
    file: Arc<GgufFile>,
    infos: Vec<TensorInfo>,
    gguf_names: Vec<String>,
    fixups: Vec<Fixup>,
    index: HashMap<String, usize>,
}

impl GgufTensors {
    /// Map every tensor of `file` to its HF name and shape (GGUF dims reversed).
    ///
    /// RoPE frequency-factor tensors (`rope_freqs`, …) are not weights and are left out.
    /// Errors: [`ModelError::UnknownArchitecture`] for an unsupported `general.architecture`,
    /// [`ModelError::Unsupported`] naming a tensor with no HF name for this architecture.
    pub fn new(file: Arc<GgufFile>, config: &ModelConfig) -> Result<Self, ModelError> {
        let path = file.path().to_path_buf();
        let arch = file.get_str("general.architecture").unwrap_or_default();
        let fam = family(arch).ok_or_else(|| ModelError::UnknownArchitecture {
            path: path.clone(),
            model_type: arch.to_string(),
            supported: super::family::supported(),
        })?;
        let n = file.tensor_infos().len();
        let (mut infos, mut gguf_names, mut fixups) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut index = HashMap::with_capacity(n);
        for t in file.tensor_infos() {
            let hf = match gguf_to_hf_name(arch, &t.name) {
                MappedName::Hf(hf) => hf,
                MappedName::NotAWeight => continue,
                MappedName::Unknown => {
                    return Err(ModelError::Unsupported {
                        path,
                        msg: format!(
                            "tensor '{}' has no HF name for architecture '{arch}'",
                            t.name
                        ),
                    })
                }
            };
            let fixup = if fam.qk_permuted && hf.contains(".self_attn.q_proj.") {
                Fixup::UnpermuteRows {
                    n_head: config.num_attention_heads,
                }
            } else if fam.qk_permuted && hf.contains(".self_attn.k_proj.") {
                Fixup::UnpermuteRows {
                    n_head: config.num_key_value_heads,
                }
            } else if fam.norm_plus_one && t.name.ends_with("norm.weight") {
                Fixup::MinusOne
            } else {
                Fixup::None
            };
            index.insert(hf.clone(), infos.len());
            infos.push(TensorInfo {
                name: hf,
                shape: t.hf_shape(),
                dtype: t.format,
                bytes: t.n_bytes,
            });
            gguf_names.push(t.name.clone());
            fixups.push(fixup);
        }
        Ok(Self {
            file,
            infos,
            gguf_names,
            fixups,
            index,
        })
    }

    /// The GGUF name a HF tensor name was mapped from.
    pub fn gguf_name(&self, hf_name: &str) -> Option<&str> {
        self.index
            .get(hf_name)
            .map(|&i| self.gguf_names[i].as_str())
    }

    /// The raw (still quantized, still permuted) bytes of a tensor, by HF name, from the mmap.
    pub fn raw_bytes(&self, hf_name: &str) -> Result<&[u8], ModelError> {
        let g = self
            .gguf_name(hf_name)
            .ok_or_else(|| ModelError::NoSuchTensor {
                path: self.file.path().to_path_buf(),
                name: hf_name.to_string(),
            })?;
        self.file.tensor_bytes(g)
    }

    /// A tensor's raw ggml blocks with its storage format, in HF row order: llama.cpp's Q/K row
    /// permutation is undone on whole rows (each row is whole blocks), so the bytes dequantize
    /// to exactly [`TensorSource::read_f32`]'s values. `Ok(None)` for a tensor whose stored values
    /// differ from HF's by more than row order (Gemma's `+1` norms).
    /// Errors: [`ModelError::NoSuchTensor`]; [`ModelError::BadTensor`] when the rows do not split
    /// into the permutation's heads.
    pub fn raw_blocks_hf_order(&self, hf_name: &str) -> Result<Option<RawBlocks<'_>>, ModelError> {
        let path = self.file.path();
        let &i = self
            .index
            .get(hf_name)
            .ok_or_else(|| ModelError::NoSuchTensor {
                path: path.to_path_buf(),
                name: hf_name.to_string(),
            })?;
        let info = self.infos[i].clone();
        let bytes = self.file.tensor_bytes(&self.gguf_names[i])?;
        match self.fixups[i] {
            Fixup::None => Ok(Some((std::borrow::Cow::Borrowed(bytes), info))),
            Fixup::MinusOne => Ok(None),
            Fixup::UnpermuteRows { n_head } => {
                let rows = info.shape.first().copied().unwrap_or(0);
                let out = unpermute_qk_byte_rows(bytes, rows, n_head).map_err(|msg| {
                    ModelError::BadTensor {
                        path: path.to_path_buf(),
                        name: hf_name.to_string(),
                        msg,
                    }
                })?;
                Ok(Some((std::borrow::Cow::Owned(out), info)))
            }
        }
    }

    /// The parsed file.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }
}

impl TensorSource for GgufTensors {
    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }

    /// Dequantize with `infer_quant::dequantize` (ggml `dequantize_row_*`), then undo
    /// llama.cpp's Q/K row permutation (llama) or the `+1` on `*norm.weight` (Gemma family).
    fn read_f32(&self, name: &str) -> Result<Tensor, ModelError> {
        let path = self.file.path();
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| ModelError::NoSuchTensor {
                path: path.to_path_buf(),
                name: name.to_string(),
            })?;
        let info = &self.infos[i];
        let bytes = self.file.tensor_bytes(&self.gguf_names[i])?;
        let mut data = vec![0f32; info.shape.iter().product()];
        infer_quant::dequantize(info.dtype, bytes, &mut data).map_err(|source| {
            ModelError::Quant {
                path: path.to_path_buf(),
                source,
            }
        })?;
        match self.fixups[i] {
            Fixup::None => {}
            Fixup::MinusOne => data.iter_mut().for_each(|v| *v -= 1.0),
            Fixup::UnpermuteRows { n_head } => {
                let rows = info.shape.first().copied().unwrap_or(0);
                data = unpermute_qk_rows(&data, rows, n_head).map_err(|msg| {
                    ModelError::BadTensor {
                        path: path.to_path_buf(),
                        name: name.to_string(),
                        msg,
                    }
                })?;
            }
        }
        Ok(Tensor {
            shape: info.shape.clone(),
            data,
        })
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.infos[i])
    }

    /// [`GgufTensors::raw_blocks_hf_order`]: the ggml blocks, Q/K rows un-permuted.
    fn encoded_rows(&self, name: &str) -> Result<Option<crate::EncodedRows<'_>>, ModelError> {
        Ok(self
            .raw_blocks_hf_order(name)?
            .map(|(bytes, info)| crate::EncodedRows {
                format: info.dtype,
                bytes,
            }))
    }
}

/// Read `dir/name` when it exists. Errors: it exists but cannot be read.
fn read_sibling(dir: &Path, name: &str) -> Result<Option<String>, ModelError> {
    let p = dir.join(name);
    if !p.is_file() {
        return Ok(None);
    }
    crate::text::read_utf8(&p)
        .map(Some)
        .map_err(|source| ModelError::Io { path: p, source })
}

/// Open a GGUF file as a [`ModelSource`]: config from metadata ([`config_from_gguf`]), tensors
/// by HF name ([`GgufTensors`]), `chat_template` from `tokenizer.chat_template`.
///
/// `tokenizer_json`: a `tokenizer.json` next to the GGUF when present, else the one
/// [`tokenizer_json_from_gguf`] builds (byte-level BPE GGUFs), else `None` — call
/// [`tokenizer_json_from_gguf`] for the reason. `tokenizer_config_json`: a
/// `tokenizer_config.json` next to the GGUF when present.
///
/// Errors: those of [`GgufFile::open`], [`config_from_gguf`] and [`GgufTensors::new`]; a
/// sibling tokenizer file that exists but cannot be read.
pub fn open_gguf_source(path: &Path) -> Result<ModelSource, ModelError> {
    let file = Arc::new(GgufFile::open(path)?);
    let config = config_from_gguf(&file)?;
    let tensors = GgufTensors::new(file.clone(), &config)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tokenizer_json = match read_sibling(dir, "tokenizer.json")? {
        Some(t) => Some(t),
        None => tokenizer_json_from_gguf(&file).ok(),
    };
    Ok(ModelSource {
        path: path.to_path_buf(),
        kind: SourceKind::Gguf,
        config,
        tensors: Box::new(tensors),
        tokenizer_json,
        tokenizer_config_json: read_sibling(dir, "tokenizer_config.json")?,
        chat_template: file.get_str("tokenizer.chat_template").map(str::to_string),
        gguf: Some(file),
    })
}
