//! Sane upper bounds on the sizes a config (HF `config.json`, GGUF metadata, a vindex's
//! `index.json`) may declare, checked as soon as a value is read and before anything is sized
//! by it: a few bytes of JSON or metadata saying `"num_hidden_layers": 1e12` must be refused
//! naming the field, not make the reader allocate a terabyte.
//!
//! The bounds are far above every published checkpoint (the widest have `hidden_size` 16384 /
//! 18432, vocabularies of 256k–262k and at most a few hundred layers), so they only reject
//! corrupt or hostile files.

use std::path::Path;

use crate::ModelError;

/// Most value of a width-like size: hidden size, FFN width, head dim, head counts, vocabulary,
/// context length (2^31, so products of two sizes still fit in a 64-bit `usize`).
pub const MAX_WIDTH: usize = 1 << 31;

/// Most value of a count that sizes per-item tables: layers, experts (2^16).
pub const MAX_COUNT: usize = 1 << 16;

/// Check `value` of `field` (named as the source spells it) against `max`.
///
/// Errors: [`ModelError::BadField`] naming `path` and `field`: "N is absurdly large (at most M)".
pub fn check_size(path: &Path, field: &str, value: usize, max: usize) -> Result<(), ModelError> {
    if value > max {
        return Err(ModelError::BadField {
            path: path.to_path_buf(),
            field: field.to_string(),
            msg: format!("{value} is absurdly large (at most {max}; corrupt or hostile file?)"),
        });
    }
    Ok(())
}

/// [`check_size`] for several `(field, value, max)` triples, stopping at the first too large.
pub fn check_sizes(path: &Path, fields: &[(&str, usize, usize)]) -> Result<(), ModelError> {
    fields
        .iter()
        .try_for_each(|&(field, value, max)| check_size(path, field, value, max))
}
