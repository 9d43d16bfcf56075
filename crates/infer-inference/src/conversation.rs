//! [`Conversation`]: a chat's messages and the token ids its KV cache holds, so each turn
//! feeds only what the cache does not hold yet.
//!
//! Every turn re-renders the whole conversation (a template may rewrite earlier turns), keeps
//! the cache for the longest prefix of ids the new rendering shares with what the cache holds,
//! and feeds the rest. Afterwards the cache holds exactly the tokenized conversation followed
//! by the reply's tokens, so its logits equal a fresh run over the same text.
//!
//! User content is tokenized as text: special-token markup a user types (`<|im_start|>`)
//! does not become a control token, so a user cannot forge turns, unless
//! [`Conversation::set_parse_special`] allows it (`infer chat --special`).

use crate::chat::{ChatTemplate, Message};
use crate::{InferenceError, KvCache, Tokenizer};

/// The messages of one chat and the ids whose K/V its cache holds (positions `0..len`).
#[derive(Clone, Debug, Default)]
pub struct Conversation {
    messages: Vec<Message>,
    fed: Vec<u32>,
    parse_special: bool,
}

impl Conversation {
    /// A conversation opened by an optional system prompt.
    pub fn new(system: Option<&str>) -> Self {
        Conversation {
            messages: system
                .map(|s| Message::new("system", s))
                .into_iter()
                .collect(),
            fed: Vec::new(),
            parse_special: false,
        }
    }

    /// A conversation of the given messages (e.g. a chat request's), its cache empty.
    pub fn from_messages(messages: Vec<Message>) -> Self {
        Conversation {
            messages,
            ..Default::default()
        }
    }

    /// Whether special-token markup in user messages becomes control tokens (default false).
    pub fn set_parse_special(&mut self, parse: bool) {
        self.parse_special = parse;
    }

    /// The messages so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The ids the cache holds, position by position.
    pub fn fed(&self) -> &[u32] {
        &self.fed
    }

    /// Append a user message (then call [`Conversation::prompt`]).
    pub fn push_user(&mut self, content: &str) {
        self.messages.push(Message::new("user", content));
    }

    /// The ids to feed next: the whole conversation rendered with the assistant-turn opener
    /// and tokenized, less the prefix `cache` already holds (`cache` is truncated to that
    /// prefix). At least one id is returned, so the caller gets logits for the reply.
    /// Errors: template rendering or tokenization.
    pub fn prompt(
        &mut self,
        template: &ChatTemplate,
        tokenizer: &Tokenizer,
        cache: &mut KvCache,
    ) -> Result<Vec<u32>, InferenceError> {
        let ids = self.render_ids(template, tokenizer)?;
        self.fed.truncate(cache.len());
        let keep = common_prefix(&self.fed, &ids).min(ids.len().saturating_sub(1));
        cache.truncate(keep);
        self.fed.truncate(keep);
        Ok(ids[keep..].to_vec())
    }

    /// Record the end of a turn: `prompt` (what [`Conversation::prompt`] returned) was fed,
    /// then `generated` ids were produced, of which the cache holds as many as its length says
    /// (generation never feeds its last token unless it was interrupted after feeding it).
    /// `reply` is the assistant's text as shown.
    pub fn finish_turn(&mut self, prompt: &[u32], generated: &[u32], reply: &str, cache: &KvCache) {
        self.fed.extend_from_slice(prompt);
        self.fed.extend_from_slice(generated);
        self.fed.truncate(cache.len());
        self.messages.push(Message::new("assistant", reply.trim()));
    }

    /// Drop the oldest exchange (its user message and the reply to it; the system prompt and
    /// the last user message stay), to make room in a full context. False when there is none.
    pub fn drop_oldest_turn(&mut self) -> bool {
        let last_user = self.messages.iter().rposition(|m| m.role == "user");
        let Some(first) = self.messages.iter().position(|m| m.role == "user") else {
            return false;
        };
        if Some(first) == last_user {
            return false;
        }
        let end = match self.messages.get(first + 1) {
            Some(m) if m.role == "assistant" => first + 2,
            _ => first + 1,
        };
        self.messages.drain(first..end);
        true
    }

    /// Forget the last user message (its turn could not run).
    pub fn drop_last_user(&mut self) {
        if self.messages.last().is_some_and(|m| m.role == "user") {
            self.messages.pop();
        }
    }

    /// The conversation rendered with the assistant-turn opener, as token ids: the template's
    /// markup with special tokens recognised, user content as text (see the module docs). No
    /// post-processor BOS: templates write it.
    /// Errors: rendering, tokenization, or (user markup without `parse_special`) a template
    /// that rewrote such a user message so that it cannot be found in the rendered text.
    pub fn render_ids(
        &self,
        template: &ChatTemplate,
        tokenizer: &Tokenizer,
    ) -> Result<Vec<u32>, InferenceError> {
        let text = template.render(&self.messages, true)?;
        let guarded: Vec<&str> = self
            .messages
            .iter()
            .filter(|m| m.role == "user" && !self.parse_special)
            .map(|m| m.content.as_str())
            .filter(|c| tokenizer.has_special_markup(c))
            .collect();
        if guarded.is_empty() {
            return tokenizer.encode(&text, false);
        }
        // Tokenize the template's text around each guarded user message with special tokens,
        // the message itself as text.
        let mut ids = Vec::new();
        let mut at = 0;
        for content in guarded {
            let (start, len) = [content, content.trim()]
                .iter()
                .find_map(|c| text[at..].find(c).map(|i| (at + i, c.len())))
                .ok_or_else(|| {
                    InferenceError::Template(
                        "the template rewrote a user message that contains special-token \
                         markup, so it cannot be tokenized as text (use --special to let \
                         user text hold control tokens)"
                            .into(),
                    )
                })?;
            ids.extend(tokenizer.encode(&text[at..start], false)?);
            ids.extend(tokenizer.encode_text(&text[start..start + len])?);
            at = start + len;
        }
        ids.extend(tokenizer.encode(&text[at..], false)?);
        Ok(ids)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
