//! KL divergence against a base model's log-probabilities, in the file format of llama.cpp's
//! `llama-perplexity --kl-divergence-base FILE` (tools/perplexity/perplexity.cpp), so that either
//! engine can write the base and either can compare against it.
//!
//! File layout (little-endian): the 8 bytes `_logits_`, `u32 n_ctx`, `i32 n_vocab`,
//! `i32 n_chunk`, `i32 tokens[n_chunk · n_ctx]` (the text's tokens, before any BOS replacement),
//! then for each window the `n_ctx − 1 − n_ctx/2` scored positions (`n_ctx/2 .. n_ctx − 2`, each
//! predicting the next token), each `nv = 2·⌈n_vocab/2⌉ + 4` `u16`s: two `f32`s (`scale`,
//! `min_log_prob`) then one `u16` per vocabulary entry, log p(i) ≈ `scale · q[i] + min_log_prob`.
//! With `max`/`min` the row's largest and smallest logit (`min` raised to `max − 16`),
//! `scale = (max − min)/65535`, `q[i] = round((logit[i] − min)/scale)` for `logit[i] > min`, else
//! 0 (llama.cpp `log_softmax` with a `uint16_t * log_prob`).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::InferenceError;

const MAGIC: &[u8; 8] = b"_logits_";
/// llama.cpp skips base log-probabilities below this in the KLD sum (their weight is < 1.2e-7).
const MIN_LOG_PROB: f32 = -16.0;

/// `u16`s per scored position: the two `f32` header values, then the vocabulary rounded up to
/// an even count (llama.cpp `nv = 2*((n_vocab + 1)/2) + 4`).
fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Scored positions per window of `n_ctx` tokens (llama-perplexity's second half).
pub fn scored_per_window(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

fn file_error(path: &Path, what: impl Into<String>) -> InferenceError {
    InferenceError::LogProbFile {
        path: path.display().to_string(),
        what: what.into(),
    }
}

/// ggml's `nearest_int` for the values this format stores (`0 ..= 65535`): round half to even.
fn nearest_int(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// Log-sum-exp pieces of one logits row: (max, ln Σ exp(logit − max)), the sum in f64 of f32
/// exponentials as llama.cpp computes it.
fn log_sum_exp(logits: &[f32]) -> (f32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (max, sum.ln() as f32)
}

/// Encodes one row of logits into `out` (`row_len(logits.len())` values), llama.cpp's
/// `log_softmax(n_vocab, logits, log_prob, tok)`.
fn encode_row(logits: &[f32], out: &mut [u16]) {
    let (max, lse) = log_sum_exp(logits);
    let min = logits
        .iter()
        .copied()
        .fold(f32::INFINITY, f32::min)
        .max(max - 16.0);
    let min_log_prob = min - max - lse;
    let scale = (max - min) / 65535.0;
    let (head, q) = out.split_at_mut(4);
    let words = |v: f32| {
        let b = v.to_le_bytes();
        [
            u16::from_le_bytes([b[0], b[1]]),
            u16::from_le_bytes([b[2], b[3]]),
        ]
    };
    head[..2].copy_from_slice(&words(scale));
    head[2..].copy_from_slice(&words(min_log_prob));
    q.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (o, &l) in q.iter_mut().zip(logits) {
            if l > min {
                *o = nearest_int(inv * (l - min)) as u16;
            }
        }
    }
}

/// Writes a base file as `llama-perplexity --kl-divergence-base FILE` does (without
/// `--kl-divergence`): the header at [`LogProbWriter::create`], then one
/// [`LogProbWriter::write_window`] per window, then [`LogProbWriter::finish`]. The file is
/// written to `.NAME.tmp-PID` beside `PATH` (the staging name of `infer extract`,
/// [`infer_vindex::files::temp_dir_name`], so the CLI's interrupt cleanup removes it) and
/// renamed at `finish`, so a failed run leaves nothing at `PATH`. Errors name `PATH`, never the
/// temp file.
pub struct LogProbWriter {
    out: BufWriter<File>,
    path: PathBuf,
    tmp: PathBuf,
    n_vocab: usize,
    n_ctx: usize,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl LogProbWriter {
    /// Creates the file and writes its header: `n_ctx` (window), `n_vocab`, and the scored
    /// text's `tokens` (`n_chunk · n_ctx` of them, `n_chunk = tokens.len() / n_ctx`).
    ///
    /// Errors: [`InferenceError::LogProbFile`] when the file cannot be created or written, or
    /// when a size does not fit the format's 32-bit fields.
    pub fn create(
        path: &Path,
        n_ctx: usize,
        n_vocab: usize,
        tokens: &[u32],
    ) -> Result<Self, InferenceError> {
        let n_chunk = tokens.len() / n_ctx.max(1);
        let fits = |v: usize| i32::try_from(v).is_ok();
        if !fits(n_ctx) || !fits(n_vocab) || !fits(n_chunk) || !fits(n_chunk * n_ctx) {
            return Err(file_error(
                path,
                "a size exceeds the format's 32-bit fields",
            ));
        }
        // Checked before any window runs (the file is only moved into place at the end).
        if path.is_dir() {
            return Err(file_error(path, "is a folder, not a file path"));
        }
        let name = path
            .file_name()
            .ok_or_else(|| file_error(path, "not a file path"))?;
        let tmp = path.with_file_name(infer_vindex::files::temp_dir_name(
            &name.to_string_lossy(),
            std::process::id(),
        ));
        let file =
            File::create(&tmp).map_err(|e| file_error(path, format!("cannot create: {e}")))?;
        let mut w = LogProbWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            path: path.to_path_buf(),
            tmp,
            n_vocab,
            n_ctx,
            row: vec![0; row_len(n_vocab)],
            bytes: Vec::new(),
        };
        let mut head = Vec::with_capacity(20 + 4 * n_chunk * n_ctx);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(n_ctx as u32).to_le_bytes());
        head.extend_from_slice(&(n_vocab as i32).to_le_bytes());
        head.extend_from_slice(&(n_chunk as i32).to_le_bytes());
        for &t in &tokens[..n_chunk * n_ctx] {
            head.extend_from_slice(&(t as i32).to_le_bytes());
        }
        w.write_bytes(&head)?;
        Ok(w)
    }

    fn write_bytes(&mut self, b: &[u8]) -> Result<(), InferenceError> {
        let r = self.out.write_all(b);
        r.map_err(|e| file_error(&self.path, format!("write failed: {e}")))
    }

    /// Appends one window: `logits` holds the scored positions' rows,
    /// `[scored_per_window(n_ctx), n_vocab]` row-major f32.
    ///
    /// Errors: [`InferenceError::LogProbFile`] on a write error or a wrong `logits` length.
    pub fn write_window(&mut self, logits: &[f32]) -> Result<(), InferenceError> {
        let rows = scored_per_window(self.n_ctx);
        if logits.len() != rows * self.n_vocab {
            return Err(file_error(
                &self.path,
                format!(
                    "window of {} logits, expected {rows} positions × {} vocabulary",
                    logits.len(),
                    self.n_vocab
                ),
            ));
        }
        let mut row = std::mem::take(&mut self.row);
        let mut bytes = std::mem::take(&mut self.bytes);
        for l in logits.chunks_exact(self.n_vocab) {
            encode_row(l, &mut row);
            bytes.clear();
            bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
            self.write_bytes(&bytes)?;
        }
        self.row = row;
        self.bytes = bytes;
        Ok(())
    }

    /// Flushes and moves the file into place. Errors: [`InferenceError::LogProbFile`].
    pub fn finish(mut self) -> Result<(), InferenceError> {
        let r = self.out.flush();
        r.map_err(|e| file_error(&self.path, format!("write failed: {e}")))?;
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| file_error(&self.path, format!("cannot move into place: {e}")))?;
        // Nothing left to remove on drop.
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for LogProbWriter {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A base file opened for reading, window by window (a 262k vocabulary makes ~130 MB per
/// window of 512, so windows are streamed, never read whole).
pub struct LogProbReader {
    input: BufReader<File>,
    path: PathBuf,
    /// Window size the base was scored with.
    pub n_ctx: usize,
    /// Vocabulary size of the base model.
    pub n_vocab: usize,
    /// Windows in the file.
    pub n_chunk: usize,
    /// The scored text's tokens, `n_chunk · n_ctx`.
    pub tokens: Vec<u32>,
    bytes: Vec<u8>,
    /// The window [`LogProbReader::read_window`] reads next (for its messages).
    chunk: usize,
}

impl LogProbReader {
    /// Opens `path` and reads its header, checking the magic, the sizes and that the file is
    /// long enough for every window it announces.
    ///
    /// Errors: [`InferenceError::LogProbFile`] naming the file and what is wrong.
    pub fn open(path: &Path) -> Result<Self, InferenceError> {
        let file = File::open(path).map_err(|e| file_error(path, format!("cannot open: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| file_error(path, format!("cannot stat: {e}")))?;
        if meta.is_dir() {
            return Err(file_error(path, "is a folder, not a file"));
        }
        let len = meta.len();
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut head = [0u8; 20];
        input.read_exact(&mut head).map_err(|_| {
            file_error(
                path,
                "shorter than the 20-byte header: not a log-probability file",
            )
        })?;
        if &head[..8] != MAGIC {
            return Err(file_error(
                path,
                "does not start with `_logits_`: not a log-probability file (llama-perplexity --kl-divergence-base)",
            ));
        }
        let word = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
        let n_ctx = u32::from_le_bytes(word(8)) as usize;
        let n_vocab = i32::from_le_bytes(word(12));
        let n_chunk = i32::from_le_bytes(word(16));
        if n_ctx < 4 {
            return Err(file_error(path, format!("n_ctx {n_ctx} is below 4")));
        }
        if n_vocab <= 0 || n_chunk <= 0 {
            return Err(file_error(
                path,
                format!("n_vocab {n_vocab} and n_chunk {n_chunk} must be positive"),
            ));
        }
        let (n_vocab, n_chunk) = (n_vocab as usize, n_chunk as usize);
        // Checked against the file's length before anything is allocated.
        let expected = (n_chunk as u128) * (n_ctx as u128) * 4
            + (n_chunk as u128)
                * (scored_per_window(n_ctx) as u128)
                * (row_len(n_vocab) as u128)
                * 2
            + 20;
        if expected != len as u128 {
            return Err(file_error(
                path,
                format!(
                    "{len} bytes, but n_ctx {n_ctx}, n_vocab {n_vocab} and n_chunk {n_chunk} need {expected} (truncated or not from this format)"
                ),
            ));
        }
        let mut raw = vec![0u8; n_chunk * n_ctx * 4];
        input
            .read_exact(&mut raw)
            .map_err(|e| file_error(path, format!("reading the tokens: {e}")))?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect();
        Ok(LogProbReader {
            input,
            path: path.to_path_buf(),
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            bytes: Vec::new(),
            chunk: 0,
        })
    }

    /// Reads the next window's rows into `out` (resized to
    /// `scored_per_window(n_ctx) · row_len(n_vocab)` values).
    ///
    /// Errors: [`InferenceError::LogProbFile`] on a read error, or when a row's `scale` or
    /// `min_log_prob` is not finite (naming the chunk, from 0, and the position in its window).
    pub fn read_window(&mut self, out: &mut Vec<u16>) -> Result<(), InferenceError> {
        let n = scored_per_window(self.n_ctx) * row_len(self.n_vocab);
        self.bytes.resize(2 * n, 0);
        self.input
            .read_exact(&mut self.bytes)
            .map_err(|e| file_error(&self.path, format!("reading a window: {e}")))?;
        out.clear();
        out.extend(
            self.bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        let first = self.n_ctx / 2;
        for (i, row) in out.chunks_exact(row_len(self.n_vocab)).enumerate() {
            for (what, at) in [("scale", 0), ("min_log_prob", 2)] {
                let v = f32::from_le_bytes(bytes4(row[at], row[at + 1]));
                if !v.is_finite() {
                    return Err(file_error(
                        &self.path,
                        format!(
                            "chunk {}, position {}: {what} is {v}, not a finite number (corrupt file)",
                            self.chunk,
                            first + i
                        ),
                    ));
                }
            }
        }
        self.chunk += 1;
        Ok(())
    }
}

/// Running sums of the comparison with a base (llama.cpp's `kl_divergence_result`), plus the
/// per-position KLD and Δp values for the percentiles.
#[derive(Clone, Debug, Default)]
pub struct KlStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    same_top: usize,
    kld: Vec<f32>,
    p_diff: Vec<f32>,
}

impl KlStats {
    /// Adds one window: `logits` `[rows, n_vocab]` of this model at the scored positions,
    /// `base` the same window's rows from [`LogProbReader::read_window`], `targets` the token
    /// each position predicts (`rows` of them). Panics if the lengths disagree.
    pub fn add_window(&mut self, logits: &[f32], base: &[u16], targets: &[u32], n_vocab: usize) {
        let nv = row_len(n_vocab);
        assert_eq!(logits.len(), targets.len() * n_vocab);
        assert_eq!(base.len(), targets.len() * nv);
        for ((l, b), &tok) in logits
            .chunks_exact(n_vocab)
            .zip(base.chunks_exact(nv))
            .zip(targets)
        {
            self.add_position(l, b, tok as usize);
        }
    }

    /// llama.cpp `log_softmax(n_vocab, logits, base_log_prob, tok, kld)`.
    fn add_position(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let f = |i: usize| f32::from_le_bytes(bytes4(base[i], base[i + 1]));
        let (scale, min_log_prob) = (f(0), f(2));
        let q = &base[4..];
        let (max, lse) = log_sum_exp(logits);
        // The first index of the maximum, as llama.cpp's strict `>` scan finds it.
        let imax = first_max(logits.iter().copied());
        let nll = max + lse - logits[tok];
        let nll_base = -(scale * q[tok] as f32 + min_log_prob);
        let log_z = max + lse;
        let mut kld = 0f64;
        let base_log_p = |i: usize| scale * q[i] as f32 + min_log_prob;
        for (i, &l) in logits.iter().enumerate() {
            let lp = base_log_p(i);
            if lp > MIN_LOG_PROB {
                kld += (lp.exp() * (lp - l + log_z)) as f64;
            }
        }
        let imax_base = first_max((0..logits.len()).map(base_log_p));
        let p_diff = (-nll).exp() - (-nll_base).exp();
        let (nll, nll_base) = (nll as f64, nll_base as f64);
        self.sum_nll += nll;
        self.sum_nll2 += nll * nll;
        self.sum_nll_base += nll_base;
        self.sum_nll_base2 += nll_base * nll_base;
        self.sum_nll_nll_base += nll * nll_base;
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.sum_p_diff += p_diff as f64;
        self.sum_p_diff2 += (p_diff as f64) * (p_diff as f64);
        self.same_top += usize::from(imax == imax_base);
        self.kld.push(kld as f32);
        self.p_diff.push(p_diff);
    }

    /// Positions compared so far.
    pub fn count(&self) -> usize {
        self.kld.len()
    }

    /// The statistics llama-perplexity prints after `--kl-divergence` (mean ± standard error
    /// of the mean as its `mean_and_uncertainty`; percentiles interpolated as its
    /// `percentile`). `None` before any position was added.
    pub fn summary(&self) -> Option<KlSummary> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let mean_unc = |sum: f64, sum2: f64| {
            let m = sum / n as f64;
            let v = sum2 / n as f64 - m * m;
            let u = if v > 0.0 && n > 10 {
                (v / (n - 1) as f64).sqrt()
            } else {
                0.0
            };
            (m, u)
        };
        let (ln_ppl, ln_ppl_u) = mean_unc(self.sum_nll, self.sum_nll2);
        let (ln_base, ln_base_u) = mean_unc(self.sum_nll_base, self.sum_nll_base2);
        // Covariance of the two means (llama.cpp's `covariance`).
        let cov = if n >= 10 {
            (self.sum_nll_nll_base / n as f64 - ln_ppl * ln_base) / (n - 1) as f64
        } else {
            0.0
        };
        let ratio_u = (ln_ppl_u * ln_ppl_u + ln_base_u * ln_base_u - 2.0 * cov)
            .max(0.0)
            .sqrt();
        let (kld, kld_u) = mean_unc(self.sum_kld, self.sum_kld2);
        let (p_diff, _) = mean_unc(self.sum_p_diff, self.sum_p_diff2);
        let mut sorted = self.kld.clone();
        sorted.sort_by(f32::total_cmp);
        Some(KlSummary {
            positions: n,
            ppl: ln_ppl.exp(),
            ppl_error: ln_ppl.exp() * ln_ppl_u,
            ppl_base: ln_base.exp(),
            ppl_base_error: ln_base.exp() * ln_base_u,
            ln_ppl_ratio: ln_ppl - ln_base,
            ln_ppl_ratio_error: ratio_u,
            kld,
            kld_error: kld_u,
            kld_max: *sorted.last().unwrap_or(&0.0),
            kld_99: percentile(&sorted, 0.99),
            kld_median: percentile(&sorted, 0.5),
            p_diff_mean: p_diff,
            p_diff_rms: (self.sum_p_diff2 / n as f64).sqrt(),
            same_top: self.same_top as f64 / n as f64,
        })
    }
}

fn bytes4(lo: u16, hi: u16) -> [u8; 4] {
    let (a, b) = (lo.to_le_bytes(), hi.to_le_bytes());
    [a[0], a[1], b[0], b[1]]
}

/// Index of the first largest value (ties keep the earlier index).
fn first_max(values: impl Iterator<Item = f32>) -> usize {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if i == 0 || v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

/// llama.cpp's interpolated percentile of sorted values (`fraction` in 0..=1).
fn percentile(sorted: &[f32], fraction: f64) -> f64 {
    let p = fraction * (sorted.len() - 1) as f64;
    let i = p as usize;
    let t = p - i as f64;
    let next = sorted[(i + 1).min(sorted.len() - 1)] as f64;
    (1.0 - t) * sorted[i] as f64 + t * next
}

/// What [`KlStats::summary`] reports. KLD in nats per position; Δp = p(target) − p_base(target).
#[derive(Clone, Debug)]
pub struct KlSummary {
    pub positions: usize,
    /// PPL of this model over the compared positions, with its standard error.
    pub ppl: f64,
    pub ppl_error: f64,
    /// PPL of the base (from the file's log-probabilities), with its standard error.
    pub ppl_base: f64,
    pub ppl_base_error: f64,
    /// Mean ln(PPL/PPL_base) and its standard error (correlation of the two taken into account).
    pub ln_ppl_ratio: f64,
    pub ln_ppl_ratio_error: f64,
    /// Mean KL divergence KL(base ‖ this) and its standard error.
    pub kld: f64,
    pub kld_error: f64,
    pub kld_max: f32,
    pub kld_99: f64,
    pub kld_median: f64,
    /// Mean and root mean square of Δp (probabilities, 0..1).
    pub p_diff_mean: f64,
    pub p_diff_rms: f64,
    /// Fraction of positions whose most likely token is the base's.
    pub same_top: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row encoded as llama.cpp encodes it: hand-computed values.
    #[test]
    fn encode_row_matches_llama_cpp_formula() {
        // max 2, min 2 - 16 = -14 (raised from -20), lse = ln(e^0 + e^-1 + e^-22 + e^-3).
        let logits = [2.0f32, 1.0, -20.0, -1.0];
        let mut row = vec![0u16; row_len(4)];
        encode_row(&logits, &mut row);
        let scale = f32::from_le_bytes(bytes4(row[0], row[1]));
        let min_lp = f32::from_le_bytes(bytes4(row[2], row[3]));
        assert_eq!(scale, 16.0 / 65535.0);
        let lse = (1.0f64 + (-1.0f64).exp() + (-22.0f64).exp() + (-3.0f64).exp()).ln();
        assert!((min_lp as f64 - (-16.0 - lse)).abs() < 1e-5, "{min_lp}");
        // (l - min)/scale: 16/scale = 65535, 15/scale, below min → 0, 13/scale.
        assert_eq!(&row[4..], &[65535, 61439, 0, 53247]);
        // Decoding gives back log-softmax within the 16-bit step.
        for (i, &l) in logits.iter().enumerate().filter(|(i, _)| *i != 2) {
            let lp = scale * row[4 + i] as f32 + min_lp;
            assert!(
                (lp as f64 - (l as f64 - 2.0 - lse)).abs() < 2e-4,
                "{i}: {lp}"
            );
        }
    }

    #[test]
    fn same_logits_give_zero_kld_and_equal_ppl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.kld");
        let (n_ctx, n_vocab) = (8usize, 5usize);
        let tokens: Vec<u32> = (0..2 * n_ctx as u32).map(|i| (i * 3) % 5).collect();
        let rows = scored_per_window(n_ctx);
        let window = |w: usize| -> Vec<f32> {
            (0..rows * n_vocab)
                .map(|i| ((i * 7 + w * 11) % 13) as f32 * 0.7 - 3.0)
                .collect()
        };
        let mut wr = LogProbWriter::create(&path, n_ctx, n_vocab, &tokens).unwrap();
        for w in 0..2 {
            wr.write_window(&window(w)).unwrap();
        }
        wr.finish().unwrap();
        let mut rd = LogProbReader::open(&path).unwrap();
        assert_eq!((rd.n_ctx, rd.n_vocab, rd.n_chunk), (8, 5, 2));
        assert_eq!(rd.tokens, tokens);
        let mut stats = KlStats::default();
        let mut base = Vec::new();
        for w in 0..2 {
            rd.read_window(&mut base).unwrap();
            let start = w * n_ctx + n_ctx / 2;
            let targets = &tokens[start + 1..start + 1 + rows];
            stats.add_window(&window(w), &base, targets, n_vocab);
        }
        let s = stats.summary().unwrap();
        assert_eq!(s.positions, 2 * rows);
        // Zero up to the 16-bit step of the stored log-probabilities.
        assert!(s.kld.abs() < 1e-5, "{}", s.kld);
        assert!((s.ppl / s.ppl_base - 1.0).abs() < 1e-4);
        assert_eq!(s.same_top, 1.0);
    }

    #[test]
    fn bad_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.kld");
        std::fs::write(&path, b"_logits_").unwrap();
        let e = LogProbReader::open(&path).err().unwrap().to_string();
        assert!(e.contains("bad.kld") && e.contains("header"), "{e}");
        std::fs::write(&path, [b"_nologit".as_slice(), &[0u8; 12]].concat()).unwrap();
        let e = LogProbReader::open(&path).err().unwrap().to_string();
        assert!(e.contains("_logits_"), "{e}");
        // A header announcing 2^30 windows of a 2^30 vocabulary: refused from its length,
        // nothing allocated.
        let mut h = b"_logits_".to_vec();
        h.extend_from_slice(&512u32.to_le_bytes());
        h.extend_from_slice(&(1i32 << 30).to_le_bytes());
        h.extend_from_slice(&(1i32 << 30).to_le_bytes());
        std::fs::write(&path, &h).unwrap();
        let e = LogProbReader::open(&path).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
        // A folder as the base file to write: refused before anything runs.
        let e = LogProbWriter::create(dir.path(), 8, 5, &[0; 8])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("is a folder"), "{e}");
        // A folder as the base file to read: said so, not "shorter than the header".
        let e = LogProbReader::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("is a folder, not a file"), "{e}");
        // The temp file is never what an error names.
        let e = LogProbWriter::create(&dir.path().join("no/such/b.kld"), 8, 5, &[0; 8])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("b.kld: cannot create") && !e.contains(".tmp-"),
            "{e}"
        );
    }

    #[test]
    fn non_finite_scale_or_min_is_refused_by_chunk_and_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nan.kld");
        let (n_ctx, n_vocab) = (8usize, 5usize);
        let rows = scored_per_window(n_ctx);
        let mut wr = LogProbWriter::create(&path, n_ctx, n_vocab, &[1; 16]).unwrap();
        for _ in 0..2 {
            wr.write_window(&vec![0.5; rows * n_vocab]).unwrap();
        }
        wr.finish().unwrap();
        let clean = std::fs::read(&path).unwrap();
        // Byte offset of value `at` (0: scale, 2: min_log_prob) of row `r` of chunk `c`.
        let offset = |c: usize, r: usize, at: usize| {
            20 + 2 * n_ctx * 4 + ((c * rows + r) * row_len(n_vocab) + at) * 2
        };
        for (c, r, at, v, want) in [
            (0, 0, 0, f32::NAN, "chunk 0, position 4: scale is NaN"),
            (
                1,
                2,
                2,
                f32::INFINITY,
                "chunk 1, position 6: min_log_prob is inf",
            ),
        ] {
            let mut bytes = clean.clone();
            let o = offset(c, r, at);
            bytes[o..o + 4].copy_from_slice(&v.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let mut rd = LogProbReader::open(&path).unwrap();
            let mut base = Vec::new();
            let e = (0..2)
                .map(|_| rd.read_window(&mut base))
                .find_map(Result::err)
                .unwrap()
                .to_string();
            assert!(
                e.contains("nan.kld") && e.contains(want) && e.contains("not a finite number"),
                "{e}"
            );
        }
    }
}
