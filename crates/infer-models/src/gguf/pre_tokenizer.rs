//! The Hugging Face pre-tokenizer for a GGUF `tokenizer.ggml.pre` value of a byte-level BPE
//! vocabulary (`tokenizer.ggml.model = gpt2`).
//!
//! The table follows llama.cpp's `llm_tokenizer_bpe` constructor and the `tokenizer_pre` switch
//! of `llama_vocab::impl::load` (`src/llama-vocab.cpp`): each of llama.cpp's split regexes
//! becomes an isolating `Split`, applied in order, then `ByteLevel` maps bytes to GPT-2's
//! alphabet. Where llama.cpp adapted a regex for its own engine, the original from the model's
//! `tokenizer.json` (quoted in llama.cpp's comments) is used, since the `tokenizers` crate runs
//! it as written (fancy-regex).

use serde_json::{json, Value};

/// GPT-2's split (HF `ByteLevel` with `use_regex`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama-3's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN35`).
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// ChatGLM-4's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_CHATGLM4`).
const CHATGLM4: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o / Llama-4's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_GPT4O`).
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral Tekken's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_TEKKEN`).
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Punctuation runs (llama.cpp's default and Falcon lists start with these).
const PUNCT_DEFAULT: &str = r"[\p{P}\$\+<=>\^~\|]+";
const PUNCT_FALCON: &str = r"[\p{P}\$\+<=>\^~\|`]+";
/// DeepSeek-LLM's letters (llama.cpp `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM`, second regex).
const DEEPSEEK_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";
/// CJK runs of the DeepSeek lists.
const DEEPSEEK_CJK: &str = r"[一-龥ࠀ-一가-퟿]+";

/// What a `tokenizer.ggml.pre` value selects.
pub struct PreTokenizer {
    /// The HF `pre_tokenizer` object.
    pub json: Value,
    /// HF BPE `ignore_merges`: a word that is a vocabulary entry is one token (llama.cpp
    /// `ignore_merges`, set for the Llama-3 family and a few others).
    pub ignore_merges: bool,
    /// Add BOS when the GGUF has no `tokenizer.ggml.add_bos_token` (llama.cpp sets it for the
    /// Llama-3 family).
    pub default_add_bos: bool,
}

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// Isolating splits in order, then bytes → GPT-2 alphabet.
fn splits(regexes: &[&str]) -> Value {
    let mut seq: Vec<Value> = regexes.iter().map(|r| split(r)).collect();
    seq.push(byte_level(false));
    json!({"type": "Sequence", "pretokenizers": seq})
}

/// The pre-tokenizer for `pre` (a missing key means `default`, as in llama.cpp), or `None` when
/// infer does not know the value (llama.cpp's custom-coded splitters: `kimi-k2`, `afmoe`,
/// `superbpe`, … and any newer name).
pub fn pre_tokenizer(pre: &str) -> Option<PreTokenizer> {
    let plain = |json| PreTokenizer {
        json,
        ignore_merges: false,
        default_add_bos: false,
    };
    let llama3 = |json| PreTokenizer {
        json,
        ignore_merges: true,
        default_add_bos: true,
    };
    Some(match pre {
        "default" => plain(splits(&[PUNCT_DEFAULT, GPT2, r"\p{N}+", "[0-9][0-9][0-9]"])),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "exaone4" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
            plain(byte_level(true))
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => llama3(splits(&[LLAMA3])),
        "dbrx" | "smaug-bpe" => plain(splits(&[LLAMA3])),
        "tekken" => llama3(splits(&[TEKKEN])),
        "deepseek-llm" => plain(splits(&[
            r"[\r\n]",
            DEEPSEEK_LETTERS,
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            DEEPSEEK_CJK,
            r"\p{N}+",
        ])),
        "deepseek-coder" => plain(splits(&[
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            DEEPSEEK_CJK,
            r"\p{N}",
        ])),
        "falcon" => plain(splits(&[PUNCT_FALCON, GPT2, "[0-9][0-9][0-9]"])),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => plain(json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]})),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "hunyuan"
        | "solar-open" | "megrez" => plain(splits(&[QWEN2])),
        "qwen35" => plain(splits(&[QWEN35])),
        "chatglm-bpe" => plain(splits(&[CHATGLM4])),
        "glm4" | "glm5" => PreTokenizer {
            ignore_merges: true,
            ..plain(splits(&[CHATGLM4]))
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => plain(splits(&[GPT4O])),
        "poro-chat" | "bloom" | "gpt3-finnish" => plain(splits(&[r" ?[^(\s|.,!?…。，、।۔،)]+"])),
        "viking" => plain(splits(&[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"])),
        _ => return None,
    })
}

/// One `tokenizer.ggml.pre` name per distinct behaviour of [`pre_tokenizer`] (names that share a
/// split, e.g. `starcoder`/`smollm`, behave alike), in the order [`pre_tokenizer_name`] tries
/// them.
const CANONICAL_NAMES: &[&str] = &[
    "default",
    "gpt-2",
    "llama-bpe",
    "dbrx",
    "tekken",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "smollm",
    "qwen2",
    "qwen35",
    "chatglm-bpe",
    "glm4",
    "gpt-4o",
    "poro-chat",
    "viking",
];

/// The inverse of [`pre_tokenizer`]: a `tokenizer.ggml.pre` name whose HF pre-tokenizer is
/// `json` and whose `ignore_merges` is `ignore_merges` (for a `tokenizer.json` built from a GGUF,
/// or a Hugging Face one with the same splits), `None` when no name matches.
pub fn pre_tokenizer_name(json: &Value, ignore_merges: bool) -> Option<&'static str> {
    CANONICAL_NAMES.iter().copied().find(|n| {
        pre_tokenizer(n).is_some_and(|p| p.json == *json && p.ignore_merges == ignore_merges)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name maps back to a name of the same behaviour (same split and ignore_merges).
    #[test]
    fn names_invert() {
        for name in [
            "default",
            "gpt-2",
            "llama3",
            "llama-bpe",
            "smaug-bpe",
            "tekken",
            "smollm",
            "starcoder",
            "qwen2",
            "stablelm2",
            "glm4",
            "gpt-4o",
            "viking",
            "olmo",
        ] {
            let p = pre_tokenizer(name).unwrap();
            let back = pre_tokenizer_name(&p.json, p.ignore_merges).unwrap();
            let q = pre_tokenizer(back).unwrap();
            assert_eq!(
                (q.json, q.ignore_merges),
                (p.json, p.ignore_merges),
                "{name} → {back}"
            );
        }
        assert_eq!(
            pre_tokenizer_name(&json!({"type": "Whitespace"}), false),
            None
        );
        let smollm = pre_tokenizer("smollm").unwrap();
        assert_eq!(pre_tokenizer_name(&smollm.json, false), Some("smollm"));
        assert_eq!(pre_tokenizer_name(&smollm.json, true), None);
    }
}
