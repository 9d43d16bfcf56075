//! GGUF ↔ Hugging Face tensor-name maps (stub).
