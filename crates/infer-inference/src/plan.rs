//! Format selection: which vindex tier each part of the model runs from, per the seed's
//! "Format Decision Flow" (attention Q4_K → Q8 → f32; FFN interleaved Q4_K → interleaved Q4_0
//! → walk FFN f32). The plan is an explicit value (printed by `--explain`), never a silent
//! fallback: asking for a tier the vindex lacks is an error.

use std::fmt;
use std::str::FromStr;

use infer_vindex::{Tier, Vindex};

use crate::layer::{AttnPath, FfnPath};
use crate::InferenceError;

/// Requested attention format (`--attn`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnChoice {
    /// Best available: Q4_K, then Q8, then f32.
    #[default]
    Auto,
    F32,
    Q8,
    Q4K,
}

/// Requested FFN format (`--ffn`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FfnChoice {
    /// Best available: interleaved Q4_K, then interleaved Q4_0, then walk FFN f32.
    #[default]
    Auto,
    Walk,
    Q4,
    Q4K,
}

/// Requested output-projection format (`--lm-head`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LmHeadChoice {
    /// When the FFN runs quantized: the q4k tier's Q6_K/Q8_0 output matrix, else the q4
    /// tier's Q4_0 one; otherwise the float tier.
    #[default]
    Auto,
    F32,
    Q6K,
    Q4,
}

/// Which output matrix the logits come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmHeadPath {
    /// The float tier (lm_head, or the embeddings when tied; in a vindex without a float tier,
    /// the tied embeddings as stored: quantized).
    Float,
    /// `lm_head_q6k.bin` of the q4k tier (Q6_K, or Q8_0 for rows not a multiple of 256).
    Q6K,
    /// `lm_head_q4.bin` of the q4 tier (Q4_0).
    Q4,
}

/// The user's requests.
#[derive(Clone, Copy, Debug, Default)]
pub struct FormatRequest {
    pub attn: AttnChoice,
    pub ffn: FfnChoice,
    pub lm_head: LmHeadChoice,
}

/// The resolved plan for the whole model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatPlan {
    pub attn: AttnPath,
    /// FFN path of dense layers (MoE layers always run their experts in f32).
    pub ffn: FfnPath,
    /// Which output matrix the logits come from.
    pub lm_head: LmHeadPath,
}

fn missing(what: &str, tier: Tier) -> InferenceError {
    InferenceError::Plan(format!(
        "{what} needs the '{tier}' tier, which this vindex does not have (rebuild with `infer extract --quant {tier}` or `--quant all`)"
    ))
}

impl FormatRequest {
    /// Resolve against the tiers a vindex has.
    pub fn resolve(&self, v: &Vindex) -> Result<FormatPlan, InferenceError> {
        let float = v.has_tier(Tier::F32) || v.has_tier(Tier::F16);
        let no_float = |what: &str| {
            InferenceError::Plan(format!(
                "{what} needs the float tier, which this vindex does not have (rebuild with `infer extract --float f16` or `--float f32`)"
            ))
        };
        let attn = match self.attn {
            AttnChoice::Auto if v.has_tier(Tier::Q4K) => AttnPath::Q4K,
            AttnChoice::Auto if v.has_tier(Tier::Q8) => AttnPath::Q8,
            AttnChoice::Auto | AttnChoice::F32 if !float => return Err(no_float("--attn f32")),
            AttnChoice::Auto | AttnChoice::F32 => AttnPath::F32,
            AttnChoice::Q8 if v.has_tier(Tier::Q8) => AttnPath::Q8,
            AttnChoice::Q8 => return Err(missing("--attn q8", Tier::Q8)),
            AttnChoice::Q4K if v.has_tier(Tier::Q4K) => AttnPath::Q4K,
            AttnChoice::Q4K => return Err(missing("--attn q4k", Tier::Q4K)),
        };
        let ffn = match self.ffn {
            FfnChoice::Auto if v.has_tier(Tier::Q4K) => FfnPath::Q4K,
            FfnChoice::Auto if v.has_tier(Tier::Q4) => FfnPath::Q4,
            // Without a float tier the walk reads the quantized tier's rows.
            FfnChoice::Auto | FfnChoice::Walk if !float => FfnPath::WalkQuantized,
            FfnChoice::Auto | FfnChoice::Walk => FfnPath::WalkF32,
            FfnChoice::Q4 if v.has_tier(Tier::Q4) => FfnPath::Q4,
            FfnChoice::Q4 => return Err(missing("--ffn q4", Tier::Q4)),
            FfnChoice::Q4K if v.has_tier(Tier::Q4K) => FfnPath::Q4K,
            FfnChoice::Q4K => return Err(missing("--ffn q4k", Tier::Q4K)),
        };
        let quantized_ffn = !matches!(ffn, FfnPath::WalkF32);
        // A tier without its output matrix: a vindex without a float tier whose embeddings
        // (stored quantized) are the tied output projection.
        let q6k = v.has_tier(Tier::Q4K) && v.has_lm_head_copy(Tier::Q4K);
        let q4 = v.has_tier(Tier::Q4) && v.has_lm_head_copy(Tier::Q4);
        let tied = v.lm_head().is_none();
        let tied_to_blocks = || {
            InferenceError::Plan(
                "this vindex has no float tier and ties its output projection to the quantized embeddings: leave --lm-head out".into(),
            )
        };
        let lm_head = match self.lm_head {
            LmHeadChoice::Auto if quantized_ffn && q6k => LmHeadPath::Q6K,
            LmHeadChoice::Auto if quantized_ffn && q4 => LmHeadPath::Q4,
            LmHeadChoice::Auto | LmHeadChoice::F32 if float || tied => LmHeadPath::Float,
            LmHeadChoice::Auto | LmHeadChoice::F32 => return Err(no_float("--lm-head f32")),
            LmHeadChoice::Q6K if q6k => LmHeadPath::Q6K,
            LmHeadChoice::Q6K if v.has_tier(Tier::Q4K) => return Err(tied_to_blocks()),
            LmHeadChoice::Q6K => return Err(missing("--lm-head q6k", Tier::Q4K)),
            LmHeadChoice::Q4 if q4 => LmHeadPath::Q4,
            LmHeadChoice::Q4 if v.has_tier(Tier::Q4) => return Err(tied_to_blocks()),
            LmHeadChoice::Q4 => return Err(missing("--lm-head q4", Tier::Q4)),
        };
        Ok(FormatPlan { attn, ffn, lm_head })
    }
}

macro_rules! parse_choice {
    ($ty:ty, $($name:literal => $val:expr),+) => {
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s.to_ascii_lowercase().as_str() {
                    $($name => Ok($val),)+
                    _ => Err(format!("unknown value '{s}' (expected one of: {})", [$($name),+].join(", "))),
                }
            }
        }
    };
}

parse_choice!(AttnChoice, "auto" => AttnChoice::Auto, "f32" => AttnChoice::F32, "q8" => AttnChoice::Q8, "q4k" => AttnChoice::Q4K);
parse_choice!(FfnChoice, "auto" => FfnChoice::Auto, "walk" => FfnChoice::Walk, "q4" => FfnChoice::Q4, "q4k" => FfnChoice::Q4K);
parse_choice!(LmHeadChoice, "auto" => LmHeadChoice::Auto, "f32" => LmHeadChoice::F32, "q6k" => LmHeadChoice::Q6K, "q4" => LmHeadChoice::Q4);

impl fmt::Display for FormatPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lm = match self.lm_head {
            LmHeadPath::Float => "float tier or tied embeddings",
            LmHeadPath::Q6K => "q4k tier (Q6_K/Q8_0)",
            LmHeadPath::Q4 => "q4 tier (Q4_0, or Q4_0x16 from extract --q4-x16)",
        };
        write!(f, "{}; {}; lm_head {lm}", self.attn, self.ffn)
    }
}
