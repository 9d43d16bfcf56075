//! SentencePiece-style tokenizer of a GGUF `tokenizer.ggml.model = llama` vocabulary, exactly as
//! llama.cpp runs it (`llm_tokenizer_spm` and the `LLAMA_VOCAB_TYPE_SPM` branch of
//! `llama_vocab::impl::tokenize` / `token_to_piece` in `src/llama-vocab.cpp`): special tokens are
//! cut out first ([`super::special::partition`]), a space is prepended to text that starts the
//! input or follows a special token (`add_space_prefix`), spaces become `▁`, then adjacent
//! symbols (initially UTF-8 characters) are merged greedily by the **score of the merged piece**
//! (highest first, leftmost on ties) while the merged text is a vocabulary entry; characters no
//! piece covers become `<0xXX>` byte tokens.
//!
//! This is not expressible as a Hugging Face BPE merge list (equal scores are broken by position,
//! not by a rank), hence a tokenizer of its own.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use serde::{Deserialize, Serialize};

use super::special::{partition, Fragment, SpecialTokens};
use super::{TokenType, TokenizerError};

/// `▁` (U+2581), SentencePiece's space.
const SPACE: &str = "\u{2581}";

/// The stored form of an SPM vocabulary (the `infer_spm` object of a vindex `tokenizer.json`):
/// the GGUF `tokenizer.ggml.*` arrays and flags, already validated.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SpmSpec {
    /// Piece text by id (`tokenizer.ggml.tokens`).
    pub tokens: Vec<String>,
    /// Piece score by id (`tokenizer.ggml.scores`).
    pub scores: Vec<f32>,
    /// llama.cpp token type by id (`tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte).
    pub token_type: Vec<i32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (llama.cpp default for SPM: true).
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token` (default false).
    pub add_eos: bool,
    /// `tokenizer.ggml.add_space_prefix` (default true; Gemma: false).
    pub add_space_prefix: bool,
}

/// A ready SPM tokenizer: the spec plus its lookup tables.
pub struct SpmTokenizer {
    spec: SpmSpec,
    index: HashMap<String, u32>,
    types: Vec<TokenType>,
    specials: SpecialTokens,
    bytes: [Option<u32>; 256],
}

/// A candidate merge of symbols `left` and `right` (llama.cpp `llm_bigram_spm`).
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// A run of the text: `start..start + len` bytes, linked to its neighbours (`usize::MAX` = none).
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

impl SpmTokenizer {
    /// Build the lookup tables. Errors: a spec whose arrays disagree in length, or a duplicate
    /// piece (both would make ids ambiguous).
    pub fn new(spec: SpmSpec) -> Result<Self, TokenizerError> {
        let n = spec.tokens.len();
        if spec.scores.len() != n || spec.token_type.len() != n {
            return Err(TokenizerError(format!(
                "SentencePiece vocabulary: {n} tokens but {} scores and {} token types",
                spec.scores.len(),
                spec.token_type.len()
            )));
        }
        let mut index = HashMap::with_capacity(n);
        for (id, t) in spec.tokens.iter().enumerate() {
            if let Some(first) = index.insert(t.clone(), id as u32) {
                return Err(TokenizerError(format!(
                    "SentencePiece vocabulary: token {t:?} appears twice (ids {first} and {id})"
                )));
            }
        }
        let types: Vec<TokenType> = spec
            .token_type
            .iter()
            .map(|&t| TokenType::from(t))
            .collect();
        let specials = SpecialTokens::new(&spec.tokens, &types);
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = index
                .get(&format!("<0x{b:02X}>"))
                .or_else(|| {
                    std::str::from_utf8(&[b as u8])
                        .ok()
                        .and_then(|s| index.get(s))
                })
                .copied();
        }
        Ok(SpmTokenizer {
            spec,
            index,
            types,
            specials,
            bytes,
        })
    }

    /// The stored spec.
    pub fn spec(&self) -> &SpmSpec {
        &self.spec
    }

    /// Number of ids.
    pub fn vocab_size(&self) -> usize {
        self.spec.tokens.len()
    }

    /// Encode `text`: `add_special` adds BOS/EOS per `add_bos`/`add_eos`; `parse_special`
    /// recognises control tokens written in the text (user-defined ones always are).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_special && self.spec.add_bos {
            out.extend(self.spec.bos);
        }
        let mut prev_special = true;
        for frag in partition(text, &self.specials, &self.types, parse_special) {
            match frag {
                Fragment::Text(piece) => {
                    let mut s = String::with_capacity(piece.len() + 3);
                    if self.spec.add_space_prefix && prev_special {
                        s.push(' ');
                    }
                    s.push_str(piece);
                    self.encode_piece(&s.replace(' ', SPACE), &mut out);
                    prev_special = false;
                }
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
            }
        }
        if add_special && self.spec.add_eos {
            out.extend(self.spec.eos);
        }
        out
    }

    /// llama.cpp `llm_tokenizer_spm_session::tokenize` on escaped text.
    fn encode_piece(&self, text: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<Symbol> = text
            .char_indices()
            .map(|(i, c)| Symbol {
                start: i,
                len: c.len_utf8(),
                prev: NONE,
                next: NONE,
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = if i == 0 { NONE } else { i - 1 };
            s.next = if i + 1 == n { NONE } else { i + 1 };
        }
        let mut queue = BinaryHeap::new();
        let try_add =
            |queue: &mut BinaryHeap<Bigram>, syms: &[Symbol], left: usize, right: usize| {
                if left == NONE || right == NONE {
                    return;
                }
                let (l, r) = (syms[left], syms[right]);
                let merged = &text[l.start..l.start + l.len + r.len];
                if let Some(&id) = self.index.get(merged) {
                    queue.push(Bigram {
                        left,
                        right,
                        score: self.spec.scores[id as usize],
                        size: merged.len(),
                    });
                }
            };
        for i in 1..n {
            try_add(&mut queue, &syms, i - 1, i);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue; // one side was merged since
            }
            syms[b.left].len += r.len;
            syms[b.right].len = 0;
            syms[b.left].next = r.next;
            if r.next != NONE {
                syms[r.next].prev = b.left;
            }
            try_add(&mut queue, &syms, syms[b.left].prev, b.left);
            try_add(&mut queue, &syms, b.left, syms[b.left].next);
        }
        let mut i = if n == 0 { NONE } else { 0 };
        while i != NONE {
            let s = syms[i];
            let piece = &text[s.start..s.start + s.len];
            match self.index.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    // Byte fallback (llama.cpp `byte_to_token`), else the unknown token.
                    for &b in piece.as_bytes() {
                        out.extend(self.bytes[b as usize].or(self.spec.unk));
                    }
                }
            }
            i = s.next;
        }
    }

    /// Decode ids as llama.cpp `token_to_piece` (SPM): normal pieces with `▁` → space, byte
    /// tokens as their byte, user-defined pieces as is, control (and unknown, unused) pieces
    /// only when `skip_special` is false; one leading space is dropped when `add_space_prefix`.
    /// Invalid UTF-8 (e.g. half a character) becomes U+FFFD. Errors: an id out of range.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let text = self.spec.tokens.get(id as usize).ok_or_else(|| {
                TokenizerError(format!(
                    "token id {id} is outside the vocabulary (size {})",
                    self.vocab_size()
                ))
            })?;
            match self.types[id as usize] {
                TokenType::Normal => bytes.extend_from_slice(text.replace(SPACE, " ").as_bytes()),
                TokenType::Byte => match parse_byte_token(text) {
                    Some(b) => bytes.push(b),
                    None => bytes.extend_from_slice(text.as_bytes()),
                },
                TokenType::UserDefined => bytes.extend_from_slice(text.as_bytes()),
                _ if !skip_special => bytes.extend_from_slice(text.as_bytes()),
                _ => {}
            }
        }
        let mut s = String::from_utf8_lossy(&bytes).into_owned();
        if self.spec.add_space_prefix && s.starts_with(' ') {
            s.remove(0);
        }
        Ok(s)
    }

    /// The id of a piece.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.index.get(token).copied()
    }

    /// The piece of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.spec.tokens.get(id as usize).cloned()
    }
}

/// `<0xAB>` → `0xAB`.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: `ab` outscores `▁a`, and `▁ab` outscores both.
    fn toy(add_space_prefix: bool) -> SpmTokenizer {
        let tokens = [
            "<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁a", "▁ab", "<0x0A>",
        ];
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5, -0.7, -0.1, 0.0];
        let types = [2, 3, 3, 1, 1, 1, 1, 1, 1, 6];
        SpmTokenizer::new(SpmSpec {
            tokens: tokens.iter().map(|s| s.to_string()).collect(),
            scores: scores.to_vec(),
            token_type: types.to_vec(),
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            add_bos: true,
            add_eos: false,
            add_space_prefix,
        })
        .unwrap()
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let t = toy(true);
        // " ab": symbols ▁ a b; "ab" (-0.5) beats "▁a" (-0.7), then "▁ab" (-0.1).
        assert_eq!(t.encode("ab", false, false), vec![8]);
        assert_eq!(t.encode("ab", true, false), vec![1, 8]);
        // "\n" is not a piece: byte token; "c" has no byte token: unknown.
        assert_eq!(t.encode("a\nc", false, false), vec![7, 9, 0]);
        assert_eq!(t.decode(&[1, 8, 9], true).unwrap(), "ab\n");
        assert_eq!(t.decode(&[1, 8], false).unwrap(), "<s> ab");
    }

    #[test]
    fn control_tokens_split_only_when_parsing_special() {
        let t = toy(false);
        assert_eq!(t.encode("a</s>b", false, true), vec![4, 2, 5]);
        assert_eq!(t.encode("a</s>b", false, false), vec![4, 0, 0, 0, 0, 5]);
    }

    #[test]
    fn duplicate_pieces_are_refused() {
        let err = SpmTokenizer::new(SpmSpec {
            tokens: vec!["a".into(), "a".into()],
            scores: vec![0.0; 2],
            token_type: vec![1; 2],
            bos: None,
            eos: None,
            unk: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
        })
        .err()
        .unwrap();
        assert!(err.0.contains("\"a\" appears twice (ids 0 and 1)"), "{err}");
    }
}
