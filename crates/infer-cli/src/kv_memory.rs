//! Memory a command will use (weights, KV cache, scratch) against what its device has, checked
//! before anything big is allocated: a context that does not fit is refused with the numbers
//! and the flags to lower, not an out-of-memory failure after the work has started. Also the
//! `memory: …` line of `bench`, `serve` and `--explain`.
//!
//! On a device backend ([`ComputeBackend::memory_info`] is `Some`) weights + KV caches +
//! scratch are compared with the device's free memory, measured before the weights are
//! uploaded. On the CPU only the KV caches are compared with `MemAvailable` + `SwapFree` of
//! /proc/meminfo (the weights are the vindex's file mapping, which the kernel pages in and out;
//! the activations are small next to the caches that would exhaust memory).

use anyhow::bail;
use infer_compute::{ComputeBackend, KvType};
use infer_inference::Model;

const GIB: f64 = (1u64 << 30) as f64;

/// Device memory set aside beyond the buffers [`estimate`] counts: cuBLAS workspaces, CUDA
/// graphs, the small per-call buffers and the allocator's rounding of the few hundred weight
/// allocations. An allowance, not a measurement.
pub const DEVICE_RESERVE: u64 = 256 << 20;

/// Most weight values a device dequantizes at once for the GEMMs of a prompt step (bf16:
/// 128 MiB, the CUDA backend's `DEQUANT_MAX_VALUES`).
const DEQUANT_BYTES: u64 = 128 << 20;

/// Most attention scores a long prompt chunk holds at once on a device (f32: 512 MiB, the CUDA
/// backend's `ATT_GEMM_MAX_SCORES`), and the query rows per piece of it.
const SCORE_BYTES: u64 = 512 << 20;
const SCORE_PIECE_ROWS: u64 = 512;

/// Bytes of KV caches of `positions` positions for layers whose K and V rows have `kv_dims`
/// values (`num_kv_heads · head_dim` per layer), stored as `kv`.
pub fn kv_bytes(kv_dims: &[usize], kv: KvType, positions: usize) -> u64 {
    let per_position: u64 = kv_dims.iter().map(|&d| 2 * kv.row_bytes(d) as u64).sum();
    per_position * positions as u64
}

/// The sizes of a model that the estimate reads.
#[derive(Clone, Debug)]
pub struct Shape {
    /// K/V row width of each layer (`num_kv_heads · head_dim`).
    pub kv_dims: Vec<usize>,
    pub hidden: usize,
    /// Widest q projection (`num_q_heads · head_dim`), most query heads, widest FFN.
    pub q_dim: usize,
    pub q_heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
    /// Weights as stored ([`Model::stored_weight_bytes`]): resident on a device, and the walk
    /// or MoE FFNs that run on the host.
    pub weights: u64,
    pub host_weights: u64,
}

impl Shape {
    /// The shape of `model` (exact per layer).
    pub fn of(model: &Model<'_>) -> Shape {
        let widest = |f: &dyn Fn(&infer_inference::LayerGeometry) -> usize| {
            model
                .layers
                .iter()
                .map(|l| f(&l.geometry))
                .max()
                .unwrap_or(0)
        };
        let (weights, host_weights) = model.stored_weight_bytes();
        Shape {
            kv_dims: model.kv_dims(),
            hidden: model.hidden_size,
            q_dim: widest(&|g| g.q_dim()),
            q_heads: widest(&|g| g.num_q_heads),
            intermediate: widest(&|g| g.intermediate_size),
            vocab: model.vocab_size,
            weights: weights as u64,
            host_weights: host_weights as u64,
        }
    }
}

/// What a command allocates.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// KV caches held at once, each of `positions` positions.
    pub sequences: usize,
    pub positions: usize,
    /// Tokens of the longest forward step (a prompt pass, a batched step): the activations.
    pub step_tokens: usize,
    /// Rows of logits one step computes (1 per sequence, or every position for `perplexity`
    /// and `logits`).
    pub logit_rows: usize,
}

/// The memory a [`Workload`] needs, in bytes.
#[derive(Clone, Debug)]
pub struct Need {
    /// Weights resident on the device (on the CPU: all of them, mapped from the vindex).
    pub weights: u64,
    /// Walk and MoE FFN weights that stay on the host with a device (0 on the CPU).
    pub host_weights: u64,
    /// Every KV cache (one per sequence).
    pub kv: u64,
    pub kv_type: KvType,
    /// Activations, logits and (on a device) the backend's work buffers and
    /// [`DEVICE_RESERVE`]: an estimate.
    pub scratch: u64,
    pub work: Workload,
    /// True when the weights and scratch are in device memory.
    pub device: bool,
}

impl Need {
    /// What is compared with the memory available: weights + KV + scratch on a device, the KV
    /// caches on the host.
    pub fn compared(&self) -> u64 {
        if self.device {
            self.weights + self.kv + self.scratch
        } else {
            self.kv
        }
    }
}

/// The memory of `w` on a backend storing its KV caches as `kv`, on a device or the host.
/// Scratch: per token of the longest step, the forward pass's f32 activations (residual,
/// norms, q/k/v, attention, FFN in and out, gate and up) plus, on a device, the backend's
/// product buffers (input and output copies, bf16 and quantized activations, about 16 bytes per
/// value of the widest product); the logits; on a device for a prompt step, the attention
/// scores of a long chunk, an f32 copy of the keys and values it reads from an f16 or q8_0
/// cache, and the dequantized weight rows of its GEMMs; and [`DEVICE_RESERVE`].
pub fn estimate(shape: &Shape, kv: KvType, device: bool, w: &Workload) -> Need {
    let kv_bytes = kv_bytes(&shape.kv_dims, kv, w.positions) * w.sequences as u64;
    let kv_dim = shape.kv_dims.iter().copied().max().unwrap_or(0) as u64;
    let (h, qd, inter) = (
        shape.hidden as u64,
        shape.q_dim as u64,
        shape.intermediate as u64,
    );
    let step = w.step_tokens.max(1) as u64;
    let positions = w.positions as u64;
    let mut per_token = 4 * (6 * h + 2 * qd + 2 * kv_dim + 2 * inter);
    if device {
        per_token += 16 * h.max(qd).max(inter);
    }
    let mut scratch = step * per_token + w.logit_rows as u64 * (shape.vocab as u64 + h) * 4;
    if device {
        if step > 1 {
            let rows = step.min(SCORE_PIECE_ROWS);
            scratch += (shape.q_heads as u64 * rows * positions * 4).min(SCORE_BYTES);
            if kv != KvType::F32 {
                scratch += 2 * positions * kv_dim * 4;
            }
            scratch += DEQUANT_BYTES;
        }
        scratch += DEVICE_RESERVE;
    }
    Need {
        weights: if device {
            shape.weights
        } else {
            shape.weights + shape.host_weights
        },
        host_weights: if device { shape.host_weights } else { 0 },
        kv: kv_bytes,
        kv_type: kv,
        scratch,
        work: *w,
        device,
    }
}

/// The memory there is: a device's free and total bytes, the host's available bytes, or
/// nothing known (no /proc/meminfo).
#[derive(Clone, Debug)]
pub enum Room {
    Device { name: String, free: u64, total: u64 },
    Host { available: u64 },
    Unknown,
}

impl Room {
    /// The memory of `backend` (named `name`, e.g. `cuda:0`): its device's free memory now, or
    /// the host's.
    pub fn of(backend: &dyn ComputeBackend, name: &str) -> Room {
        match backend.memory_info() {
            Some((free, total)) => Room::Device {
                name: name.to_string(),
                free: free as u64,
                total: total as u64,
            },
            None => Room::host(),
        }
    }

    /// `MemAvailable` + `SwapFree` of /proc/meminfo ([`Room::Unknown`] where it cannot be read).
    pub fn host() -> Room {
        let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
            return Room::Unknown;
        };
        let kib = |key: &str| -> Option<u64> {
            let line = meminfo.lines().find(|l| l.starts_with(key))?;
            line[key.len()..].split_whitespace().next()?.parse().ok()
        };
        match kib("MemAvailable:") {
            Some(a) => Room::Host {
                available: (a + kib("SwapFree:").unwrap_or(0)) * 1024,
            },
            None => Room::Unknown,
        }
    }
}

/// `4.58 GiB`, or `12.5 MiB` below a GiB.
pub fn size(bytes: u64) -> String {
    if bytes as f64 >= GIB {
        format!("{:.2} GiB", bytes as f64 / GIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The `memory: …` line: weights, KV cache (type, positions × sequences), scratch, and the
/// room.
pub fn line(need: &Need, room: &Room) -> String {
    let w = &need.work;
    let s = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let weights = match (need.device, need.host_weights) {
        (false, _) => format!("weights {} (mapped from the vindex)", size(need.weights)),
        (true, 0) => format!("weights {}", size(need.weights)),
        (true, h) => format!(
            "weights {} (+ {} of walk/MoE FFN weights on the host)",
            size(need.weights),
            size(h)
        ),
    };
    let room = match room {
        Room::Device { name, free, total } => {
            format!("{name} has {} free of {}", size(*free), size(*total))
        }
        Room::Host { available } => format!(
            "the host has {} available (MemAvailable + SwapFree)",
            size(*available)
        ),
        Room::Unknown => "memory available unknown".into(),
    };
    format!(
        "memory: {weights}, KV cache {} ({}, {} × {}), scratch ~{} (steps of up to {}); \
         {room}",
        size(need.kv),
        need.kv_type,
        s(w.positions, "position", "positions"),
        s(w.sequences, "sequence", "sequences"),
        size(need.scratch),
        s(w.step_tokens.max(1), "token", "tokens"),
    )
}

/// The refusal of `need` in `room`, if it does not fit: `what` names the request (the flags
/// and their values), `fix` says which flags to lower. On the host the KV caches against the
/// memory available; on a device weights + KV + scratch against its free memory.
pub fn refusal(need: &Need, room: &Room, what: &str, fix: &str) -> Option<String> {
    let gib = |b: u64| b as f64 / GIB;
    match room {
        Room::Unknown => None,
        Room::Host { available } => (need.kv > *available).then(|| {
            let smaller = match need.kv_type {
                KvType::F32 => " or --kv-type f16 (half the KV cache)",
                KvType::F16 | KvType::Q8_0 => "",
            };
            format!(
                "KV cache: {what} need {:.1} GiB, more than the {:.1} GiB of memory available; \
                 {fix}{smaller}",
                gib(need.kv),
                gib(*available)
            )
        }),
        Room::Device { name, free, total } => (need.compared() > *free).then(|| {
            let smaller = match need.kv_type {
                KvType::F32 => {
                    " or a smaller --kv-type (f16: half the KV cache, q8_0: about a quarter)"
                }
                KvType::F16 => " or --kv-type q8_0 (about half the KV cache)",
                KvType::Q8_0 => "",
            };
            format!(
                "device memory: {what} need {:.2} GiB on {name} (weights {:.2} GiB + KV cache \
                 {:.2} GiB {} + scratch ~{:.2} GiB), more than the {:.2} GiB free of {:.2} GiB; \
                 {fix}{smaller}",
                gib(need.compared()),
                gib(need.weights),
                gib(need.kv),
                need.kv_type,
                gib(need.scratch),
                gib(*free),
                gib(*total),
            )
        }),
    }
}

/// Estimate `w` for `model` on `backend` (its device named `device`), print the `memory:`
/// line on stderr with `explain`, and refuse a workload that does not fit ([`refusal`]).
/// Returns the estimate and the room for the caller's own output.
pub fn check(
    model: &Model<'_>,
    backend: &dyn ComputeBackend,
    device: &str,
    w: &Workload,
    what: &str,
    fix: &str,
    explain: bool,
) -> anyhow::Result<(Need, Room)> {
    let room = Room::of(backend, device);
    let need = estimate(
        &Shape::of(model),
        backend.kv_type(),
        matches!(room, Room::Device { .. }),
        w,
    );
    if explain {
        eprintln!("{}", line(&need, &room));
    }
    if let Some(e) = refusal(&need, &room, what, fix) {
        bail!(e);
    }
    Ok((need, room))
}

/// The host check of `slots` × `ctx` KV positions stored as `kv` from the config alone (every
/// layer `num_key_value_heads · head_dim` wide), before the model is assembled: `serve` on the
/// CPU refuses before it listens.
pub fn check_host_config(
    config: &infer_models::ModelConfig,
    kv: KvType,
    slots: usize,
    ctx: usize,
    what: &str,
    fix: &str,
) -> anyhow::Result<()> {
    let dims = vec![config.num_key_value_heads * config.head_dim; config.num_hidden_layers];
    let need = Need {
        weights: 0,
        host_weights: 0,
        kv: kv_bytes(&dims, kv, ctx) * slots as u64,
        kv_type: kv,
        scratch: 0,
        work: Workload {
            sequences: slots,
            positions: ctx,
            step_tokens: 1,
            logit_rows: 1,
        },
        device: false,
    };
    if let Some(e) = refusal(&need, &Room::host(), what, fix) {
        bail!(e);
    }
    Ok(())
}

/// The estimate and the room as JSON fields (bytes) for `bench --json`.
pub fn json(need: &Need, room: &Room) -> serde_json::Value {
    let (free, total, available) = match room {
        Room::Device { free, total, .. } => (Some(*free), Some(*total), None),
        Room::Host { available } => (None, None, Some(*available)),
        Room::Unknown => (None, None, None),
    };
    serde_json::json!({
        "weights_bytes": need.weights,
        "host_weights_bytes": need.host_weights,
        "kv_cache_bytes": need.kv,
        "kv_type": need.kv_type.name(),
        "scratch_bytes": need.scratch,
        "device_free_bytes": free,
        "device_total_bytes": total,
        "host_available_bytes": available,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Llama-3.1-8B: 32 layers × 8 KV heads × 128 head_dim, hidden 4096, 32 query heads,
    /// FFN 14336, vocabulary 128256; Q4_K_M-sized weights.
    fn llama8b() -> Shape {
        Shape {
            kv_dims: vec![8 * 128; 32],
            hidden: 4096,
            q_dim: 4096,
            q_heads: 32,
            intermediate: 14336,
            vocab: 128256,
            weights: 4_920_000_000,
            host_weights: 0,
        }
    }

    fn one(positions: usize) -> Workload {
        Workload {
            sequences: 1,
            positions,
            step_tokens: 512,
            logit_rows: 1,
        }
    }

    #[test]
    fn kv_bytes_of_llama_8b() {
        let dims = llama8b().kv_dims;
        // 32 layers × (K + V) × 1024 values: 128 KiB per position as f32.
        assert_eq!(kv_bytes(&dims, KvType::F32, 1), 32 * 2 * 1024 * 4);
        assert_eq!(kv_bytes(&dims, KvType::F32, 4096), 1024 * MIB);
        assert_eq!(kv_bytes(&dims, KvType::F16, 4096), 512 * MIB);
        // q8_0: 34 bytes per 32 values, 17/32 of f16's.
        assert_eq!(kv_bytes(&dims, KvType::Q8_0, 4096), 272 * MIB);
        // Per-layer widths are summed as they are (a layer of 2 heads of 64, one of 4 × 128).
        assert_eq!(
            kv_bytes(&[128, 512], KvType::F16, 10),
            10 * 2 * 2 * (128 + 512)
        );
    }

    #[test]
    fn estimate_counts_sequences_and_the_device_scratch() {
        let s = llama8b();
        let host = estimate(&s, KvType::F32, false, &one(4096));
        assert_eq!(host.kv, 1024 * MIB);
        assert!(!host.device && host.compared() == host.kv);
        let mut w = one(4096);
        w.sequences = 4;
        let dev = estimate(&s, KvType::F16, true, &w);
        assert_eq!(dev.kv, 4 * 512 * MIB);
        assert_eq!(dev.compared(), dev.weights + dev.kv + dev.scratch);
        assert!(
            dev.scratch > DEVICE_RESERVE && dev.scratch < 2 << 30,
            "{}",
            dev.scratch
        );
        // One sequence: one cache (the forward pass's, the only one).
        w.sequences = 1;
        let one = estimate(&s, KvType::F16, true, &w);
        assert_eq!(one.kv, 512 * MIB);
        // A decode-only step needs no prompt buffers: less scratch than a 512-token step.
        w.step_tokens = 1;
        assert!(estimate(&s, KvType::F16, true, &w).scratch < one.scratch);
    }

    #[test]
    fn a_device_refusal_names_the_numbers_and_the_flags() {
        let need = estimate(&llama8b(), KvType::F16, true, &one(131072));
        assert_eq!(need.kv, 16 << 30);
        let room = |free: u64| Room::Device {
            name: "cuda:0".into(),
            free,
            total: 80 << 30,
        };
        assert!(refusal(&need, &room(need.compared()), "x", "y").is_none());
        let e = refusal(
            &need,
            &room(need.compared() - 1),
            "--ctx 131072 positions",
            "lower --ctx",
        )
        .expect("refused");
        let want = format!(
            "device memory: --ctx 131072 positions need {:.2} GiB on cuda:0 (weights 4.58 GiB \
             + KV cache 16.00 GiB f16 + scratch ~{:.2} GiB), more than the {:.2} GiB free of \
             80.00 GiB; lower --ctx or --kv-type q8_0",
            need.compared() as f64 / GIB,
            need.scratch as f64 / GIB,
            (need.compared() - 1) as f64 / GIB,
        );
        assert!(e.starts_with(&want), "{e}\n{want}");
        let l = line(&need, &room(10 << 30));
        assert!(
            l.starts_with(
                "memory: weights 4.58 GiB, KV cache 16.00 GiB (f16, 131072 positions × 1 sequence), scratch ~"
            ) && l.ends_with("(steps of up to 512 tokens); cuda:0 has 10.00 GiB free of 80.00 GiB"),
            "{l}"
        );
    }

    #[test]
    fn the_host_refuses_the_kv_cache_alone_as_before() {
        // SmolLM2-1.7B-like: 30 layers × 3 KV heads × 64, f32: 46080 bytes per position.
        let s = Shape {
            kv_dims: vec![3 * 64; 30],
            hidden: 2048,
            q_dim: 2048,
            q_heads: 32,
            intermediate: 8192,
            vocab: 49152,
            weights: 3 << 30,
            host_weights: 0,
        };
        let mut w = one(8101);
        w.sequences = 4096;
        let need = estimate(&s, KvType::F32, false, &w);
        assert_eq!(need.kv, 4096 * 8101 * 46080);
        let what = "4096 sequences × 8101 positions (-p + -n + 1)";
        let e = refusal(
            &need,
            &Room::Host {
                available: 64 << 30,
            },
            what,
            "lower -B, -p or -n",
        )
        .expect("refused");
        assert_eq!(
            e,
            "KV cache: 4096 sequences × 8101 positions (-p + -n + 1) need 1424.0 GiB, more than \
             the 64.0 GiB of memory available; lower -B, -p or -n or --kv-type f16 (half the KV \
             cache)"
        );
        // The weights (mapped) and scratch are not compared on the host.
        let small = estimate(&s, KvType::F32, false, &one(4096));
        let room = Room::Host {
            available: small.kv,
        };
        assert!(refusal(&small, &room, what, "").is_none());
        assert!(refusal(&small, &Room::Unknown, what, "").is_none());
        assert!(line(&small, &room).contains(
            "weights 3.00 GiB (mapped from the vindex), KV cache 180.0 MiB (f32, 4096 positions"
        ));
    }
}
