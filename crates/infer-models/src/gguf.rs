//! GGUF v2/v3 reader (stub; filled in by the GGUF work).

use std::path::Path;

use crate::{ModelError, ModelSource};

/// A parsed GGUF file: metadata, tensor infos, and the memory map of its data.
pub struct GgufFile {}

/// Open a GGUF file as a [`ModelSource`].
pub fn open_gguf_source(path: &Path) -> Result<ModelSource, ModelError> {
    Err(ModelError::Unsupported {
        path: path.to_path_buf(),
        msg: "GGUF not implemented yet".into(),
    })
}
