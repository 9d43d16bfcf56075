//! Fuzz target `serve_request`: see [`infer_fuzz::serve_request`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::serve_request(data));
