//! Tokenization ([`infer_models::tokenizer::Tokenizer`]: HF `tokenizer.json` or a GGUF
//! SentencePiece vocabulary), and streaming detokenization.

use crate::InferenceError;

fn err(e: infer_models::tokenizer::TokenizerError) -> InferenceError {
    InferenceError::Tokenizer(e.0)
}

/// A vindex tokenizer (see [`infer_models::tokenizer`]).
pub struct Tokenizer {
    inner: infer_models::tokenizer::Tokenizer,
}

impl Tokenizer {
    /// Parse a vindex `tokenizer.json` document.
    pub fn from_json(json: &str) -> Result<Self, InferenceError> {
        let inner = infer_models::tokenizer::Tokenizer::from_json(json).map_err(err)?;
        Ok(Tokenizer { inner })
    }

    /// Encode text. `add_special` adds the model's BOS/EOS (e.g. Gemma's `<bos>`); special-token
    /// markup in the text (`<|im_start|>`) is recognised.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, InferenceError> {
        self.encode_with(text, add_special, true)
    }

    /// Encode text; `parse_special` false encodes special-token markup as plain text.
    pub fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, InferenceError> {
        self.inner
            .encode_with(text, add_special, parse_special)
            .map_err(err)
    }

    /// Encode text with special-token markup taken as plain text (`<|im_start|>` becomes the
    /// tokens of its characters, never the control token), without BOS/EOS: how user-typed
    /// content is tokenized.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, InferenceError> {
        self.encode_with(text, false, false)
    }

    /// True when `text` contains the markup of a special token (it tokenizes differently with
    /// and without special-token parsing).
    pub fn has_special_markup(&self, text: &str) -> bool {
        match (
            self.encode_with(text, false, true),
            self.encode_with(text, false, false),
        ) {
            (Ok(a), Ok(b)) => a != b,
            _ => false,
        }
    }

    /// Decode ids to text (special tokens kept when `skip_special` is false).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, InferenceError> {
        self.inner.decode(ids, skip_special).map_err(err)
    }

    /// The id of a token string, e.g. `"<end_of_turn>"`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

/// Turns a stream of token ids into a stream of valid UTF-8 text pieces: a piece is released
/// only once the decoded text no longer ends in an incomplete character (U+FFFD).
pub struct TextStreamer<'t> {
    tok: &'t Tokenizer,
    ids: Vec<u32>,
    emitted: usize,
}

impl<'t> TextStreamer<'t> {
    pub fn new(tok: &'t Tokenizer) -> Self {
        TextStreamer {
            tok,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Add a token; returns newly completed text, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, InferenceError> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids, true)?;
        if text.ends_with('\u{FFFD}')
            || text.len() <= self.emitted
            || !text.is_char_boundary(self.emitted)
        {
            return Ok(None);
        }
        let piece = text[self.emitted..].to_string();
        self.emitted = text.len();
        Ok(Some(piece))
    }

    /// All text decoded so far.
    pub fn text(&self) -> Result<String, InferenceError> {
        self.tok.decode(&self.ids, true)
    }
}
