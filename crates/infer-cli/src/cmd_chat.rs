//! `infer chat`: an interactive chat (or one-shot with `-p`) through the model's chat
//! template, keeping the KV cache between turns ([`Conversation`]).
//!
//! Interactive behaviour, as llama-cli: Ctrl-C during a reply stops the reply and returns to
//! the prompt (Ctrl-C at the prompt, or a second one while stopping, exits 130); a full context
//! drops the oldest exchanges to make room, saying so (`/clear` starts over); a line that is
//! not valid UTF-8 is ignored with a note.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::Args;
use infer_inference::chat::{ChatTemplate, CHATML_TEMPLATE, GEMMA_TEMPLATE};
use infer_inference::{Conversation, StopReason, Tokenizer};
use infer_vindex::Vindex;

use crate::cmd_run::{
    build_model, context_size, exit_if_interrupted, interrupt_flag, load, warn_double_bos,
    SamplingArgs,
};

/// Tokens of one prompt pass (a message with its template markup, or the first with the
/// system prompt) that the memory check assumes: the activations of longer passes grow with
/// them (a message is one pass, up to the context).
const CHAT_STEP_ESTIMATE: usize = 2048;
/// Tokens of template markup added to the `-p` message and system prompt in that estimate.
const CHAT_MARKUP_ESTIMATE: usize = 64;

/// Arguments of `infer chat`.
#[derive(Args)]
pub struct ChatArgs {
    /// The vindex directory.
    pub vindex: PathBuf,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// One-shot: answer this message and exit.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Let special-token markup in user messages (`<|im_start|>`, `<end_of_turn>`) become
    /// control tokens; by default user text is tokenized as text, so it cannot forge turns.
    #[arg(long)]
    pub special: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// The vindex's chat template, or Gemma's turn format / ChatML when it has none.
pub(crate) fn chat_template(v: &Vindex, tok: &Tokenizer) -> anyhow::Result<ChatTemplate> {
    let is_gemma = v.config().model_type.starts_with("gemma");
    let source = match v.chat_template() {
        Some(t) => t.to_string(),
        None if is_gemma => GEMMA_TEMPLATE.to_string(),
        None => CHATML_TEMPLATE.to_string(),
    };
    let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).unwrap_or_default();
    let cfg = v.config();
    Ok(ChatTemplate::new(
        &source,
        &name(cfg.bos_token_id),
        &name(cfg.eos_token_ids.first().copied()),
    )?)
}

/// One line typed at the prompt: `None` at end of input; a line that is not UTF-8 is
/// reported and read past.
fn read_user_line(stdin: &std::io::Stdin) -> anyhow::Result<Option<String>> {
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut bytes = Vec::new();
        if stdin.lock().read_until(b'\n', &mut bytes)? == 0 {
            return Ok(None);
        }
        match String::from_utf8(bytes) {
            Ok(line) => {
                let line = line.trim_end_matches(['\n', '\r']).to_string();
                if !line.is_empty() {
                    return Ok(Some(line));
                }
            }
            Err(_) => eprintln!("[that line is not valid UTF-8; it was ignored]"),
        }
    }
}

/// Run `infer chat`.
pub fn chat(args: ChatArgs) -> anyhow::Result<()> {
    if args.prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
        anyhow::bail!("-p: the message is empty");
    }
    let l = load(&args.vindex)?;
    let model = build_model(&l.vindex, &args.vindex, &args.sampling.formats)?;
    if args.sampling.explain {
        eprint!("{}", model.explain());
    }
    let backend = args.sampling.device.backend()?;
    let ctx = context_size(model.arch.config(), args.sampling.ctx, "--ctx")?;
    let vindex_name = args.vindex.display().to_string();
    let template = chat_template(&l.vindex, &l.tokenizer)
        .with_context(|| format!("{vindex_name}: chat template"))?;
    // The memory check counts prompt passes of CHAT_STEP_ESTIMATE tokens, or of the -p
    // message and system prompt with their markup when longer (at most the context).
    let mut given = CHAT_MARKUP_ESTIMATE;
    for text in [&args.prompt, &args.system].into_iter().flatten() {
        given += l.tokenizer.encode(text, false)?.len();
    }
    let longest = CHAT_STEP_ESTIMATE.max(given);
    let mut d = args
        .sampling
        .decoding(&model, &*backend, &l.tokenizer, ctx, longest)?;
    let interrupt = interrupt_flag();
    let new_conversation = || {
        let mut c = Conversation::new(args.system.as_deref());
        c.set_parse_special(args.special);
        c
    };
    let mut conv = new_conversation();
    let stdin = std::io::stdin();
    let interactive = args.prompt.is_none();
    loop {
        let user = match &args.prompt {
            Some(p) if conv.messages().iter().all(|m| m.role != "user") => p.clone(),
            Some(_) => break,
            None => match read_user_line(&stdin)? {
                None => break,
                Some(l) if l.trim() == "/clear" => {
                    conv = new_conversation();
                    d.gen.cache.clear();
                    eprintln!("[conversation cleared]");
                    continue;
                }
                Some(l) => l,
            },
        };
        conv.push_user(&user);
        // Only what the KV cache does not hold yet is fed (the kept prefix is not fed again).
        // In a full context the oldest exchanges make room (interactive only).
        let prompt = loop {
            let p = conv
                .prompt(&template, &l.tokenizer, &mut d.gen.cache)
                .with_context(|| format!("{vindex_name}: chat template"))?;
            if !interactive || d.gen.cache.len() + p.len() <= d.gen.cache.capacity() {
                break Some(p);
            }
            if conv.drop_oldest_turn() {
                eprintln!(
                    "[context full ({} positions, -c): dropped the oldest exchange; /clear starts over]",
                    d.gen.cache.capacity()
                );
                continue;
            }
            eprintln!(
                "[context full: this message needs {} positions, the context has {} (-c); it was dropped]",
                d.gen.cache.len() + p.len(),
                d.gen.cache.capacity()
            );
            conv.drop_last_user();
            break None;
        };
        let Some(prompt) = prompt else { continue };
        if d.gen.cache.is_empty() {
            warn_double_bos(&model, &prompt);
        }
        interrupt.store(false, Ordering::SeqCst);
        let mut reply = String::new();
        let stats = d.generate_to_stdout(&prompt, &interrupt, |piece| reply.push_str(piece))?;
        conv.finish_turn(&prompt, &stats.tokens, &reply, &d.gen.cache);
        if !interactive {
            exit_if_interrupted(&stats);
            break;
        }
        match stats.stop {
            StopReason::Interrupted => eprintln!("[reply stopped]"),
            StopReason::ContextFull => eprintln!(
                "[context full: the next message drops the oldest exchange; /clear starts over]"
            ),
            _ => {}
        }
    }
    Ok(())
}
