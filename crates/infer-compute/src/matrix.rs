//! [`Matrix`]: the one view of a weight matrix that the vindex hands to every kernel — its
//! storage ([`MatData`]: the format tag and the raw bytes or values) and its shape — like
//! ggml's `ggml_tensor` or candle's `QTensor`. Nothing is copied or decoded here.

use half::f16;
use infer_quant::QuantFormat;

use crate::ComputeError;

/// How a matrix's values are stored.
#[derive(Clone, Copy, Debug)]
pub enum MatData<'a> {
    /// f32 values, row-major, `rows · cols`.
    F32(&'a [f32]),
    /// IEEE half values, row-major, `rows · cols` (multiplied in place, never widened).
    F16(&'a [f16]),
    /// ggml blocks of `format`: `rows` rows of `format.bytes_for(cols)` bytes (ggml /
    /// llama.cpp tensor layout).
    Blocks {
        format: QuantFormat,
        bytes: &'a [u8],
    },
    /// The seed's Q8 attention format: int8 `values` `[rows, cols]` and one f32 scale per 32
    /// values of a row in `scales` `[rows, cols / 32]` (`w = q · scale`).
    SplitQ8 { values: &'a [u8], scales: &'a [f32] },
}

/// A weight matrix `[rows, cols]` in HF Linear layout (one output feature per row), as stored.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub data: MatData<'a>,
    /// Output features.
    pub rows: usize,
    /// Input features (values per row).
    pub cols: usize,
}

impl<'a> Matrix<'a> {
    /// An f32 matrix `[rows, cols]`.
    pub fn f32(values: &'a [f32], rows: usize, cols: usize) -> Self {
        Matrix {
            data: MatData::F32(values),
            rows,
            cols,
        }
    }

    /// An f16 matrix `[rows, cols]`.
    pub fn f16(values: &'a [f16], rows: usize, cols: usize) -> Self {
        Matrix {
            data: MatData::F16(values),
            rows,
            cols,
        }
    }

    /// `rows` rows of ggml blocks of `format`.
    pub fn blocks(format: QuantFormat, bytes: &'a [u8], rows: usize, cols: usize) -> Self {
        Matrix {
            data: MatData::Blocks { format, bytes },
            rows,
            cols,
        }
    }

    /// The seed's split Q8 format (int8 values + f32 scales per 32).
    pub fn split_q8(values: &'a [u8], scales: &'a [f32], rows: usize, cols: usize) -> Self {
        Matrix {
            data: MatData::SplitQ8 { values, scales },
            rows,
            cols,
        }
    }

    /// The format and bytes of a block-format matrix. Errors: [`ComputeError::NotBlocks`] when
    /// the storage is f32, f16 or split Q8.
    pub fn blocks_data(&self) -> Result<(QuantFormat, &'a [u8]), ComputeError> {
        match self.data {
            MatData::Blocks { format, bytes } => Ok((format, bytes)),
            _ => Err(ComputeError::NotBlocks {
                storage: self.describe(),
            }),
        }
    }

    /// Bytes of storage (the weight bytes one product reads).
    pub fn byte_len(&self) -> usize {
        match self.data {
            MatData::F32(v) => v.len() * 4,
            MatData::F16(v) => v.len() * 2,
            MatData::Blocks { bytes, .. } => bytes.len(),
            MatData::SplitQ8 { values, scales } => values.len() + scales.len() * 4,
        }
    }

    /// Short name of the storage for `--explain`: `f32`, `f16`, `Q4_K`, …, `Q8`.
    pub fn describe(&self) -> String {
        match self.data {
            MatData::F32(_) => "f32".into(),
            MatData::F16(_) => "f16".into(),
            MatData::Blocks { format, .. } => format.name().into(),
            MatData::SplitQ8 { .. } => "Q8".into(),
        }
    }

    /// The storage holds exactly `rows × cols` values of its format. Errors:
    /// [`ComputeError::ShapeMismatch`] naming what disagrees, [`ComputeError::Quant`] for a
    /// row length that is not whole blocks of the format.
    pub fn check(&self) -> Result<(), ComputeError> {
        let n = self
            .rows
            .checked_mul(self.cols)
            .ok_or(ComputeError::ShapeMismatch {
                what: "matrix rows × cols (overflows)",
                expected: usize::MAX,
                got: self.rows,
                unit: "rows",
            })?;
        let (what, expected, got, unit) = match self.data {
            MatData::F32(v) => ("f32 matrix", n, v.len(), "values"),
            MatData::F16(v) => ("f16 matrix", n, v.len(), "values"),
            MatData::Blocks { format, bytes } => {
                let row = format.bytes_for(self.cols)?;
                let expected = self.rows.saturating_mul(row);
                (
                    "quantized matrix bytes (rows × bytes per row)",
                    expected,
                    bytes.len(),
                    "bytes",
                )
            }
            MatData::SplitQ8 { values, scales } => {
                if !self.cols.is_multiple_of(crate::q8_split::Q8_BLOCK) {
                    return Err(ComputeError::ShapeMismatch {
                        what: "split Q8 row length (a multiple of 32)",
                        expected: self.cols.next_multiple_of(crate::q8_split::Q8_BLOCK),
                        got: self.cols,
                        unit: "values",
                    });
                }
                let blocks = n / crate::q8_split::Q8_BLOCK;
                if scales.len() != blocks {
                    return Err(ComputeError::ShapeMismatch {
                        what: "split Q8 scales (one per 32 values)",
                        expected: blocks,
                        got: scales.len(),
                        unit: "scales",
                    });
                }
                ("split Q8 values", n, values.len(), "bytes")
            }
        };
        crate::host_ops::check(what, got, expected, unit)
    }

    /// [`Matrix::check`] and [`Matrix::check_io`] together: everything a product
    /// `y = x · Wᵀ` needs to hold before it runs.
    pub fn check_product(&self, x: &[f32], m: usize, y: &[f32]) -> Result<(), ComputeError> {
        self.check()?;
        self.check_io(x, m, y)
    }

    /// `x` is `[m, cols]` and `y` is `[m, rows]` for a product `y = x · Wᵀ`. Errors:
    /// [`ComputeError::ShapeMismatch`].
    pub fn check_io(&self, x: &[f32], m: usize, y: &[f32]) -> Result<(), ComputeError> {
        crate::host_ops::check(
            "product input x (m × cols)",
            x.len(),
            m * self.cols,
            "values",
        )?;
        crate::host_ops::check(
            "product output y (m × rows)",
            y.len(),
            m * self.rows,
            "values",
        )
    }
}

/// One matrix of a [`crate::ComputeBackend::linear_many`] call and its output `[m, w.rows]`
/// (fully overwritten).
#[derive(Debug)]
pub struct Proj<'a> {
    pub w: Matrix<'a>,
    pub y: &'a mut [f32],
}

/// The shared shape of every [`crate::ComputeBackend::linear_many`]: check every matrix first,
/// run `fused` when every one holds ggml blocks (a backend's one-region kernel), else one
/// `linear` per matrix.
pub(crate) fn linear_many_with(
    backend: &(impl crate::ComputeBackend + ?Sized),
    x: &[f32],
    m: usize,
    projs: &mut [Proj<'_>],
    fused: impl FnOnce(&mut [Proj<'_>]) -> Result<(), ComputeError>,
) -> Result<(), ComputeError> {
    for p in projs.iter() {
        p.w.check_product(x, m, p.y)?;
    }
    if projs
        .iter()
        .all(|p| matches!(p.w.data, MatData::Blocks { .. }))
    {
        return fused(projs);
    }
    for p in projs.iter_mut() {
        backend.linear(&p.w, x, m, p.y)?;
    }
    Ok(())
}

/// One product of [`crate::ComputeBackend::project_many`]: weight `w` and its output tensor.
#[derive(Debug)]
pub struct TensorProj<'a> {
    pub w: Matrix<'a>,
    /// `[m, w.rows]` (fit by the call).
    pub y: &'a mut crate::Tensor,
}

/// A run of consecutive activation rows that all chose one expert, for
/// [`crate::ComputeBackend::project_grouped`] (ggml's `mul_mat_id` for many tokens: the rows of
/// a prompt chunk sorted by the expert they chose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertRows {
    /// Index into the products' expert lists.
    pub expert: usize,
    /// How many consecutive rows (≥ 1) go to this expert.
    pub rows: usize,
}

/// One product of [`crate::ComputeBackend::project_routed`]: the matrix of every expert (one
/// shape) and the output tensor of the chosen one's product.
#[derive(Debug)]
pub struct RoutedProj<'a> {
    /// `[num_experts]` matrices of one shape, format and storage.
    pub experts: &'a [Matrix<'a>],
    /// `[m, rows]` (fit by the call).
    pub y: &'a mut crate::Tensor,
}
