//! Chat templates: the model's Jinja template (from the vindex) rendered with `minijinja`, with
//! Python-compatible string methods (`minijinja-contrib` pycompat) as HF templates expect.
//!
//! A template comes with a downloaded model, so it is untrusted code: rendering runs on a
//! budget of [`TEMPLATE_FUEL`] minijinja instructions and stops once the output passes
//! [`TEMPLATE_MAX_OUTPUT`] bytes, failing with an error instead of hanging or filling memory.

use serde::Serialize;

use crate::InferenceError;

/// One chat message (`role`: `system`, `user`, `assistant`).
#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// Gemma's turn format, used when a Gemma vindex carries no template (base models).
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}{% if role == 'system' %}{% set role = 'user' %}{% endif %}<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

/// ChatML, used when a vindex carries no template and the model is not Gemma.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Instructions one render may execute (minijinja fuel). Real templates use a few hundred per
/// message; a render that needs more is a template that loops without end.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Bytes one render may produce (far more than any context window of text).
pub const TEMPLATE_MAX_OUTPUT: usize = 16 << 20;

/// A compiled chat template plus the special-token strings it may reference.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compile `source`. Errors: template syntax errors.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, InferenceError> {
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat".to_string(), source.to_string())
            .map_err(|e| InferenceError::Template(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Render a conversation; `add_generation_prompt` appends the assistant-turn opener.
    /// Errors: [`InferenceError::Template`] for a template error, a render that runs out of
    /// fuel ([`TEMPLATE_FUEL`]) or output longer than [`TEMPLATE_MAX_OUTPUT`].
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, InferenceError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| InferenceError::Template(e.to_string()))?;
        let mut out = CappedOutput::default();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|_| InferenceError::Template("rendered text is not UTF-8".into())),
            Err(_) if out.overflowed => Err(InferenceError::Template(format!(
                "the rendered prompt exceeds {} MiB (a template that loops without end?)",
                TEMPLATE_MAX_OUTPUT >> 20
            ))),
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => {
                Err(InferenceError::Template(format!(
                    "rendering ran out of its budget of {TEMPLATE_FUEL} instructions (a \
                     template that loops without end?)"
                )))
            }
            Err(e) => Err(InferenceError::Template(e.to_string())),
        }
    }
}

/// A render's output buffer that refuses to grow past [`TEMPLATE_MAX_OUTPUT`].
#[derive(Default)]
struct CappedOutput {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > TEMPLATE_MAX_OUTPUT {
            self.overflowed = true;
            return Err(std::io::Error::other("template output too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_renders_the_reference_prompt() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
        let s = t
            .render(
                &[Message::new("user", "What is the capital of France?")],
                true,
            )
            .unwrap();
        assert_eq!(
            s,
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn gemma_template_maps_assistant_to_model() {
        let t = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        let s = t
            .render(
                &[
                    Message::new("user", " Hi "),
                    Message::new("assistant", "Hello"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            s,
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    /// Issue 15 bug 7: two nested `range(100000)` loops ran for minutes at growing memory.
    #[test]
    fn chat_template_hang_is_stopped_by_fuel() {
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[], true).unwrap_err().to_string();
        assert!(e.contains("ran out of its budget"), "{e}");
        // Output that grows without end is cut at the cap (each loop body writes 1 MiB).
        let t = ChatTemplate::new(
            "{% set s = 'x' * 1048576 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[], true).unwrap_err().to_string();
        assert!(e.contains("exceeds 16 MiB"), "{e}");
        // A real template still renders (ChatML over 200 turns fits the budget).
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
        let msgs: Vec<Message> = (0..200)
            .map(|i| Message::new("user", &format!("m{i}")))
            .collect();
        let s = t.render(&msgs, true).unwrap();
        assert!(s.ends_with("<|im_start|>user\nm199<|im_end|>\n<|im_start|>assistant\n"));
    }

    #[test]
    fn raise_exception_is_an_error_not_a_panic() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        assert!(t.render(&[], false).is_err());
    }
}
