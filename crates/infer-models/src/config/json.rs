//! Typed reads of one JSON object of a config file; every error names the file and the key.

use std::path::Path;

use serde_json::{Map, Value};

use crate::ModelError;

/// A JSON object of a config file plus the file path (for errors) and a key prefix
/// (e.g. `rope_scaling.`) so nested fields are named in full.
pub(crate) struct Obj<'a> {
    pub path: &'a Path,
    pub map: &'a Map<String, Value>,
    pub prefix: String,
}

impl<'a> Obj<'a> {
    /// Wrap `v`, which must be a JSON object; otherwise [`ModelError::BadField`] naming `what`.
    pub fn new(path: &'a Path, v: &'a Value, prefix: &str) -> Result<Self, ModelError> {
        match v.as_object() {
            Some(map) => Ok(Obj {
                path,
                map,
                prefix: prefix.to_string(),
            }),
            None => Err(ModelError::BadField {
                path: path.to_path_buf(),
                field: prefix.trim_end_matches('.').to_string(),
                msg: "expected a JSON object".into(),
            }),
        }
    }

    /// `key` with this object's prefix (e.g. `text_config.max_position_embeddings`).
    pub fn name(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// The value at `key`, treating JSON `null` as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// True when the key exists (even with a `null` value).
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub fn missing(&self, key: &str) -> ModelError {
        ModelError::MissingField {
            path: self.path.to_path_buf(),
            field: self.name(key),
        }
    }

    pub fn bad(&self, key: &str, msg: impl Into<String>) -> ModelError {
        ModelError::BadField {
            path: self.path.to_path_buf(),
            field: self.name(key),
            msg: msg.into(),
        }
    }

    /// Optional non-negative integer (also accepts a float with no fraction, e.g. `16.0`).
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                if let Some(u) = v.as_u64() {
                    return usize::try_from(u)
                        .map(Some)
                        .map_err(|_| self.bad(key, "integer too large"));
                }
                match v.as_f64() {
                    Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 1e15 => Ok(Some(f as usize)),
                    _ => Err(self.bad(key, format!("expected a non-negative integer, got {v}"))),
                }
            }
        }
    }

    /// Required non-negative integer; absent or `null` → [`ModelError::MissingField`].
    pub fn req_usize(&self, key: &str) -> Result<usize, ModelError> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    /// First present key of `keys` as a required integer of at least 1; missing → names
    /// `keys[0]`, 0 → names the key it was read from.
    pub fn req_positive_any(&self, keys: &[&str]) -> Result<usize, ModelError> {
        for k in keys {
            match self.opt_usize(k)? {
                Some(0) => return Err(self.bad(k, "must be at least 1 (got 0)")),
                Some(v) => return Ok(v),
                None => {}
            }
        }
        Err(self.missing(keys[0]))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected a number, got {v}"))),
        }
    }

    /// First present key of `keys` as a number.
    pub fn opt_f64_any(&self, keys: &[&str]) -> Result<Option<f64>, ModelError> {
        for k in keys {
            if let Some(v) = self.opt_f64(k)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    pub fn req_f64(&self, key: &str) -> Result<f64, ModelError> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected true/false, got {v}"))),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected a string, got {v}"))),
        }
    }

    /// A token id (`u32`).
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, ModelError> {
        match self.opt_usize(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| self.bad(key, "token id does not fit in u32")),
        }
    }

    /// A token id or a list of them (HF `eos_token_id`); absent → empty.
    pub fn u32_or_list(&self, key: &str) -> Result<Vec<u32>, ModelError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|u| u32::try_from(u).ok())
                        .ok_or_else(|| self.bad(key, format!("expected token ids, got {v}")))
                })
                .collect(),
            Some(_) => Ok(self.opt_u32(key)?.into_iter().collect()),
        }
    }

    /// A nested object (absent or `null` → `None`).
    pub fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => Obj::new(self.path, v, &format!("{}.", self.name(key))).map(Some),
        }
    }
}
