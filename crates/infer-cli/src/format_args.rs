//! `--attn`, `--ffn`, `--lm-head`: which vindex tier each part of the model runs from.

use clap::Args;
use infer_inference::{AttnChoice, FfnChoice, FormatRequest, LmHeadChoice};

/// Format overrides shared by every command that runs the model.
#[derive(Args, Clone, Debug)]
pub struct FormatArgs {
    /// Attention weights: auto (Q4_K → Q8 → f32, best available), f32, q8, q4k.
    #[arg(long = "attn", default_value = "auto", value_parser = clap::value_parser!(AttnChoice))]
    pub attn: AttnChoice,
    /// FFN weights: auto (Q4_K → Q4_0 → walk FFN f32), walk, q4, q4k.
    #[arg(long = "ffn", default_value = "auto", value_parser = clap::value_parser!(FfnChoice))]
    pub ffn: FfnChoice,
    /// Output projection: auto (with a quantized FFN: q4k tier's Q6_K, else q4 tier's Q4_0), f32, q6k, q4.
    #[arg(long = "lm-head", default_value = "auto", value_parser = clap::value_parser!(LmHeadChoice))]
    pub lm_head: LmHeadChoice,
}

impl FormatArgs {
    pub fn request(&self) -> FormatRequest {
        FormatRequest {
            attn: self.attn,
            ffn: self.ffn,
            lm_head: self.lm_head,
        }
    }
}
