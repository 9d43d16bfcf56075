//! The sparse walk FFN's knobs: how many features each layer keeps ([`WalkK`], `--walk-k`) and
//! where the candidate scores come from ([`Selection`], `--walk-select`).
//!
//! Spec grammar (`--walk-k`), issue 8:
//! - `all`: every feature (exact, the default);
//! - a fraction with a decimal point, `0.5`: `ceil(0.5 · intermediate)` features, in (0, 1];
//! - a positive integer, `512`: that many features (capped at the layer's intermediate size);
//! - a comma-separated per-layer list `0-9:all,10-29:0.5,31:256`: inclusive layer ranges or
//!   single layers, each with one of the values above; an entry without `LAYERS:` covers every
//!   layer. Later entries override earlier ones; layers no entry covers keep every feature.

use std::fmt;
use std::str::FromStr;

/// How many features one layer keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KValue {
    /// Every feature (exact).
    All,
    /// `ceil(f · intermediate)` features, `f` in (0, 1].
    Fraction(f64),
    /// An absolute number of features (≥ 1), capped at the intermediate size.
    Count(usize),
}

impl KValue {
    /// Features kept out of `intermediate` (in `1..=intermediate`; 0 only when
    /// `intermediate` is 0).
    pub fn resolve(self, intermediate: usize) -> usize {
        let k = match self {
            KValue::All => intermediate,
            KValue::Fraction(f) => (f * intermediate as f64).ceil() as usize,
            KValue::Count(n) => n,
        };
        k.clamp(intermediate.min(1), intermediate)
    }

    fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(KValue::All);
        }
        if s.contains(['.', 'e', 'E']) {
            let f: f64 = s
                .parse()
                .map_err(|_| format!("'{s}' is not a number (expected all, a fraction such as 0.5, or a feature count such as 512)"))?;
            if !(f > 0.0 && f <= 1.0) {
                return Err(format!(
                    "fraction {s} is not in (0, 1] (use an integer for an absolute feature count)"
                ));
            }
            return Ok(KValue::Fraction(f));
        }
        let n: usize = s.parse().map_err(|_| {
            format!("'{s}' is not a number (expected all, a fraction such as 0.5, or a feature count such as 512)")
        })?;
        if n == 0 {
            return Err("a feature count of 0 keeps nothing (use at least 1)".into());
        }
        Ok(KValue::Count(n))
    }
}

impl fmt::Display for KValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KValue::All => f.write_str("all"),
            KValue::Fraction(x) => write!(f, "{x}"),
            KValue::Count(n) => write!(f, "{n}"),
        }
    }
}

/// Layers an entry covers: every layer, or an inclusive range `first..=last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layers {
    Every,
    Range(usize, usize),
}

impl Layers {
    fn contains(self, l: usize) -> bool {
        match self {
            Layers::Every => true,
            Layers::Range(a, b) => (a..=b).contains(&l),
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        let num = |p: &str| {
            p.trim()
                .parse::<usize>()
                .map_err(|_| format!("'{}' is not a layer number", p.trim()))
        };
        match s.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("layer range {a}-{b} is out of order"));
                }
                Ok(Layers::Range(a, b))
            }
            None => {
                let a = num(s)?;
                Ok(Layers::Range(a, a))
            }
        }
    }
}

/// Features kept per layer by the walk FFN (`--walk-k`). The default keeps every feature.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WalkK {
    /// In the order given; the last entry covering a layer wins.
    entries: Vec<(Layers, KValue)>,
}

impl WalkK {
    /// Every feature in every layer (exact).
    pub fn all() -> Self {
        Self::default()
    }

    /// Parse a spec (grammar in the module docs). Errors name the offending part: a bad number,
    /// a fraction outside (0, 1], a count of 0, a layer range out of order, an empty entry.
    /// Layers beyond the model are checked by [`WalkK::check_layers`] once the model is known.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err("empty --walk-k spec (expected all, 0.5, 512 or 0-9:all,10-29:0.5)".into());
        }
        let mut entries = Vec::new();
        for part in spec.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("--walk-k '{spec}': empty entry"));
            }
            let entry = match part.split_once(':') {
                Some((layers, k)) => (Layers::parse(layers), KValue::parse(k)),
                None => (Ok(Layers::Every), KValue::parse(part)),
            };
            match entry {
                (Ok(l), Ok(k)) => entries.push((l, k)),
                (Err(e), _) | (_, Err(e)) => return Err(format!("--walk-k '{spec}': {e}")),
            }
        }
        Ok(WalkK { entries })
    }

    /// The value that applies to layer `layer`.
    pub fn value_for_layer(&self, layer: usize) -> KValue {
        self.entries
            .iter()
            .rev()
            .find(|(l, _)| l.contains(layer))
            .map_or(KValue::All, |&(_, k)| k)
    }

    /// Features layer `layer` keeps out of `intermediate` (`intermediate` means exact).
    pub fn k_for_layer(&self, layer: usize, intermediate: usize) -> usize {
        self.value_for_layer(layer).resolve(intermediate)
    }

    /// Whether every layer keeps every feature, whatever its size.
    pub fn is_all(&self) -> bool {
        self.entries.iter().all(|(_, k)| *k == KValue::All)
    }

    /// Error when an entry names a layer at or beyond `num_layers`.
    pub fn check_layers(&self, num_layers: usize) -> Result<(), String> {
        for (l, _) in &self.entries {
            if let Layers::Range(a, b) = *l {
                if b >= num_layers {
                    let what = if a == b {
                        format!("layer {a}")
                    } else {
                        format!("layer range {a}-{b}")
                    };
                    return Err(format!(
                        "--walk-k: {what} is beyond the model's {num_layers} layers (0-{})",
                        num_layers.saturating_sub(1)
                    ));
                }
            }
        }
        Ok(())
    }
}

impl FromStr for WalkK {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        WalkK::parse(s)
    }
}

impl fmt::Display for WalkK {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("all");
        }
        for (i, (l, k)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match l {
                Layers::Every => write!(f, "{k}")?,
                Layers::Range(a, b) if a == b => write!(f, "{a}:{k}")?,
                Layers::Range(a, b) => write!(f, "{a}-{b}:{k}")?,
            }
        }
        Ok(())
    }
}

/// Where the sparse walk FFN's candidate scores |gᵢ·x| come from (`--walk-select`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Selection {
    /// The float-tier gate rows (the full gate mat-vec; its values are reused exactly).
    #[default]
    F32,
    /// The Q4_0 gate copy `gate_vectors_q4.bin` (`quant_matvec`, activations quantized to
    /// Q8_0); the selected features' gate values are then recomputed from the float rows.
    Q4,
}

impl FromStr for Selection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Selection::F32),
            "q4" => Ok(Selection::Q4),
            _ => Err(format!("unknown value '{s}' (expected one of: f32, q4)")),
        }
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Selection::F32 => "float-tier gate",
            Selection::Q4 => "Q4_0 gate copy",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_values() {
        assert!(WalkK::parse("all").unwrap().is_all());
        assert_eq!(WalkK::parse("ALL").unwrap().k_for_layer(3, 1536), 1536);
        let half = WalkK::parse("0.5").unwrap();
        assert_eq!(half.k_for_layer(0, 1536), 768);
        assert_eq!(half.k_for_layer(0, 3), 2); // ceil
        assert_eq!(WalkK::parse("1.0").unwrap().k_for_layer(0, 1536), 1536);
        assert_eq!(WalkK::parse("0.1").unwrap().k_for_layer(7, 2048), 205);
        assert_eq!(WalkK::parse("512").unwrap().k_for_layer(0, 1536), 512);
        assert_eq!(WalkK::parse("4096").unwrap().k_for_layer(0, 1536), 1536);
        assert_eq!(WalkK::parse("1").unwrap().k_for_layer(0, 1536), 1);
        assert_eq!(WalkK::parse("1e-3").unwrap().k_for_layer(0, 1536), 2);
        assert!(!WalkK::parse("0.75").unwrap().is_all());
        assert_eq!(WalkK::all().k_for_layer(100, 64), 64);
    }

    #[test]
    fn per_layer_spec() {
        let k = WalkK::parse("0-9:all, 10-29:0.5,12:256").unwrap();
        assert_eq!(k.k_for_layer(0, 1000), 1000);
        assert_eq!(k.k_for_layer(9, 1000), 1000);
        assert_eq!(k.k_for_layer(10, 1000), 500);
        assert_eq!(k.k_for_layer(12, 1000), 256);
        assert_eq!(k.k_for_layer(29, 1000), 500);
        // Not covered: exact.
        assert_eq!(k.k_for_layer(30, 1000), 1000);
        // Later entries override earlier ones, including a whole-model entry.
        let k = WalkK::parse("3:0.25,0.5").unwrap();
        assert_eq!(k.k_for_layer(3, 100), 50);
        let k = WalkK::parse("0.5,3:0.25").unwrap();
        assert_eq!(k.k_for_layer(3, 100), 25);
        assert_eq!(k.k_for_layer(4, 100), 50);
        assert_eq!(k.to_string(), "0.5,3:0.25");
        assert_eq!(
            WalkK::parse("0-9:all,10-29:0.5").unwrap().to_string(),
            "0-9:all,10-29:0.5"
        );
        assert!(WalkK::parse("0-9:all").unwrap().is_all());
    }

    #[test]
    fn layer_bounds() {
        let k = WalkK::parse("0-29:0.5").unwrap();
        assert!(k.check_layers(30).is_ok());
        let e = k.check_layers(18).unwrap_err();
        assert!(e.contains("0-29") && e.contains("18 layers"), "{e}");
        let e = WalkK::parse("30:0.5")
            .unwrap()
            .check_layers(30)
            .unwrap_err();
        assert!(e.contains("layer 30"), "{e}");
        assert!(WalkK::parse("0.5").unwrap().check_layers(1).is_ok());
    }

    #[test]
    fn errors() {
        let cases = [
            ("", "empty"),
            ("abc", "not a number"),
            ("0.0", "not in (0, 1]"),
            ("1.5", "not in (0, 1]"),
            ("-0.5", "not in (0, 1]"),
            ("0", "count of 0"),
            ("9-3:0.5", "out of order"),
            ("x:0.5", "not a layer number"),
            ("1-:0.5", "not a layer number"),
            ("0-3:", "not a number"),
            ("0.5,,all", "empty entry"),
            ("nan", "not a number"),
        ];
        for (spec, want) in cases {
            let e = WalkK::parse(spec).expect_err(spec);
            assert!(
                e.contains(want),
                "spec '{spec}': error '{e}' lacks '{want}'"
            );
        }
    }

    #[test]
    fn selection() {
        assert_eq!("f32".parse::<Selection>(), Ok(Selection::F32));
        assert_eq!("Q4".parse::<Selection>(), Ok(Selection::Q4));
        assert!("q8".parse::<Selection>().unwrap_err().contains("f32, q4"));
    }
}
