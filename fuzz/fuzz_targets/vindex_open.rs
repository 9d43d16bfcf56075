//! Fuzz target `vindex_open`: see [`infer_fuzz::vindex_open`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infer_fuzz::vindex_open(data));
