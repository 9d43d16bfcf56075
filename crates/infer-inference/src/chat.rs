//! Chat templates: the model's Jinja template (from the vindex) rendered with `minijinja`, with
//! Python-compatible string methods (`minijinja-contrib` pycompat) as HF templates expect.
//!
//! A template comes with a downloaded model, so it is untrusted code. A render runs on a budget
//! of [`TEMPLATE_FUEL`] minijinja instructions and [`TEMPLATE_MAX_RECURSION`] levels of
//! recursion, and its bytecode is rewritten by the `guard` module so that no value grows past
//! [`TEMPLATE_MAX_VALUE`] bytes, [`TEMPLATE_MAX_ITEMS`] items or [`TEMPLATE_MAX_DEPTH`] levels
//! of nesting, no namespace can be stored into a namespace (a cycle), and one render creates,
//! scans and writes at most [`TEMPLATE_MAX_WORK`] bytes; a prompt longer than
//! [`TEMPLATE_MAX_OUTPUT`] is refused. Each limit fails the render with an error instead of
//! hanging, filling memory, leaking or overflowing the stack (found by fuzzing: FUZZING.md).
//! Templates within the limits render exactly as with plain minijinja.

use serde::Serialize;

use crate::InferenceError;

mod guard;

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

/// Instructions one render may execute (minijinja fuel, counting the guard's own), plus
/// [`TEMPLATE_FUEL_PER_MESSAGE`] per message: what a template does besides its loop over the
/// messages takes a few hundred. A render that needs more is a template that loops without
/// end, stopped within a fraction of a second (the instructions, at ~0.1–6 µs each from a
/// plain build to an instrumented fuzzing one, are the time bound of a render).
pub const TEMPLATE_FUEL: u64 = 100_000;

/// Fuel added per message of the conversation: real templates use 20 to 200 per message
/// (ChatML 23, Gemma's 41, a Qwen-style one 59).
pub const TEMPLATE_FUEL_PER_MESSAGE: u64 = 1_000;

/// Bytes one rendered prompt may have (far more than any context window of text).
pub const TEMPLATE_MAX_OUTPUT: usize = 16 << 20;

/// Bytes one string of a render may have, or one value when printed (`{{ v }}`, `v ~ ''`,
/// `tojson`): no value of a prompt is longer than the prompt.
pub const TEMPLATE_MAX_VALUE: usize = TEMPLATE_MAX_OUTPUT;

/// Values one list or map of a render may hold, counted through its nesting (real templates
/// hold the conversation: five per message, its role and content with their keys).
pub const TEMPLATE_MAX_ITEMS: usize = 1 << 16;

/// Levels lists and maps of a render may nest (real messages nest two or three; deeper values
/// would make printing, comparing and dropping them recurse that deep).
pub const TEMPLATE_MAX_DEPTH: usize = 64;

/// Bytes one render may create, scan or write in all (strings made by `~`, `+`, `*`, filters
/// and methods, 4 per byte of a string scanned, output including captured blocks, and 128 per
/// value measured or iterated by a filter). Real templates use 3 to 20 times the prompt's
/// length, so this allows prompts of a few MiB (far more than any context window).
pub const TEMPLATE_MAX_WORK: usize = 64 << 20;

/// minijinja's recursion limit for a render: each macro call counts 4, each loop or `with`
/// block 1 (its default is 500). Chat templates nest a few loops and macro calls; a macro
/// recursing on its own output is cut off after ~24 levels.
pub const TEMPLATE_MAX_RECURSION: usize = 100;

/// Bytes a chat template's source may have (real ones have a few KB to ~30 KB).
pub const TEMPLATE_MAX_SOURCE: usize = 256 << 10;

/// Tokens one `{{ … }}` or `{% … %}` tag may have (real ones have up to ~50): minijinja's
/// compiler recurses once per operator of a chain (`x ~ x ~ …`) and its time grows with the
/// square of the chain's length.
pub const TEMPLATE_MAX_TAG_TOKENS: usize = 1024;

/// Bytes compiling a template may spend on folding its constant expressions (minijinja
/// evaluates `'x' * 1000 ~ 'y'` at compile time, again for every operator above it).
pub const TEMPLATE_MAX_FOLD: usize = 64 << 20;

/// `namespace()` objects one render may create. Real templates create one or two; each
/// namespace is compared with every map the guard measures (to refuse storing a namespace
/// into a namespace, found by fuzzing: such a cycle was never freed and printed forever).
pub const TEMPLATE_MAX_NAMESPACES: usize = 256;

/// A compiled chat template plus the special-token strings it may reference.
pub struct ChatTemplate {
    /// In a mutex: each render sets its fuel (which depends on the number of messages).
    env: std::sync::Mutex<minijinja::Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compile `source`. Errors: template syntax errors; a source over [`TEMPLATE_MAX_SOURCE`]
    /// bytes, a tag over [`TEMPLATE_MAX_TAG_TOKENS`] tokens, constant expressions over
    /// [`TEMPLATE_MAX_VALUE`] bytes or [`TEMPLATE_MAX_FOLD`] bytes of folding in all (what
    /// compiling costs, checked first); `include`, `extends` and `import`
    /// (a chat template has no other templates to load); `*args` unpacking into a filter,
    /// test or method call (which the resource guard cannot check).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, InferenceError> {
        let mut env = minijinja::Environment::new();
        env.set_recursion_limit(TEMPLATE_MAX_RECURSION);
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
        guard::install(&mut env);
        let source = without_generation_tags(source);
        guard::check_source(&source).map_err(|e| InferenceError::Template(e.to_string()))?;
        env.add_template_owned("chat".to_string(), source)
            .map_err(|e| InferenceError::Template(e.to_string()))?;
        let template = ChatTemplate {
            env: std::sync::Mutex::new(env),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        };
        template.guarded(TEMPLATE_FUEL, |_, _, _, _| ())?;
        Ok(template)
    }

    /// Call `f` with the environment (its fuel set to `fuel`), the compiled template's guarded
    /// bytecode (root, blocks) and its initial auto-escape mode.
    fn guarded<R>(
        &self,
        fuel: u64,
        f: impl FnOnce(
            &minijinja::Environment<'_>,
            &minijinja::machinery::Instructions<'_>,
            &std::collections::BTreeMap<&str, minijinja::machinery::Instructions<'_>>,
            minijinja::AutoEscape,
        ) -> R,
    ) -> Result<R, InferenceError> {
        let error = |e: minijinja::Error| InferenceError::Template(e.to_string());
        let mut env = self
            .env
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        env.set_fuel(Some(fuel));
        let env = &*env;
        let tmpl = env.get_template("chat").map_err(error)?;
        let compiled = minijinja::machinery::get_compiled_template(&tmpl);
        let root = guard::guarded(&compiled.instructions).map_err(error)?;
        let blocks = guard::guarded_blocks(&compiled.blocks).map_err(error)?;
        Ok(f(env, &root, &blocks, compiled.initial_auto_escape))
    }

    /// Render a conversation; `add_generation_prompt` appends the assistant-turn opener.
    /// Errors: [`InferenceError::Template`] for a template error, a render that runs out of
    /// fuel ([`TEMPLATE_FUEL`] + [`TEMPLATE_FUEL_PER_MESSAGE`] per message) or recursion ([`TEMPLATE_MAX_RECURSION`]), a value or a render
    /// over the guard's limits ([`TEMPLATE_MAX_VALUE`], [`TEMPLATE_MAX_ITEMS`],
    /// [`TEMPLATE_MAX_DEPTH`], [`TEMPLATE_MAX_WORK`]), a namespace stored into a namespace, or
    /// output longer than [`TEMPLATE_MAX_OUTPUT`].
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, InferenceError> {
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let fuel = TEMPLATE_FUEL
            .saturating_add(TEMPLATE_FUEL_PER_MESSAGE.saturating_mul(messages.len() as u64));
        let mut text = String::new();
        let result = self.guarded(fuel, |env, root, blocks, auto_escape| {
            let _scope = guard::RenderScope::begin();
            let mut out = minijinja::machinery::make_string_output(&mut text);
            // The state (and with it every value of the render) is dropped before the scope.
            minijinja::machinery::Vm::new(env)
                .eval(root, ctx, blocks, &mut out, auto_escape)
                .map(drop)
        })?;
        match result {
            _ if text.len() > TEMPLATE_MAX_OUTPUT => Err(InferenceError::Template(format!(
                "the rendered prompt exceeds {} MiB (a template that loops without end?)",
                TEMPLATE_MAX_OUTPUT >> 20
            ))),
            Ok(()) => Ok(text),
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => {
                Err(InferenceError::Template(format!(
                    "rendering ran out of its budget of {fuel} instructions (a template that \
                     loops without end?)"
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

    /// Found by the `chat_template` fuzz target (crash-6bac16d0f796…, FUZZING.md finding 6): a
    /// backward slice of an empty value (`""[::-1]`, `A[::-1][::-2]`) panicked inside minijinja
    /// 2.24 (index 0 of an empty vector). Empty backward slices now render empty, and the others
    /// as Python slices them.
    #[test]
    fn fuzz_backward_slice_of_empty_value_does_not_panic() {
        let data = include_bytes!(
            "../../../fuzz/regressions/chat_template/crash-6bac16d0f79653c4d86f29a5277626af1e6943b0"
        );
        let _ = render_fuzz_input(data);
        let cases = [
            ("{{ ''[::-1] }}|", "|"),
            ("{{ [][::-1] | length }}", "0"),
            ("{{ [][::-2] | list | length }}", "0"),
            ("{{ ([][::-1])[::-2] | list | length }}", "0"),
            ("{{ 'abc'[0:2:-1] }}|", "|"),
            ("{{ 'abc'[::-1] }}", "cba"),
            ("{{ 'abcde'[3:0:-2] }}", "db"),
            ("{{ [1, 2, 3][::-2] | join(',') }}", "3,1"),
            ("{{ [1, 2, 3][-1:-5:-1] | join(',') }}", "3,2,1"),
            (
                "{% for m in messages[::-1] %}{{ m.content }};{% endfor %}",
                "b;a;",
            ),
        ];
        let messages = [Message::new("user", "a"), Message::new("assistant", "b")];
        for (template, want) in cases {
            let t = ChatTemplate::new(template, "<s>", "</s>").unwrap();
            assert_eq!(t.render(&messages, false).unwrap(), want, "{template}");
        }
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

    /// `(content, template)` of a fuzz input, split as the `chat_template` target does.
    fn fuzz_input(data: &[u8]) -> (&str, &str) {
        let text = std::str::from_utf8(data).expect("UTF-8 fuzz input");
        text.split_once('\n').unwrap_or(("hi", text))
    }

    /// Render a fuzz input as the `chat_template` fuzz target does (both of its renders), and
    /// return the first render's result.
    fn render_fuzz_input(data: &[u8]) -> Result<String, String> {
        let (content, template) = fuzz_input(data);
        let t = ChatTemplate::new(template, "<s>", "</s>").map_err(|e| e.to_string())?;
        let messages = [
            Message::new("system", "Be brief."),
            Message::new("user", content),
            Message::new("assistant", "Ok."),
            Message::new("user", content),
        ];
        let first = t.render(&messages, true).map_err(|e| e.to_string());
        let _ = t.render(&messages[1..2], false);
        first
    }

    /// The error of compiling or else rendering `template` (which must fail).
    fn render_err(template: &str) -> String {
        let t = match ChatTemplate::new(template, "<s>", "</s>") {
            Ok(t) => t,
            Err(e) => return e.to_string(),
        };
        match t.render(&[Message::new("user", "hi")], true) {
            Ok(s) => panic!("{template:?} rendered {} bytes", s.len()),
            Err(e) => e.to_string(),
        }
    }

    /// Found by the `chat_template` fuzz target: `{% set ns.n = ns %}` stored a namespace into
    /// itself, an `Arc` cycle minijinja never frees (leak-9296424b2e81…, finding 2), which
    /// `{{ ns.n }}` then printed by unbounded recursion (stack-overflow-namespace-self-print,
    /// found by the CI smoke run, finding 4). No value holding a namespace (itself or another,
    /// in any list or map) nor a macro, loop or function can be stored into a namespace, so no
    /// cycle can be built; namespaces holding plain values work as before.
    #[test]
    fn fuzz_namespace_stored_into_itself_is_refused() {
        for data in [
            &include_bytes!(
                "../../../fuzz/regressions/chat_template/leak-9296424b2e818a3416deadcc409733eb26d79422"
            )[..],
            include_bytes!(
                "../../../fuzz/regressions/chat_template/stack-overflow-namespace-self-print"
            ),
        ] {
            let e = render_fuzz_input(data).unwrap_err();
            assert!(e.contains("cannot be stored in a namespace"), "{e}");
        }
        let cycle = "cannot be stored in a namespace";
        for t in [
            "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns.n }}",
            "{% set ns = namespace() %}{% set ns.l = [ns] %}{{ ns }}",
            "{% set ns = namespace() %}{% set ns.d = {'a': [1, {'b': ns}]} %}",
            "{% set ns = namespace() %}{% set ns.d = dict(x=ns) %}",
            "{% set ns = namespace() %}{% set ns.l = [1] + [ns] %}",
            "{% set ns = namespace() %}{% set other = namespace() %}{% set ns.o = other %}\
             {% set other.o = ns %}",
            "{% set ns = namespace() %}{% for x in [ns] %}{% set ns.x = x %}{% endfor %}",
            "{% set ns = namespace() %}{% macro m(x) %}{% set ns.x = x %}{% endmacro %}{{ m(ns) }}",
            "{% set ns = namespace() %}{% set ns2 = namespace(a=ns) %}",
            "{% set ns = namespace() %}{% set ns2 = namespace(ns) %}",
            "{% for i in range(100000) %}{% set ns = namespace(n=0) %}{% set ns.n = ns %}{% endfor %}",
        ] {
            let e = render_err(t);
            assert!(e.contains(cycle), "{t}: {e}");
        }
        let plain = "not a macro, loop or function";
        for t in [
            "{% set ns = namespace() %}{% macro m() %}{{ ns }}{% endmacro %}{% set ns.m = m %}",
            "{% set ns = namespace() %}{% macro m() %}{{ ns }}{% endmacro %}{% set ns.m = [m] %}",
            "{% set ns = namespace() %}{% for x in [1] %}{% set ns.l = loop %}{% endfor %}",
            "{% set ns = namespace() %}{% set ns.f = range %}",
        ] {
            let e = render_err(t);
            assert!(e.contains(plain), "{t}: {e}");
        }
        // Namespaces of plain values, nested lists and maps, print and count as before.
        let ok = "{% set ns = namespace(n=0, l=[], s='') %}{% for m in messages %}\
                  {% set ns.n = ns.n + 1 %}{% set ns.l = ns.l + [m.role] %}\
                  {% set ns.s = ns.s ~ m.content %}{% set ns.d = {'last': [m.role, {'c': 1}]} %}\
                  {% endfor %}{{ ns.n }} {{ ns.l }} {{ ns.s }} {{ ns.d }}";
        let t = ChatTemplate::new(ok, "", "").unwrap();
        let msgs = [Message::new("user", "a"), Message::new("assistant", "b")];
        for _ in 0..(2 * TEMPLATE_MAX_NAMESPACES) {
            assert_eq!(
                t.render(&msgs, false).unwrap(),
                r#"2 ["user", "assistant"] ab {"last": ["assistant", {"c": 1}]}"#
            );
        }
        // A render may create at most TEMPLATE_MAX_NAMESPACES namespaces (the count resets per
        // render, above).
        let e = render_err("{% for i in range(100000) %}{% set ns = namespace(n=i) %}{% endfor %}");
        assert!(e.contains("namespace() objects in one render"), "{e}");
    }

    /// Found by the `chat_template` fuzz target (timeout-12df05a8a734…, and the 120-byte
    /// `oom-string-doubling.jinja` derived from it; finding 3): a template that doubles a
    /// string per loop iteration (`{% set ns.s = ns.s ~ ns.s %}`, `tojson`, `* 2`) grew it
    /// exponentially, as can macro recursion, `{% set %}` blocks, `caller()`, chains of `set`,
    /// and filters or methods that expand their input by an argument (`join`, `replace`,
    /// `indent`, `format`, `tojson(indent=…)`). Every one now stops with an error at the value
    /// cap, the item cap, the nesting cap or the render's work budget.
    #[test]
    fn fuzz_string_doubling_is_refused() {
        for data in [
            &include_bytes!(
                "../../../fuzz/regressions/chat_template/timeout-12df05a8a734d5558d9ee2769bb9d8513dcebeea"
            )[..],
            include_bytes!("../../../fuzz/regressions/chat_template/oom-string-doubling.jinja"),
        ] {
            let e = render_fuzz_input(data).unwrap_err();
            assert!(e.contains("would exceed 16 MiB"), "{e}");
        }
        let value = &"would exceed 16 MiB".to_string();
        let items = &"would hold more than".to_string();
        let depth = &format!("nests lists or maps more than {TEMPLATE_MAX_DEPTH} deep");
        let work = &format!(
            "more than {} MiB of values in one render",
            TEMPLATE_MAX_WORK >> 20
        );
        // Growth that either cap may stop first (alternatives separated by `|`).
        let grown = &format!("{value}|{work}");
        let ns = "{% set ns = namespace(s='x', l=[1], n=1) %}";
        let straight = format!("{{% set s = 'x' %}}{}", "{% set s = s ~ s %}".repeat(40));
        let cases: Vec<(String, &String)> = vec![
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s = ns.s ~ ns.s %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s = ns.s + ns.s %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s = ns.s * 2 %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s = ns.s | tojson * 2 %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s %}}{{{{ ns.s }}}}{{{{ ns.s }}}}{{% endset %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s = [ns.s, ns.s] | join %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s = ns.s.replace('x', 'xx') %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.s = '{{}}{{}}'.format(ns.s, ns.s) %}}{{% endfor %}}"), grown),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.l = ns.l + ns.l %}}{{% endfor %}}"), items),
            (format!("{ns}{{% for i in range(64) %}}{{% set ns.l = ns.l * 2 %}}{{% endfor %}}"), items),
            (format!("{ns}{{% for i in range(100) %}}{{% set ns.l = [ns.l] %}}{{% endfor %}}"), depth),
            (format!("{ns}{{% for i in range(100) %}}{{% set ns.l = [ns.l, ns.l] %}}{{% endfor %}}{{{{ ns.l }}}}"), items),
            (format!("{ns}{{% for i in range(100000) %}}{{% set ns.l = ns.l + [ns.s ~ i ~ 'y' * 1000] %}}{{% endfor %}}"), work),
            ("{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('x' * 1000) }}".into(), grown),
            ("{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ f('x' * 100000, 20) }}".into(), grown),
            ("{% macro f() %}{{ caller() }}{{ caller() }}{% endmacro %}{% macro g(n) %}{% if n %}{% call f() %}{{ g(n - 1) }}{% endcall %}{% else %}{{ 'x' * 4000000 }}{% endif %}{% endmacro %}{{ g(4) }}".into(), work),
            (straight, grown),
            ("{{ 'x' * 100000000 }}".into(), grown),
            ("{% set s = 'x' * 1000000 %}{{ ([s] * 100) | join }}".into(), grown),
            ("{% set s = 'x' * 1000000 %}{{ ([s] * 100) | string }}".into(), grown),
            ("{% set s = 'x' * 1000000 %}{{ (([s] * 100) ~ '') | length }}".into(), grown),
            ("{% set s = 'x' * 1000000 %}{{ ([s] * 100) | tojson | length }}".into(), grown),
            ("{% set s = 'x' * 1000000 %}{{ ([s] * 100) | pprint | length }}".into(), grown),
            ("{{ ('x' * 1000000) | replace('', 'yyyyyyyyyyyyyyyyyyyyyyy') | length }}".into(), grown),
            ("{{ ('x\n' * 100000) | indent(1000) | length }}".into(), grown),
            ("{{ '%999999999s' | format('x') | length }}".into(), grown),
            ("{{ '{:>999999999}'.format('x') | length }}".into(), grown),
            ("{{ '{:.999999999f}'.format(1.5) | length }}".into(), grown),
            ("{{ range(10000) | tojson(indent=10000) | length }}".into(), grown),
            ("{{ ', '.join(['x' * 1000000] * 100) | length }}".into(), grown),
            ("{{ (range(100000) * 1000) | list | length }}".into(), items),
            ("{{ range(10) | batch(100000000, 'x') | list | length }}".into(), items),
            ("{{ (['x'] * 60000) | map('indent', 1000000, true) | list | length }}".into(), work),
            ("{{ ('x' * 10000000) | list | length }}".into(), items),
            ("{% set a, b = range(100000) * 100000 %}".into(), items),
            ("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{% if s == s ~ '' %}{% endif %}{% endfor %}".into(), work),
            ("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ 'y' in s }}{% endfor %}".into(), work),
            ("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ s[::100000] }}{% endfor %}".into(), work),
            ("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ s[5] }}{% endfor %}".into(), work),
            ("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ s.count('y') }}{% endfor %}".into(), work),
            ("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ loop.changed(s) }}{% endfor %}".into(), work),
            ("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set t %}{{ s }}{% endset %}{% endfor %}".into(), work),
        ];
        for (t, expected) in &cases {
            let start = std::time::Instant::now();
            let e = render_err(t);
            assert!(expected.split('|').any(|x| e.contains(x)), "{t}: {e}");
            assert!(start.elapsed().as_secs() < 20, "{t}: {:?}", start.elapsed());
        }
    }

    /// Found while fixing finding 3 (minijinja compiles templates it is given, and a chain of
    /// operators or a constant expression costs at compile time): a tag of ~30,000 `~ x`
    /// overflowed the stack of minijinja's code generator, a megabyte of 1,000-operator chains
    /// took seconds (its constant folding is quadratic in a chain's length), and constant
    /// expressions (`'x' * 99999999 ~ 'x' * 99999999 ~ …`) are evaluated while compiling. Each
    /// is refused before minijinja compiles the template.
    #[test]
    fn compile_time_blowups_are_refused_before_compiling() {
        for (data, expected) in [
            (
                &include_bytes!(
                    "../../../fuzz/regressions/chat_template/compile-operator-chain.jinja"
                )[..],
                "has more than 1024 tokens",
            ),
            (
                include_bytes!(
                    "../../../fuzz/regressions/chat_template/compile-constant-folding.jinja"
                ),
                "a constant expression of the template would exceed 16 MiB",
            ),
        ] {
            let e = render_fuzz_input(data).unwrap_err();
            assert!(e.contains(expected), "{e}");
        }
        let chain = format!("{{{{ x{} }}}}", " ~ x".repeat(30_000));
        let e = render_err(&chain);
        assert!(e.contains("has more than 1024 tokens"), "{e}");
        let e = render_err(&"x".repeat(TEMPLATE_MAX_SOURCE + 1));
        assert!(e.contains("more than the 256 KiB"), "{e}");
        let big = "('x' * 10000000)";
        for (t, expected) in [
            (
                format!("{{{{ {big} ~ {big} }}}}"),
                "a constant expression of the template would exceed 16 MiB",
            ),
            (
                "{{ (['xxxxxxxxxx'] * 10000000) ~ '' }}".to_string(),
                "a constant expression of the template would exceed 16 MiB",
            ),
            ("{{ 'x' * 99999999 }}".to_string(), "would exceed 16 MiB"),
            (
                format!("{{{{ {big}{} }}}}", " ~ x".repeat(10)),
                "constant expressions would take more than 64 MiB",
            ),
            (
                format!("{{{{ {big} ~ x }}}}").repeat(10),
                "constant expressions would take more than 64 MiB",
            ),
        ] {
            let start = std::time::Instant::now();
            let e = ChatTemplate::new(&t, "", "")
                .err()
                .expect("compiled")
                .to_string();
            assert!(e.contains(expected), "{}: {e}", &t[..60.min(t.len())]);
            assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
        }
        // Real-sized constants and chains compile.
        let ok = format!(
            "{{{{ '=' * 80 ~ x ~ ('-' * 1000) ~ 'y' }}}}{{{{ x{} }}}}",
            " ~ x".repeat(500)
        );
        let t = ChatTemplate::new(&ok, "", "").unwrap();
        assert_eq!(t.render(&[], false).unwrap().len(), 80 + 1000 + 1);
    }

    /// The guard rewrites minijinja's bytecode; everything a chat template may use renders as
    /// with plain minijinja (same source, same context, no guard).
    #[test]
    fn guarded_templates_render_as_plain_minijinja() {
        fn plain(
            source: &str,
            messages: &[Message],
            agp: bool,
        ) -> Result<String, minijinja::Error> {
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
            env.render_str(
                &without_generation_tags(source),
                minijinja::context! {
                    messages => messages,
                    add_generation_prompt => agp,
                    bos_token => "<s>",
                    eos_token => "</s>",
                },
            )
        }
        let seed = |data: &'static str| data.split_once('\n').unwrap().1;
        let templates = [
            CHATML_TEMPLATE,
            GEMMA_TEMPLATE,
            seed(include_str!("../../../fuzz/seeds/chat_template/smollm2.jinja")),
            seed(include_str!("../../../fuzz/seeds/chat_template/loops.jinja")),
            // Qwen-style: a namespace scanned backwards, string methods, whitespace control.
            "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\
             {%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}\
             {%- if ns.multi_step_tool and message.role == 'user' and not(message.content.startswith('<tool_response>') \
             and message.content.endswith('</tool_response>')) %}{%- set ns.multi_step_tool = false %}\
             {%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}\
             {%- for message in messages %}{%- set content = message.content %}\
             {%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}\
             {{- '<|im_start|>' + message.role + '\\n' + content.strip() + '<|im_end|>' + '\\n' }}\
             {%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}{{ ns.last_query_index }}",
            // Llama-3-style: the system message taken out, trimmed, headers concatenated.
            "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}\
             {%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}\
             {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}\
             {%- for message in messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
             {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}\
             {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\
             {%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
            // Macros, call blocks, filters, tests, literals, slicing, recursion, blocks.
            "{% macro render(m, sep=': ') %}{{ m.role|upper }}{{ sep }}{{ m.content|replace('a', 'A')|indent(2, true) }}{% endmacro %}\
             {% macro wrap() %}[{{ caller() }}]{% endmacro %}\
             {% for m in messages %}{{ render(m) }}|{% call wrap() %}{{ loop.index }}{{ loop.cycle('a', 'b') }}{{ loop.changed(m.role) }}{% endcall %}\
             {% if not loop.last %}, {% endif %}{% endfor %}",
            "{{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}\
             {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|map('upper')|list }}",
            "{{ messages|tojson }} {{ messages[:1]|tojson(indent=2) }} {{ messages|groupby('role')|list|length }}",
            "{{ '%s-%d'|format('a', 3) }} {{ 'x {} y {:>5}'.format(1, 'z') }} {{ 'a,b,,c'.split(',') }} {{ 'l1\\nl2'.splitlines() }}",
            "{% set d = {'a': [1, 2, {'b': 3.5}], 'c': none, 'e': true} %}{{ d }} {{ d|pprint }} {{ d|dictsort }} {{ d.items()|list }}\
             {% for k, v in d|items %}{{ k }}={{ v }};{% endfor %} {{ range(5)|batch(2, 0)|list }} {{ range(5)|slice(2)|list }}",
            "{{ [3, 1, 2]|sort }} {{ [1, 1, 2]|unique|list }} {{ [1, 2]|reverse|list }} {{ [1, 2]|sum }} {{ [[1], [2]]|map('first')|list }}",
            "{% filter upper %}shout {{ messages|length }}{% endfilter %} {% set block %}cap{{ 1 + 1 }}{% endset %}{{ block }}\
             {% with x = 2 %}{{ x * 3 }} {{ 'ab' * 3 }} {{ [1] * 3 }} {{ [1] + [2] }} {{ 1.5 + 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}{% endwith %}",
            "{{ 'abcdef'[1:4] }} {{ 'abc'[::-1] }} {{ [1, 2, 3][-1] }} {{ 'abc'[1] }} {{ 1 < 2 < 3 }} {{ 'a' in 'abc' }} {{ 3 not in [1] }}\
             {{ undefined_var ~ 'x' }} {{ undefined_var is defined }} {{ none is none }} {{ 'A' is upper }} {{ 4 is divisibleby 2 }}",
            "{% set a, b = 1, 2 %}{{ a }}{{ b }} {{ '<tag>'|e }} {{ ' pad '|trim }} {{ 'Hello World'|lower|title|capitalize }}\
             {% for x in [[1, [2, [3]]], 4] recursive %}{% if x is sequence %}({{ loop(x) }}){% else %}{{ x }}{% endif %}{% endfor %}",
            "{% block tail %}tail {{ messages[-1].content|length }}{% endblock %} {{ self.tail() }} {{ dict(a=1, b=[2]) }}\
             {{ messages|first }} {{ (messages|last).role }} {{ [4, 9]|max }} {{ [4, 9]|min }} {{ -3|abs }} {{ '42'|int + 1 }} {{ 2.567|round(1) }}\
             {% generation %}gen{% endgeneration %} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} {{ messages[0].items()|list|length }}",
        ];
        let conversations: Vec<Vec<Message>> = vec![
            vec![Message::new("user", "Hi <b>&'\"")],
            vec![
                Message::new("system", " Be brief. "),
                Message::new("user", "What is a cat?"),
                Message::new("assistant", "<think>hm</think>\nAn animal."),
                Message::new("user", "<tool_response>x</tool_response>"),
            ],
            (0..300)
                .map(|i| {
                    let role = if i % 2 == 0 { "user" } else { "assistant" };
                    Message::new(role, &format!("turn {i}: {}", "word ".repeat(400)))
                })
                .collect(),
            // A long conversation of short turns (fuel and per-message charges).
            (0..5000)
                .map(|i| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, "ok"))
                .collect(),
        ];
        for source in templates {
            let mut compared = 0;
            let guarded = ChatTemplate::new(source, "<s>", "</s>").unwrap();
            for msgs in &conversations {
                for agp in [true, false] {
                    let want = plain(source, msgs, agp);
                    let got = guarded.render(msgs, agp);
                    match (want, got) {
                        (Ok(w), Ok(g)) => {
                            assert_eq!(w, g, "{source}");
                            compared += 1;
                        }
                        (Err(_), Err(_)) => {}
                        (w, g) => panic!("{source}: plain {w:?}, guarded {g:?}"),
                    }
                }
            }
            // Each template renders (and is compared) for the first two conversations at least.
            assert!(compared >= 4, "{source}: {compared} renders compared");
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
