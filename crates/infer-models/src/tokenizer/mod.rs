//! Text ↔ token ids for every tokenizer a vindex can store.
//!
//! A vindex `tokenizer.json` is either a Hugging Face `tokenizer.json` (run by the `tokenizers`
//! crate; GGUF byte-level BPE vocabularies are converted to one by
//! [`crate::gguf::tokenizer_json_from_gguf`]) or, for a GGUF SentencePiece vocabulary
//! (`tokenizer.ggml.model = llama`), a document `{"infer_spm": {…}}` ([`SpmSpec`]) run by
//! [`SpmTokenizer`], llama.cpp's algorithm.

mod special;
mod spm;

use std::sync::OnceLock;

pub use special::{partition, Fragment, SpecialTokens};
pub use spm::{SpmSpec, SpmTokenizer};

/// A tokenizer error (malformed document, id out of range, …), as text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenizerError(pub String);

/// llama.cpp `llama_token_type` (GGUF `tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl From<i32> for TokenType {
    fn from(t: i32) -> Self {
        match t {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

impl TokenType {
    /// Control, unknown or user-defined: matched verbatim in text before tokenizing.
    pub fn is_special_or_user(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::Unknown | TokenType::UserDefined
        )
    }
}

/// Key of the SPM document in a vindex `tokenizer.json`.
pub const SPM_KEY: &str = "infer_spm";

/// The SPM document `{"infer_spm": spec}` as JSON text.
pub fn spm_json(spec: &SpmSpec) -> String {
    let mut doc = serde_json::Map::new();
    doc.insert(
        SPM_KEY.to_string(),
        serde_json::to_value(spec).expect("SpmSpec serializes"),
    );
    serde_json::Value::Object(doc).to_string()
}

enum Inner {
    Hf {
        tok: Box<tokenizers::Tokenizer>,
        /// The same tokenizer with special tokens encoded as text (built on first use).
        plain: OnceLock<Box<tokenizers::Tokenizer>>,
    },
    Spm(Box<SpmTokenizer>),
}

/// A loaded tokenizer: HF `tokenizers` or llama.cpp-style SentencePiece.
pub struct Tokenizer {
    inner: Inner,
}

fn hf_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError(e.to_string())
}

impl Tokenizer {
    /// Parse a vindex `tokenizer.json` (see the module doc). Errors: not JSON, not a tokenizer.
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        if json.trim_start().starts_with(&format!("{{\"{SPM_KEY}\"")) {
            let mut doc: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(json).map_err(hf_err)?;
            let spec = doc
                .remove(SPM_KEY)
                .ok_or_else(|| TokenizerError(format!("no \"{SPM_KEY}\" object")))?;
            let spec: SpmSpec = serde_json::from_value(spec)
                .map_err(|e| TokenizerError(format!("\"{SPM_KEY}\": {e}")))?;
            return Ok(Tokenizer {
                inner: Inner::Spm(Box::new(SpmTokenizer::new(spec)?)),
            });
        }
        let tok = json.parse::<tokenizers::Tokenizer>().map_err(hf_err)?;
        Ok(Tokenizer {
            inner: Inner::Hf {
                tok: Box::new(tok),
                plain: OnceLock::new(),
            },
        })
    }

    /// Encode text. `add_special` adds the model's BOS/EOS (HF post-processor, or GGUF
    /// `add_bos_token`/`add_eos_token`); `parse_special` recognises special-token markup
    /// (`<|im_start|>`) in the text — false encodes it as plain text (llama.cpp
    /// `parse_special`, HF `encode_special_tokens`). Non-special added (user-defined) tokens are
    /// always recognised.
    pub fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        match &self.inner {
            Inner::Spm(t) => Ok(t.encode(text, add_special, parse_special)),
            Inner::Hf { tok, plain } => {
                let tok = if parse_special {
                    tok
                } else {
                    plain.get_or_init(|| {
                        let mut t = tok.clone();
                        t.set_encode_special_tokens(true);
                        t
                    })
                };
                let enc = tok.encode_fast(text, add_special).map_err(hf_err)?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }

    /// Decode ids to text (special tokens dropped when `skip_special`). Errors: unknown ids.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        match &self.inner {
            Inner::Spm(t) => t.decode(ids, skip_special),
            Inner::Hf { tok, .. } => {
                if let Some(&bad) = ids.iter().find(|&&i| tok.id_to_token(i).is_none()) {
                    return Err(TokenizerError(format!(
                        "token id {bad} is outside the vocabulary (size {})",
                        tok.get_vocab_size(true)
                    )));
                }
                tok.decode(ids, skip_special).map_err(hf_err)
            }
        }
    }

    /// The id of a token string, e.g. `"<end_of_turn>"`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Inner::Spm(t) => t.token_to_id(token),
            Inner::Hf { tok, .. } => tok.token_to_id(token),
        }
    }

    /// The token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Spm(t) => t.id_to_token(id),
            Inner::Hf { tok, .. } => tok.id_to_token(id),
        }
    }

    /// One more than the largest id the tokenizer can produce (vocabulary plus added tokens).
    pub fn id_bound(&self) -> usize {
        match &self.inner {
            Inner::Spm(t) => t.vocab_size(),
            Inner::Hf { tok, .. } => {
                let model_max = tok.get_vocab(true).values().copied().max();
                model_max.map_or(0, |m| m as usize + 1)
            }
        }
    }
}
