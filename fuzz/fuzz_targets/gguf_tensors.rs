//! Fuzz target `gguf_tensors`: see [`infer_fuzz::gguf_tensors`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::gguf_tensors(data));
