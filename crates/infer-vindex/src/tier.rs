//! Storage tiers of a vindex ([`Tier`]) and the choice of quantized tiers to build
//! ([`QuantTiers`], `infer extract --quant`).

use crate::files;

/// One storage tier. `index.json`'s `tiers` lists the names ([`Tier::name`]) of those present.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// f32 float tier (embeddings, norms, feature-major FFN, attention, lm_head).
    F32,
    /// f16 float tier (as F32, matrices in f16).
    F16,
    /// [`files::ATTN_Q4K_BIN`] + [`files::INTERLEAVED_Q4K_BIN`] + [`files::LM_HEAD_Q6K_BIN`]
    /// (Q4_K/Q6_K, Q5_0/Q8_0 fallbacks).
    Q4K,
    /// [`files::ATTN_Q8_BIN`] + [`files::ATTN_Q8_SCALES_BIN`] (int8 + f32 scale per 32 values).
    Q8,
    /// [`files::INTERLEAVED_Q4_BIN`] + [`files::GATE_Q4_BIN`] + [`files::LM_HEAD_Q4_BIN`] (Q4_0).
    Q4,
}

impl Tier {
    /// Every tier, float tiers first.
    pub const ALL: [Tier; 5] = [Tier::F32, Tier::F16, Tier::Q4K, Tier::Q8, Tier::Q4];

    /// Name in `index.json`: `f32`, `f16`, `q4k`, `q8`, `q4`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::F32 => "f32",
            Tier::F16 => "f16",
            Tier::Q4K => "q4k",
            Tier::Q8 => "q8",
            Tier::Q4 => "q4",
        }
    }

    /// The tier of a name, `None` for an unknown one.
    pub fn from_name(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Data files a quantized tier always has (empty for the float tiers, whose files are
    /// checked separately). The loader refuses a vindex that lists the tier without them. The
    /// tiers' output matrices ([`files::LM_HEAD_Q6K_BIN`], [`files::LM_HEAD_Q4_BIN`]) and the
    /// Q4_0 gate copy ([`files::GATE_Q4_BIN`]) are optional: a vindex without a float tier
    /// has no copy of tied embeddings (the output projection is the quantized embedding table)
    /// and no gate copy (the gate copy selects features of the float tier's sparse walk).
    pub fn required_files(self) -> &'static [&'static str] {
        match self {
            Tier::F32 | Tier::F16 => &[],
            Tier::Q4K => &[files::ATTN_Q4K_BIN, files::INTERLEAVED_Q4K_BIN],
            Tier::Q8 => &[files::ATTN_Q8_BIN, files::ATTN_Q8_SCALES_BIN],
            Tier::Q4 => &[files::INTERLEAVED_Q4_BIN],
        }
    }

    /// Every data file the tier may write (its required files and its optional output matrix
    /// and gate copy).
    pub fn files(self) -> &'static [&'static str] {
        match self {
            Tier::F32 | Tier::F16 => &[],
            Tier::Q4K => &[
                files::ATTN_Q4K_BIN,
                files::INTERLEAVED_Q4K_BIN,
                files::LM_HEAD_Q6K_BIN,
            ],
            Tier::Q8 => &[files::ATTN_Q8_BIN, files::ATTN_Q8_SCALES_BIN],
            Tier::Q4 => &[
                files::INTERLEAVED_Q4_BIN,
                files::GATE_Q4_BIN,
                files::LM_HEAD_Q4_BIN,
            ],
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which quantized tiers a build writes (besides the float tier, unless
/// [`crate::BuildOptions::float_tier`] is false).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantTiers {
    pub q4k: bool,
    pub q8: bool,
    pub q4: bool,
}

impl QuantTiers {
    /// No quantized tier (the library default: float tier only).
    pub const NONE: QuantTiers = QuantTiers {
        q4k: false,
        q8: false,
        q4: false,
    };
    /// Every quantized tier.
    pub const ALL: QuantTiers = QuantTiers {
        q4k: true,
        q8: true,
        q4: true,
    };
    /// Q4_K tiers only: the seed's preferred format (the CLI default).
    pub const Q4K: QuantTiers = QuantTiers {
        q4k: true,
        q8: false,
        q4: false,
    };

    /// True when no quantized tier is selected.
    pub fn is_none(self) -> bool {
        !(self.q4k || self.q8 || self.q4)
    }

    /// The selected tiers, in [`Tier::ALL`] order.
    pub fn tiers(self) -> Vec<Tier> {
        let mut v = Vec::new();
        if self.q4k {
            v.push(Tier::Q4K);
        }
        if self.q8 {
            v.push(Tier::Q8);
        }
        if self.q4 {
            v.push(Tier::Q4);
        }
        v
    }
}

impl std::str::FromStr for QuantTiers {
    type Err = String;
    /// `none`, `all`, or a comma-separated list of `q4k`, `q8`, `q4`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut t = QuantTiers::NONE;
        for part in s.split(',').map(|p| p.trim().to_ascii_lowercase()) {
            match part.as_str() {
                "none" => {}
                "all" => t = QuantTiers::ALL,
                "q4k" => t.q4k = true,
                "q8" => t.q8 = true,
                "q4" => t.q4 = true,
                other => {
                    return Err(format!(
                        "unknown quantized tier '{other}' (expected q4k, q8, q4, all or none)"
                    ))
                }
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_names() {
        assert_eq!("all".parse::<QuantTiers>().unwrap(), QuantTiers::ALL);
        assert_eq!("none".parse::<QuantTiers>().unwrap(), QuantTiers::NONE);
        let t: QuantTiers = "q4k,q8".parse().unwrap();
        assert_eq!(t.tiers(), vec![Tier::Q4K, Tier::Q8]);
        assert!("q5".parse::<QuantTiers>().is_err());
        for t in Tier::ALL {
            assert_eq!(Tier::from_name(t.name()), Some(t));
        }
        assert_eq!(Tier::from_name("q4_k"), None);
    }
}
