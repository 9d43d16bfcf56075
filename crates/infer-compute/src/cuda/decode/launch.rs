//! Launching a decode step's kernels (`decode.cu`, and the quantizers of `kernels.cu`) on the
//! decoder's stream, eagerly or into the CUDA graph, with optional timing events.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use super::group::Group;
use super::{
    attention_splits, ptr, split_kernel, CudaDecoder, DevLayer, DevWeight, WKind, A,
    ATT_SPLIT_THREADS, ATT_THREADS, DEC_THREADS, RN_THREADS,
};
use crate::cuda::device::{capture_graph, dev_err, drv, int, launch_pdl, Device, ROWS_PER_BLOCK};
use crate::cuda::quant::{self, mv_grid, rowdot_grid};
use crate::ComputeError;

impl CudaDecoder<'_> {
    /// Launch `f` on the decode stream with programmatic dependent launch ([`launch_pdl`]):
    /// every decode kernel waits (`pdl_wait` in kernels.cu) before it reads what an earlier
    /// kernel wrote, so only the launch latency and the mat-vecs' weight loads overlap the
    /// kernel before.
    fn go(
        &self,
        name: &'static str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[A],
    ) -> Result<(), ComputeError> {
        // Each argument in an 8-byte slot (ints and floats in the low 4 bytes: little-endian).
        let mut vals: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                A::P(v) => v,
                A::I(v) => v as u32 as u64,
                A::F(v) => v.to_bits() as u64,
            })
            .collect();
        // SAFETY: every call site passes the argument list of the named kernel (decode.cu /
        // kernels.cu) with device pointers into buffers sized for it (allocated in `new`).
        unsafe { launch_pdl(&self.stream, f, cfg, &mut vals) }?;
        if let Some(events) = self.profile.borrow_mut().as_mut() {
            let e = drv(
                "record a profiling event",
                self.stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
            )?;
            events.push((name, e));
        }
        Ok(())
    }

    fn p<T>(&self, s: &CudaSlice<T>) -> u64 {
        ptr(s, &self.stream)
    }

    /// Quantize `cols` activations at `x` once per activation family used by `ws`.
    fn quantize_for(
        &self,
        dev: &Device,
        ws: &[&DevWeight],
        x: u64,
        cols: usize,
    ) -> Result<(), ComputeError> {
        for family in [true, false] {
            if !ws.iter().any(|w| w.family() == Some(family)) {
                continue;
            }
            let block = if family { 256 } else { 32 };
            let nblocks = cols / block;
            let cfg = LaunchConfig {
                grid_dim: (nblocks.div_ceil(4) as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let nb = A::I(int("activation blocks", nblocks)?);
            if family {
                let a = &self.bufs.kq;
                let args = [
                    A::P(x),
                    A::P(self.p(&a.aq)),
                    A::P(self.p(&a.ad)),
                    A::P(self.p(&a.bsums)),
                    nb,
                ];
                self.go("quantize", &dev.k.quantize_q8_k, cfg, &args)?;
            } else {
                let a = &self.bufs.b32;
                let args = [
                    A::P(x),
                    A::P(self.p(&a.aq)),
                    A::P(self.p(&a.ad)),
                    nb,
                    A::I(1),
                ];
                self.go("quantize", &dev.k.quantize_q8_32, cfg, &args)?;
            }
        }
        Ok(())
    }

    /// `y[rows] = W · x` with `x` (f32, `cols`) at `x`, already quantized for `w`'s family by
    /// [`Self::quantize_for`] when `w` is quantized.
    fn matvec(&self, dev: &Device, w: &DevWeight, x: u64, y: u64) -> Result<(), ComputeError> {
        let (rows, cols) = (int("rows", w.rows)?, int("cols", w.cols)?);
        let cfg = mv_grid(w.rows, 1);
        match w.kind {
            WKind::Quant(format) => {
                let Some((f, kq)) = quant::kernel(dev, format) else {
                    return Err(ComputeError::UnsupportedFormat {
                        backend: "cuda".to_string(),
                        format,
                    });
                };
                let a = if kq { &self.bufs.kq } else { &self.bufs.b32 };
                let mut args = vec![A::P(w.ptr), A::P(self.p(&a.aq)), A::P(self.p(&a.ad))];
                if kq {
                    args.push(A::P(self.p(&a.bsums)));
                }
                args.extend([A::P(y), A::I(rows), A::I(cols), A::I(1)]);
                self.go("mat-vec (single)", f, cfg, &args)
            }
            WKind::F32 | WKind::F16 => {
                let f = match w.kind {
                    WKind::F16 => &dev.k.rowdot_f16,
                    _ => &dev.k.rowdot_f32,
                };
                let cfg = rowdot_grid(w.rows, 1);
                let args = [
                    A::P(x),
                    A::P(w.ptr),
                    A::P(y),
                    A::I(1),
                    A::I(rows),
                    A::I(cols),
                ];
                self.go("mat-vec (float)", f, cfg, &args)
            }
        }
    }

    /// The key-split attention kernel (`dec_attn_split*`, then `dec_attn_merge`) for layer `l`
    /// when its cache has `splits > 1` key splits and [`split_kernel`] takes its heads; `None`:
    /// one `dec_attention` block per query head.
    fn split_kernel<'d>(
        &self,
        dev: &'d Device,
        l: &DevLayer,
        splits: usize,
    ) -> Option<&'d CudaFunction> {
        if splits < 2 {
            return None;
        }
        split_kernel(dev, l.n_q / l.n_kv.max(1), l.head_dim)
    }

    /// Quantized-activation pointers of the families `fam` = (Q8_K, 32-value): (q32, d32, qk, dk,
    /// bsums), 0 where not wanted.
    fn quant_targets(&self, fam: (bool, bool)) -> [A; 5] {
        let (k, b) = (&self.bufs.kq, &self.bufs.b32);
        let pick = |on: bool, v: u64| A::P(if on { v } else { 0 });
        [
            pick(fam.1, self.p(&b.aq)),
            pick(fam.1, self.p(&b.ad)),
            pick(fam.0, self.p(&k.aq)),
            pick(fam.0, self.p(&k.ad)),
            pick(fam.0, self.p(&k.bsums)),
        ]
    }

    /// `x += [post](branch) · mult` (when `branch` ≠ 0), then `xn = rmsnorm(x) · (norm + off)`
    /// quantized for the families of the products that read `xn` (`dec_residual_norm`).
    fn residual_norm(&self, dev: &Device, branch: u64, n: NormTail) -> Result<(), ComputeError> {
        let b = &self.bufs;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (RN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = vec![
            A::P(self.p(&b.x)),
            A::P(branch),
            A::P(n.post),
            A::F(n.mult),
            A::P(n.norm),
            A::P(self.p(&b.xn)),
            A::I(int("hidden", self.hidden)?),
            A::F(n.eps.0),
            A::F(n.eps.1),
            A::F(n.eps2.0),
            A::F(n.eps2.1),
        ];
        args.extend(self.quant_targets(n.fam));
        self.go(
            "residual+norm+quantize",
            &dev.k.dec_residual_norm,
            cfg,
            &args,
        )
    }

    /// The products of `g` on their input (already quantized for [`Group::families`]): one
    /// `dec_mv_multi` launch over its job table, or one product each when a weight is float;
    /// then `tail` on their outputs.
    fn run_group(&self, dev: &Device, g: &Group, x: u64, tail: &Tail) -> Result<(), ComputeError> {
        match &g.jobs {
            Some(jobs) => {
                let (k, b) = (&self.bufs.kq, &self.bufs.b32);
                let cfg = LaunchConfig {
                    grid_dim: (g.blocks as u32, 1, 1),
                    block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                let args = [
                    A::P(self.p(jobs)),
                    A::I(g.weights.len() as i32),
                    A::P(self.p(&b.aq)),
                    A::P(self.p(&b.ad)),
                    A::P(self.p(&k.aq)),
                    A::P(self.p(&k.ad)),
                    A::P(self.p(&k.bsums)),
                    A::I(int("cols", g.cols)?),
                ];
                self.go("mat-vec (fused)", &dev.k.dec_mv_multi, cfg, &args)?;
            }
            None => {
                for (w, &y) in g.weights.iter().zip(&g.outs) {
                    self.matvec(dev, w, x, y)?;
                }
            }
        }
        match *tail {
            Tail::None => Ok(()),
            Tail::Norm(n) => self.residual_norm(dev, g.outs[0], n),
            Tail::Act { layer, down_family } => {
                let gate = if g.outs.len() == 2 { g.outs[0] } else { 0 };
                self.act_quant(dev, layer, down_family, gate, g.outs[g.outs.len() - 1])
            }
        }
    }

    /// Enqueue one whole step on the decode stream (recorded into the graph on first use).
    pub(super) fn record(&self, dev: &Device) -> Result<(), ComputeError> {
        let b = &self.bufs;
        let k = &dev.k;
        let one = |threads: u32| LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (x, xn, pp) = (self.p(&b.x), self.p(&b.xn), self.p(&b.p));
        let h = int("hidden", self.hidden)?;
        let embed = if self.embed.1 {
            &k.dec_embed_f16
        } else {
            &k.dec_embed_f32
        };
        let args = [
            A::P(self.embed.0),
            A::P(pp),
            A::P(x),
            A::I(h),
            A::F(self.embed_scale),
            A::P(self.p(&b.best)),
        ];
        self.go("embedding", embed, one(DEC_THREADS), &args)?;
        let (Some(first), Some(g0)) = (self.layers.first(), self.groups.first()) else {
            return Err(dev_err("decode: a plan without layers"));
        };
        let norm0 = (first.eps, first.off);
        let fam0 = g0.qkv.families();
        let first_norm = NormTail {
            post: 0,
            mult: 1.0,
            eps: norm0,
            norm: first.pre_attn_norm,
            eps2: norm0,
            fam: fam0,
        };
        self.residual_norm(dev, 0, first_norm)?;
        let (q, kk, v) = (self.p(&b.q), self.p(&b.k), self.p(&b.v));
        let (attn, up) = (self.p(&b.attn), self.p(&b.up));
        for (i, (l, g)) in self.layers.iter().zip(&self.groups).enumerate() {
            let en = (l.eps, l.off);
            self.run_group(dev, &g.qkv, xn, &Tail::None)?;
            let inv = l.inv_freq.as_ref().map_or(0, |f| self.p(f));
            // The attention blocks quantize their heads for the o projection when every
            // quantized block lies within one head; else a separate quantize launch.
            let fam = g.o.families();
            let fused = (!fam.0 || l.head_dim.is_multiple_of(256))
                && (!fam.1 || l.head_dim.is_multiple_of(32));
            let quant = self.quant_targets(if fused { fam } else { (false, false) });
            let (nq, nkv) = (int("query heads", l.n_q)?, int("kv heads", l.n_kv)?);
            let (hd, rot) = (int("head_dim", l.head_dim)?, int("rotary dim", l.rot)?);
            let splits = attention_splits(self.context, l.window);
            let kt = super::super::tensor_ops::kv_code(self.kv);
            // Arguments both attention kernels take: the projections' heads and the norms,
            // RoPE and caches they go through, then (after kernel-specific outputs and the
            // step's {token, position}) the head geometry.
            let heads = [
                A::P(q),
                A::P(kk),
                A::P(v),
                A::P(l.q_norm),
                A::P(l.k_norm),
                A::P(inv),
                A::P(self.p(&l.k_cache)),
                A::P(self.p(&l.v_cache)),
            ];
            let geometry = [
                A::I(nq),
                A::I(nkv),
                A::I(hd),
                A::I(rot),
                A::I(l.interleaved as i32),
                A::F(l.eps),
                A::F(l.off),
            ];
            if let Some(split_kernel) = self.split_kernel(dev, l, splits) {
                let cfg = LaunchConfig {
                    grid_dim: (l.n_kv as u32, splits as u32, 1),
                    block_dim: (ATT_SPLIT_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut args = heads.to_vec();
                args.extend([A::P(self.p(&b.splits)), A::P(pp), A::P(0)]);
                args.extend(geometry);
                args.extend([
                    A::F(l.scale),
                    A::I(l.window),
                    A::F(l.softcap),
                    A::I(splits as i32),
                    A::I(kt),
                ]);
                self.go(
                    "attention (rope, kv store, key splits)",
                    split_kernel,
                    cfg,
                    &args,
                )?;
                let merge = LaunchConfig {
                    grid_dim: (l.n_q as u32, 1, 1),
                    block_dim: (DEC_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut args = vec![
                    A::P(self.p(&b.splits)),
                    A::P(attn),
                    A::I(hd),
                    A::I(splits as i32),
                ];
                args.extend(quant);
                self.go(
                    "attention merge (quantize)",
                    &k.dec_attn_merge,
                    merge,
                    &args,
                )?;
            } else {
                let cfg = LaunchConfig {
                    grid_dim: (l.n_q as u32, 1, 1),
                    block_dim: (ATT_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut args = heads.to_vec();
                args.extend([A::P(attn), A::P(self.p(&b.scores)), A::P(pp)]);
                args.extend(geometry);
                args.extend([
                    A::I(int("context", self.context)?),
                    A::F(l.scale),
                    A::I(l.window),
                    A::F(l.softcap),
                ]);
                args.extend(quant);
                args.push(A::I(kt));
                self.go(
                    "attention (rope, kv store, quantize)",
                    &k.dec_attention,
                    cfg,
                    &args,
                )?;
            }
            if !fused {
                self.quantize_for(dev, &g.o.weights.iter().collect::<Vec<_>>(), attn, g.o.cols)?;
            }
            let post_attn = NormTail {
                post: l.post_attn_norm,
                mult: l.mult,
                eps: en,
                norm: l.pre_ffn_norm,
                eps2: en,
                fam: g.gate_up.families(),
            };
            self.run_group(dev, &g.o, attn, &Tail::Norm(post_attn))?;
            let act = Tail::Act {
                layer: l,
                down_family: g.down.weights.first().and_then(|w| w.family()),
            };
            self.run_group(dev, &g.gate_up, xn, &act)?;
            let (norm, eps2, fam) = match (self.layers.get(i + 1), self.groups.get(i + 1)) {
                (Some(next), Some(ng)) => {
                    (next.pre_attn_norm, (next.eps, next.off), ng.qkv.families())
                }
                _ => (
                    self.final_norm,
                    (self.final_eps, self.final_off),
                    self.lm_group.families(),
                ),
            };
            let post_ffn = NormTail {
                post: l.post_ffn_norm,
                mult: l.mult,
                eps: en,
                norm,
                eps2,
                fam,
            };
            self.run_group(dev, &g.down, up, &Tail::Norm(post_ffn))?;
        }
        let logits = self.p(&b.logits);
        self.run_group(dev, &self.lm_group, xn, &Tail::None)?;
        if self.logits_div != 1.0 || self.final_cap > 0.0 {
            let cfg = LaunchConfig {
                grid_dim: (self.vocab.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let args = [
                A::P(logits),
                A::I(int("vocab", self.vocab)?),
                A::F(self.logits_div),
                A::F(self.final_cap),
            ];
            self.go("logit soft-cap", &k.dec_logits_post, cfg, &args)?;
        }
        // The greedy token (read by `step_argmax`; `step` ignores it): a few µs, so always.
        let cfg = LaunchConfig {
            grid_dim: (self.vocab.div_ceil(256 * 8).min(1024) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            A::P(logits),
            A::I(int("vocab", self.vocab)?),
            A::P(self.p(&b.best)),
        ];
        self.go("argmax", &k.dec_argmax, cfg, &args)?;
        Ok(())
    }

    /// `up = act(gate) · up` (or `act(up)` when `gate` is 0), quantized for the down product
    /// when it is quantized (`down_family`: see [`DevWeight::family`]).
    fn act_quant(
        &self,
        dev: &Device,
        l: &DevLayer,
        down_family: Option<bool>,
        gate: u64,
        up: u64,
    ) -> Result<(), ComputeError> {
        let kq = down_family == Some(true);
        let per_warp = if kq { 256 } else { 32 };
        let warps = l.inter.div_ceil(per_warp);
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let t = self.quant_targets((kq, down_family == Some(false)));
        let (qa, da) = if kq { (t[2], t[3]) } else { (t[0], t[1]) };
        let args = [
            A::P(gate),
            A::P(up),
            A::I(int("intermediate", l.inter)?),
            A::I(l.act),
            qa,
            da,
            t[4],
            A::I(kq as i32),
        ];
        self.go("activation+quantize", &dev.k.dec_act_quant, cfg, &args)
    }

    /// Capture [`Self::record`] into a graph (once).
    pub(super) fn capture(&mut self, dev: &Device) -> Result<(), ComputeError> {
        let stream = self.stream.clone();
        self.graph = Some(capture_graph(&stream, || self.record(dev))?);
        Ok(())
    }
}

/// What follows a group's products.
#[derive(Clone, Copy)]
enum Tail<'a> {
    None,
    /// The residual add of the group's one output and the next norm.
    Norm(NormTail),
    /// The activation of gate/up for the down product of `down_family`.
    Act {
        layer: &'a DevLayer,
        down_family: Option<bool>,
    },
}

/// A residual + RMSNorm + quantization: `post` norm (0 = none) of the branch with `eps` =
/// (eps, offset), residual multiplier `mult`, then the `norm` weight with `eps2`, quantized for
/// the activation families `fam` = (Q8_K, 32-value).
#[derive(Clone, Copy)]
struct NormTail {
    post: u64,
    mult: f32,
    eps: (f32, f32),
    norm: u64,
    eps2: (f32, f32),
    fam: (bool, bool),
}
