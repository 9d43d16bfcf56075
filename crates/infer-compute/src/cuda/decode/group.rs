//! Products of one input fused into one `dec_mv_multi` launch (fused QKV, gate+up, or a single
//! matrix) over a device job table.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::{DevWeight, WKind};
use crate::cuda::device::{drv, int};
use crate::cuda::quant::mv_job;
use crate::ComputeError;

/// The products of one input: one `dec_mv_multi` launch over a device job table when every
/// weight is quantized, else one product each. The input's producer quantizes it for
/// [`Group::families`].
#[derive(Debug)]
pub(super) struct Group {
    pub weights: Vec<DevWeight>,
    pub outs: Vec<u64>,
    pub cols: usize,
    /// `[W, y, rows, format, first block, rows per warp, bias]` per weight; `None` when a
    /// weight is float.
    pub jobs: Option<CudaSlice<i64>>,
    pub blocks: usize,
}

impl Group {
    pub fn new(
        st: &Arc<CudaStream>,
        weights: Vec<DevWeight>,
        outs: Vec<u64>,
        cols: usize,
    ) -> Result<Self, ComputeError> {
        let mut table = Vec::new();
        let mut blocks = 0usize;
        let mut all_quant = true;
        for (w, &y) in weights.iter().zip(&outs) {
            let WKind::Quant(f) = w.kind else {
                all_quant = false;
                break;
            };
            let (job, n) = mv_job(f, w.ptr, y, w.bias, w.rows, w.cols, blocks)?;
            table.extend(job);
            blocks += n;
        }
        let jobs = if all_quant {
            int("mat-vec blocks", blocks)?;
            Some(drv("upload mat-vec jobs", st.clone_htod(&table))?)
        } else {
            None
        };
        Ok(Group {
            weights,
            outs,
            cols,
            jobs,
            blocks,
        })
    }

    /// Activation families the quantized weights need: (Q8_K, 32-value blocks).
    pub fn families(&self) -> (bool, bool) {
        let has = |k| self.weights.iter().any(|w| w.family() == Some(k));
        (has(true), has(false))
    }
}

/// Per-layer product groups.
#[derive(Debug)]
pub(super) struct LayerGroups {
    pub qkv: Group,
    pub o: Group,
    pub gate_up: Group,
    pub down: Group,
}
