//! infer-vindex
