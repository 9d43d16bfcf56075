//! Tokenization through the `tokenizers` crate, and streaming detokenization.

use crate::InferenceError;

/// A HF `tokenizer.json` tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens encoded as plain text ([`Tokenizer::encode_text`]).
    text_only: tokenizers::Tokenizer,
    /// Contents of the special added tokens (`<|im_start|>`, `<bos>`, …).
    special: Vec<String>,
}

impl Tokenizer {
    /// Parse a `tokenizer.json` document.
    pub fn from_json(json: &str) -> Result<Self, InferenceError> {
        let inner = json
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| InferenceError::Tokenizer(e.to_string()))?;
        let mut text_only = inner.clone();
        text_only.set_encode_special_tokens(true);
        let special = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        Ok(Tokenizer {
            inner,
            text_only,
            special,
        })
    }

    /// Encode text with special-token markup taken as plain text (`<|im_start|>` becomes the
    /// tokens of its characters, never the control token), without the post-processor: how
    /// user-typed content is tokenized.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, InferenceError> {
        let enc = self
            .text_only
            .encode(text, false)
            .map_err(|e| InferenceError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// True when `text` contains the markup of a special token.
    pub fn has_special_markup(&self, text: &str) -> bool {
        self.special.iter().any(|t| text.contains(t.as_str()))
    }

    /// Encode text. `add_special` applies the tokenizer's post-processor (e.g. Gemma's `<bos>`);
    /// special-token markup in the text (`<|im_start|>`) is always recognised.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, InferenceError> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| InferenceError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode ids to text (special tokens kept when `skip_special` is false).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, InferenceError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| InferenceError::Tokenizer(e.to_string()))
    }

    /// The id of a token string, e.g. `"<end_of_turn>"`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

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
