//! Fuzz target `gguf_header`: see [`infer_fuzz::gguf_header`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::gguf_header(data));
