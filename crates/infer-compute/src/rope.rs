//! Rotary position embeddings (RoPE): inverse frequencies (and YaRN's cos/sin factor) as HF
//! transformers' `ROPE_INIT_FUNCTIONS` compute them, and the rotation in the `rotate_half` (GPT-NeoX/Llama)
//! or interleaved (GPT-J) pairing, optionally on only the first `rotary_dim` dims of each head.

use crate::scratch;
use std::cell::Cell;

/// Frequency scaling of a RoPE (HF `rope_scaling` / `rope_parameters`). infer-inference
/// converts the model config's own type into this one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// `rope_type = "default"`: `inv_freq[i] = base^(−2i/rotary_dim)`.
    None,
    /// `rope_type = "linear"`: default frequencies divided by `factor`
    /// (`_compute_linear_scaling_rope_parameters`).
    Linear { factor: f64 },
    /// `rope_type = "llama3"` (`_compute_llama3_parameters`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// `rope_type = "yarn"` (`_compute_yarn_parameters`, transformers 5): see
    /// [`RopeConfig::inv_freq`]; cos and sin are multiplied by `attention_factor`.
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        original_max_position_embeddings: usize,
        attention_factor: f64,
        /// Floor/ceil the correction range (HF `truncate`).
        truncate: bool,
    },
}

/// Geometry of one layer's RoPE.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// Values per attention head.
    pub head_dim: usize,
    /// Leading dims of each head that are rotated (`head_dim · partial_rotary_factor`); even,
    /// ≤ `head_dim`. The rest pass through unchanged.
    pub rotary_dim: usize,
    /// `rope_theta`.
    pub base: f64,
    /// Frequency scaling.
    pub scaling: RopeScaling,
    /// `false`: HF `rotate_half`, dim `i` pairs with `i + rotary_dim/2`.
    /// `true`: GPT-J style, dim `2i` pairs with `2i + 1`.
    pub interleaved: bool,
}

impl RopeConfig {
    /// Inverse frequencies, `rotary_dim / 2` values (radians per position), in f64.
    ///
    /// Default: `1 / base^(2i / rotary_dim)` (HF `_compute_default_rope_parameters`, whose
    /// `dim` is `head_dim · partial_rotary_factor`). Linear: divided by `factor`. Llama3:
    /// with `wavelen = 2π / inv_freq`, `low = orig / low_freq_factor`,
    /// `high = orig / high_freq_factor`: `wavelen > low` → `inv_freq / factor`;
    /// `wavelen < high` → unchanged; otherwise, with
    /// `s = (orig / wavelen − low_freq_factor) / (high_freq_factor − low_freq_factor)`,
    /// `(1 − s) · inv_freq / factor + s · inv_freq`. YaRN: with
    /// `d(r) = rotary_dim · ln(orig / (2π·r)) / (2 ln base)`, `low = d(beta_fast)`,
    /// `high = d(beta_slow)` (floored/ceiled when `truncate`), clamped to `[0, rotary_dim − 1]`
    /// (`high += 0.001` when equal), and the ramp `r_i = clamp((i − low) / (high − low), 0, 1)`:
    /// `inv_freq / factor · r_i + inv_freq · (1 − r_i)`.
    ///
    /// Panics if `rotary_dim` is odd or larger than `head_dim`.
    pub fn inv_freq(&self) -> Vec<f64> {
        let mut out = Vec::new();
        self.inv_freq_into(&mut out);
        out
    }

    /// [`RopeConfig::inv_freq`] into `out` (cleared first; no allocation when its capacity
    /// suffices).
    fn inv_freq_into(&self, out: &mut Vec<f64>) {
        self.check();
        out.clear();
        let dim = self.rotary_dim as f64;
        let default = (0..self.rotary_dim / 2).map(|i| 1.0 / self.base.powf((2 * i) as f64 / dim));
        match self.scaling {
            RopeScaling::None => out.extend(default),
            RopeScaling::Linear { factor } => out.extend(default.map(|f| f / factor)),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = original_max_position_embeddings as f64;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                out.extend(default.map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen > low_wavelen {
                        f / factor
                    } else if wavelen < high_wavelen {
                        f
                    } else {
                        let s = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - s) * f / factor + s * f
                    }
                }))
            }
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                truncate,
                ..
            } => {
                let orig = original_max_position_embeddings as f64;
                let correction_dim = |rotations: f64| {
                    dim * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * self.base.ln())
                };
                let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                if truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(dim - 1.0);
                if low == high {
                    high += 0.001; // HF: prevent a zero-width ramp
                }
                out.extend(default.enumerate().map(|(i, f)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    f / factor * (1.0 - extrapolation) + f * extrapolation
                }))
            }
        }
    }

    /// Multiplier of cos and sin: YaRN's `attention_factor`, 1 for the other scalings.
    pub fn attention_factor(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    fn check(&self) {
        assert!(
            self.rotary_dim.is_multiple_of(2) && self.rotary_dim <= self.head_dim,
            "RoPE: rotary_dim {} must be even and <= head_dim {}",
            self.rotary_dim,
            self.head_dim
        );
    }
}

/// A RoPE with its inverse frequencies and a cos/sin table for positions `0..max_positions`
/// (angles `pos · inv_freq` in f64, cos/sin rounded to f32). Positions beyond the table are
/// computed on the fly with the same formula, so results never depend on the table size.
#[derive(Clone, Debug)]
pub struct Rope {
    cfg: RopeConfig,
    inv_freq: Vec<f64>,
    /// `[max_positions, rotary_dim/2]` cosines then sines.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// Precompute the tables for positions `0..max_positions`. Panics on an invalid config
    /// (see [`RopeConfig::inv_freq`]).
    pub fn new(cfg: RopeConfig, max_positions: usize) -> Self {
        let inv_freq = cfg.inv_freq();
        let half = inv_freq.len();
        let mut cos = vec![0f32; max_positions * half];
        let mut sin = vec![0f32; max_positions * half];
        if half > 0 {
            for (pos, (c, s)) in cos
                .chunks_exact_mut(half)
                .zip(sin.chunks_exact_mut(half))
                .enumerate()
            {
                fill_cos_sin(&inv_freq, cfg.attention_factor(), pos, c, s);
            }
        }
        Rope {
            cfg,
            inv_freq,
            cos,
            sin,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.cfg
    }

    /// Rotate `x`, a row-major `[positions.len(), n_heads · head_dim]` buffer, in place; row
    /// `t` is at absolute position `positions[t]`. Panics if `x.len()` disagrees. Allocates
    /// nothing once this thread's cos/sin buffer has grown (positions beyond the table).
    pub fn apply(&self, x: &mut [f32], n_heads: usize, positions: &[usize]) {
        rotate_rows(
            &self.cfg,
            &self.inv_freq,
            CosSin::Table(&self.cos, &self.sin),
            x,
            n_heads,
            positions,
        );
    }
}

/// How many RoPE configurations [`apply_rope`] keeps the inverse frequencies of, per thread
/// (models alternate at most a few, e.g. Gemma-3's local and global layers).
const CACHED_CONFIGS: usize = 4;

/// Positions whose cos/sin [`apply_rope`] keeps per configuration and thread, direct-mapped by
/// position: a decode step rotates the same positions in every layer (queries and keys), and
/// recomputing their f64 sin/cos was ~1% of a 16-sequence SmolLM2 step on one thread.
const MEMO_SLOTS: usize = 128;

/// A configuration's inverse frequencies and its memo of [`MEMO_SLOTS`] positions: `pos[k]`
/// (`usize::MAX`: empty) and its cos then sin at `cs[2·half·k ..]`.
struct Cached {
    cfg: RopeConfig,
    inv_freq: Vec<f64>,
    pos: Vec<usize>,
    cs: Vec<f32>,
}

thread_local! {
    /// Inverse frequencies and cos/sin memos of recently used configurations ([`apply_rope`]).
    static INV_FREQ: Cell<Vec<Cached>> = const { Cell::new(Vec::new()) };
    /// cos then sin of one position, for positions outside a table.
    static COS_SIN: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Rotate a `[T, n_heads · head_dim]` buffer in place (see [`Rope::apply`]) without a cached
/// table: the cos/sin of each position are computed on the fly (same formula and bits as
/// [`Rope`]). The inverse frequencies of the last few configurations are kept per thread, so
/// after warm-up a call allocates nothing. Panics on an invalid config (see
/// [`RopeConfig::inv_freq`]) or a length mismatch.
pub fn apply_rope(x: &mut [f32], n_heads: usize, positions: &[usize], cfg: &RopeConfig) {
    cfg.check();
    let mut cache = INV_FREQ.take();
    let i = match cache.iter().position(|c| c.cfg == *cfg) {
        Some(i) => i,
        None => {
            if cache.len() < CACHED_CONFIGS {
                cache.push(Cached {
                    cfg: *cfg,
                    inv_freq: Vec::new(),
                    pos: Vec::new(),
                    cs: Vec::new(),
                });
            }
            let i = cache.len() - 1;
            let c = &mut cache[i];
            c.cfg = *cfg;
            cfg.inv_freq_into(&mut c.inv_freq);
            c.pos.clear();
            c.pos.resize(MEMO_SLOTS, usize::MAX);
            c.cs.resize(MEMO_SLOTS * 2 * c.inv_freq.len(), 0.0);
            i
        }
    };
    let c = &mut cache[i];
    let memo = CosSin::Memo(&mut c.pos[..], &mut c.cs[..]);
    rotate_rows(cfg, &c.inv_freq, memo, x, n_heads, positions);
    INV_FREQ.set(cache);
}

/// Where [`rotate_rows`] finds the cos/sin of a position.
enum CosSin<'a> {
    /// `cos`/`sin` tables `[positions, half]`; positions past them computed into a per-thread
    /// buffer.
    Table(&'a [f32], &'a [f32]),
    /// A memo of recent positions (see [`Cached`]: slots, then cos/sin per slot).
    Memo(&'a mut [usize], &'a mut [f32]),
}

/// The rotation of [`Rope::apply`] and [`apply_rope`], cos/sin from `src` or computed from
/// `inv_freq`.
fn rotate_rows(
    cfg: &RopeConfig,
    inv_freq: &[f64],
    mut src: CosSin<'_>,
    x: &mut [f32],
    n_heads: usize,
    positions: &[usize],
) {
    let hd = cfg.head_dim;
    let row = n_heads * hd;
    assert_eq!(
        x.len(),
        positions.len() * row,
        "apply_rope: x has {} values, want positions({}) * n_heads({n_heads}) * head_dim({hd})",
        x.len(),
        positions.len()
    );
    let half = inv_freq.len();
    if half == 0 || row == 0 {
        return;
    }
    scratch::with(&COS_SIN, 2 * half, |buf| {
        let (cbuf, sbuf) = buf.split_at_mut(half);
        for (xr, &pos) in x.chunks_exact_mut(row).zip(positions) {
            let (c, s) = match &mut src {
                CosSin::Table(cos, sin) if (pos + 1) * half <= cos.len() => {
                    let r = pos * half..(pos + 1) * half;
                    (&cos[r.clone()], &sin[r])
                }
                CosSin::Memo(slots, cs) => {
                    let k = pos % MEMO_SLOTS;
                    let (mc, ms) = cs[2 * half * k..2 * half * (k + 1)].split_at_mut(half);
                    if slots[k] != pos {
                        fill_cos_sin(inv_freq, cfg.attention_factor(), pos, mc, ms);
                        slots[k] = pos;
                    }
                    (&mc[..], &ms[..])
                }
                CosSin::Table(..) => {
                    fill_cos_sin(inv_freq, cfg.attention_factor(), pos, cbuf, sbuf);
                    (&cbuf[..], &sbuf[..])
                }
            };
            for head in xr.chunks_exact_mut(hd) {
                rotate(&mut head[..2 * half], c, s, cfg.interleaved);
            }
        }
    });
}

/// cos and sin of `pos · inv_freq[i]`, times `mscale` (YaRN's attention factor; HF multiplies
/// the cos/sin tables by it).
fn fill_cos_sin(inv_freq: &[f64], mscale: f64, pos: usize, c: &mut [f32], s: &mut [f32]) {
    for ((ci, si), &f) in c.iter_mut().zip(s.iter_mut()).zip(inv_freq) {
        let angle = pos as f64 * f;
        *ci = (angle.cos() * mscale) as f32;
        *si = (angle.sin() * mscale) as f32;
    }
}

/// Rotate the `2·half` leading dims of one head: `x·cos + rotate(x)·sin` in f32.
fn rotate(x: &mut [f32], c: &[f32], s: &[f32], interleaved: bool) {
    let half = c.len();
    if interleaved {
        for (i, (&ci, &si)) in c.iter().zip(s).enumerate() {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * ci - b * si;
            x[2 * i + 1] = b * ci + a * si;
        }
    } else {
        let (lo, hi) = x.split_at_mut(half);
        for (((a, b), &ci), &si) in lo.iter_mut().zip(hi.iter_mut()).zip(c).zip(s) {
            let (x1, x2) = (*a, *b);
            *a = x1 * ci - x2 * si;
            *b = x2 * ci + x1 * si;
        }
    }
}
