//! `--attn`, `--ffn`, `--lm-head`: which vindex tier each part of the model runs from; and
//! `--walk-k`, `--walk-select`: the sparse walk FFN (issue 8).

use clap::Args;
use infer_inference::{AttnChoice, FfnChoice, FormatRequest, LmHeadChoice, Selection, WalkK};

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
    /// Walk FFN features kept per token and layer, by |gate·x|: all (exact), a fraction (0.5),
    /// a count (512), or per layer (0-9:all,10-29:0.5; later entries win, others all). Anything
    /// but all needs --ffn walk.
    #[arg(long = "walk-k", default_value = "all", value_parser = clap::value_parser!(WalkK))]
    pub walk_k: WalkK,
    /// Where the sparse walk scores its candidates: f32 (the float gate rows) or q4 (the Q4_0
    /// copy gate_vectors_q4.bin of the q4 tier; gate values then recomputed exactly).
    #[arg(long = "walk-select", default_value = "f32", value_parser = clap::value_parser!(Selection))]
    pub walk_select: Selection,
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
