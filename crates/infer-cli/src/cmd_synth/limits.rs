//! Sanity limits on a `config.json`'s sizes, checked on the raw JSON before the config is
//! parsed, so an absurd value (`"hidden_size": 1e12`) is refused naming the field instead of
//! exhausting memory.

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

/// Width-like fields: at most 2^31 each (the largest real models are below 2^20).
const SIZE_FIELDS: &[&str] = &[
    "hidden_size",
    "n_embd",
    "intermediate_size",
    "n_inner",
    "head_dim",
    "vocab_size",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "max_position_embeddings",
    "n_positions",
];
/// Most values of a width-like field.
pub const MAX_SIZE: f64 = (1u64 << 31) as f64;
/// Count fields (layers, experts): at most 2^16 each, and layers × experts at most 2^20 (each
/// expert of each layer is three tensors).
const COUNT_FIELDS: &[&str] = &[
    "num_hidden_layers",
    "n_layer",
    "num_experts",
    "num_local_experts",
];
/// Most value of a count field.
pub const MAX_COUNT: f64 = (1u64 << 16) as f64;
/// Most layers × experts.
pub const MAX_LAYER_EXPERTS: f64 = (1u64 << 20) as f64;

fn num(obj: &serde_json::Map<String, Value>, key: &str) -> Option<f64> {
    obj.get(key).and_then(Value::as_f64)
}

/// Check the size and count fields of `obj` (and of a nested `text_config`).
fn check_object(path: &Path, obj: &serde_json::Map<String, Value>) -> anyhow::Result<()> {
    for (fields, max) in [(SIZE_FIELDS, MAX_SIZE), (COUNT_FIELDS, MAX_COUNT)] {
        for &k in fields {
            if let Some(v) = num(obj, k) {
                if v > max {
                    bail!(
                        "{}: \"{k}\" is {v}, an absurd size (at most {max}); refusing",
                        path.display()
                    );
                }
            }
        }
    }
    let layers = num(obj, "num_hidden_layers").or(num(obj, "n_layer"));
    let experts = num(obj, "num_experts").or(num(obj, "num_local_experts"));
    if let (Some(l), Some(e)) = (layers, experts) {
        if l * e.max(1.0) > MAX_LAYER_EXPERTS {
            bail!(
                "{}: {l} layers × {e} experts is an absurd number of tensors (layers × experts at most {MAX_LAYER_EXPERTS}); refusing",
                path.display()
            );
        }
    }
    if let Some(Value::Object(t)) = obj.get("text_config") {
        check_object(path, t)?;
    }
    Ok(())
}

/// Read `path` as JSON and refuse absurd sizes: a width-like field above [`MAX_SIZE`], a layer
/// or expert count above [`MAX_COUNT`], layers × experts above [`MAX_LAYER_EXPERTS`].
/// Errors name the file and the field. Unparseable JSON is left to the config parser.
pub fn check_config_sizes(path: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(obj)) => check_object(path, &obj),
        _ => Ok(()),
    }
}
