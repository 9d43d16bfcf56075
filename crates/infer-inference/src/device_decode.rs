//! [`TokenRunner`]: forward passes through a backend's device-resident whole-token decoder
//! ([`ComputeBackend::token_decoder`], the seed's `decode_token`) when it has one and the model
//! can be expressed as a [`DecodePlan`], else through the host loop ([`Model::forward_into`]).
//! Prefill (several tokens) always runs the host loop with the backend's products; the K/V rows
//! it writes are copied to the device cache before the next device step, and rows the device
//! wrote are copied back before the next host pass, so both caches agree wherever they are read
//! (device to device when the host loop's cache is in the decoder's device memory).

use infer_compute::{ComputeBackend, DecodePlan, MatData, PlanBiases, PlanLayer, TokenDecoder};
use infer_models::{FfnType, NormType};

use crate::forward::Logits;
use crate::layer::Ffn;
use crate::layer::{Linear, NormWeights, WeightData};
use crate::{InferenceError, KvCache, Model};

impl Model<'_> {
    /// This model as a [`DecodePlan`] with a KV cache of `context` positions, or the reason it
    /// has none: the plan covers pre-norm RMSNorm blocks with quantized or float Linear weights
    /// (biases on quantized ones), a dense FFN, RoPE or no positional encoding (not learned positions), no
    /// parallel residual and no OLMo-2 style whole-projection q/k norm.
    pub fn decode_plan(&self, context: usize) -> Result<DecodePlan<'_>, String> {
        if self.position_embeddings.is_some() {
            return Err("learned position embeddings".into());
        }
        if self.lm_head_bias.is_some() {
            return Err("an lm_head bias".into());
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            let g = &l.geometry;
            let at = |what: &str| format!("layer {i}: {what}");
            if g.norm_type != NormType::RmsNorm {
                return Err(at("LayerNorm"));
            }
            if g.parallel_residual {
                return Err(at("parallel residual"));
            }
            if g.qk_norm_whole_projection {
                return Err(at("whole-projection q/k norm"));
            }
            if l.attn_sinks.is_some() {
                return Err(at("attention sinks"));
            }
            if g.rope.is_some_and(|r| r.attention_factor() != 1.0) {
                return Err(at("YaRN RoPE (scaled cos/sin)"));
            }
            let Ffn::Dense(d) = &l.ffn else {
                return Err(at("walk or MoE FFN"));
            };
            let norm = |n| norm_weight(n).map_err(&at);
            let pre_attn_norm =
                norm(&l.pre_attn_norm)?.ok_or_else(|| at("no pre-attention norm"))?;
            let pre_ffn_norm = norm(&l.pre_ffn_norm)?.ok_or_else(|| at("no pre-FFN norm"))?;
            let (gate, gate_bias) = match (&d.gate, g.ffn_type) {
                (Some(gate), FfnType::Gated) => {
                    (Some(plan_weight(gate).map_err(|e| at(&e))?), bias_of(gate))
                }
                _ => (None, None),
            };
            layers.push(PlanLayer {
                pre_attn_norm,
                post_attn_norm: norm(&l.post_attn_norm)?,
                pre_ffn_norm,
                post_ffn_norm: norm(&l.post_ffn_norm)?,
                q_norm: norm(&l.q_norm)?,
                k_norm: norm(&l.k_norm)?,
                wq: plan_weight(&l.wq).map_err(|e| at(&e))?,
                wk: plan_weight(&l.wk).map_err(|e| at(&e))?,
                wv: plan_weight(&l.wv).map_err(|e| at(&e))?,
                wo: plan_weight(&l.wo).map_err(|e| at(&e))?,
                gate,
                up: plan_weight(&d.up).map_err(|e| at(&e))?,
                down: plan_weight(&d.down).map_err(|e| at(&e))?,
                biases: PlanBiases {
                    q: bias_of(&l.wq),
                    k: bias_of(&l.wk),
                    v: bias_of(&l.wv),
                    o: bias_of(&l.wo),
                    gate: gate_bias,
                    up: bias_of(&d.up),
                    down: bias_of(&d.down),
                },
                intermediate_size: g.intermediate_size,
                attention: g.attention,
                rope: g.rope,
                activation: crate::walk::compute_activation(g.activation),
                eps: g.eps,
                norm_offset: g.norm_offset,
                residual_multiplier: g.residual_multiplier,
            });
        }
        if self.final_norm.bias.is_some() {
            return Err("a final norm bias".into());
        }
        let lm_head = match &self.lm_head {
            None => None,
            Some(w) => Some(weight_data(w)?),
        };
        Ok(DecodePlan {
            hidden_size: self.hidden_size,
            vocab_size: self.vocab_size,
            embeddings: self.embeddings.table(),
            embedding_scale: self.arch.embedding_scale(),
            layers,
            final_norm: &self.final_norm.weight,
            final_eps: self.arch.norm_eps() as f32,
            final_norm_offset: self.arch.norm_weight_offset(),
            lm_head,
            logits_divisor: self.arch.logits_divisor(),
            final_softcap: self.arch.final_logit_softcap().map(|c| c as f32),
            context,
        })
    }
}

/// A bias-free RMSNorm weight (`None` when the norm is absent).
fn norm_weight<'w>(n: &'w Option<NormWeights<'_>>) -> Result<Option<&'w [f32]>, &'static str> {
    match n {
        None => Ok(None),
        Some(NormWeights { bias: Some(_), .. }) => Err("a norm bias"),
        Some(n) => Ok(Some(&n.weight[..])),
    }
}

/// A Linear's weight as a plan weight (its bias: [`bias_of`]). Errors: a format the device
/// decoder has no kernel for, or a bias on a float weight (the device adds biases in the
/// quantized mat-vecs only).
fn plan_weight<'w>(l: &'w Linear<'_>) -> Result<MatData<'w>, String> {
    let data = weight_data(&l.weight)?;
    if l.bias.is_some() && !matches!(data, MatData::Blocks { .. }) {
        return Err("a Linear bias on a float weight".into());
    }
    Ok(data)
}

/// A Linear's `[out_features]` bias, if it has one.
fn bias_of<'w>(l: &'w Linear<'_>) -> Option<&'w [f32]> {
    l.bias.as_deref()
}

fn weight_data<'w>(w: &'w WeightData<'_>) -> Result<MatData<'w>, String> {
    match w.view() {
        MatData::SplitQ8 { .. } => Err("the Q8 (int8 + f32 scales) attention tier".into()),
        data => Ok(data),
    }
}

/// A [`TokenDecoder`] and how far each cache holds real rows.
struct DeviceCache<'b> {
    decoder: Box<dyn TokenDecoder + 'b>,
    /// Positions `0..device_valid` of the device cache equal the host's.
    device_valid: usize,
    /// Positions `0..host_valid` of the host cache hold K/V (later ones only on the device).
    host_valid: usize,
}

impl DeviceCache<'_> {
    /// Copy the device cache's rows `host_valid..len` to the host cache.
    fn download_rows(
        &mut self,
        backend: &dyn ComputeBackend,
        cache: &mut KvCache,
    ) -> Result<(), InferenceError> {
        let len = cache.len();
        self.host_valid = self.host_valid.min(len);
        if self.host_valid == len {
            return Ok(());
        }
        // A decode that started on the device leaves the host-loop cache unallocated.
        cache.ensure(backend)?;
        for l in 0..cache.layers() {
            let rows = len - self.host_valid;
            let (k, v) = cache.layer_mut(l);
            if self.decoder.read_kv_into(l, self.host_valid, rows, k, v)? {
                continue; // device to device
            }
            let n = rows * cache.kv_dim(l);
            let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
            self.decoder.read_kv(l, self.host_valid, &mut k, &mut v)?;
            cache.write_rows(backend, l, self.host_valid, &k, &v)?;
        }
        self.host_valid = len;
        Ok(())
    }

    /// Copy the host cache's rows `device_valid..len` to the device.
    fn upload_rows(
        &mut self,
        backend: &dyn ComputeBackend,
        cache: &KvCache,
    ) -> Result<(), InferenceError> {
        let len = cache.len();
        self.device_valid = self.device_valid.min(len);
        if self.device_valid == len {
            // The usual decode step: the device already holds every row.
            return Ok(());
        }
        for l in 0..cache.layers() {
            let rows = len - self.device_valid;
            let (k, v) = cache.layer(l);
            if self
                .decoder
                .write_kv_from(l, self.device_valid, rows, k, v)?
            {
                continue; // device to device
            }
            let n = rows * cache.kv_dim(l);
            let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
            cache.read_rows(backend, l, self.device_valid, &mut k, &mut v)?;
            self.decoder.write_kv(l, self.device_valid, &k, &v)?;
        }
        self.device_valid = len;
        Ok(())
    }
}

/// One device step of `token` at position `cache.len()`: check the id and the room, upload
/// the host-only K/V rows, `run` the decoder at that position, and advance both caches when
/// `run` says a step ran (`Ok(false)`: the decoder declined, nothing changed).
fn device_step(
    dev: &mut DeviceCache<'_>,
    model: &Model<'_>,
    backend: &dyn ComputeBackend,
    token: u32,
    cache: &mut KvCache,
    run: impl FnOnce(&mut dyn TokenDecoder, usize) -> Result<bool, infer_compute::ComputeError>,
) -> Result<bool, InferenceError> {
    if token as usize >= model.vocab_size {
        return Err(InferenceError::TokenOutOfRange {
            id: token,
            vocab: model.vocab_size,
        });
    }
    cache.check_room(1)?;
    dev.upload_rows(backend, cache)?;
    let len = cache.len();
    if !run(&mut *dev.decoder, len)? {
        return Ok(false);
    }
    cache.advance(1);
    dev.device_valid = len + 1;
    Ok(true)
}

/// See the [module docs](self).
pub struct TokenRunner<'m, 'a> {
    model: &'m Model<'a>,
    backend: &'m dyn ComputeBackend,
    device: Option<DeviceCache<'m>>,
    /// Why the model has no [`DecodePlan`] (single tokens then run the host loop on any
    /// backend); `None` when it has one.
    pub host_reason: Option<String>,
}

impl<'m, 'a> TokenRunner<'m, 'a> {
    /// A runner for caches of `context` positions. With `device_decode`, when `backend` offers
    /// a device decoder and the model has a [`DecodePlan`], the weights are uploaded and the
    /// device KV cache allocated here; without, every pass runs the host loop. Errors: the
    /// device fails while setting up.
    pub fn new(
        model: &'m Model<'a>,
        backend: &'m dyn ComputeBackend,
        context: usize,
        device_decode: bool,
    ) -> Result<Self, InferenceError> {
        let mut host_reason = None;
        let device = match model.decode_plan(context) {
            Ok(_) if !device_decode => None,
            Ok(plan) => backend.token_decoder(&plan)?.map(|decoder| DeviceCache {
                decoder,
                device_valid: 0,
                host_valid: 0,
            }),
            Err(why) => {
                host_reason = Some(why);
                None
            }
        };
        Ok(TokenRunner {
            model,
            backend,
            device,
            host_reason,
        })
    }

    /// True when single-token steps run on the device decoder.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// Run `tokens` at positions `cache.len()..` and write the logits into `logits` (as
    /// [`Model::forward_into`]). One token with a device decoder: one device step; otherwise the
    /// host loop. Errors as [`Model::forward`], plus device failures.
    pub fn forward_into(
        &mut self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        logits: &mut Vec<f32>,
    ) -> Result<(), InferenceError> {
        let len = cache.len();
        let Some(dev) = &mut self.device else {
            return self
                .model
                .forward_into(self.backend, tokens, cache, which, logits);
        };
        // The caller may have truncated or cleared the cache since the last call: device rows
        // past its length are stale (the host's are trimmed in `download_rows`).
        dev.device_valid = dev.device_valid.min(len);
        if tokens.len() != 1 {
            // Host pass: copy the rows only the device has into the host cache first.
            dev.download_rows(self.backend, cache)?;
            self.model
                .forward_into(self.backend, tokens, cache, which, logits)?;
            dev.host_valid = cache.len();
            return Ok(());
        }
        logits.resize(self.model.vocab_size, 0.0);
        device_step(dev, self.model, self.backend, tokens[0], cache, |d, pos| {
            d.step(tokens[0], pos, logits).map(|()| true)
        })?;
        Ok(())
    }

    /// Copy the K/V rows a host pass wrote into `cache` to the device decoder's cache now
    /// (the next device step would copy them first), e.g. to keep that copy out of a timed
    /// decode; nothing without a device decoder. Errors: a device failure.
    pub fn sync_to_device(&mut self, cache: &KvCache) -> Result<(), InferenceError> {
        if let Some(dev) = &mut self.device {
            dev.device_valid = dev.device_valid.min(cache.len());
            dev.upload_rows(self.backend, cache)?;
        }
        Ok(())
    }

    /// One token at position `cache.len()` and the greedy next token: the largest logit, ties
    /// to the smaller id ([`crate::sampling::argmax`]). The device decoder chooses it where the
    /// logits are when it can ([`TokenDecoder::step_argmax`]: no logits copied back, `logits`
    /// untouched); otherwise [`TokenRunner::forward_into`] writes `logits` and the host picks.
    /// Errors as [`TokenRunner::forward_into`], and [`InferenceError::NonFiniteLogits`] when a
    /// logit is NaN or infinite (the cache has advanced past `token` by then).
    pub fn forward_greedy(
        &mut self,
        token: u32,
        cache: &mut KvCache,
        logits: &mut Vec<f32>,
    ) -> Result<u32, InferenceError> {
        if let Some(dev) = &mut self.device {
            dev.device_valid = dev.device_valid.min(cache.len());
            let mut chosen = None;
            device_step(dev, self.model, self.backend, token, cache, |d, pos| {
                chosen = d.step_argmax(token, pos)?;
                Ok(chosen.is_some())
            })?;
            if let Some(a) = chosen {
                if !a.all_finite {
                    return Err(InferenceError::NonFiniteLogits);
                }
                return Ok(a.token);
            }
        }
        if self.device.is_none() {
            // The forward pass chooses where the logits are.
            return self.model.forward_greedy(self.backend, &[token], cache);
        }
        self.forward_into(&[token], cache, Logits::Last, logits)?;
        if logits.iter().any(|v| !v.is_finite()) {
            return Err(InferenceError::NonFiniteLogits);
        }
        Ok(crate::sampling::argmax(logits))
    }

    /// Device time per kernel kind of one device step of `token` at position `cache.len()`
    /// ([`TokenDecoder::profile_step`]: name, launches, µs); empty without a device decoder.
    /// The step writes K/V at that position but the cache is not advanced. Errors: a full
    /// cache, a token outside the vocabulary, device failures.
    pub fn profile_step(
        &mut self,
        token: u32,
        cache: &KvCache,
    ) -> Result<Vec<(String, usize, f64)>, InferenceError> {
        let Some(dev) = &mut self.device else {
            return Ok(Vec::new());
        };
        cache.check_room(1)?;
        if token as usize >= self.model.vocab_size {
            return Err(InferenceError::TokenOutOfRange {
                id: token,
                vocab: self.model.vocab_size,
            });
        }
        dev.upload_rows(self.backend, cache)?;
        Ok(dev.decoder.profile_step(token, cache.len())?)
    }
}
