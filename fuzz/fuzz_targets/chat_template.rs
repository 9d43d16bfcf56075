//! Fuzz target `chat_template`: see [`infer_fuzz::chat_template`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::chat_template(data));
