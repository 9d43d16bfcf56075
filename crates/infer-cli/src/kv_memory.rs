//! Refusing KV caches that cannot fit in memory, before anything is allocated.

use anyhow::bail;

/// Refuse `slots` × `ctx` KV positions (f32 K and V of every layer, allocated at start) that
/// need more than the memory the kernel says is available (`MemAvailable` + `SwapFree` of
/// /proc/meminfo; no check where it cannot be read): touching them would end in the OOM
/// killer, after the work had started. `what` names the request in the error (the flags and
/// their values), `fix` says which flags to lower.
pub fn check(
    config: &infer_models::ModelConfig,
    slots: usize,
    ctx: usize,
    what: &str,
    fix: &str,
) -> anyhow::Result<()> {
    let per_position = config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 8;
    let need = (slots as f64) * (ctx as f64) * per_position as f64;
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
        return Ok(());
    };
    let kib = |key: &str| -> Option<f64> {
        let line = meminfo.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].split_whitespace().next()?.parse().ok()
    };
    let Some(available) = kib("MemAvailable:") else {
        return Ok(());
    };
    let available = (available + kib("SwapFree:").unwrap_or(0.0)) * 1024.0;
    if need > available {
        let gib = |b: f64| b / (1u64 << 30) as f64;
        bail!(
            "KV cache: {what} need {:.1} GiB, more than the {:.1} GiB of memory available; {fix}",
            gib(need),
            gib(available)
        );
    }
    Ok(())
}
