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
    /// Q4_0 when the vindex has it and the FFN runs quantized; otherwise f32.
    #[default]
    Auto,
    F32,
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
    /// Output projection from the Q4_0 tier (`true`) or the float tier.
    pub lm_head_q4: bool,
}

fn missing(what: &str, tier: Tier) -> InferenceError {
    InferenceError::Plan(format!(
        "{what} needs the '{tier}' tier, which this vindex does not have (rebuild with `infer extract --quant {tier}` or `--quant all`)"
    ))
}

impl FormatRequest {
    /// Resolve against the tiers a vindex has.
    pub fn resolve(&self, v: &Vindex) -> Result<FormatPlan, InferenceError> {
        let attn = match self.attn {
            AttnChoice::Auto if v.has_tier(Tier::Q4K) => AttnPath::Q4K,
            AttnChoice::Auto if v.has_tier(Tier::Q8) => AttnPath::Q8,
            AttnChoice::Auto | AttnChoice::F32 => AttnPath::F32,
            AttnChoice::Q8 if v.has_tier(Tier::Q8) => AttnPath::Q8,
            AttnChoice::Q8 => return Err(missing("--attn q8", Tier::Q8)),
            AttnChoice::Q4K if v.has_tier(Tier::Q4K) => AttnPath::Q4K,
            AttnChoice::Q4K => return Err(missing("--attn q4k", Tier::Q4K)),
        };
        let ffn = match self.ffn {
            FfnChoice::Auto if v.has_tier(Tier::Q4K) => FfnPath::Q4K,
            FfnChoice::Auto if v.has_tier(Tier::Q4) => FfnPath::Q4,
            FfnChoice::Auto | FfnChoice::Walk => FfnPath::WalkF32,
            FfnChoice::Q4 if v.has_tier(Tier::Q4) => FfnPath::Q4,
            FfnChoice::Q4 => return Err(missing("--ffn q4", Tier::Q4)),
            FfnChoice::Q4K if v.has_tier(Tier::Q4K) => FfnPath::Q4K,
            FfnChoice::Q4K => return Err(missing("--ffn q4k", Tier::Q4K)),
        };
        let lm_head_q4 = match self.lm_head {
            LmHeadChoice::Auto => v.has_tier(Tier::Q4) && ffn != FfnPath::WalkF32,
            LmHeadChoice::F32 => false,
            LmHeadChoice::Q4 if v.has_tier(Tier::Q4) => true,
            LmHeadChoice::Q4 => return Err(missing("--lm-head q4", Tier::Q4)),
        };
        Ok(FormatPlan {
            attn,
            ffn,
            lm_head_q4,
        })
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
parse_choice!(LmHeadChoice, "auto" => LmHeadChoice::Auto, "f32" => LmHeadChoice::F32, "q4" => LmHeadChoice::Q4);

impl fmt::Display for FormatPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; {}; lm_head {}",
            self.attn,
            self.ffn,
            if self.lm_head_q4 {
                "Q4_0"
            } else {
                "float tier"
            }
        )
    }
}
