//! Cutting special tokens out of text before it is tokenized (llama.cpp
//! `llama_vocab::impl::tokenizer_st_partition`): every control, user-defined and unknown token,
//! longest text first, splits the remaining text fragments where it occurs; control and unknown
//! tokens only when special tokens are parsed, user-defined ones always.

use super::TokenType;

/// One piece of partitioned input: raw text, or a token id matched verbatim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// The ids that [`partition`] looks for, longest text first (ties: lower id first), with an
/// index by first byte to find the few that occur in a text.
pub struct SpecialTokens {
    order: Vec<(u32, String)>,
    by_first_byte: Vec<Vec<usize>>,
}

impl SpecialTokens {
    /// Collect the control, user-defined and unknown tokens (non-empty texts only).
    pub fn new(tokens: &[String], types: &[TokenType]) -> Self {
        let mut order: Vec<(u32, String)> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (t, ty))| !t.is_empty() && ty.is_special_or_user())
            .map(|(id, (t, _))| (id as u32, t.clone()))
            .collect();
        order.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let mut by_first_byte = vec![Vec::new(); 256];
        for (k, (_, t)) in order.iter().enumerate() {
            by_first_byte[t.as_bytes()[0] as usize].push(k);
        }
        SpecialTokens {
            order,
            by_first_byte,
        }
    }

    /// Which entries of `order` occur somewhere in `text`.
    fn present(&self, text: &str) -> Vec<bool> {
        let mut present = vec![false; self.order.len()];
        let bytes = text.as_bytes();
        for i in 0..bytes.len() {
            for &k in &self.by_first_byte[bytes[i] as usize] {
                if !present[k] && bytes[i..].starts_with(self.order[k].1.as_bytes()) {
                    present[k] = true;
                }
            }
        }
        present
    }
}

/// Split `text` at the special tokens (see the module doc). `types` is indexed by id.
pub fn partition<'a>(
    text: &'a str,
    specials: &SpecialTokens,
    types: &[TokenType],
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frags = vec![Fragment::Text(text)];
    let present = specials.present(text);
    for ((id, tok), _) in specials.order.iter().zip(present).filter(|(_, p)| *p) {
        if !parse_special && types[*id as usize] != TokenType::UserDefined {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(pos) = rest.find(tok.as_str()) {
                if pos > 0 {
                    next.push(Fragment::Text(&rest[..pos]));
                }
                next.push(Fragment::Token(*id));
                rest = &rest[pos + tok.len()..];
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        frags = next;
    }
    frags
}
