//! infer-compute
