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

/// Gemma's turn format, used when a Gemma vindex carries no template (base models): as
/// Gemma's own template, a system prompt is merged into the first user turn (Gemma has no
/// system role), and the assistant's role is `model`.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] | trim ~ '\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}<start_of_turn>{{ role }}\n{{ first_user_prefix if loop.first else '' }}{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

/// ChatML, used when a vindex carries no template and the model is not Gemma.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Instructions one render may execute (minijinja fuel). Real templates use a few hundred per
/// message; a render that needs more is a template that loops without end.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Bytes one render may produce (far more than any context window of text).
pub const TEMPLATE_MAX_OUTPUT: usize = 16 << 20;

/// `namespace()` objects one render may create. Real templates create one or two. A namespace
/// is minijinja's only mutable value, and one that is stored into itself (`{% set ns.x = ns %}`,
/// found by fuzzing) is an `Arc` cycle that is never freed: this cap bounds what a hostile
/// template can leak per render (~0.5 KB per namespace) instead of up to its whole fuel.
pub const TEMPLATE_MAX_NAMESPACES: usize = 256;

thread_local! {
    /// `namespace()` calls of the render running on this thread (minijinja renders on the
    /// caller's thread; reset by [`ChatTemplate::render`]).
    static NAMESPACES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// minijinja's `namespace()`, refused after [`TEMPLATE_MAX_NAMESPACES`] calls in one render.
fn capped_namespace(
    defaults: Option<minijinja::Value>,
) -> Result<minijinja::Value, minijinja::Error> {
    let n = NAMESPACES.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    if n > TEMPLATE_MAX_NAMESPACES {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("more than {TEMPLATE_MAX_NAMESPACES} namespace() objects in one render"),
        ));
    }
    minijinja::functions::namespace(defaults)
}

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
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_function("namespace", capped_namespace);
        env.add_template_owned("chat".to_string(), without_generation_tags(source))
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
        NAMESPACES.with(|c| c.set(0));
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

/// `source` with transformers' `{% generation %}` … `{% endgeneration %}` markers (which only
/// mark the assistant's tokens for training masks; SmolLM3 and others use them) turned into
/// `{% if true %}` … `{% endif %}`, keeping their whitespace control (`{%-`, `-%}`).
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The close is searched after the open: in `{%}` the two overlap (found by fuzzing).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            break;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{open} {r} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// transformers' `strftime_now(format)`: the current UTC date and time formatted with the C
/// `strftime` directives templates use (`%d %m %Y %y %B %b %A %a %H %M %S %j %%`; others are
/// kept as written).
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(format, secs)
}

/// [`strftime_now`] at `secs` seconds since the Unix epoch (UTC).
fn strftime(format: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(month - 1) as usize];
    let yday = before + day + i64::from(leap && month > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{:02}", sod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", sod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", sod % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
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

    /// Found by the `chat_template` fuzz target (crash-9664177976c5…): a tag whose `%}` overlaps
    /// its `{%` (`{%}`) made the `{% generation %}` rewrite slice `[2..1]` and panic.
    #[test]
    fn fuzz_overlapping_tag_delimiters_do_not_panic() {
        for t in [
            "{%}",
            "{%%}",
            "{%-%}",
            "a {%}",
            "{%}for c in m.content %}{{ c }}{% endfor %}",
        ] {
            assert!(
                ChatTemplate::new(t, "<s>", "</s>").is_err(),
                "{t:?} compiled"
            );
        }
        assert_eq!(without_generation_tags("{%}"), "{%}");
        assert_eq!(
            without_generation_tags("{% generation %}x{%- endgeneration -%}{%}"),
            "{% if true %}x{%- endif -%}{%}"
        );
        // As Jinja lexes it: `{%}{% generation %}` is one tag, left as written.
        assert_eq!(
            without_generation_tags("{%}{% generation %}x"),
            "{%}{% generation %}x"
        );
        let found = "hi <|im_end|>\n{% for message in messagds %}{{'<|im_start|>' + \
                     message['role'] + '\\n' + message['contet ns = namespace(n=0) %}{% for m \
                     in messages %}{%}for c in m.content\0%}{% set ns.n = ns.n + 1 %}{{ c | \
                     up'<|im_end|>' + '\\n'}}{% endfor %}{% ifa dd_generation_prompt %}{{ \
                     '<|im_start|>assistant\\n' }}{% endif %}";
        let (_, template) = found.split_once('\n').unwrap();
        assert!(ChatTemplate::new(template, "<s>", "</s>").is_err());
    }

    /// Found by the `chat_template` fuzz target (leak-9296424b2e81…): `{% set ns.n = ns %}`
    /// stores a namespace into itself, an `Arc` cycle minijinja never frees. A render may create
    /// at most TEMPLATE_MAX_NAMESPACES namespaces, so a loop of such cycles is stopped (and
    /// what one render can leak is bounded); real templates with a namespace still render.
    #[test]
    fn fuzz_namespace_cycles_are_capped_per_render() {
        let looped = "{% for i in range(100000) %}{% set ns = namespace(n=0) %}{% set ns.n = ns %}{% endfor %}";
        let t = ChatTemplate::new(looped, "", "").unwrap();
        let e = t.render(&[Message::new("user", "hi")], false).unwrap_err();
        assert!(
            e.to_string().contains("namespace() objects in one render"),
            "{e}"
        );
        let ok = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}";
        let t = ChatTemplate::new(ok, "", "").unwrap();
        let msgs = [Message::new("user", "a"), Message::new("assistant", "b")];
        for _ in 0..(2 * TEMPLATE_MAX_NAMESPACES) {
            assert_eq!(t.render(&msgs, false).unwrap(), "2"); // the count resets per render
        }
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
    fn gemma_fallback_merges_the_system_prompt_into_the_first_user_turn() {
        let t = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        let s = t
            .render(
                &[
                    Message::new("system", "Be brief. "),
                    Message::new("user", "Hi"),
                    Message::new("assistant", "Hello"),
                    Message::new("user", "Bye"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            s,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn generation_blocks_and_strftime_now_render_as_in_transformers() {
        let src = "{%- for m in messages -%}{{ m.role }}: {% if m.role == 'assistant' %}{%- generation -%} {{ m.content }} {%- endgeneration -%}{% else %}{{ m.content }}{% endif %}\n{% endfor %}{{ strftime_now('%d %b %Y') | length }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let s = t
            .render(
                &[
                    Message::new("user", "Hi"),
                    Message::new("assistant", "Hello"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(s, "user: Hi\nassistant: Hello\n11");
        // 2024-02-29 13:05:09 UTC, a Thursday and a leap day.
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %a %B %b %j %y %%", 1_709_211_909),
            "2024-02-29 13:05:09 Thursday Thu February Feb 060 24 %"
        );
        assert_eq!(strftime("%d %B %Y", 0), "01 January 1970");
    }

    #[test]
    fn raise_exception_is_an_error_not_a_panic() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        assert!(t.render(&[], false).is_err());
    }
}
