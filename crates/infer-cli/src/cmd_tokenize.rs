//! `infer tokenize` / `infer detokenize`: text ↔ token ids with a vindex's or a GGUF's tokenizer,
//! as llama.cpp's `llama-tokenize`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use infer_inference::Tokenizer;

/// Tokenize text: one `id -> 'piece'` line per token (`--ids`: a `[1, 2, 3]` list, `--json`: ids,
/// token strings and pieces).
#[derive(Args)]
pub struct TokenizeArgs {
    /// A vindex folder, or a GGUF file (its `tokenizer.json` sibling, else its metadata).
    pub model: PathBuf,
    /// The text to tokenize (or `-f FILE`).
    #[arg(required_unless_present = "file")]
    pub text: Option<String>,
    /// Read the text from this file instead.
    #[arg(short = 'f', long, conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// Print only the ids, as `[1, 2, 3]`.
    #[arg(long, conflicts_with = "json")]
    pub ids: bool,
    /// Print `{"ids": [...], "tokens": [...], "pieces": [...]}`.
    #[arg(long)]
    pub json: bool,
    /// Treat special-token markup in the text (`<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_special: bool,
    /// Do not add the model's BOS/EOS.
    #[arg(long)]
    pub no_bos: bool,
}

/// Detokenize ids to text.
#[derive(Args)]
pub struct DetokenizeArgs {
    /// A vindex folder, or a GGUF file.
    pub model: PathBuf,
    /// Token ids, separated by commas or spaces (`[1, 2, 3]` as `tokenize --ids` prints is
    /// accepted).
    #[arg(long, required = true, allow_hyphen_values = true)]
    pub ids: String,
    /// Drop special tokens (BOS, end-of-turn, …) from the text.
    #[arg(long)]
    pub skip_special: bool,
}

/// The tokenizer of a vindex folder or a GGUF file.
fn load(path: &Path) -> anyhow::Result<Tokenizer> {
    let json = if path.is_dir() {
        let v = infer_vindex::Vindex::open(path)
            .with_context(|| format!("opening vindex {}", path.display()))?;
        v.tokenizer_json()
            .with_context(|| format!("{}: reading tokenizer", path.display()))?
    } else {
        let sibling = path.with_file_name("tokenizer.json");
        let g = infer_models::gguf::GgufFile::open(path)?;
        if sibling.is_file() {
            std::fs::read_to_string(&sibling)
                .with_context(|| format!("reading {}", sibling.display()))?
        } else {
            infer_models::gguf::tokenizer_json_from_gguf(&g)?
        }
    };
    Tokenizer::from_json(&json).with_context(|| format!("{}: tokenizer", path.display()))
}

/// `infer tokenize`.
pub fn tokenize(args: TokenizeArgs) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (_, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (Some(t), None) => t.clone(),
        (None, None) => bail!("give the text to tokenize, or -f FILE"),
    };
    let tok = load(&args.model)?;
    let ids = tok.encode_with(&text, !args.no_bos, !args.no_special)?;
    let pieces = ids
        .iter()
        .map(|&id| tok.decode(&[id], false))
        .collect::<Result<Vec<_>, _>>()?;
    let out = if args.ids {
        format!("{ids:?}\n")
    } else if args.json {
        let tokens: Vec<String> = ids
            .iter()
            .map(|&id| tok.id_to_token(id).unwrap_or_default())
            .collect();
        let doc = serde_json::json!({"ids": ids, "tokens": tokens, "pieces": pieces});
        format!("{doc}\n")
    } else {
        ids.iter()
            .zip(&pieces)
            .map(|(id, p)| format!("{id:>6} -> '{p}'\n"))
            .collect()
    };
    crate::print_stdout(&out);
    Ok(())
}

/// Parse `1,2, 3` / `[1, 2, 3]` / `1 2 3`. Refused, quoting the bad part: an unbalanced
/// bracket, an empty item (`1,,2`, a leading or trailing comma), anything not a `u32`, no ids.
fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    let t = s.trim();
    let inner = match (t.strip_prefix('['), t.strip_suffix(']')) {
        (Some(_), Some(_)) => &t[1..t.len() - 1],
        (Some(_), _) => bail!("--ids: '{t}' opens '[' but does not close it with ']'"),
        (None, Some(_)) => bail!("--ids: '{t}' closes ']' but does not open it with '['"),
        (None, None) => t,
    };
    let mut ids = Vec::new();
    if inner.trim().is_empty() {
        bail!("--ids: no token ids given");
    }
    for (i, item) in inner.split(',').enumerate() {
        if item.trim().is_empty() {
            bail!("--ids: item {} of '{inner}' is empty (two commas in a row, or a comma at the start or end)", i + 1);
        }
        for tok in item.split_whitespace() {
            let id = tok
                .parse::<u32>()
                .with_context(|| format!("--ids: '{tok}' is not a token id"))?;
            ids.push(id);
        }
    }
    Ok(ids)
}

/// `infer detokenize`.
pub fn detokenize(args: DetokenizeArgs) -> anyhow::Result<()> {
    let ids = parse_ids(&args.ids)?;
    let tok = load(&args.model)?;
    let text = tok
        .decode(&ids, args.skip_special)
        .with_context(|| format!("{}: --ids", args.model.display()))?;
    crate::print_stdout(&format!("{text}\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_ids;

    #[test]
    fn ids_parse_in_every_printed_form() {
        for s in ["1,2,3", "[1, 2, 3]", " 1 2  3 "] {
            assert_eq!(parse_ids(s).unwrap(), vec![1, 2, 3], "{s}");
        }
        assert!(parse_ids("1,x").unwrap_err().to_string().contains("'x'"));
        assert!(parse_ids("-1").is_err());
        assert!(parse_ids("[]").is_err());
    }

    #[test]
    fn malformed_id_lists_are_refused_quoting_the_bad_part() {
        let err = |s: &str| parse_ids(s).unwrap_err().to_string();
        assert_eq!(
            err("1,,2"),
            "--ids: item 2 of '1,,2' is empty (two commas in a row, or a comma at the start or end)"
        );
        assert!(err("1,2,").contains("item 3 of '1,2,' is empty"));
        assert!(err("[,1]").contains("item 1 of ',1' is empty"));
        assert_eq!(
            err("[1, 2"),
            "--ids: '[1, 2' opens '[' but does not close it with ']'"
        );
        assert_eq!(
            err("1, 2]"),
            "--ids: '1, 2]' closes ']' but does not open it with '['"
        );
        assert!(err("[[1]]").contains("'[1]' is not a token id"));
        assert_eq!(parse_ids("[7]").unwrap(), vec![7]);
    }
}
