//! The one table of block formats (ggml's, from `ggml/src/ggml.c` `type_traits`).

use crate::QuantError;

/// A tensor storage format: plain floats or one of ggml's block-quantized formats.
///
/// Block layouts are exactly ggml's, so bytes written by infer run in llama.cpp and vice versa.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuantFormat {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    /// Q4_0 blocks re-laid sixteen rows at a time for the CPU's int8 kernels (infer's own, no
    /// ggml type id; layout in [`crate::interleave`]).
    Q4_0x16,
}

/// One row of the format table.
struct FormatInfo {
    format: QuantFormat,
    name: &'static str,
    /// ggml `enum ggml_type` value; `None` for infer's own layouts (never in a GGUF).
    ggml_type_id: Option<u32>,
    block_elems: usize,
    block_bytes: usize,
    /// ggml's `vec_dot_type`: the format activations are quantized to for this format's dot
    /// product (`None`: float formats and the activation-only formats).
    vec_dot_type: Option<QuantFormat>,
    /// `Some((row format, rows))`: the blocks of `row format`, the same bytes, re-laid `rows`
    /// rows at a time ([`crate::interleave`]); `None`: rows one after another (ggml's layout).
    interleaved: Option<(QuantFormat, usize)>,
}

const TABLE: &[FormatInfo] = &[
    FormatInfo {
        format: QuantFormat::F32,
        name: "F32",
        ggml_type_id: Some(0),
        block_elems: 1,
        block_bytes: 4,
        vec_dot_type: None,
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::F16,
        name: "F16",
        ggml_type_id: Some(1),
        block_elems: 1,
        block_bytes: 2,
        vec_dot_type: None,
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q4_0,
        name: "Q4_0",
        ggml_type_id: Some(2),
        block_elems: 32,
        block_bytes: 18,
        vec_dot_type: Some(QuantFormat::Q8_0),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q4_1,
        name: "Q4_1",
        ggml_type_id: Some(3),
        block_elems: 32,
        block_bytes: 20,
        vec_dot_type: Some(QuantFormat::Q8_1),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q5_0,
        name: "Q5_0",
        ggml_type_id: Some(6),
        block_elems: 32,
        block_bytes: 22,
        vec_dot_type: Some(QuantFormat::Q8_0),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q5_1,
        name: "Q5_1",
        ggml_type_id: Some(7),
        block_elems: 32,
        block_bytes: 24,
        vec_dot_type: Some(QuantFormat::Q8_1),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q8_0,
        name: "Q8_0",
        ggml_type_id: Some(8),
        block_elems: 32,
        block_bytes: 34,
        vec_dot_type: Some(QuantFormat::Q8_0),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q8_1,
        name: "Q8_1",
        ggml_type_id: Some(9),
        block_elems: 32,
        block_bytes: 36,
        vec_dot_type: None,
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q2_K,
        name: "Q2_K",
        ggml_type_id: Some(10),
        block_elems: 256,
        block_bytes: 84,
        vec_dot_type: Some(QuantFormat::Q8_K),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q3_K,
        name: "Q3_K",
        ggml_type_id: Some(11),
        block_elems: 256,
        block_bytes: 110,
        vec_dot_type: Some(QuantFormat::Q8_K),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q4_K,
        name: "Q4_K",
        ggml_type_id: Some(12),
        block_elems: 256,
        block_bytes: 144,
        vec_dot_type: Some(QuantFormat::Q8_K),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q5_K,
        name: "Q5_K",
        ggml_type_id: Some(13),
        block_elems: 256,
        block_bytes: 176,
        vec_dot_type: Some(QuantFormat::Q8_K),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q6_K,
        name: "Q6_K",
        ggml_type_id: Some(14),
        block_elems: 256,
        block_bytes: 210,
        vec_dot_type: Some(QuantFormat::Q8_K),
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q8_K,
        name: "Q8_K",
        ggml_type_id: Some(15),
        block_elems: 256,
        block_bytes: 292,
        vec_dot_type: None,
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::BF16,
        name: "BF16",
        ggml_type_id: Some(30),
        block_elems: 1,
        block_bytes: 2,
        vec_dot_type: None,
        interleaved: None,
    },
    FormatInfo {
        format: QuantFormat::Q4_0x16,
        name: "Q4_0x16",
        ggml_type_id: None,
        block_elems: 32,
        block_bytes: 18,
        vec_dot_type: Some(QuantFormat::Q8_0),
        interleaved: Some((QuantFormat::Q4_0, 16)),
    },
];

impl QuantFormat {
    fn info(self) -> &'static FormatInfo {
        TABLE
            .iter()
            .find(|i| i.format == self)
            .expect("every QuantFormat variant has a table row")
    }

    /// Canonical name as ggml prints it (`"Q4_K"`, `"F32"`, …); also the manifest tag.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// ggml `enum ggml_type` value (GGUF tensor-info type field); `None` for infer's own
    /// layouts ([`QuantFormat::interleaved`]), which no GGUF holds.
    pub fn ggml_type_id(self) -> Option<u32> {
        self.info().ggml_type_id
    }

    /// `Some((row format, rows per group))` for a layout that re-lays the blocks of `row
    /// format` several rows at a time (Q4_0x16: `(Q4_0, 16)`; see [`crate::interleave`]), with
    /// the same bytes per row; `None` for ggml's one-row-after-another layouts. A reader that
    /// slices such a matrix into rows must go through [`crate::interleave`].
    pub fn interleaved(self) -> Option<(QuantFormat, usize)> {
        self.info().interleaved
    }

    /// The format whose blocks this one holds: the row format of an interleaved layout, else
    /// the format itself.
    pub fn row_format(self) -> QuantFormat {
        self.interleaved().map_or(self, |(f, _)| f)
    }

    /// Values per block (1 for plain float formats).
    pub fn block_elems(self) -> usize {
        self.info().block_elems
    }

    /// Bytes per block (Q4_K: 144, Q6_K: 210, Q4_0: 18, …).
    pub fn block_bytes(self) -> usize {
        self.info().block_bytes
    }

    /// The activation format ggml pairs with this weight format in its dot product (ggml
    /// `type_traits_cpu[..].vec_dot_type`: Q4_0, Q5_0, Q8_0 → Q8_0; Q4_1, Q5_1 → Q8_1; the
    /// K-quants → Q8_K); `None` for float and activation-only formats.
    pub fn vec_dot_type(self) -> Option<QuantFormat> {
        self.info().vec_dot_type
    }

    /// True for formats made of multi-value blocks (everything except F32/F16/BF16).
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Parse a manifest/CLI tag (case-insensitive: `"q4_k"`, `"Q4_K"`).
    ///
    /// Errors: [`QuantError::UnknownFormat`] for anything not in the table.
    pub fn from_name(name: &str) -> Result<Self, QuantError> {
        TABLE
            .iter()
            .find(|i| i.name.eq_ignore_ascii_case(name))
            .map(|i| i.format)
            .ok_or_else(|| QuantError::UnknownFormat(name.to_string()))
    }

    /// Map a ggml type id to a format. Errors: [`QuantError::UnknownGgmlType`].
    pub fn from_ggml_type_id(id: u32) -> Result<Self, QuantError> {
        TABLE
            .iter()
            .find(|i| i.ggml_type_id == Some(id))
            .map(|i| i.format)
            .ok_or(QuantError::UnknownGgmlType(id))
    }

    /// Bytes needed for `n_elems` values (for an interleaved layout: per row, as its row
    /// format; a matrix's bytes are its rows' bytes). Errors: [`QuantError::NotBlockAligned`] when `n_elems`
    /// is not a multiple of the block size.
    pub fn bytes_for(self, n_elems: usize) -> Result<usize, QuantError> {
        let be = self.block_elems();
        if n_elems % be != 0 {
            return Err(QuantError::NotBlockAligned {
                format: self,
                n_elems,
                block_elems: be,
            });
        }
        (n_elems / be)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| QuantError::BadShape(format!("{n_elems} values overflow a byte count")))
    }

    /// Bytes of a row-major tensor of `shape` (last dimension = row length, which must be a
    /// multiple of the block size, as ggml requires).
    pub fn expected_bytes(self, shape: &[usize]) -> Result<usize, QuantError> {
        let too_large = || QuantError::BadShape(format!("{shape:?} is too large"));
        let row = shape.last().copied().unwrap_or(1);
        let rows = shape
            .iter()
            .rev()
            .skip(1)
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(too_large)?;
        self.bytes_for(row)?.checked_mul(rows).ok_or_else(too_large)
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QuantFormat {
    type Err = QuantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_names_and_ids() {
        for i in TABLE {
            assert_eq!(QuantFormat::from_name(i.name).unwrap(), i.format);
            if let Some(id) = i.ggml_type_id {
                assert_eq!(QuantFormat::from_ggml_type_id(id).unwrap(), i.format);
            }
        }
        // Q4_0x16: infer's own, the bytes of Q4_0 per row, no ggml id, Q8_0 activations.
        let x = QuantFormat::from_name("q4_0x16").unwrap();
        assert_eq!(x, QuantFormat::Q4_0x16);
        assert_eq!(x.ggml_type_id(), None);
        assert_eq!(x.interleaved(), Some((QuantFormat::Q4_0, 16)));
        assert_eq!(x.row_format(), QuantFormat::Q4_0);
        assert_eq!(QuantFormat::Q4_0.row_format(), QuantFormat::Q4_0);
        assert_eq!(x.vec_dot_type(), Some(QuantFormat::Q8_0));
        assert_eq!(
            x.expected_bytes(&[40, 576]).unwrap(),
            QuantFormat::Q4_0.expected_bytes(&[40, 576]).unwrap()
        );
        assert_eq!(QuantFormat::Q4_K.block_bytes(), 144);
        assert_eq!(QuantFormat::Q4_K.bytes_for(512).unwrap(), 288);
        assert!(QuantFormat::Q4_K.bytes_for(576).is_err());
        assert!(QuantFormat::from_name("Q4_K_148").is_err());
    }

    #[test]
    fn vec_dot_types_are_ggmls() {
        use QuantFormat::*;
        for (w, a) in [
            (Q4_0, Q8_0),
            (Q5_0, Q8_0),
            (Q8_0, Q8_0),
            (Q4_1, Q8_1),
            (Q5_1, Q8_1),
            (Q4_0x16, Q8_0),
        ] {
            assert_eq!(w.vec_dot_type(), Some(a), "{w}");
        }
        for w in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
            assert_eq!(w.vec_dot_type(), Some(Q8_K), "{w}");
        }
        for w in [F32, F16, BF16, Q8_1, Q8_K] {
            assert_eq!(w.vec_dot_type(), None, "{w}");
        }
    }
}
