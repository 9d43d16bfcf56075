//! The CPU backend's whole operations against scalar references ([`common::ops_parity`]), with
//! the fastest kernels of this CPU and with the generic (scalar) ones.

mod common;

use infer_compute::{CpuBackend, Isa};

#[test]
fn cpu_backend_operations_match_scalar_references() {
    common::ops_parity::check_backend_ops(&CpuBackend::new());
}

#[test]
fn generic_cpu_backend_operations_match_scalar_references() {
    let generic = CpuBackend::with_isa(Isa::Generic).expect("the generic ISA is always available");
    common::ops_parity::check_backend_ops(&generic);
}

/// An f16 KV cache (`CpuBackend::with_kv_type`, `--kv-type f16`): `attend` — decode rows of
/// several sequences and prompt chunks (the blocked path, its tiles widened), with and without
/// a window, head dims 64 and 80 — equals, bit for bit, an f32 cache holding the same keys and
/// values rounded to f16 on the host (`half::f16::from_f32`, round to nearest even); the new
/// rows read back (`read_at`) are the rounded values. A q8_0 cache is refused by `fit_kv`.
#[test]
fn f16_kv_cache_equals_f32_cache_on_the_rounded_values() {
    use common::ops_parity::{down, kv_slots, up};
    use half::f16;
    use infer_compute::{Attend, AttentionParams, ComputeBackend, KvType, Tensor};
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let f32_cache = CpuBackend::new();
    let f16_cache = CpuBackend::new().with_kv_type(KvType::F16);
    assert_eq!(f16_cache.kv_type(), KvType::F16);
    let round = |x: &[f32]| -> Vec<f32> { x.iter().map(|&v| f16::from_f32(v).to_f32()).collect() };
    let mut rng = StdRng::seed_from_u64(16);
    let mut random = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect() };
    // (query heads, kv heads, head_dim, window, sequences as (start, new rows)).
    type Case = (usize, usize, usize, Option<usize>, Vec<(usize, usize)>);
    let cases: [Case; 4] = [
        (9, 3, 64, None, vec![(37, 1), (0, 1), (300, 1)]),
        (8, 2, 80, Some(40), vec![(5, 70), (0, 33)]),
        (9, 3, 64, None, vec![(400, 200), (3, 1)]),
        (4, 1, 64, Some(50), vec![(10, 300)]),
    ];
    for (nq, nkv, hd, window, seqs) in cases {
        let p = AttentionParams {
            n_q_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            sliding_window: window,
            softcap: None,
            sinks: None,
        };
        let (qd, kvd) = (nq * hd, nkv * hd);
        let rows: usize = seqs.iter().map(|s| s.1).sum();
        let (q, k, v) = (random(rows * qd), random(rows * kvd), random(rows * kvd));
        let prior: Vec<(Vec<f32>, Vec<f32>)> = seqs
            .iter()
            .map(|&(st, n)| (random((st + n + 2) * kvd), random((st + n + 2) * kvd)))
            .collect();
        let cache = |b: &CpuBackend, x: &[f32]| {
            let mut t = Tensor::default();
            b.fit_kv(&mut t, x.len(), hd).expect("fit_kv");
            b.write_at(x, &mut t, 0).expect("write_at");
            t
        };
        let mut typed: Vec<(Tensor, Tensor)> = prior
            .iter()
            .map(|(pk, pv)| (cache(&f16_cache, pk), cache(&f16_cache, pv)))
            .collect();
        let mut rounded: Vec<(Tensor, Tensor)> = prior
            .iter()
            .map(|(pk, pv)| (cache(&f32_cache, &round(pk)), cache(&f32_cache, &round(pv))))
            .collect();
        let run = |b: &CpuBackend, caches: &mut Vec<(Tensor, Tensor)>, k: &[f32], v: &[f32]| {
            let (qt, kt, vt) = (up(b, &q), up(b, k), up(b, v));
            let mut slots = kv_slots(caches, &seqs);
            let mut a = Attend {
                q: &qt,
                k: &kt,
                v: &vt,
                seqs: &mut slots,
            };
            let mut out = Tensor::default();
            b.attend(&mut a, &p, &mut out).expect("attend");
            down(b, &out)
        };
        let got = run(&f16_cache, &mut typed, &k, &v);
        let want = run(&f32_cache, &mut rounded, &round(&k), &round(&v));
        let what = format!("{nq}q/{nkv}kv×{hd} window {window:?} seqs {seqs:?}");
        assert_eq!(got, want, "{what}");
        let mut row0 = 0;
        for ((kc, vc), &(start, n)) in typed.iter().zip(&seqs) {
            let mut back = vec![0f32; n * kvd];
            f16_cache
                .read_at(kc, start * kvd, &mut back)
                .expect("read keys");
            assert_eq!(
                back,
                round(&k[row0 * kvd..(row0 + n) * kvd]),
                "{what}: keys"
            );
            f16_cache
                .read_at(vc, start * kvd, &mut back)
                .expect("read values");
            assert_eq!(
                back,
                round(&v[row0 * kvd..(row0 + n) * kvd]),
                "{what}: values"
            );
            row0 += n;
        }
    }
    let mut t = Tensor::default();
    let e = CpuBackend::new()
        .with_kv_type(KvType::Q8_0)
        .fit_kv(&mut t, 64, 64)
        .expect_err("no q8_0 cache on the CPU")
        .to_string();
    assert!(e.contains("q8_0") && e.contains("f32 or f16"), "{e}");
}
