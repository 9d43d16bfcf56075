//! `down_meta.bin`: for every FFN feature, the tokens its output vector writes most and least.
//!
//! Feature i of layer l adds aᵢ·dᵢ to the residual stream, dᵢ being row i of the layer's
//! feature-major `down_features.bin` matrix `[intermediate, hidden]` and aᵢ its activation.
//! Projected through the unembedding, its largest entries are the tokens the feature promotes
//! when aᵢ > 0 (Geva et al. 2022, "Transformer Feed-Forward Layers Build Predictions by
//! Promoting Concepts in the Vocabulary Space"); when aᵢ < 0 (gated FFNs: act(g)·u with u < 0,
//! common) it promotes the tokens of the **smallest** entries, so both ends are stored.
//!
//! Score of token t: `W_unembed[t] · (γ ⊙ dᵢ)`, `W_unembed` = `lm_head.bin` `[vocab, hidden]`
//! (or `embeddings.bin` when tied), γ = the final norm's weight plus the architecture's
//! `norm_weight_offset` (Gemma's `1 + w`), when the vindex stores the final norm (header flag
//! bit 0; otherwise γ = 1, the raw projection). This is the direct logit attribution of dᵢ up to
//! the final norm's per-position positive scale (1/RMS, which does not change ranks); a LayerNorm
//! bias, logit soft-cap, scaling or multiplier is not applied. Scores compare between features
//! of one model only.
//!
//! # Layout (version 1; every integer and float little-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `b"INFDMETA"` |
//! | 8 | 4 | u32 version = 1 |
//! | 12 | 4 | u32 `num_layers` (= `index.json` `shapes.num_layers`) |
//! | 16 | 4 | u32 `top_n` ≥ 1 (tokens per feature; at most `vocab_size`) |
//! | 20 | 4 | u32 `vocab_size` (every token id is below it) |
//! | 24 | 4 | u32 unembedding: 0 = `lm_head.bin`, 1 = `embeddings.bin` (tied) |
//! | 28 | 4 | u32 flags: bit 0 = scores include the final norm weight γ; other bits 0 |
//! | 32 | 4 × `num_layers` | u32 `features[l]`: the layer's intermediate size, 0 for a layer without a dense FFN (MoE) |
//! | … | 0 or 4 | zero padding to a multiple of 8 |
//! | data | 16 × `top_n` × Σ `features` | for layer 0 … L-1, feature 0 … F-1: `top_n` top records then `top_n` bottom records, each (u32 token id, f32 score) |
//!
//! A feature's top records hold its `top_n` largest scores, descending; its bottom records its
//! `top_n` smallest, ascending (most negative first); ties by token id ascending. A NaN score
//! ranks (and is stored) as `-inf` in the top list and `+inf` in the bottom list. The file size
//! is exactly `data + 16 · top_n · Σ features`.
//! Records are 4-byte aligned in the page-aligned map, so [`DownMeta`] hands out
//! `&[TokenScore]` straight from it.

use std::path::Path;

use crate::files;
use crate::load::Vindex;
use crate::VindexError;

/// First 8 bytes of `down_meta.bin`.
pub const DOWN_META_MAGIC: [u8; 8] = *b"INFDMETA";
/// The layout version this build writes and reads.
pub const DOWN_META_VERSION: u32 = 1;
/// Bytes of the fixed header before the per-layer feature counts.
const FIXED_HEADER: usize = 32;

/// One token of a feature's list: token id and score `W_unembed[token] · (γ ⊙ dᵢ)`.
/// Layout: `#[repr(C)]` (u32, f32), 8 bytes, exactly the file's record.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct TokenScore {
    /// Token id, `< vocab_size`.
    pub token: u32,
    /// Projection score (see the module docs: final norm weight γ, no soft-cap).
    pub score: f32,
}

/// Which matrix the scores were projected through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unembedding {
    /// `lm_head.bin` (untied output projection).
    LmHead,
    /// `embeddings.bin` (tied embeddings).
    Embeddings,
}

impl Unembedding {
    fn code(self) -> u32 {
        match self {
            Unembedding::LmHead => 0,
            Unembedding::Embeddings => 1,
        }
    }
}

/// The parsed header of `down_meta.bin`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownMetaHeader {
    /// Decoder layers covered (= the vindex's).
    pub num_layers: usize,
    /// Tokens stored per feature.
    pub top_n: usize,
    /// Vocabulary size; every stored token id is below it.
    pub vocab_size: usize,
    /// Matrix the scores were projected through.
    pub unembedding: Unembedding,
    /// Scores include the final norm weight γ (flag bit 0).
    pub final_norm_weighted: bool,
    /// Features per layer (0 for a layer without a dense FFN).
    pub features: Vec<usize>,
}

impl DownMetaHeader {
    /// Byte offset of the first record (header + feature table, padded to 8).
    pub fn data_offset(&self) -> usize {
        (FIXED_HEADER + 4 * self.num_layers).next_multiple_of(8)
    }

    /// Exact file size this header implies.
    pub fn file_size(&self) -> usize {
        self.data_offset() + self.feature_bytes() * self.features.iter().sum::<usize>()
    }

    /// Bytes of one feature's records (top and bottom).
    fn feature_bytes(&self) -> usize {
        16 * self.top_n
    }

    /// Byte offset of layer `layer`'s first record.
    fn layer_offset(&self, layer: usize) -> usize {
        self.data_offset() + self.feature_bytes() * self.features[..layer].iter().sum::<usize>()
    }

    /// The header and feature table as bytes (padded to [`DownMetaHeader::data_offset`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.data_offset());
        b.extend_from_slice(&DOWN_META_MAGIC);
        for v in [
            DOWN_META_VERSION,
            self.num_layers as u32,
            self.top_n as u32,
            self.vocab_size as u32,
            self.unembedding.code(),
            u32::from(self.final_norm_weighted),
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for &f in &self.features {
            b.extend_from_slice(&(f as u32).to_le_bytes());
        }
        b.resize(self.data_offset(), 0);
        b
    }

    /// Parse and check the header of `bytes` (the whole file): magic, version, `top_n ≥ 1`,
    /// `top_n ≤ vocab_size`, a known unembedding code, and a file size equal to
    /// [`DownMetaHeader::file_size`].
    /// Errors: [`VindexError::Corrupt`] naming `path` and what is wrong.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, VindexError> {
        let bad = |msg: String| VindexError::Corrupt {
            path: path.to_path_buf(),
            msg,
        };
        if bytes.len() < FIXED_HEADER {
            return Err(bad(format!(
                "{} bytes, shorter than the {FIXED_HEADER}-byte header (truncated?)",
                bytes.len()
            )));
        }
        if bytes[..8] != DOWN_META_MAGIC {
            return Err(bad(format!(
                "bad magic {:?} (expected \"INFDMETA\")",
                String::from_utf8_lossy(&bytes[..8])
            )));
        }
        let u32_at = |o: usize| -> u32 {
            let mut w = [0u8; 4];
            w.copy_from_slice(&bytes[o..o + 4]);
            u32::from_le_bytes(w)
        };
        let version = u32_at(8);
        if version != DOWN_META_VERSION {
            return Err(bad(format!(
                "version {version} (this build reads {DOWN_META_VERSION})"
            )));
        }
        let num_layers = u32_at(12) as usize;
        let top_n = u32_at(16) as usize;
        let vocab_size = u32_at(20) as usize;
        let unembedding = match u32_at(24) {
            0 => Unembedding::LmHead,
            1 => Unembedding::Embeddings,
            c => return Err(bad(format!("unknown unembedding code {c}"))),
        };
        let flags = u32_at(28);
        if flags > 1 {
            return Err(bad(format!("unknown flags {flags:#x}")));
        }
        if top_n == 0 || top_n > vocab_size {
            return Err(bad(format!(
                "top_n {top_n} is not in 1..={vocab_size} (vocab_size)"
            )));
        }
        let table_end = FIXED_HEADER + 4 * num_layers;
        if bytes.len() < table_end {
            return Err(bad(format!(
                "{} bytes, shorter than the header with {num_layers} layers (truncated?)",
                bytes.len()
            )));
        }
        let features = (0..num_layers)
            .map(|l| u32_at(FIXED_HEADER + 4 * l) as usize)
            .collect();
        let h = DownMetaHeader {
            num_layers,
            top_n,
            vocab_size,
            unembedding,
            final_norm_weighted: flags & 1 == 1,
            features,
        };
        let want = h
            .features
            .iter()
            .try_fold(h.data_offset() as u128, |acc, &f| {
                Some(acc + 16 * h.top_n as u128 * f as u128)
            })
            .unwrap_or(u128::MAX);
        if bytes.len() as u128 != want {
            return Err(bad(format!(
                "{} bytes, but the header implies {want} (truncated or corrupt?)",
                bytes.len()
            )));
        }
        Ok(h)
    }
}

/// One layer's view of `down_meta.bin`: per feature `top_n` top and `top_n` bottom
/// [`TokenScore`]s, borrowed from the memory map.
#[derive(Clone, Copy, Debug)]
pub struct DownMeta<'a> {
    layer: usize,
    top_n: usize,
    records: &'a [TokenScore],
}

impl<'a> DownMeta<'a> {
    /// The layer this view covers.
    pub fn layer(&self) -> usize {
        self.layer
    }

    /// Tokens stored per feature.
    pub fn top_n(&self) -> usize {
        self.top_n
    }

    /// Number of features (the layer's intermediate size).
    pub fn num_features(&self) -> usize {
        self.records.len() / (2 * self.top_n)
    }

    /// Feature `i`'s `top_n` largest-score tokens, descending (what +dᵢ promotes); `None` when
    /// `i >= num_features()`.
    pub fn top(&self, i: usize) -> Option<&'a [TokenScore]> {
        let n = self.top_n;
        self.records.get(2 * i * n..(2 * i + 1) * n)
    }

    /// Feature `i`'s `top_n` smallest-score tokens, ascending, most negative first (what −dᵢ
    /// promotes); `None` when `i >= num_features()`.
    pub fn bottom(&self, i: usize) -> Option<&'a [TokenScore]> {
        let n = self.top_n;
        self.records.get((2 * i + 1) * n..(2 * i + 2) * n)
    }

    /// The tokens feature `i` promotes at activation `activation`: [`DownMeta::top`] when it is
    /// ≥ 0, else [`DownMeta::bottom`] (scores as stored, i.e. negative for the bottom list).
    pub fn promoted(&self, i: usize, activation: f32) -> Option<&'a [TokenScore]> {
        if activation >= 0.0 {
            self.top(i)
        } else {
            self.bottom(i)
        }
    }

    /// Every record of the layer, `[num_features, 2, top_n]` row-major (top, then bottom).
    pub fn records(&self) -> &'a [TokenScore] {
        self.records
    }
}

impl Vindex {
    /// True when the vindex holds `down_meta.bin` (built with `infer extract --down-meta`).
    pub fn has_down_meta(&self) -> bool {
        self.maps.contains_key(files::DOWN_META_BIN)
    }

    /// The parsed header of `down_meta.bin`; `None` when the vindex has none.
    /// Errors: [`VindexError::Corrupt`] naming the file (bad magic/version, a size that
    /// disagrees with the header, or a header that disagrees with the vindex: layer count,
    /// vocabulary size, a layer's feature count vs its down matrix).
    pub fn down_meta_header(&self) -> Result<Option<DownMetaHeader>, VindexError> {
        let Some(bytes) = self.mapped_bytes(files::DOWN_META_BIN) else {
            return Ok(None);
        };
        let path = self.path.join(files::DOWN_META_BIN);
        let h = DownMetaHeader::parse(&path, bytes)?;
        let bad = |msg: String| VindexError::Corrupt {
            path: path.clone(),
            msg,
        };
        if h.num_layers != self.num_layers() {
            return Err(bad(format!(
                "covers {} layers, the vindex has {}",
                h.num_layers,
                self.num_layers()
            )));
        }
        if h.vocab_size != self.index.shapes.vocab_size {
            return Err(bad(format!(
                "vocab_size {}, the vindex has {}",
                h.vocab_size, self.index.shapes.vocab_size
            )));
        }
        for (l, &f) in h.features.iter().enumerate() {
            let want = self.index.layers[l].down.as_ref().map_or(0, |e| e.shape[0]);
            if f != want {
                return Err(bad(format!(
                    "layer {l} has {f} features, its down matrix has {want}"
                )));
            }
        }
        Ok(Some(h))
    }

    /// Layer `layer`'s feature → top-token table from `down_meta.bin`, zero-copy.
    ///
    /// Returns `Ok(None)` when the vindex has no `down_meta.bin` (add one with
    /// `infer extract --down-meta`) or the layer has no dense FFN (0 features).
    /// Errors: [`VindexError::LayerOutOfRange`]; [`VindexError::Corrupt`] naming the file for a
    /// bad header (see [`Vindex::down_meta_header`]), a token id `>= vocab_size`, or a feature
    /// whose top scores are not descending or bottom scores not ascending.
    pub fn down_meta(&self, layer: usize) -> Result<Option<DownMeta<'_>>, VindexError> {
        self.check_layer(layer)?;
        let Some(h) = self.down_meta_header()? else {
            return Ok(None);
        };
        let features = h.features[layer];
        if features == 0 {
            return Ok(None);
        }
        let Some(bytes) = self.mapped_bytes(files::DOWN_META_BIN) else {
            return Ok(None);
        };
        let start = h.layer_offset(layer);
        let len = h.feature_bytes() * features;
        let slice = &bytes[start..start + len];
        if slice.as_ptr() as usize % std::mem::align_of::<TokenScore>() != 0 {
            return Err(VindexError::Corrupt {
                path: self.path.join(files::DOWN_META_BIN),
                msg: format!("layer {layer}'s records are not 4-byte aligned in the map"),
            });
        }
        // SAFETY: `slice` lies in the read-only map that lives as long as `self` (file size
        // checked against the header above), is 4-byte aligned (checked), its length is a
        // multiple of 8 = size_of::<TokenScore>(), TokenScore is repr(C) (u32, f32) with no
        // padding and every bit pattern valid, and the host is little-endian (see load.rs).
        let records: &[TokenScore] =
            unsafe { std::slice::from_raw_parts(slice.as_ptr() as *const TokenScore, len / 8) };
        let bad = |msg: String| VindexError::Corrupt {
            path: self.path.join(files::DOWN_META_BIN),
            msg: format!("layer {layer}: {msg}"),
        };
        for (i, feat) in records.chunks_exact(2 * h.top_n).enumerate() {
            if let Some(r) = feat.iter().find(|r| r.token as usize >= h.vocab_size) {
                return Err(bad(format!(
                    "feature {i} has token id {} >= vocab_size {}",
                    r.token, h.vocab_size
                )));
            }
            let (top, bottom) = feat.split_at(h.top_n);
            if top.windows(2).any(|w| w[1].score > w[0].score) {
                return Err(bad(format!(
                    "feature {i}'s top scores are not sorted descending"
                )));
            }
            if bottom.windows(2).any(|w| w[1].score < w[0].score) {
                return Err(bad(format!(
                    "feature {i}'s bottom scores are not sorted ascending"
                )));
            }
        }
        Ok(Some(DownMeta {
            layer,
            top_n: h.top_n,
            records,
        }))
    }
}

/// The `n` largest values of `row` as (index, value), value descending, ties by index ascending
/// (a NaN counts as `-inf`). One pass with a sorted buffer of `n`: O(len · n) worst case, about
/// O(len) in practice. `out` is cleared first; it gets `min(n, row.len())` entries.
pub fn top_n_into(row: &[f32], n: usize, out: &mut Vec<TokenScore>) {
    select_into(row.iter().copied(), n, out);
}

/// The `n` smallest values of `row`, value ascending, ties by index ascending (a NaN counts as
/// `+inf`); as [`top_n_into`] otherwise.
pub fn bottom_n_into(row: &[f32], n: usize, out: &mut Vec<TokenScore>) {
    select_into(row.iter().map(|v| -v), n, out);
    for r in out.iter_mut() {
        r.score = -r.score;
    }
}

/// Largest `n` of `values` (NaN = `-inf`), descending, ties by index ascending.
fn select_into(values: impl Iterator<Item = f32>, n: usize, out: &mut Vec<TokenScore>) {
    out.clear();
    if n == 0 {
        return;
    }
    for (t, v) in values.enumerate() {
        let s = if v.is_nan() { f32::NEG_INFINITY } else { v };
        if out.len() == n {
            // Full: only a strictly larger score enters (an equal one has a larger index).
            if s <= out[n - 1].score {
                continue;
            }
            out.pop();
        }
        // First position holding a strictly smaller score: equal scores keep index order.
        let pos = out.partition_point(|r| r.score >= s);
        out.insert(
            pos,
            TokenScore {
                token: t as u32,
                score: s,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_n_matches_full_sort_with_ties_and_nan() {
        let row = [1.0, 5.0, f32::NAN, 5.0, -2.0, 3.0, 7.0, 3.0, 0.0];
        let mut out = Vec::new();
        top_n_into(&row, 4, &mut out);
        let got: Vec<(u32, f32)> = out.iter().map(|r| (r.token, r.score)).collect();
        assert_eq!(got, vec![(6, 7.0), (1, 5.0), (3, 5.0), (5, 3.0)]);
        top_n_into(&row, 20, &mut out);
        assert_eq!(out.len(), row.len());
        assert_eq!(
            out.last().map(|r| (r.token, r.score)),
            Some((2, f32::NEG_INFINITY))
        );
        top_n_into(&row, 0, &mut out);
        assert!(out.is_empty());
        bottom_n_into(&row, 3, &mut out);
        let got: Vec<(u32, f32)> = out.iter().map(|r| (r.token, r.score)).collect();
        assert_eq!(got, vec![(4, -2.0), (8, 0.0), (0, 1.0)]);
        bottom_n_into(&row, 20, &mut out);
        assert_eq!(
            out.last().map(|r| (r.token, r.score)),
            Some((2, f32::INFINITY))
        );
    }

    #[test]
    fn header_round_trip_and_errors_name_the_file() {
        let h = DownMetaHeader {
            num_layers: 3,
            top_n: 2,
            vocab_size: 10,
            unembedding: Unembedding::Embeddings,
            final_norm_weighted: true,
            features: vec![4, 0, 5],
        };
        assert_eq!(h.data_offset(), 48);
        let mut bytes = h.to_bytes();
        bytes.resize(h.file_size(), 0);
        let p = Path::new("/v/down_meta.bin");
        assert_eq!(DownMetaHeader::parse(p, &bytes).unwrap(), h);
        assert_eq!(bytes.len(), 48 + 16 * 2 * 9);
        let e = DownMetaHeader::parse(p, &bytes[..bytes.len() - 8]).unwrap_err();
        assert!(e.to_string().contains("/v/down_meta.bin"), "{e}");
        assert!(e.to_string().contains("truncated"), "{e}");
        let e = DownMetaHeader::parse(p, &bytes[..20]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        let mut bad = bytes.clone();
        bad[0] = b'X';
        let e = DownMetaHeader::parse(p, &bad).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        let mut bad = bytes.clone();
        bad[16] = 11; // top_n 11 > vocab 10
        let e = DownMetaHeader::parse(p, &bad).unwrap_err();
        assert!(e.to_string().contains("top_n"), "{e}");
        let mut bad = bytes.clone();
        bad[28] = 2;
        let e = DownMetaHeader::parse(p, &bad).unwrap_err();
        assert!(e.to_string().contains("flags"), "{e}");
    }
}
