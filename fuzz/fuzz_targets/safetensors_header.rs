//! Fuzz target `safetensors_header`: see [`infer_fuzz::safetensors_header`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::safetensors_header(data));
