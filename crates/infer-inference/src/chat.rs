//! Chat templates: the model's Jinja template (from the vindex) rendered with `minijinja`, with
//! Python-compatible string methods (`minijinja-contrib` pycompat) as HF templates expect.

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
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, InferenceError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| InferenceError::Template(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| InferenceError::Template(e.to_string()))
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

    #[test]
    fn raise_exception_is_an_error_not_a_panic() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        assert!(t.render(&[], false).is_err());
    }
}
