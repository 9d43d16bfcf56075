//! The forward pass — one loop for prefill (many tokens) and decode (one token).

use infer_compute::{
    ops, Argmax, Chosen, ComputeBackend, ComputeError, KvSlot, ResidualNorm, RopeAttend,
    RoutedProj, Tensor, TensorProj,
};
use infer_models::{FfnType, NormType};

use crate::layer::{DenseFfn, Ffn, FullPipelineLayer, Linear, MoeFfn, NormWeights};
use crate::scratch::{FfnScratch, Scratch};
use crate::walk::{layer_walk_ffn, walk_ffn, WalkBuffers};
use crate::{InferenceError, KvCache, Model};

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's `[vocab]` logits (generation).
    Last,
    /// Every position's `[T, vocab]` logits (evaluation, perplexity).
    All,
}

/// Hidden states captured per layer for debugging/tests: entry 0 is the embedding output,
/// entry i the output of layer i (the last replaced by the final-norm output, HF convention).
pub type HiddenStates = Vec<Vec<f32>>;

/// What a forward pass records besides the logits.
enum Capture<'c> {
    Nothing,
    /// Every position's hidden state after each layer ([`HiddenStates`]).
    Hidden(&'c mut HiddenStates),
    /// The last position's FFN input (after the pre-FFN norm) of each layer, `[hidden]` each.
    FfnInputs(&'c mut Vec<Vec<f32>>),
}

/// What a forward pass hands back: the logits on the host, or only the greedy choice of each
/// sequence (chosen where the logits are: [`ComputeBackend::argmax_rows`]).
enum Output<'o> {
    Logits(&'o mut Vec<f32>),
    Greedy(&'o mut Vec<Argmax>),
    /// The greedy choices left where they were made, on their way to the host
    /// ([`ComputeBackend::argmax_rows_later`]).
    Later(&'o mut Chosen),
}

/// The token ids of a pass: given, or the greedy choices of the pass before, read where they
/// were made ([`ComputeBackend::embed_chosen`]).
#[derive(Clone, Copy)]
enum Feed<'f> {
    Ids(&'f [u32]),
    Chosen(&'f Chosen),
}

/// The norm that follows a block: the next layer's pre-attention norm (with that layer's
/// geometry) or the final norm; `norm: None` for a next layer without one (a copy).
#[derive(Clone, Copy)]
struct NextNorm<'n, 'w> {
    norm: Option<&'n NormWeights<'w>>,
    g: &'n crate::LayerGeometry,
}

/// One sequence's part of a [`Model::forward_batch`] step.
pub struct BatchSeq<'b> {
    /// Token ids run at positions `cache.len()..`: a prompt chunk or one decode token.
    pub tokens: &'b [u32],
    /// This sequence's KV cache (its slot); advanced by `tokens.len()` on success.
    pub cache: &'b mut KvCache,
    /// Which of its logits the step returns.
    pub logits: Logits,
}

impl BatchSeq<'_> {
    /// Rows of `[vocab]` logits this sequence contributes to the step's output: 1 for
    /// [`Logits::Last`], `tokens.len()` for [`Logits::All`].
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            Logits::Last => 1,
            Logits::All => self.tokens.len(),
        }
    }
}

/// Activation buffers reused by [`Model::forward_batch`] across steps (so that a step of the
/// same or a smaller batch allocates nothing in this crate).
#[derive(Debug, Default)]
pub struct BatchBuffers {
    scratch: Scratch,
}

/// Where the rows of one sequence sit in a batch step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    /// First row of the sequence in the batch's `[R, width]` buffers.
    pub(crate) row0: usize,
    /// Its number of rows (tokens).
    pub(crate) rows: usize,
}

/// The state of one forward pass over a batch.
struct Pass<'p, 'b, 'c> {
    backend: &'p dyn ComputeBackend,
    seqs: &'p mut [BatchSeq<'b>],
    s: &'p mut Scratch,
    capture: Capture<'c>,
    /// The choices the rows' token ids are (the sequences' `tokens` then only count rows).
    chosen: Option<&'p Chosen>,
}

impl Pass<'_, '_, '_> {
    /// Check every sequence (tokens present, room in its cache) and lay out the batch's rows:
    /// token ids, absolute positions and each sequence's [`Span`].
    fn plan_rows(&mut self) -> Result<(), InferenceError> {
        if self.seqs.is_empty() {
            return Err(InferenceError::EmptyInput);
        }
        let s = &mut *self.s;
        s.tokens.clear();
        s.positions.clear();
        s.spans.clear();
        for q in self.seqs.iter() {
            if q.tokens.is_empty() {
                return Err(InferenceError::EmptyInput);
            }
            q.cache.check_room(q.tokens.len())?;
            let start = q.cache.len();
            s.spans.push(Span {
                row0: s.tokens.len(),
                rows: q.tokens.len(),
            });
            s.tokens.extend_from_slice(q.tokens);
            s.positions.extend(start..start + q.tokens.len());
        }
        Ok(())
    }
}

/// Runs `f` on a worker of rayon's current pool. Called from a thread outside the pool (the
/// CLI's main thread), every parallel product would otherwise be injected into the pool and
/// the caller put to sleep on a latch until it is done: two futex wake-ups per product, ~120
/// per decoded token. Entering the pool once per forward pass makes the nested parallel
/// regions plain work-stealing joins.
fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_num_threads() <= 1 || rayon::current_thread_index().is_some() {
        f()
    } else {
        let mut out = None;
        rayon::scope(|_| out = Some(f()));
        match out {
            Some(r) => r,
            None => unreachable!("rayon::scope runs its closure"),
        }
    }
}

impl Model<'_> {
    /// KV-dim of every layer, to size a [`KvCache`].
    pub fn kv_dims(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.geometry.kv_dim()).collect()
    }

    /// A KV cache for `context` positions.
    pub fn new_cache(&self, context: usize) -> KvCache {
        let head_dims: Vec<usize> = self.layers.iter().map(|l| l.geometry.head_dim).collect();
        KvCache::new(&self.kv_dims(), &head_dims, context)
    }

    /// Run `tokens` at positions `cache.len()..` through every layer, append their K/V to the
    /// cache, and return logits (`[vocab]` or `[T, vocab]`). Errors: empty input, a token id
    /// outside the vocabulary, or a full cache (checked before anything is written).
    pub fn forward(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>, InferenceError> {
        let mut logits = Vec::new();
        self.forward_into(backend, tokens, cache, which, &mut logits)?;
        Ok(logits)
    }

    /// [`Model::forward`] writing the logits (`[vocab]` or `[T, vocab]` f32) into `logits`,
    /// which is resized to fit. With a reused `logits` buffer and cache, a decode step
    /// allocates nothing in this crate once the cache's scratch buffers have grown to the
    /// largest batch seen (kernels of `infer-compute` may still allocate their own temporaries).
    /// Errors as [`Model::forward`]; on error `logits` holds unspecified values.
    pub fn forward_into(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        logits: &mut Vec<f32>,
    ) -> Result<(), InferenceError> {
        self.forward_inner(
            backend,
            Feed::Ids(tokens),
            cache,
            which,
            Capture::Nothing,
            Output::Logits(logits),
        )
    }

    /// Run `tokens` at positions `cache.len()..` (as [`Model::forward`]) and return the greedy
    /// next token: the largest logit of the last position, ties to the smaller id
    /// ([`crate::sampling::argmax`]). The choice is made where the logits are
    /// ([`ComputeBackend::argmax_rows`]: on a device backend only the token id is copied
    /// back). Errors as [`Model::forward`], and [`InferenceError::NonFiniteLogits`] when a
    /// logit is NaN or infinite (the cache has advanced past `tokens` by then).
    pub fn forward_greedy(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<u32, InferenceError> {
        let mut chosen = Vec::with_capacity(1);
        self.forward_inner(
            backend,
            Feed::Ids(tokens),
            cache,
            Logits::Last,
            Capture::Nothing,
            Output::Greedy(&mut chosen),
        )?;
        match chosen.first() {
            Some(a) if a.all_finite => Ok(a.token),
            _ => Err(InferenceError::NonFiniteLogits),
        }
    }

    /// Greedy decode of one sequence: runs `first` at position `cache.len()`, then each token
    /// chosen (the largest logit, ties to the smaller id, [`crate::sampling::argmax`]) in
    /// turn, and hands each choice to `on_token`, which returns whether to go on. Stops after
    /// `max_new` choices, when `on_token` says so, or when the cache is full; returns the
    /// choices made. The cache then holds `first` and every choice but the last (as a loop
    /// of [`Model::forward_greedy`] would leave it).
    ///
    /// Where a device makes the choices ([`ComputeBackend::argmax_rows_later`] leaves them
    /// there), the next step is recorded and launched from the device's choice
    /// ([`ComputeBackend::embed_chosen`]) before the host reads it: the host's work for
    /// step `i + 1` overlaps the device's for step `i`. A step run ahead of a stop is dropped
    /// from the cache. A host backend chooses at once and runs no step ahead.
    ///
    /// Errors as [`Model::forward_greedy`] (a choice with non-finite logits:
    /// [`InferenceError::NonFiniteLogits`]), and those of `on_token`.
    pub fn decode_greedy(
        &self,
        backend: &dyn ComputeBackend,
        first: u32,
        cache: &mut KvCache,
        max_new: usize,
        mut on_token: impl FnMut(u32) -> Result<bool, InferenceError>,
    ) -> Result<usize, InferenceError> {
        if max_new == 0 || cache.check_room(1).is_err() {
            return Ok(0);
        }
        let step = |feed: Feed<'_>, cache: &mut KvCache, out: &mut Chosen| {
            self.forward_inner(
                backend,
                feed,
                cache,
                Logits::Last,
                Capture::Nothing,
                Output::Later(out),
            )
        };
        let (mut cur, mut next) = (Chosen::default(), Chosen::default());
        step(Feed::Ids(&[first]), cache, &mut cur)?;
        let mut picks = Vec::with_capacity(1);
        let mut made = 0;
        loop {
            let wanted = made + 1 < max_new && cache.check_room(1).is_ok();
            // The step of the choice not read yet, from where it is.
            let ahead = wanted && cur.host.is_none();
            if ahead {
                step(Feed::Chosen(&cur), cache, &mut next)?;
            }
            backend.take_chosen(&cur, &mut picks)?;
            let Some(a) = picks.first().copied() else {
                return Err(InferenceError::EmptyInput);
            };
            if !a.all_finite {
                return Err(InferenceError::NonFiniteLogits);
            }
            made += 1;
            if !(on_token(a.token)? && wanted) {
                if ahead {
                    cache.truncate(cache.len() - 1);
                }
                return Ok(made);
            }
            if !ahead {
                step(Feed::Ids(&[a.token]), cache, &mut next)?;
            }
            std::mem::swap(&mut cur, &mut next);
        }
    }

    /// Prefill: run the whole prompt as one batch (every layer, matrix-matrix products) and
    /// return the last position's logits `[vocab]`.
    pub fn prefill(
        &self,
        backend: &dyn ComputeBackend,
        prompt: &[u32],
        cache: &mut KvCache,
    ) -> Result<Vec<f32>, InferenceError> {
        self.forward(backend, prompt, cache, Logits::Last)
    }

    /// Decode one token through all layers (the seed's `decode_token`), appending its K/V to
    /// the cache; returns its logits `[vocab]`.
    pub fn decode_token(
        &self,
        backend: &dyn ComputeBackend,
        token: u32,
        cache: &mut KvCache,
    ) -> Result<Vec<f32>, InferenceError> {
        self.forward(backend, &[token], cache, Logits::Last)
    }

    /// Like [`Model::forward`], also returning the hidden states after each layer.
    pub fn forward_with_hidden(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<(Vec<f32>, HiddenStates), InferenceError> {
        let mut hidden = Vec::new();
        let mut logits = Vec::new();
        self.forward_inner(
            backend,
            Feed::Ids(tokens),
            cache,
            which,
            Capture::Hidden(&mut hidden),
            Output::Logits(&mut logits),
        )?;
        Ok((logits, hidden))
    }

    /// Like [`Model::forward`] with [`Logits::Last`], also returning, for each layer, the last
    /// token's FFN input: the residual stream after attention passed through the pre-FFN norm
    /// (for a parallel-residual block without its own FFN norm, the shared pre-attention norm
    /// output), `[hidden]` f32 — the `x` of `FFN(x) = Σᵢ act(gᵢ·x)(uᵢ·x)dᵢ` that `infer walk`
    /// inspects.
    pub fn forward_with_ffn_inputs(
        &self,
        backend: &dyn ComputeBackend,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>), InferenceError> {
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut logits = Vec::new();
        self.forward_inner(
            backend,
            Feed::Ids(tokens),
            cache,
            Logits::Last,
            Capture::FfnInputs(&mut inputs),
            Output::Logits(&mut logits),
        )?;
        Ok((logits, inputs))
    }

    /// One step for a batch of sequences: each [`BatchSeq`] runs its `tokens` (a prompt chunk,
    /// or one decode token) at positions `cache.len()..` of its own cache, and the steps of
    /// prefilling and decoding sequences mix freely. The matrix products see every row of the
    /// batch at once (each weight matrix is read once per step for all sequences); RoPE uses
    /// each row's own position and attention runs per sequence against its own cache.
    ///
    /// `logits` is resized to the concatenation, in batch order, of each sequence's logits:
    /// `[vocab]` for [`Logits::Last`], `[T_i, vocab]` for [`Logits::All`]
    /// ([`BatchSeq::logit_rows`] rows each). Each sequence's logits equal those of the same
    /// sequence run alone through [`Model::forward`] up to the summation order of the
    /// products (the quantized kernels are row-independent, so they are bit-identical there).
    ///
    /// Errors (checked before any cache is written): an empty batch or a sequence without
    /// tokens ([`InferenceError::EmptyInput`]), a token id outside the vocabulary, a sequence
    /// whose cache has no room for its tokens; and backend failures. On error no cache has
    /// advanced (rows past a cache's length may have been overwritten).
    pub fn forward_batch(
        &self,
        backend: &dyn ComputeBackend,
        seqs: &mut [BatchSeq<'_>],
        bufs: &mut BatchBuffers,
        logits: &mut Vec<f32>,
    ) -> Result<(), InferenceError> {
        self.batch_pass(backend, seqs, bufs, Output::Logits(logits))
    }

    /// [`Model::forward_batch`] returning only the greedy choice of each sequence's last
    /// row (every [`BatchSeq::logits`] is taken as [`Logits::Last`]): into `chosen`, one
    /// [`Argmax`] per sequence in batch order — the largest logit, ties to the smaller id, and
    /// whether every logit of the row was finite ([`crate::sampling::argmax`]). The choice is
    /// made where the logits are ([`ComputeBackend::argmax_rows`]): a device backend copies
    /// back the ids, not `[B, vocab]` logits. Errors as [`Model::forward_batch`].
    pub fn forward_batch_greedy(
        &self,
        backend: &dyn ComputeBackend,
        seqs: &mut [BatchSeq<'_>],
        bufs: &mut BatchBuffers,
        chosen: &mut Vec<Argmax>,
    ) -> Result<(), InferenceError> {
        for q in seqs.iter_mut() {
            q.logits = Logits::Last;
        }
        self.batch_pass(backend, seqs, bufs, Output::Greedy(chosen))
    }

    /// One step of a batch ([`Model::forward_batch`]) whose greedy choices, one per sequence
    /// (each one's last row), stay where they are made ([`ComputeBackend::argmax_rows_later`])
    /// into `out`. With `feed`, every sequence runs one token: its choice of the step before
    /// (row `i` of `feed` for sequence `i`; the sequences' `tokens` then only count one row
    /// each), looked up where it was made ([`ComputeBackend::embed_chosen`]). So a device runs
    /// step `i + 1` before the host has read step `i`'s choices
    /// ([`ComputeBackend::take_chosen`]), as [`Model::decode_greedy`] does for one sequence.
    /// Errors as [`Model::forward_batch`], and with `feed` a sequence of more than one token
    /// or a `feed` without one row per sequence ([`ComputeError::ShapeMismatch`], checked before
    /// anything runs).
    pub fn forward_batch_later(
        &self,
        backend: &dyn ComputeBackend,
        seqs: &mut [BatchSeq<'_>],
        bufs: &mut BatchBuffers,
        feed: Option<&Chosen>,
        out: &mut Chosen,
    ) -> Result<(), InferenceError> {
        if let Some(f) = feed {
            // One row per sequence, each its own choice.
            let rows: usize = seqs.iter().map(|q| q.tokens.len()).sum();
            for (what, got) in [
                ("choices feeding a batch step (one per sequence)", f.rows),
                ("tokens of a fed batch step (one per sequence)", rows),
            ] {
                if got != seqs.len() {
                    return Err(ComputeError::ShapeMismatch {
                        what,
                        expected: seqs.len(),
                        got,
                        unit: "rows",
                    }
                    .into());
                }
            }
        }
        for q in seqs.iter_mut() {
            q.logits = Logits::Last;
        }
        self.batch_pass_fed(backend, seqs, bufs, feed, Output::Later(out))
    }

    /// A batch through [`Model::forward_body`] with the batch's scratch buffers.
    fn batch_pass(
        &self,
        backend: &dyn ComputeBackend,
        seqs: &mut [BatchSeq<'_>],
        bufs: &mut BatchBuffers,
        out: Output<'_>,
    ) -> Result<(), InferenceError> {
        self.batch_pass_fed(backend, seqs, bufs, None, out)
    }

    /// [`Model::batch_pass`] with the token ids of `chosen` when given.
    fn batch_pass_fed(
        &self,
        backend: &dyn ComputeBackend,
        seqs: &mut [BatchSeq<'_>],
        bufs: &mut BatchBuffers,
        chosen: Option<&Chosen>,
        out: Output<'_>,
    ) -> Result<(), InferenceError> {
        let mut pass = Pass {
            backend,
            seqs,
            s: &mut bufs.scratch,
            capture: Capture::Nothing,
            chosen,
        };
        in_pool(|| self.forward_body(&mut pass, out))
    }

    /// A pass of one sequence through [`Model::forward_body`] with the cache's own scratch
    /// buffers.
    fn forward_inner(
        &self,
        backend: &dyn ComputeBackend,
        feed: Feed<'_>,
        cache: &mut KvCache,
        which: Logits,
        capture: Capture<'_>,
        out: Output<'_>,
    ) -> Result<(), InferenceError> {
        // The scratch buffers leave the cache for the pass (a move, no allocation) so that
        // the cache can be written while they are borrowed; they are put back even on error.
        let mut s = std::mem::take(&mut cache.scratch);
        let (tokens, chosen) = match feed {
            Feed::Ids(t) => (t, None),
            // One row: the choice of the pass before (its id is not known here).
            Feed::Chosen(c) => (&[0u32][..], Some(c)),
        };
        let mut seqs = [BatchSeq {
            tokens,
            cache,
            logits: which,
        }];
        let mut pass = Pass {
            backend,
            seqs: &mut seqs,
            s: &mut s,
            capture,
            chosen,
        };
        let r = in_pool(|| self.forward_body(&mut pass, out));
        seqs[0].cache.scratch = s;
        r
    }

    /// The forward pass of a batch: embeddings, every layer, final norm and output projection
    /// of the rows whose logits are asked for; the logits (or the greedy choices) into `out`.
    fn forward_body(
        &self,
        p: &mut Pass<'_, '_, '_>,
        out: Output<'_>,
    ) -> Result<(), InferenceError> {
        let h = self.hidden_size;
        let b = p.backend;
        p.plan_rows()?;
        for q in p.seqs.iter_mut() {
            q.cache.ensure(b)?;
        }
        let s = &mut *p.s;
        self.embed(b, s, p.chosen)?;
        if let Capture::Hidden(hs) = &mut p.capture {
            hs.push(to_host(b, &p.s.x)?);
        }
        let Some(first) = self.layers.first() else {
            return Err(InferenceError::EmptyInput);
        };
        let g0 = &first.geometry;
        // The first layer's input norm; every layer leaves the norm after it (the next layer's,
        // or the final norm) in `s.normed`, fused with its residual add.
        let s = &mut *p.s;
        maybe_norm(b, first.pre_attn_norm.as_ref(), g0, &s.x, &mut s.normed)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let next = match self.layers.get(l + 1) {
                Some(n) => NextNorm {
                    norm: n.pre_attn_norm.as_ref(),
                    g: &n.geometry,
                },
                None => NextNorm {
                    norm: Some(&self.final_norm),
                    g: g0,
                },
            };
            self.layer_forward(p, layer, l, next)?;
            if let Capture::Hidden(hs) = &mut p.capture {
                hs.push(to_host(b, &p.s.x)?);
            }
        }
        for seq in p.seqs.iter_mut() {
            seq.cache.advance(seq.tokens.len());
        }

        // `s.normed` holds the final norm of every row; the rows whose logits are asked for:
        // all of them (read in place) or gathered into `last`.
        let s = &mut *p.s;
        let all = p.seqs.iter().all(|q| q.logits == Logits::All);
        let picked = &mut s.picked;
        picked.clear();
        for (q, span) in p.seqs.iter().zip(&s.spans) {
            match q.logits {
                Logits::All => picked.extend(span.row0..span.row0 + span.rows),
                Logits::Last => picked.push(span.row0 + span.rows - 1),
            }
        }
        let every_row = picked.len() == s.positions.len();
        let rows: &Tensor = if every_row {
            // Every row (all logits, or decode steps of one token each): no gather.
            &s.normed
        } else {
            b.copy_rows(&s.normed, h, picked, &mut s.last)?;
            &s.last
        };
        let n_rows = rows.len() / h;
        if let Capture::Hidden(hs) = &mut p.capture {
            if all {
                if let Some(last) = hs.last_mut() {
                    *last = to_host(b, rows)?;
                }
            }
        }
        match &self.lm_head {
            Some(w) => b.project(&w.matrix(self.vocab_size, h), rows, n_rows, &mut s.logits)?,
            None => b.project(
                &self.embeddings.matrix(self.vocab_size, h),
                rows,
                n_rows,
                &mut s.logits,
            )?,
        }
        if let Some(bias) = &self.lm_head_bias {
            b.add_bias(&mut s.logits, bias)?;
        }
        let div = self.arch.logits_divisor();
        let cap = self.arch.final_logit_softcap().map(|c| c as f32);
        if div != 1.0 || cap.is_some() {
            b.scale_softcap(&mut s.logits, div, cap)?;
        }
        let logits = match out {
            Output::Greedy(chosen) => {
                b.argmax_rows(&s.logits, self.vocab_size, chosen)?;
                return Ok(());
            }
            Output::Later(chosen) => {
                b.argmax_rows_later(&s.logits, self.vocab_size, chosen)?;
                return Ok(());
            }
            Output::Logits(logits) => logits,
        };
        // Host logits: swapped out of a host tensor (no copy), downloaded from a device one.
        if s.logits.is_host() {
            if let Some(mut v) = s.logits.host_vec_mut() {
                std::mem::swap(logits, &mut *v);
            }
        } else {
            logits.resize(s.logits.len(), 0.0);
            b.download(&s.logits, logits)?;
        }
        Ok(())
    }

    /// Token (and learned position) embeddings times the embedding scale of every row of the
    /// batch (`s.tokens[r]`, or the choice of row `r` of `chosen`, at `s.positions[r]`), into
    /// `s.x`: `[R, hidden]`.
    fn embed(
        &self,
        backend: &dyn ComputeBackend,
        s: &mut Scratch,
        chosen: Option<&Chosen>,
    ) -> Result<(), InferenceError> {
        let h = self.hidden_size;
        let (table, scale) = (self.embeddings.table(), self.arch.embedding_scale());
        match chosen {
            Some(c) => backend.embed_chosen(table, h, c, scale, &mut s.x)?,
            None => {
                if let Some(&id) = s.tokens.iter().find(|&&id| id as usize >= self.vocab_size) {
                    return Err(InferenceError::TokenOutOfRange {
                        id,
                        vocab: self.vocab_size,
                    });
                }
                backend.embed(table, h, &s.tokens, scale, &mut s.x)?;
            }
        }
        if let Some(pe) = &self.position_embeddings {
            let capacity = pe.len() / h;
            if let Some(&pos) = s.positions.iter().find(|&&pos| pos >= capacity) {
                return Err(InferenceError::ContextFull {
                    needed: pos + 1,
                    capacity,
                });
            }
            let ids = &mut s.ids;
            ids.clear();
            ids.extend(s.positions.iter().map(|&p| p as u32));
            backend.embed(infer_compute::FloatTable::F32(pe), h, ids, 1.0, &mut s.tmp)?;
            backend.add_scaled(&mut s.x, &s.tmp, 1.0)?;
        }
        Ok(())
    }

    /// One block on the residual stream `s.x` `[R, hidden]` (the rows of every sequence of
    /// the batch) at positions `s.positions`, its input norm already in `s.normed`; leaves
    /// `next` of the updated stream in `s.normed`.
    fn layer_forward(
        &self,
        p: &mut Pass<'_, '_, '_>,
        layer: &FullPipelineLayer<'_>,
        l: usize,
        next: NextNorm<'_, '_>,
    ) -> Result<(), InferenceError> {
        let b = p.backend;
        let s = &mut *p.s;
        let g = &layer.geometry;
        let t = s.positions.len();
        let h = self.hidden_size;

        // Attention: projections, q/k norms, RoPE, cache, attention, output projection.
        project_many(
            b,
            [&layer.wq, &layer.wk, &layer.wv],
            &s.normed,
            t,
            [&mut s.q, &mut s.k, &mut s.v],
        )?;
        attend(b, p.seqs, s, l, layer)?;
        project(b, &layer.wo, &s.attn, t, &mut s.attn_out)?;

        if g.parallel_residual {
            if let Some(n) = &layer.post_attn_norm {
                b.norm_inplace(&n.view(norm_kind(g), g.eps), &mut s.attn_out)?;
            }
            // x + attn(norm1(x)) + ffn(norm2(x)); phi shares the first norm.
            let ffn_in = match &layer.pre_ffn_norm {
                Some(n) => {
                    maybe_norm(b, Some(n), g, &s.x, &mut s.ffn_in)?;
                    &s.ffn_in
                }
                None => &s.normed,
            };
            if let Capture::FfnInputs(inputs) = &mut p.capture {
                inputs.push(to_host(b, ffn_in)?[(t - 1) * h..t * h].to_vec());
            }
            ffn(b, &layer.ffn, ffn_in, t, g, &mut s.ffn, &mut s.ffn_out)?;
            b.add_scaled(&mut s.attn_out, &s.ffn_out, 1.0)?;
            return residual(b, &mut s.x, &mut s.attn_out, None, g, next, &mut s.normed);
        }
        let pre_ffn = NextNorm {
            norm: layer.pre_ffn_norm.as_ref(),
            g,
        };
        let post_attn = layer.post_attn_norm.as_ref();
        residual(
            b,
            &mut s.x,
            &mut s.attn_out,
            post_attn,
            g,
            pre_ffn,
            &mut s.ffn_in,
        )?;
        if let Capture::FfnInputs(inputs) = &mut p.capture {
            inputs.push(to_host(b, &s.ffn_in)?[(t - 1) * h..t * h].to_vec());
        }
        ffn(b, &layer.ffn, &s.ffn_in, t, g, &mut s.ffn, &mut s.ffn_out)?;
        let post_ffn = layer.post_ffn_norm.as_ref();
        residual(
            b,
            &mut s.x,
            &mut s.ffn_out,
            post_ffn,
            g,
            next,
            &mut s.normed,
        )
    }
}

/// The residual step of layer geometry `g`: `x += residual_multiplier · post(branch)` (`post`:
/// the branch's own norm, in place), then `out = next(x)`, or a copy of `x` when the next
/// sub-block has no input norm. One [`ComputeBackend::add_norm`] when there is a next norm.
fn residual(
    backend: &dyn ComputeBackend,
    x: &mut Tensor,
    branch: &mut Tensor,
    post: Option<&NormWeights<'_>>,
    g: &crate::LayerGeometry,
    next: NextNorm<'_, '_>,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let post = post.map(|n| n.view(norm_kind(g), g.eps));
    match next.norm {
        Some(n) => {
            let rn = ResidualNorm {
                post,
                alpha: g.residual_multiplier,
                next: n.view(norm_kind(next.g), next.g.eps),
            };
            backend.add_norm(x, branch, &rn, out)?;
        }
        None => {
            if let Some(p) = &post {
                backend.norm_inplace(p, branch)?;
            }
            backend.add_scaled(x, branch, g.residual_multiplier)?;
            maybe_norm(backend, None, next.g, x, out)?;
        }
    }
    Ok(())
}

/// Host copies for the parts of a step that run on the host (walk FFN, MoE): for a device
/// backend, `x` is downloaded into `tmp_in` and the result uploaded from `tmp_out`.
struct HostIo<'a> {
    tmp_in: &'a mut Vec<f32>,
    tmp_out: &'a mut Vec<f32>,
}

impl HostIo<'_> {
    /// Run the host routine `f(x, out)` on the values of `x`, its result (`out`, resized by
    /// `f`) landing in `y`. Host tensors are borrowed in place (no copy).
    fn run(
        self,
        backend: &dyn ComputeBackend,
        x: &Tensor,
        y: &mut Tensor,
        f: impl FnOnce(&[f32], &mut Vec<f32>) -> Result<(), InferenceError>,
    ) -> Result<(), InferenceError> {
        let x = match x.host() {
            Some(x) => x,
            None => {
                self.tmp_in.resize(x.len(), 0.0);
                backend.download(x, self.tmp_in)?;
                &self.tmp_in[..]
            }
        };
        // `y` in this backend's memory first, so that a host `y` of a device backend is not
        // written in place.
        backend.fit(y, 0)?;
        if y.is_host() {
            if let Some(mut v) = y.host_vec_mut() {
                return f(x, &mut v);
            }
        }
        f(x, self.tmp_out)?;
        backend.upload(self.tmp_out, y)?;
        Ok(())
    }
}

/// The values of `t` on the host (a copy).
fn to_host(backend: &dyn ComputeBackend, t: &Tensor) -> Result<Vec<f32>, InferenceError> {
    let mut v = vec![0.0; t.len()];
    backend.download(t, &mut v)?;
    Ok(v)
}

/// The layer's FFN of `x` `[T, hidden]` into `out` `[T, hidden]`; `bufs` are scratch. The walk
/// FFN, and MoE layers whose experts are not Linear-layout products (gpt-oss's clamped SwiGLU,
/// the float tier's feature-major experts), run on the host.
fn ffn(
    backend: &dyn ComputeBackend,
    w: &Ffn<'_>,
    x: &Tensor,
    t: usize,
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let io = HostIo {
        tmp_in: &mut bufs.host_in,
        tmp_out: &mut bufs.host_out,
    };
    match w {
        Ffn::Walk(w) => io.run(backend, x, out, |x, out| {
            layer_walk_ffn(backend, w, x, t, g, &mut bufs.walk, out)
        }),
        Ffn::Dense(d) => dense_ffn(backend, d, x, t, g, bufs, out),
        Ffn::Moe(m) if t == 1 && m.runs_as_products(g) => {
            moe_ffn_one_row(backend, m, x, g, bufs, out)
        }
        Ffn::Moe(m) if m.runs_as_products(g) => moe_ffn_rows(backend, m, x, t, g, bufs, out),
        Ffn::Moe(m) => io.run(backend, x, out, |x, out| {
            *out = moe_ffn(backend, m, x, t, g)?;
            Ok(())
        }),
    }
}

/// A dense FFN over Linear-layout (quantized) matrices: `down(act(gate(x)) ⊙ up(x))`, into
/// `out`; `bufs.gate`, `bufs.up` are scratch.
fn dense_ffn(
    backend: &dyn ComputeBackend,
    d: &DenseFfn<'_>,
    x: &Tensor,
    t: usize,
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    // Quantized tiers: the vectorised activations of `ops::gated_mul_fast` (≤ 4e-7 relative
    // from the exact f64 SiLU, ≤ 1e-5 for tanh-GELU: far below the activation quantization
    // error of these paths).
    let act = crate::walk::compute_activation(g.activation);
    let FfnScratch {
        gate: gate_buf, up, ..
    } = bufs;
    match (&d.gate, g.ffn_type) {
        (Some(gate), FfnType::Gated) => {
            project_many(backend, [gate, &d.up], x, t, [&mut *gate_buf, &mut *up])?;
            backend.gated_activation(act, gate_buf, up)?;
        }
        _ => {
            project(backend, &d.up, x, t, up)?;
            backend.activation(act, up)?;
        }
    }
    project(backend, &d.down, up, t, out)
}
/// The experts a token's router logits `probs` choose ([`ops::moe_route`] with the layer's
/// router bias, top-k and `norm_topk_prob`).
fn route(m: &MoeFfn<'_>, probs: &mut [f32]) -> smallvec::SmallVec<[(usize, f32); 8]> {
    ops::moe_route(probs, m.router_bias.as_deref(), m.top_k, m.norm_topk_prob)
}

/// One expert as a dense FFN on the backend's tensors: `down(act(gate(x) + bg) ⊙ (up(x) + bu))
/// + bd` for the `m` rows of `x` (`[m, hidden]`), into `out`; `bufs.gate`, `bufs.up` are scratch.
fn expert_ffn(
    backend: &dyn ComputeBackend,
    e: &crate::layer::WalkFfn<'_>,
    x: &Tensor,
    m: usize,
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let (h, inter) = (g.hidden_size, e.intermediate_size);
    let act = crate::walk::compute_activation(g.activation);
    let FfnScratch { gate, up, .. } = bufs;
    let up_w = e.up.matrix(inter, h);
    match &e.gate {
        Some(gw) => {
            // One quantization of `x` and (one row) one launch for both products.
            backend.project_many(
                x,
                m,
                &mut [
                    TensorProj {
                        w: gw.matrix(inter, h),
                        y: &mut *gate,
                    },
                    TensorProj {
                        w: up_w,
                        y: &mut *up,
                    },
                ],
            )?;
            if let Some(b) = &e.gate_bias {
                backend.add_bias(gate, b)?;
            }
        }
        None => backend.project(&up_w, x, m, up)?,
    }
    if let Some(b) = &e.up_bias {
        backend.add_bias(up, b)?;
    }
    match &e.gate {
        Some(_) => backend.gated_activation(act, gate, up)?,
        None => backend.activation(act, up)?,
    }
    backend.project(&e.down.matrix(h, inter), up, m, out)?;
    if let Some(b) = &e.down_bias {
        backend.add_bias(out, b)?;
    }
    Ok(())
}

/// [`moe_ffn`] for one row (a decode step) with the activations left in the backend's memory:
/// only the router's `num_experts` logits come to the host for [`route`]; the chosen experts
/// (and the shared one) run as dense products on the backend, so on a device the experts'
/// weights are read there. `out` = Σ wₑ FFNₑ(x) + `sigmoid(x · shared_gate)` · shared(x),
/// each expert's term added by `add_rows_scaled`, whose weight is data rather than a launch
/// argument. A backend that routes on the device ([`moe_experts_routed`]) keeps even the
/// logits: it records the same launches whichever experts a token chooses, so it can replay
/// them.
fn moe_ffn_one_row(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    x: &Tensor,
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let (h, n) = (g.hidden_size, m.experts.len());
    let router = m.router_matrix(h);
    backend.project(&router, x, 1, &mut bufs.moe_out)?;
    let biased = m.experts_biased();
    if backend.routes_on_device() && !biased && n > 0 {
        return moe_experts_routed(backend, m, x, g, bufs, out);
    }
    let probs = crate::scratch::fit(&mut bufs.host_out, n);
    backend.download(&bufs.moe_out, probs)?;
    let chosen = route(m, probs);
    if chosen.is_empty() {
        return Err(InferenceError::Architecture(
            "an MoE layer without experts (top_k or num_experts is 0)".into(),
        ));
    }
    backend.fill(out, h, 0.0)?;
    for &(e, w) in &chosen {
        let mut y = std::mem::take(&mut bufs.moe_out);
        let r = expert_ffn(backend, &m.experts[e], x, 1, g, bufs, &mut y)
            .and_then(|()| Ok(backend.add_rows_scaled(&y, h, &[0], &[w], out)?));
        bufs.moe_out = y;
        r?;
    }
    add_shared_expert(backend, m, x, 1, g, bufs, out)
}

/// `out += gate · shared(x)` for the `t` rows of `x` (`[t, hidden]`), when the layer has a
/// shared expert: `gate = sigmoid(x · shared_gate)` per row, its logits kept on the backend
/// (`add_gated`, HF `Qwen2MoeSparseMoeBlock`), or 1 without a shared gate. Nothing comes to
/// the host, so a device backend records the same launches at every decode step.
fn add_shared_expert(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    x: &Tensor,
    t: usize,
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let Some(shared) = &m.shared else {
        return Ok(());
    };
    let mut y = std::mem::take(&mut bufs.moe_out);
    let r = expert_ffn(backend, shared, x, t, g, bufs, &mut y).and_then(|()| {
        match &m.shared_gate {
            Some(sg) => {
                let sgm = MoeFfn::shared_gate_matrix(sg, g.hidden_size);
                let z = &mut bufs.shared_gate;
                backend.project(&sgm, x, t, z)?;
                backend.add_gated(out, &y, z, g.hidden_size)?;
            }
            None => backend.add_scaled(out, &y, 1.0)?,
        }
        Ok(())
    });
    bufs.moe_out = y;
    r
}

/// The experts of [`moe_ffn_one_row`] on a backend that keeps the router's choice in its own
/// memory ([`ComputeBackend::routes_on_device`]): the router logits (in `bufs.moe_out`) →
/// `moe_route` → the gate/up and down products of the chosen experts, all slots in one
/// `project_routed` each (ggml's `mul_mat_id`), summed with their weights (`combine_routed`),
/// plus the shared expert under its gate ([`add_shared_expert`]). Nothing comes to the host, so a
/// decode step of a device backend stays one list of launches (one CUDA graph).
fn moe_experts_routed(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    x: &Tensor,
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let h = g.hidden_size;
    let k = route_where_logits_are(backend, m, bufs)?;
    let act = crate::walk::compute_activation(g.activation);
    let FfnScratch {
        gate,
        up,
        moe_out,
        moe_sel,
        ..
    } = &mut *bufs;
    // Every slot at once: gate/up `[k, inter]` from the one input row, the activation over
    // all slots, down `[k, hidden]` from each slot's own row, then the weighted sum.
    ExpertMatrices::of(m, h).run(backend, act, x, [gate, up], moe_out, &mut |x, projs| {
        backend.project_routed(x, projs, moe_sel, k)
    })?;
    backend.combine_routed(moe_out, moe_sel, k, out)?;
    add_shared_expert(backend, m, x, 1, g, bufs, out)
}

/// The layer's top-k choice for the router logits in `bufs.moe_out` (`[rows, num_experts]`),
/// made where they are (`moe_route`: on a device, one warp per row) into `bufs.moe_sel`
/// (`[rows, 2·k]`: the experts, then their weights). Returns `k`.
fn route_where_logits_are(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    bufs: &mut FfnScratch,
) -> Result<usize, InferenceError> {
    let n = m.experts.len();
    let k = m.top_k.min(n);
    backend.moe_route(
        &bufs.moe_out,
        n,
        m.router_bias.as_deref(),
        k,
        m.norm_topk_prob,
        &mut bufs.moe_sel,
    )?;
    Ok(k)
}

/// Runs every chosen expert's products of the listed projections on an input
/// ([`ExpertMatrices::run`]): routed slots of a decode row or a chunk's grouped rows.
type ExpertProducts<'f> =
    dyn FnMut(&Tensor, &mut [RoutedProj<'_>]) -> Result<(), ComputeError> + 'f;

/// Every expert's matrices of an MoE layer, one list per projection (the gates `None` for
/// ungated experts), as the routed and grouped products take them.
struct ExpertMatrices<'w> {
    gates: Option<Vec<infer_compute::Matrix<'w>>>,
    ups: Vec<infer_compute::Matrix<'w>>,
    downs: Vec<infer_compute::Matrix<'w>>,
}

impl<'w> ExpertMatrices<'w> {
    fn of(m: &'w MoeFfn<'_>, h: usize) -> Self {
        let inter = m.experts.first().map_or(0, |e| e.intermediate_size);
        ExpertMatrices {
            gates: m
                .experts
                .iter()
                .map(|e| e.gate.as_ref().map(|gw| gw.matrix(inter, h)))
                .collect(),
            ups: m.experts.iter().map(|e| e.up.matrix(inter, h)).collect(),
            downs: m.experts.iter().map(|e| e.down.matrix(h, inter)).collect(),
        }
    }

    /// The chosen experts' FFN over `x`, `down(act(gate(x)) ⊙ up(x))` (ungated experts:
    /// `down(act(up(x)))`), into `y`; `gate`, `up` are scratch. `products(input, projections)`
    /// runs every chosen expert's products of each projection listed (gate and up in one
    /// call): the routed slots of a decode row (`project_routed`) or a chunk's rows grouped by
    /// expert (`project_grouped`).
    fn run(
        &self,
        backend: &dyn ComputeBackend,
        act: ops::Activation,
        x: &Tensor,
        [gate, up]: [&mut Tensor; 2],
        y: &mut Tensor,
        products: &mut ExpertProducts<'_>,
    ) -> Result<(), InferenceError> {
        match &self.gates {
            Some(gates) => {
                products(
                    x,
                    &mut [
                        RoutedProj {
                            experts: gates,
                            y: &mut *gate,
                        },
                        RoutedProj {
                            experts: &self.ups,
                            y: &mut *up,
                        },
                    ],
                )?;
                backend.gated_activation(act, gate, up)?;
            }
            None => {
                products(
                    x,
                    &mut [RoutedProj {
                        experts: &self.ups,
                        y: &mut *up,
                    }],
                )?;
                backend.activation(act, up)?;
            }
        }
        products(
            up,
            &mut [RoutedProj {
                experts: &self.downs,
                y,
            }],
        )?;
        Ok(())
    }
}

/// A prompt chunk's expert choices, sorted by expert (for
/// [`ComputeBackend::project_grouped`]): `order[i]` is the token of sorted row `i`; token
/// `r`'s slot `j` is sorted row `slots[r·k + j]`, with router weight `weights[r·k + j]`;
/// `groups` the runs of sorted rows per expert, in expert order.
#[derive(Default)]
struct SortedRoutes {
    order: Vec<usize>,
    slots: Vec<usize>,
    weights: Vec<f32>,
    groups: Vec<infer_compute::ExpertRows>,
}

impl SortedRoutes {
    /// The choices of `k` experts per token of `picks` (`(expert, weight)`, token-major) among
    /// `n` experts (indices below `n`: `moe_route`'s, checked by `expert_index`).
    fn sort(picks: &[(usize, f32)], n: usize, k: usize) -> Self {
        let mut start = vec![0usize; n + 1];
        for &(e, _) in picks {
            start[e + 1] += 1;
        }
        let groups = (0..n)
            .filter(|&e| start[e + 1] > 0)
            .map(|e| infer_compute::ExpertRows {
                expert: e,
                rows: start[e + 1],
            })
            .collect();
        for e in 0..n {
            start[e + 1] += start[e];
        }
        let mut r = SortedRoutes {
            order: vec![0; picks.len()],
            slots: vec![0; picks.len()],
            weights: picks.iter().map(|&(_, w)| w).collect(),
            groups,
        };
        for (i, &(e, _)) in picks.iter().enumerate() {
            let pos = start[e];
            start[e] += 1;
            r.order[pos] = i / k;
            r.slots[i] = pos;
        }
        r
    }
}

/// [`moe_ffn`] for a chunk of `t` rows (`x` `[t, hidden]`) with the activations left in the
/// backend's memory: the router's `[t, num_experts]` logits choose their experts where they are
/// (`moe_route`) and only the `[t, 2·k]` choice comes to the host, which sorts the chosen
/// (token, expert) pairs by expert ([`SortedRoutes`]); their rows
/// gathered once (`copy_rows`), and each projection of every chosen expert runs as one
/// grouped product (`project_grouped`, ggml's `mul_mat_id`: each expert's weights read once
/// per chunk, one launch on a device); `combine_rows` sums each token's slots with their router
/// weights. Experts with biases (gpt-oss) run one expert at a time instead
/// ([`moe_ffn_rows_each`]). The shared expert runs over all rows, each scaled by
/// `sigmoid(x · shared_gate)`. `out` is fit to `[t, hidden]`.
fn moe_ffn_rows(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    x: &Tensor,
    t: usize,
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let (h, n) = (g.hidden_size, m.experts.len());
    let router = m.router_matrix(h);
    if n == 0 || m.top_k == 0 {
        return Err(InferenceError::Architecture(
            "an MoE layer without experts (top_k or num_experts is 0)".into(),
        ));
    }
    backend.project(&router, x, t, &mut bufs.moe_out)?;
    // Only the chosen experts and their weights come to the host.
    let k = route_where_logits_are(backend, m, bufs)?;
    let sel = crate::scratch::fit(&mut bufs.host_out, t * 2 * k);
    backend.download(&bufs.moe_sel, sel)?;
    let mut picks: Vec<(usize, f32)> = Vec::with_capacity(t * k);
    for row in sel.chunks_exact(2 * k) {
        for (&id, &w) in row[..k].iter().zip(&row[k..]) {
            picks.push((infer_compute::expert_index(id, n)?, w));
        }
    }
    let biased = m.experts_biased();
    if biased {
        moe_ffn_rows_each(backend, m, x, &picks, g, bufs, out)?;
        return add_shared_expert(backend, m, x, t, g, bufs, out);
    }
    let routes = SortedRoutes::sort(&picks, n, k);
    let act = crate::walk::compute_activation(g.activation);
    let FfnScratch {
        gate,
        up,
        moe_in,
        moe_out,
        ..
    } = &mut *bufs;
    backend.copy_rows(x, h, &routes.order, moe_in)?;
    ExpertMatrices::of(m, h).run(
        backend,
        act,
        moe_in,
        [gate, up],
        moe_out,
        &mut |x, projs| backend.project_grouped(x, projs, &routes.groups),
    )?;
    backend.combine_rows(moe_out, h, &routes.slots, &routes.weights, k, out)?;
    add_shared_expert(backend, m, x, t, g, bufs, out)
}

/// The experts of [`moe_ffn_rows`] one at a time (experts with biases): each chosen expert runs
/// once, as dense products over the rows that chose it (gathered with `copy_rows`, its output
/// rows added back with their router weights by `add_rows_scaled`). `picks` as
/// [`SortedRoutes::sort`] takes them (`top_k` per token); `out` is fit to `[t, hidden]`.
fn moe_ffn_rows_each(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    x: &Tensor,
    picks: &[(usize, f32)],
    g: &crate::LayerGeometry,
    bufs: &mut FfnScratch,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    let (h, n) = (g.hidden_size, m.experts.len());
    let k = m.top_k.min(n).max(1);
    let t = picks.len() / k;
    // Per expert: the rows that chose it and their weights.
    let mut chosen: Vec<(Vec<usize>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); n];
    for (i, &(e, w)) in picks.iter().enumerate() {
        chosen[e].0.push(i / k);
        chosen[e].1.push(w);
    }
    backend.fill(out, t * h, 0.0)?;
    let (mut xs, mut y) = (
        std::mem::take(&mut bufs.moe_in),
        std::mem::take(&mut bufs.moe_out),
    );
    let mut run = || -> Result<(), InferenceError> {
        for (e, (rows, weights)) in chosen.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            backend.copy_rows(x, h, rows, &mut xs)?;
            expert_ffn(backend, &m.experts[e], &xs, rows.len(), g, bufs, &mut y)?;
            backend.add_rows_scaled(&y, h, rows, weights, out)?;
        }
        Ok(())
    };
    let res = run();
    (bufs.moe_in, bufs.moe_out) = (xs, y);
    res
}

/// Mixture of experts, per token: softmax router (logits plus the router bias, gpt-oss), top-k
/// experts weighted by their probability (renormalised when `norm_topk_prob`, which equals
/// gpt-oss's softmax over the top-k logits; ties → lower expert index), plus the shared expert
/// scaled by `sigmoid(x · shared_gate)` (HF `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`,
/// `GptOssTopKRouter`).
fn moe_ffn(
    backend: &dyn ComputeBackend,
    m: &MoeFfn<'_>,
    x: &[f32],
    t: usize,
    g: &crate::LayerGeometry,
) -> Result<Vec<f32>, InferenceError> {
    let h = g.hidden_size;
    let n = m.experts.len();
    let mut router = vec![0.0; t * n];
    backend.matmul_transb(x, &m.router, t, h, n, &mut router)?;
    let mut out = vec![0.0; t * h];
    let (mut bufs, mut y) = (WalkBuffers::default(), Vec::new());
    for (row, (xr, probs)) in x
        .chunks_exact(h)
        .zip(router.chunks_exact_mut(n))
        .enumerate()
    {
        let o = &mut out[row * h..(row + 1) * h];
        for (e, weight) in route(m, probs) {
            walk_ffn(backend, &m.experts[e], xr, 1, g, &mut bufs, &mut y)?;
            o.iter_mut().zip(&y).for_each(|(a, b)| *a += weight * b);
        }
    }
    if let Some(shared) = &m.shared {
        walk_ffn(backend, shared, x, t, g, &mut bufs, &mut y)?;
        for (row, (o, yr)) in out.chunks_exact_mut(h).zip(y.chunks_exact(h)).enumerate() {
            let gate = match &m.shared_gate {
                Some(sg) => {
                    let z = ops::dot(&x[row * h..(row + 1) * h], sg);
                    1.0 / (1.0 + (-z).exp())
                }
                None => 1.0,
            };
            o.iter_mut().zip(yr).for_each(|(a, b)| *a += gate * b);
        }
    }
    Ok(out)
}

/// Layer `l`'s attention step for the batch (one [`ComputeBackend::rope_attend`]): the q/k
/// norms and RoPE of the new rows `s.q`, `s.k`, then each sequence stores its new K/V rows in
/// its cache and its query rows attend over it, into `s.attn` `[R, q_dim]`, with the layer's
/// attention sinks if it has them.
fn attend(
    backend: &dyn ComputeBackend,
    seqs: &mut [BatchSeq<'_>],
    s: &mut Scratch,
    l: usize,
    layer: &FullPipelineLayer<'_>,
) -> Result<(), InferenceError> {
    let g = &layer.geometry;
    let mut slots: smallvec::SmallVec<[KvSlot<'_>; 4]> = seqs
        .iter_mut()
        .zip(&s.spans)
        .map(|(seq, span)| {
            let start = seq.cache.len();
            let (k_cache, v_cache) = seq.cache.layer_mut(l);
            KvSlot {
                k_cache,
                v_cache,
                row0: span.row0,
                rows: span.rows,
                start,
            }
        })
        .collect();
    // q/k RMSNorm: the weight's length is the row width (head_dim per head, or the whole
    // projection for OLMo-2), so one row-wise norm covers both.
    let rms = infer_compute::NormKind::Rms {
        offset: g.norm_offset,
    };
    let mut a = RopeAttend {
        q: &mut s.q,
        k: &mut s.k,
        v: &s.v,
        q_norm: layer.q_norm.as_ref().map(|n| n.view(rms, g.eps)),
        k_norm: layer.k_norm.as_ref().map(|n| n.view(rms, g.eps)),
        rope: g.rope.as_ref(),
        positions: &s.positions,
        seqs: &mut slots,
    };
    let params = infer_compute::AttentionParams {
        sinks: layer.attn_sinks.as_deref(),
        ..g.attention
    };
    backend.rope_attend(&mut a, &params, &mut s.attn)?;
    Ok(())
}

/// `x · Wᵀ + b` for `t` rows, into `out` (fit to `[t, out_features]`).
fn project(
    backend: &dyn ComputeBackend,
    w: &Linear<'_>,
    x: &Tensor,
    t: usize,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    backend.project(&w.matrix(), x, t, out)?;
    if let Some(b) = &w.bias {
        backend.add_bias(out, b)?;
    }
    Ok(())
}

/// `x · Wᵢᵀ + bᵢ` for `t` rows and `N` Linear layers with the same input, into `outs[i]`
/// (fit to `[t, out_featuresᵢ]`): one [`ComputeBackend::project_many`] call (on the CPU,
/// activations quantized once and one parallel region when every weight is in a ggml block
/// format).
fn project_many<const N: usize>(
    backend: &dyn ComputeBackend,
    ws: [&Linear<'_>; N],
    x: &Tensor,
    t: usize,
    outs: [&mut Tensor; N],
) -> Result<(), InferenceError> {
    let mut i = 0;
    let mut projs = outs.map(|y| {
        let w = ws[i];
        i += 1;
        TensorProj { w: w.matrix(), y }
    });
    backend.project_many(x, t, &mut projs)?;
    for (p, w) in projs.iter_mut().zip(ws) {
        if let Some(b) = &w.bias {
            backend.add_bias(p.y, b)?;
        }
    }
    Ok(())
}

/// The norm of a layer geometry's kind (RMSNorm with its weight offset, or LayerNorm).
fn norm_kind(g: &crate::LayerGeometry) -> infer_compute::NormKind {
    match g.norm_type {
        NormType::RmsNorm => infer_compute::NormKind::Rms {
            offset: g.norm_offset,
        },
        NormType::LayerNorm => infer_compute::NormKind::Layer,
    }
}

/// Normalise every row of `x` (row length = the norm's width) into `out`, or copy when there
/// is no norm; `out` is fit to `x.len()`.
fn maybe_norm(
    backend: &dyn ComputeBackend,
    n: Option<&NormWeights<'_>>,
    g: &crate::LayerGeometry,
    x: &Tensor,
    out: &mut Tensor,
) -> Result<(), InferenceError> {
    match n {
        Some(n) => backend.norm(&n.view(norm_kind(g), g.eps), x, out)?,
        // The whole tensor as one row.
        None => backend.copy_rows(x, x.len(), &[0], out)?,
    }
    Ok(())
}
