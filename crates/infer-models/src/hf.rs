//! Hugging Face folder source (stub; filled in by the HF work).

use std::path::Path;

use crate::{ModelError, ModelSource};

/// Open a Hugging Face folder (`config.json` + safetensors) as a [`ModelSource`].
pub fn open_hf_folder(path: &Path) -> Result<ModelSource, ModelError> {
    Err(ModelError::Unsupported {
        path: path.to_path_buf(),
        msg: "HF folders not implemented yet".into(),
    })
}
