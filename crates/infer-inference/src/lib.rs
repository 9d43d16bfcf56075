//! infer-inference
