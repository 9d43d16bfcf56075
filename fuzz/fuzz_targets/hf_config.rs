//! Fuzz target `hf_config`: see [`infer_fuzz::hf_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::hf_config(data));
