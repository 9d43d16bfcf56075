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

/// The ids that [`partition`] looks for, longest text first (ties: lower id first).
pub struct SpecialTokens {
    order: Vec<(u32, String)>,
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
        SpecialTokens { order }
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
    for (id, tok) in &specials.order {
        if !parse_special && types[*id as usize] != TokenType::UserDefined {
            continue;
        }
        if !frags
            .iter()
            .any(|f| matches!(f, Fragment::Text(t) if t.contains(tok.as_str())))
        {
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
