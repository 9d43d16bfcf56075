//! ggml's scale-search helpers from `ggml/src/ggml-quants.c`: `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`, `make_qkx3_quants` and `make_qp_quants`.
//!
//! Ported operation by operation (same association order, no fused multiply-add, C `MIN`/`MAX`
//! semantics, C integer truncations), so the chosen levels match ggml bit for bit.

use crate::util::{cmin, nearest_int};

/// ggml `GROUP_MAX_EPS`.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Weight of element `x` in `make_qx_quants` when no importance weights are given.
#[inline(always)]
fn qx_weight(qw: Option<&[f32]>, i: usize, x: f32, rmse_type: i32) -> f32 {
    match qw {
        Some(w) => w[i],
        None => match rmse_type {
            1 => x * x,
            2 => 1.0,
            3 => x.abs(),
            _ => x.abs().sqrt(),
        },
    }
}

/// `fn $name(args) -> R` that runs `$body(args)` compiled for AVX-512F or AVX2 when the CPU
/// has them (detected per call, a cached load): the side-by-side trial sums of the searches get
/// wider lanes. No fused multiply-add is enabled, so every variant gives the same bits.
macro_rules! wide_lanes {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $body:ident;) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: AVX-512F was just detected.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 was just detected.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

wide_lanes! {
    /// ggml `make_qx_quants`: symmetric quantization of `x` to levels `L[i] = l + nmax`,
    /// `l ∈ [-nmax, nmax-1]`; returns the scale.
    pub(crate) fn make_qx_quants(
        nmax: i32,
        x: &[f32],
        l_out: &mut [i8],
        rmse_type: i32,
        qw: Option<&[f32]>,
    ) -> f32 = make_qx_quants_body;
}

#[inline(always)]
fn make_qx_quants_body(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    mut rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &xi in x {
        let ax = xi.abs();
        if ax > amax {
            amax = ax;
            max = xi;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let clamp = |l: i32| l.min(nmax - 1).max(-nmax);
    if rmse_type == 0 {
        for i in 0..n {
            let l = nearest_int(iscale * x[i]);
            l_out[i] = (nmax + clamp(l)) as i8;
        }
        return 1.0 / iscale;
    }
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        l_out[i] = (l + nmax) as i8;
        let w = qx_weight(qw, i, x[i], rmse_type);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    // ggml tries the 18 scales `is = -9..=9, is != 0` one after the other; their sums do not
    // depend on which earlier one won, so all 18 are accumulated side by side (each in ggml's
    // order of additions: the same bits) and then compared in ggml's order.
    let mut iscales = [0f32; QX_STEPS];
    for (k, is) in (-9i32..=9).filter(|&is| is != 0).enumerate() {
        iscales[k] = -(nmax as f32 + 0.1f32 * is as f32) / max;
    }
    let (sumlxs, suml2s) = qx_step_sums(nmax, x, &iscales, |i| qx_weight(qw, i, x[i], rmse_type));
    for k in 0..QX_STEPS {
        let (sumlx, suml2) = (sumlxs[k], suml2s[k]);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscales[k] * x[i]);
                l_out[i] = (nmax + clamp(l)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Steps of `make_qkx2_quants` evaluated side by side.
const QKX_LANES: usize = 8;

/// The scales `make_qx_quants` tries after its first guess.
const QX_STEPS: usize = 18;

/// For each trial inverse scale `iscales[k]`: `Σ w·x·l` and `Σ w·l·l` over `x` in index order,
/// `l = clamp(nearest_int(iscales[k]·x))` (ggml's inner loop of `make_qx_quants`), the 18
/// trials in independent accumulators.
#[inline(always)]
fn qx_step_sums(
    nmax: i32,
    x: &[f32],
    iscales: &[f32; QX_STEPS],
    weight: impl Fn(usize) -> f32,
) -> ([f32; QX_STEPS], [f32; QX_STEPS]) {
    let mut sumlx = [0f32; QX_STEPS];
    let mut suml2 = [0f32; QX_STEPS];
    for (i, &xi) in x.iter().enumerate() {
        let w = weight(i);
        let wx = w * xi;
        for k in 0..QX_STEPS {
            let lf = nearest_int(iscales[k] * xi).min(nmax - 1).max(-nmax) as f32;
            // ggml: `sumlx += w*x[i]*l; suml2 += w*l*l;` (left to right).
            sumlx[k] += wx * lf;
            suml2[k] += w * lf * lf;
        }
    }
    (sumlx, suml2)
}

/// ggml `make_q3_quants` (Q3_K reference path).
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &xi in x {
        let ax = xi.abs();
        if ax > amax {
            amax = ax;
            max = xi;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let clamp = |l: i32| l.min(nmax - 1).max(-nmax);
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * x[i]));
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                    if new_l != l_out[i] as i32 {
                        let nl = new_l as f32;
                        slx += w * x[i] * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in l_out[..n].iter_mut() {
            *l = l.wrapping_add(nmax as i8);
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        l_out[i] = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// Parameters of the `make_qkx2_quants` / `make_qkx3_quants` scale search.
#[derive(Clone, Copy)]
pub(crate) struct QkxSearch {
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

wide_lanes! {
    /// ggml `make_qkx2_quants`: asymmetric (scale + min) quantization to `[0, nmax]`.
    /// Returns `(scale, the_min)` where `the_min = -min >= 0`.
    pub(crate) fn make_qkx2_quants(
        nmax: i32,
        x: &[f32],
        weights: &[f32],
        l_out: &mut [u8],
        p: QkxSearch,
    ) -> (f32, f32) = make_qkx2_quants_body;
}

#[inline(always)]
fn make_qkx2_quants_body(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    p: QkxSearch,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.min(nmax).max(0) as u8;
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if p.use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    // ggml tries `is = 0..=nstep` in order, and an accepted step moves `min`, which the later
    // steps use. The steps are evaluated QKX_LANES at a time side by side, speculating that
    // `min` stays; at the first accepted step the state moves and the next group starts right
    // after it. Every sum keeps ggml's order of additions: the same bits.
    let steps = p.nstep as usize + 1;
    let mut next = 0;
    while next < steps {
        let g = (steps - next).min(QKX_LANES);
        let mut iscales = [0f32; QKX_LANES];
        for (k, s) in iscales[..g].iter_mut().enumerate() {
            *s = (p.rmin + p.rdelta * (next + k) as f32 + nmaxf) / (max - min);
        }
        let level = |s: f32, xi: f32| nearest_int(s * (xi - min)).min(nmax).max(0);
        let (mut sum_l, mut sum_l2, mut sum_xl) =
            ([0f32; QKX_LANES], [0f32; QKX_LANES], [0f32; QKX_LANES]);
        for (&xi, &w) in x.iter().zip(&weights[..n]) {
            for k in 0..QKX_LANES {
                let lf = level(iscales[k], xi) as f32;
                sum_l[k] += w * lf;
                sum_l2[k] += w * lf * lf;
                sum_xl[k] += w * lf * xi;
            }
        }
        let (mut this_scale, mut this_min, mut ok) =
            ([0f32; QKX_LANES], [0f32; QKX_LANES], [false; QKX_LANES]);
        for k in 0..g {
            let d = sum_w * sum_l2[k] - sum_l[k] * sum_l[k];
            ok[k] = d > 0.0;
            if ok[k] {
                this_scale[k] = (sum_w * sum_xl[k] - sum_x * sum_l[k]) / d;
                this_min[k] = (sum_l2[k] * sum_x - sum_l[k] * sum_xl[k]) / d;
                if this_min[k] > 0.0 {
                    this_min[k] = 0.0;
                    this_scale[k] = sum_xl[k] / sum_l2[k];
                }
            }
        }
        let mut cur_error = [0f32; QKX_LANES];
        for (&xi, &w) in x.iter().zip(&weights[..n]) {
            for k in 0..QKX_LANES {
                let lf = level(iscales[k], xi) as f32;
                let diff = this_scale[k] * lf + this_min[k] - xi;
                let diff = if p.use_mad { diff.abs() } else { diff * diff };
                cur_error[k] += w * diff;
            }
        }
        match (0..g).find(|&k| ok[k] && cur_error[k] < best_error) {
            None => next += g,
            Some(k) => {
                for (l, &xi) in l_out[..n].iter_mut().zip(x) {
                    *l = level(iscales[k], xi) as u8;
                }
                best_error = cur_error[k];
                scale = this_scale[k];
                min = this_min[k];
                next += k + 1;
            }
        }
    }
    (scale, -min)
}

/// ggml `make_qkx3_quants` (the imatrix paths). `weights == None` means `x[i]²`.
/// Returns `(scale, the_min)`.
pub(crate) fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    l_out: &mut [u8],
    laux: &mut [u8],
    p: QkxSearch,
) -> (f32, f32) {
    let n = x.len();
    let wt = |i: usize| match weights {
        Some(w) => w[i],
        None => x[i] * x[i],
    };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = wt(0);
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = wt(i);
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.min(nmax).max(0) as u8;
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if p.use_mad { diff.abs() } else { diff * diff };
        best_mad += wt(i) * diff;
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            // ggml: `v > 0 ? nearest_int(MIN(v, nmax)) : 0` (v may be inf/NaN/out of range).
            let v = iscale * (x[i] - min);
            let l = if v > 0.0 {
                nearest_int(cmin(v, nmaxf))
            } else {
                0
            };
            laux[i] = l as u8;
            let w = wt(i);
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0.0f32;
            for i in 0..n {
                let mut diff = this_scale * laux[i] as f32 + this_min - x[i];
                diff = if p.use_mad { diff.abs() } else { diff * diff };
                mad += wt(i) * diff;
            }
            if mad < best_mad {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml `make_qp_quants`: quantize non-negative `x` (sub-block scales or mins) to `[0, nmax]`
/// with importance `quant_weights`; returns the super-block scale.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], quant_weights: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &xi in x {
        max = crate::util::cmax(max, xi);
    }
    if max < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / max;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        best_mse += quant_weights[i] * diff * diff;
    }
    for is in -4i32..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmaxf) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += quant_weights[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = quant_weights[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _itry in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = quant_weights[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values with the spread of real weights (a few outliers per block).
    fn block(seed: u32, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                if s % 17 == 0 {
                    u * 8.0
                } else {
                    u
                }
            })
            .collect()
    }

    /// The wide-lane variants the CPU picks give the bits of the baseline build of the same
    /// body (the quant vectors check the dispatched one against ggml).
    #[test]
    fn wide_lane_searches_equal_the_baseline() {
        for seed in 0..2000 {
            let x = block(seed, 32);
            let w: Vec<f32> = x.iter().map(|v| v.abs() + 0.1).collect();
            let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
            let sa = make_qx_quants(32, &x[..16], &mut a, 1, None);
            let sb = make_qx_quants_body(32, &x[..16], &mut b, 1, None);
            assert_eq!((sa.to_bits(), a), (sb.to_bits(), b), "qx seed {seed}");
            let sa = make_qx_quants(16, &x, &mut a, 1, Some(&w));
            let sb = make_qx_quants_body(16, &x, &mut b, 1, Some(&w));
            assert_eq!(
                (sa.to_bits(), a),
                (sb.to_bits(), b),
                "qx weighted seed {seed}"
            );
            let p = QkxSearch {
                rmin: -1.0,
                rdelta: 0.1,
                nstep: 20,
                use_mad: false,
            };
            let (mut la, mut lb) = ([0u8; 32], [0u8; 32]);
            let ra = make_qkx2_quants(15, &x, &w, &mut la, p);
            let rb = make_qkx2_quants_body(15, &x, &w, &mut lb, p);
            assert_eq!(
                (ra.0.to_bits(), ra.1.to_bits(), la),
                (rb.0.to_bits(), rb.1.to_bits(), lb),
                "qkx2 seed {seed}"
            );
        }
    }
}
