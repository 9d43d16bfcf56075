//! The quantized data-provider API (the seed's table): raw ggml block bytes straight from the
//! mmap with the format tag of each tensor as its manifest records it. The vindex never
//! interprets the blocks; compute dequantizes them (the format tag, not the file name, picks
//! the kernel).
//!
//! Every matrix is in HF Linear layout `[out, in]`: attention Q `[q_dim, hidden]`, K/V
//! `[kv_dim, hidden]`, O `[hidden, q_dim]`; FFN gate/up `[intermediate, hidden]`, down
//! `[hidden, intermediate]`; lm_head `[vocab, hidden]`. Each row is `in / block_elems` whole
//! blocks. Entries were validated at open (length = `QuantFormat::expected_bytes(shape)`).

use infer_quant::QuantFormat;

use crate::files;
use crate::load::Vindex;
use crate::manifest::{I8Entry, TensorEntry};
use crate::tier::Tier;
use crate::VindexError;

/// One Q8-tier tensor: int8 values `[out, in]` as bytes, f32 scales `[out, in/32]`.
pub type Q8Slices<'a> = (&'a [u8], &'a [f32]);

const ATTN: [&str; 4] = ["q_proj", "k_proj", "v_proj", "o_proj"];
const FFN: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

impl Vindex {
    /// Tiers present (from `index.json`, checked at open): the float tier, then quantized ones.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Whether the vindex has `tier` (listed in index.json and its files present).
    pub fn has_tier(&self, tier: Tier) -> bool {
        self.tiers.contains(&tier)
    }

    /// Whether the quantized tier `tier` holds its own output matrix (`lm_head.weight` in
    /// [`files::LM_HEAD_Q6K_BIN`] for q4k, [`files::LM_HEAD_Q4_BIN`] for q4). False for other
    /// tiers, and for a vindex without a float tier whose output projection is the tied,
    /// quantized embedding table.
    pub fn has_lm_head_copy(&self, tier: Tier) -> bool {
        let file = match tier {
            Tier::Q4K => files::LM_HEAD_Q6K_BIN,
            Tier::Q4 => files::LM_HEAD_Q4_BIN,
            _ => return false,
        };
        self.quant
            .get(file)
            .is_some_and(|m| m.contains_key("lm_head.weight"))
    }

    /// Entries of a quantized file (one of [`files::QUANT_BINS`]), unordered; empty when absent.
    pub fn quant_entries(&self, file: &str) -> Vec<&TensorEntry> {
        self.quant
            .get(file)
            .map(|m| m.values().collect())
            .unwrap_or_default()
    }

    /// The I8 entries of [`files::ATTN_Q8_BIN`], unordered; empty when absent.
    pub fn q8_value_entries(&self) -> Vec<&I8Entry> {
        self.q8_values.values().collect()
    }

    /// A tensor of a quantized file: its bytes (borrowed from the mmap) and entry.
    /// Errors: [`VindexError::Absent`] when the file or the key is not in this vindex.
    pub fn quant_tensor(
        &self,
        file: &'static str,
        key: &str,
    ) -> Result<(&[u8], &TensorEntry), VindexError> {
        let e = self
            .quant
            .get(file)
            .and_then(|m| m.get(key))
            .ok_or_else(|| VindexError::Absent {
                path: self.path.join(file),
                what: format!("tensor '{key}'"),
            })?;
        let map = self
            .maps
            .get(file)
            .ok_or_else(|| VindexError::MissingFile {
                path: self.path.join(file),
            })?;
        // In bounds: checked by `TensorEntry::validate` at open.
        Ok((&map[e.offset..e.offset + e.length], e))
    }

    fn layer_key(&self, layer: usize, module: &str, name: &str) -> Result<String, VindexError> {
        self.check_layer(layer)?;
        Ok(format!("model.layers.{layer}.{module}.{name}.weight"))
    }

    /// Q, K, V, O projections of `layer` from [`files::ATTN_Q4K_BIN`], each with the format it
    /// is stored in (Q4_K / Q6_K, or Q5_0 / Q8_0 where the row length is not a multiple of 256).
    /// Errors: layer out of range; [`VindexError::Absent`] without the q4k tier or a projection.
    pub fn attn_q4k_layer_data(
        &self,
        layer: usize,
    ) -> Result<[(&[u8], QuantFormat); 4], VindexError> {
        let mut out = [(&[][..], QuantFormat::Q4_K); 4];
        for (o, p) in out.iter_mut().zip(ATTN) {
            let (b, e) =
                self.quant_tensor(files::ATTN_Q4K_BIN, &self.layer_key(layer, "self_attn", p)?)?;
            *o = (b, e.format);
        }
        Ok(out)
    }

    /// Q, K, V, O projections of `layer` from the Q8 tier: int8 values `[out, in]` (as `u8`
    /// bytes; reinterpret as `i8`) and f32 scales `[out, in/32]` (value = `q as f32 · scale`,
    /// ggml `dequantize_row_q8_0`).
    /// Errors: layer out of range; [`VindexError::Absent`] without the q8 tier or a projection.
    pub fn attn_q8_layer_data(&self, layer: usize) -> Result<[Q8Slices<'_>; 4], VindexError> {
        let mut out: [Q8Slices<'_>; 4] = [(&[], &[]); 4];
        for (o, p) in out.iter_mut().zip(ATTN) {
            let key = self.layer_key(layer, "self_attn", p)?;
            *o = self.q8_tensor(&key)?;
        }
        Ok(out)
    }

    /// One tensor of the Q8 tier by key: int8 values (as bytes) and f32 scales.
    /// Errors: [`VindexError::Absent`].
    pub fn q8_tensor(&self, key: &str) -> Result<Q8Slices<'_>, VindexError> {
        let e = self.q8_values.get(key).ok_or_else(|| VindexError::Absent {
            path: self.path.join(files::ATTN_Q8_BIN),
            what: format!("tensor '{key}'"),
        })?;
        let map = self
            .maps
            .get(files::ATTN_Q8_BIN)
            .ok_or_else(|| VindexError::MissingFile {
                path: self.path.join(files::ATTN_Q8_BIN),
            })?;
        let values = &map[e.offset..e.offset + e.length];
        let (sb, _) = self.quant_tensor(files::ATTN_Q8_SCALES_BIN, key)?;
        debug_assert_eq!(sb.as_ptr() as usize % std::mem::align_of::<f32>(), 0);
        // SAFETY: the scales entry was validated at open (F32, in bounds, 64-byte aligned offset
        // in a page-aligned map, length = 4 × numel); every bit pattern is a valid f32 and the
        // map lives as long as `self`.
        let scales = unsafe { std::slice::from_raw_parts(sb.as_ptr() as *const f32, sb.len() / 4) };
        Ok((values, scales))
    }

    /// Gate, up, down of `layer` from [`files::INTERLEAVED_Q4K_BIN`] with their stored formats
    /// (gate/up Q4_K or Q5_0; down Q6_K, Q4_K with `--down-q4k`, or Q8_0 / Q5_0).
    /// Errors: layer out of range; [`VindexError::Absent`] without the q4k tier or a dense FFN.
    pub fn ffn_q4k_layer_data(
        &self,
        layer: usize,
    ) -> Result<[(&[u8], QuantFormat); 3], VindexError> {
        self.ffn_quant(files::INTERLEAVED_Q4K_BIN, layer)
    }

    /// Gate, up, down of `layer` from [`files::INTERLEAVED_Q4_BIN`] (Q4_0, or Q4_0x16).
    /// Errors: as [`Vindex::ffn_q4k_layer_data`] for the q4 tier.
    pub fn ffn_q4_layer_data(
        &self,
        layer: usize,
    ) -> Result<[(&[u8], QuantFormat); 3], VindexError> {
        self.ffn_quant(files::INTERLEAVED_Q4_BIN, layer)
    }

    /// Gate (`None` for a non-gated FFN: GPT-2, StarCoder2, phi, GPT-NeoX), up and down of
    /// `layer` from the q4k ([`Tier::Q4K`]) or q4 ([`Tier::Q4`]) FFN tier, with stored formats.
    /// Errors: layer out of range; another tier; [`VindexError::Absent`] without the tier or
    /// without up/down.
    #[allow(clippy::type_complexity)]
    pub fn ffn_quant_layer(
        &self,
        tier: Tier,
        layer: usize,
    ) -> Result<(Option<(&[u8], QuantFormat)>, [(&[u8], QuantFormat); 2]), VindexError> {
        let file = match tier {
            Tier::Q4K => files::INTERLEAVED_Q4K_BIN,
            Tier::Q4 => files::INTERLEAVED_Q4_BIN,
            _ => {
                return Err(VindexError::Absent {
                    path: self.path.clone(),
                    what: format!("a quantized FFN in tier '{tier}'"),
                })
            }
        };
        let get = |p: &str| -> Result<(&[u8], QuantFormat), VindexError> {
            let (b, e) = self.quant_tensor(file, &self.layer_key(layer, "mlp", p)?)?;
            Ok((b, e.format))
        };
        let gate_key = self.layer_key(layer, "mlp", "gate_proj")?;
        let gate = match self
            .quant
            .get(file)
            .is_some_and(|m| m.contains_key(&gate_key))
        {
            true => Some(get("gate_proj")?),
            false => None,
        };
        Ok((gate, [get("up_proj")?, get("down_proj")?]))
    }

    fn ffn_quant(
        &self,
        file: &'static str,
        layer: usize,
    ) -> Result<[(&[u8], QuantFormat); 3], VindexError> {
        let mut out = [(&[][..], QuantFormat::Q4_0); 3];
        for (o, p) in out.iter_mut().zip(FFN) {
            let (b, e) = self.quant_tensor(file, &self.layer_key(layer, "mlp", p)?)?;
            *o = (b, e.format);
        }
        Ok(out)
    }

    /// One FFN matrix by canonical key from the q4k ([`Tier::Q4K`]) or q4 ([`Tier::Q4`]) FFN
    /// tier with its stored format: MoE experts (`….mlp.experts.{e}.{gate,up,down}_proj.weight`,
    /// `….mlp.shared_expert.*`), stored per expert in HF Linear layout.
    /// Errors: another tier; [`VindexError::Absent`] without the tier or the key.
    pub fn ffn_quant_tensor(
        &self,
        tier: Tier,
        key: &str,
    ) -> Result<(&[u8], QuantFormat), VindexError> {
        let file = match tier {
            Tier::Q4K => files::INTERLEAVED_Q4K_BIN,
            Tier::Q4 => files::INTERLEAVED_Q4_BIN,
            _ => {
                return Err(VindexError::Absent {
                    path: self.path.clone(),
                    what: format!("a quantized FFN in tier '{tier}'"),
                })
            }
        };
        let (b, e) = self.quant_tensor(file, key)?;
        Ok((b, e.format))
    }

    /// Gate rows of `layer` in Q4_0, `[intermediate, hidden]` ([`files::GATE_Q4_BIN`]).
    /// Errors: layer out of range; [`VindexError::Absent`] without the q4 tier.
    pub fn gate_q4_data(&self, layer: usize) -> Result<&[u8], VindexError> {
        let key = self.layer_key(layer, "mlp", "gate_proj")?;
        Ok(self.quant_tensor(files::GATE_Q4_BIN, &key)?.0)
    }

    /// The whole mapped [`files::INTERLEAVED_Q4K_BIN`] (per layer gate, up, down; offsets and
    /// formats in its manifest, see [`Vindex::quant_tensor`]), `None` without the q4k tier.
    pub fn interleaved_q4k_mmap_ref(&self) -> Option<&[u8]> {
        self.mapped_bytes(files::INTERLEAVED_Q4K_BIN)
    }

    /// The whole mapped [`files::INTERLEAVED_Q4_BIN`], `None` without the q4 tier.
    pub fn interleaved_q4_mmap_ref(&self) -> Option<&[u8]> {
        self.mapped_bytes(files::INTERLEAVED_Q4_BIN)
    }

    /// The output projection `[vocab, hidden]` of the q4 tier with its stored format (Q4_0,
    /// or Q4_0x16 from `infer extract --q4-x16`), quantized from the embeddings when the model
    /// ties them. Errors: [`VindexError::Absent`] without the q4 tier.
    pub fn lm_head_q4_data(&self) -> Result<(&[u8], QuantFormat), VindexError> {
        let (b, e) = self.quant_tensor(files::LM_HEAD_Q4_BIN, "lm_head.weight")?;
        Ok((b, e.format))
    }

    /// The output projection `[vocab, hidden]` of the q4k tier with its stored format (Q6_K,
    /// or Q8_0 when rows are not a multiple of 256), from the embeddings when tied.
    /// Errors: [`VindexError::Absent`] without the q4k tier.
    pub fn lm_head_q6k_data(&self) -> Result<(&[u8], QuantFormat), VindexError> {
        let (b, e) = self.quant_tensor(files::LM_HEAD_Q6K_BIN, "lm_head.weight")?;
        Ok((b, e.format))
    }
}
