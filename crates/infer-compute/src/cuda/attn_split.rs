//! How the forward pass's decode attention splits each kv head's keys over blocks (flash
//! decoding, `rope_attend` in `tensor_ops.rs`): the split count of a cache and the key-split
//! kernel (`dec_attn_split*` in decode.cu, merged by `dec_attn_merge` when there is more than one
//! split) for a head shape.

use cudarc::driver::CudaFunction;

use super::device::Device;

/// Threads of a `dec_attn_merge` block (`DEC_THREADS` in decode.cu).
pub(super) const DEC_THREADS: u32 = 256;
/// Largest group of query heads × head_dim that `dec_attn_split*` and `dec_attn_merge` hold
/// in shared memory (`MAX_HD` in decode.cu).
const MAX_HEAD_DIM: usize = 1024;
/// KV caches of more than `ATT_SPLIT_MIN_CONTEXT` positions split each kv head's keys over
/// one `dec_attn_split*` block per `ATT_SPLIT_KEYS` positions, at most `ATT_MAX_SPLITS`;
/// smaller caches by [`row_attention_splits`].
const ATT_SPLIT_MIN_CONTEXT: usize = 512;
const ATT_SPLIT_KEYS: usize = 128;
const ATT_MAX_SPLITS: usize = 64;
/// Threads of a `dec_attn_split*` block (`SPLIT_WARPS` warps in decode.cu).
pub(super) const ATT_SPLIT_THREADS: u32 = 128;
/// Query heads per kv head that `dec_attn_split*` holds (`SPLIT_GRP` in decode.cu).
const SPLIT_GRP: usize = 8;

/// Key splits of a layer's attention for a KV cache of `context` positions past
/// [`ATT_SPLIT_MIN_CONTEXT`] (1 up to it): by the keys the layer can attend to (`window`: > 0
/// a sliding window, < 0 no key visible, 0 the whole cache).
fn attention_splits(context: usize, window: i32) -> usize {
    let keys = attended_keys(context, window);
    if keys <= ATT_SPLIT_MIN_CONTEXT {
        return 1;
    }
    keys.div_ceil(ATT_SPLIT_KEYS).min(ATT_MAX_SPLITS)
}

/// The positions a layer attends to in a cache of `context` (`window` as in
/// [`attention_splits`]).
fn attended_keys(context: usize, window: i32) -> usize {
    match window {
        w if w > 0 => context.min(w as usize),
        w if w < 0 => 0,
        _ => context,
    }
}

/// Positions per key split of a small cache in the forward pass's decode attention: one step
/// of a `dec_attn_split*` block's tile loop (`SPLIT_WARPS` warps × `TK` keys). H100, one
/// Qwen3-30B-A3B decode token at a 128-position cache: 5.88 ms of device time with one
/// `t_rope_attend` block per query head, 4.28 ms with splits of 32 positions (4.33 with 64).
const SMALL_SPLIT_KEYS: usize = 32;

/// Key splits of the forward pass's decode attention over a batch (`blocks_per_split` blocks
/// for each split: kv heads × rows): [`attention_splits`] past `ATT_SPLIT_MIN_CONTEXT`
/// positions; a smaller cache is split into pieces of at least [`SMALL_SPLIT_KEYS`]
/// positions, no more than fill the device's `sms` multiprocessors once (1: no split). The
/// count follows the cache's size, not the position, so a decode step's launches stay the
/// same over a decode (one CUDA graph).
pub(super) fn row_attention_splits(
    context: usize,
    window: i32,
    blocks_per_split: usize,
    sms: usize,
) -> usize {
    let s = attention_splits(context, window);
    if s > 1 {
        return s;
    }
    attended_keys(context, window)
        .div_ceil(SMALL_SPLIT_KEYS)
        .min(sms.div_ceil(blocks_per_split.max(1)))
        .max(1)
}

/// The key-split attention kernel (`dec_attn_split*`) for heads of `head_dim` values with `grp`
/// query heads per kv head: `None` unless head_dim is a multiple of 8 and at most 256 (the
/// kernel reads 8 values of a key at a time), `grp` is at most `SPLIT_GRP` and the group's
/// heads fit the kernel's shared memory.
pub(super) fn split_kernel(dev: &Device, grp: usize, head_dim: usize) -> Option<&CudaFunction> {
    if grp == 0 || grp > SPLIT_GRP || grp * head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(8) {
        return None;
    }
    let class = match head_dim {
        0..=64 => 0,
        65..=128 => 1,
        129..=256 => 2,
        _ => return None,
    };
    Some(&dev.k.dec_attn_split[class + if grp > 4 { 3 } else { 0 }])
}

// decode.cu's limits: `dec_attn_merge` holds `wt[64]` and takes one split per thread of its
// DEC_THREADS block; `dec_attn_split*` runs SPLIT_WARPS = 4 warps.
const _: () = assert!(ATT_MAX_SPLITS <= 64 && ATT_MAX_SPLITS <= DEC_THREADS as usize);
const _: () = assert!(ATT_SPLIT_THREADS == 4 * 32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_follow_the_keys_a_layer_attends_to() {
        // Up to 512 keys: one split; past it one per 128 keys, at most 64.
        assert_eq!(attention_splits(512, 0), 1);
        assert_eq!(attention_splits(513, 0), 5);
        assert_eq!(attention_splits(1 << 20, 0), ATT_MAX_SPLITS);
        // A sliding window bounds the keys; no key visible: one split.
        assert_eq!(attention_splits(4096, 256), 1);
        assert_eq!(attention_splits(4096, -1), 1);
        // A small cache: pieces of 32 keys, no more than fill the multiprocessors once.
        assert_eq!(row_attention_splits(128, 0, 8, 132), 4);
        assert_eq!(row_attention_splits(128, 0, 132, 132), 1);
        assert_eq!(row_attention_splits(4096, 0, 8, 132), 32);
    }
}
