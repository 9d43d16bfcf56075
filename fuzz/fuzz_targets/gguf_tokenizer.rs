//! Fuzz target `gguf_tokenizer`: see [`infer_fuzz::gguf_tokenizer`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::gguf_tokenizer(data));
