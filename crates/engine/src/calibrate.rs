//! Once at load: what target batches cost on this machine (so the draft
//! controller can price a draft before the first one is tried), and the
//! self-check that bit-exact speculation rests on — the same tokens decoded
//! one at a time and as batches give bit-identical logits at every row,
//! also when the batch holds another sequence (`core::speculation::invariance`).

use std::io::Read;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use crate::attention_check::{self, Shape};
use crate::{ggml_setup, matmul_check};
use llama_engine_core::cache::verdicts::{Verdicts, MAX_BYTES};
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::files::write_atomically;
use llama_engine_core::speculation::cost::BatchCost;
use llama_engine_core::speculation::invariance::{InvarianceCheck, CHECK_SIZES};

/// Rows of each of two sequences in the mixed-sequence check.
const MIXED_ROWS: usize = 16;

/// Batch sizes timed twice at load: those drafts are verified in.
const RETIMED_MAX: usize = 16;

/// The context the self-check runs in: its cells, batch size, sequences
/// and threads.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub n_ctx: usize,
    pub n_batch: usize,
    pub n_seq: usize,
    pub threads: usize,
    /// `determinism: 'portable'`: the context computes with the portable
    /// kernels, and the kernel checks check those.
    pub portable: bool,
}

/// Measures batch costs into `costs` and runs the self-check, in sequence 0
/// (and 1, when the context has two or more). Leaves the cache empty.
pub fn calibrate(
    ctx: &mut LlamaContext,
    batch: &mut LlamaBatch,
    model: &LlamaModel,
    weight_types: &[String],
    limits: Limits,
    costs: &mut BatchCost,
) -> InvarianceCheck {
    let Limits { n_ctx, n_batch, n_seq, threads, portable } = limits;
    let start = Instant::now();
    let mut check = InvarianceCheck::default();
    let tokens = calibration_tokens(model);
    // A short context first, like a real prompt (it also warms up).
    let prefix = 32.min(n_ctx / 4).max(1);
    let sizes: Vec<usize> = CHECK_SIZES.into_iter().filter(|&n| prefix + n < n_ctx && n <= n_batch).collect();
    let mut cal = Calibration { ctx, batch, costs };
    let outcome = cal.decode_prefix(&tokens[..prefix], 0).and_then(|_| {
        // Plain decoding of the rows, one token at a time: the reference
        // every batch is compared with (and the cost of a batch of one).
        let rows = &tokens[prefix..prefix + sizes.last().copied().unwrap_or(1)];
        let mut reference = Vec::with_capacity(rows.len());
        for (i, &t) in rows.iter().enumerate() {
            cal.decode_alone(t, prefix + i)?;
            reference.push(cal.ctx.get_logits_ith(0).to_vec());
        }
        for &n in &sizes {
            cal.check_batch(&rows[..n], prefix, &reference[..n], &mut check)?;
        }
        // Two sequences in one batch, each in its own KV stream, each
        // against the same reference: what neighbours in a batch must not change.
        let mixed = MIXED_ROWS.min(rows.len());
        if n_seq >= 2 && check.mismatch.is_none() && 2 * mixed <= n_batch && mixed > 0 {
            cal.decode_prefix(&tokens[..prefix], 1)?;
            cal.check_mixed(&rows[..mixed], prefix, &reference[..mixed], &mut check)?;
        }
        Ok(())
    });
    if let Err(e) = outcome {
        check.fail(e.message);
    }
    // Portable mode has no flash attention to check (attention is a
    // product, a softmax and a product there, as the decodes above ran it).
    if check.holds() && !portable {
        attention(model, threads, &mut check);
    }
    if check.holds() {
        matmul(threads, portable, weight_types, &mut check);
    }
    // The portable kernels compute the reference machine's bits here.
    if check.holds() && portable {
        let differ = crate::portable::portable_mismatches();
        if !differ.is_empty() {
            check.fail(format!("the portable kernels compute other bits on this CPU than on the reference machine: {}", differ.join(", ")));
        }
    }
    check.kernels = if portable { crate::portable::PORTABLE_KERNELS.to_string() } else { ggml_setup::fast_kernels() };
    ctx_clear(cal.ctx);
    check.ms = start.elapsed().as_secs_f64() * 1000.0;
    check
}

/// The attention kernel over long caches (`engine::attention_check`).
fn attention(model: &LlamaModel, threads: usize, check: &mut InvarianceCheck) {
    let Some(shape) = Shape::of(model) else {
        check.fail("the model's attention shape is not known");
        return;
    };
    match attention_check::check(shape, threads) {
        Ok(None) => check.attention_cells = attention_check::CELLS.to_vec(),
        Ok(Some(m)) => {
            check.attention_mismatch = Some(format!(
                "row {} of a batch of {} over {} cells, {} thread(s), differs from the row alone",
                m.row, m.batch, m.cells, m.threads
            ))
        }
        Err(why) => check.fail(why),
    }
}

/// Each weight type's mat-mul kernels (`engine::matmul_check`). A type the
/// models do not hold may differ without making the verdict false: it is
/// named, as a warning for models that hold it.
fn matmul(threads: usize, portable: bool, weight_types: &[String], check: &mut InvarianceCheck) {
    match matmul_check::check(threads, portable) {
        Ok(found) => {
            for (kind, repacked, mismatch) in found {
                match mismatch {
                    None if repacked => check.matmul_types.push(format!("{kind} (plain and repacked)")),
                    None => check.matmul_types.push(kind.to_string()),
                    Some(m) => {
                        let why = format!(
                            "{} weights{}: row {} of a batch of {}, {} thread(s), differs from the row alone",
                            m.kind,
                            if m.repacked { " (repacked)" } else { "" },
                            m.row,
                            m.batch,
                            m.threads
                        );
                        if weight_types.iter().any(|t| t == kind) {
                            check.matmul_mismatch.get_or_insert(why);
                        } else {
                            check.matmul_elsewhere.push(why);
                        }
                    }
                }
            }
        }
        Err(why) => check.fail(why),
    }
}

/// Self-checks that held, by model file, adapters, context settings and
/// build, with the batch costs measured with them: an engine loaded again
/// with the same ones — in this process (a server reloading, a test suite),
/// or in another when a file keeps them (`selfCheckCache`: a restarted
/// isolated engine, the next server process) — reuses the verdict instead
/// of decoding the same batches again. The verdict is a fact of this build
/// on this CPU for those inputs; a check that failed is run again at every
/// load and never kept.
static CHECKED: Mutex<Vec<(String, InvarianceCheck, BatchCost)>> = Mutex::new(Vec::new());
/// Verdicts kept in this process (the oldest forgotten first).
const CHECKED_MAX: usize = 16;

/// The verdict of an earlier load with this `key`: in this process, else
/// in `file` (read whole and checked; a file that is not right is ignored,
/// and replaced at the next verdict kept).
pub fn earlier_verdict(key: &str, file: Option<&Path>) -> Option<(InvarianceCheck, BatchCost)> {
    {
        let done = CHECKED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, check, costs)) = done.iter().find(|(k, _, _)| k == key) {
            return Some((InvarianceCheck { reused: true, ..check.clone() }, costs.clone()));
        }
    }
    let file = file?;
    let verdicts = read_verdicts(file)?;
    let v = verdicts.get(key)?;
    remember(key, &v.check, &v.costs);
    let kept_in = Some(file.display().to_string());
    Some((InvarianceCheck { reused: true, kept_in, ..v.check.clone() }, v.costs.clone()))
}

/// Keeps a verdict that held for later loads: in this process, and in
/// `file` when given (written atomically; a file that cannot be written is
/// left as it is — the next load checks again).
pub fn keep_verdict(key: &str, check: &InvarianceCheck, costs: &BatchCost, file: Option<&Path>) {
    if !check.holds() {
        return;
    }
    remember(key, check, costs);
    let Some(file) = file else { return };
    let mut verdicts = read_verdicts(file).unwrap_or_default();
    verdicts.put(key, check, costs);
    if let Some(dir) = file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let bytes = verdicts.to_bytes();
    let _ = write_atomically(file, |w| w.write_all(&bytes));
}

fn remember(key: &str, check: &InvarianceCheck, costs: &BatchCost) {
    let mut done = CHECKED.lock().unwrap_or_else(|p| p.into_inner());
    done.retain(|(k, _, _)| k != key);
    if done.len() >= CHECKED_MAX {
        done.remove(0);
    }
    done.push((key.to_owned(), check.clone(), costs.clone()));
}

fn read_verdicts(file: &Path) -> Option<Verdicts> {
    let mut bytes = Vec::new();
    std::fs::File::open(file).ok()?.take(MAX_BYTES as u64 + 1).read_to_end(&mut bytes).ok()?;
    Verdicts::parse(&bytes).ok()
}

/// Varied, real tokens (prose, code, digits, accents), enough for the
/// prefix and the largest checked batch.
pub fn calibration_tokens(model: &LlamaModel) -> Vec<LlamaToken> {
    const TEXT: &str = "The lighthouse keeper wrote down the weather at 6:45 every evening. \
        fn main() { let total: u32 = (1..=10).map(|x| x * x).sum(); println!(\"{total}\"); } \
        Naïve café owners in Zürich sold 1,024 croissants; 37% were déjà réservés. \
        {\"name\": \"Alice\", \"age\": 31, \"tags\": [\"a\", \"b\"]} <div class=\"note\">Done.</div>";
    let n = 32 + CHECK_SIZES[CHECK_SIZES.len() - 1];
    let n_vocab = model.n_vocab();
    let mut tokens: Vec<LlamaToken> = model.vocab().tokenize(TEXT.as_bytes(), false, false);
    tokens.retain(|t| (0..n_vocab).contains(&t.0));
    if tokens.is_empty() {
        tokens.push(LlamaToken(0));
    }
    tokens.iter().copied().cycle().take(n).collect()
}

fn ctx_clear(ctx: &mut LlamaContext) {
    ctx.clear_kv_cache();
}

struct Calibration<'a, 'm, 'b> {
    ctx: &'a mut LlamaContext<'m>,
    batch: &'a mut LlamaBatch<'b>,
    costs: &'a mut BatchCost,
}

impl Calibration<'_, '_, '_> {
    fn decode(&mut self) -> Result<f64> {
        let t = Instant::now();
        self.ctx.decode(self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    }

    fn add(&mut self, token: LlamaToken, pos: usize, seq: i32, logits: bool) -> Result<()> {
        self.batch.add(token, pos as i32, &[seq], logits).map_err(|e| EngineError::internal(format!("batch: {e}")))
    }

    fn clear_from(&mut self, seq: i32, pos: usize) -> Result<()> {
        self.ctx.kv_cache_seq_rm(seq, Some(pos as u32), None).map(|_| ()).map_err(|e| EngineError::internal(format!("kv cache: {e}")))
    }

    fn decode_prefix(&mut self, tokens: &[LlamaToken], seq: i32) -> Result<()> {
        self.batch.clear();
        for (i, &t) in tokens.iter().enumerate() {
            self.add(t, i, seq, i + 1 == tokens.len())?;
        }
        self.decode().map(|_| ())
    }

    /// Decodes one token at `pos` of sequence 0 (holding the positions
    /// before it) with its logits, timed as a batch of one.
    fn decode_alone(&mut self, token: LlamaToken, pos: usize) -> Result<()> {
        self.batch.clear();
        self.add(token, pos, 0, true)?;
        let ms = self.decode()?;
        self.costs.observe(1, ms);
        Ok(())
    }

    /// Decodes `rows` as one batch at positions from `base` (timed) and
    /// compares every row's logits bit for bit with `reference`, the same
    /// rows decoded one at a time. Leaves the cache at `base`.
    fn check_batch(&mut self, rows: &[LlamaToken], base: usize, reference: &[Vec<f32>], check: &mut InvarianceCheck) -> Result<()> {
        let n = rows.len();
        self.clear_from(0, base)?;
        self.batch.clear();
        for (i, &t) in rows.iter().enumerate() {
            self.add(t, base + i, 0, true)?;
        }
        let mut ms = self.decode()?;
        if (0..n).all(|r| check.compare(n, r, &reference[r], self.ctx.get_logits_ith(r as i32))) {
            check.passed(n);
        }
        self.clear_from(0, base)?;
        if n <= RETIMED_MAX {
            ms = ms.min(self.retime(rows, base)?);
        }
        self.costs.observe(n, ms);
        Ok(())
    }

    /// The same batch decoded again, timed only: one measurement taken in a
    /// busy moment would otherwise price drafts of that length out until the
    /// engine runs that size again (the lower of two is kept).
    fn retime(&mut self, rows: &[LlamaToken], base: usize) -> Result<f64> {
        self.batch.clear();
        for (i, &t) in rows.iter().enumerate() {
            self.add(t, base + i, 0, true)?;
        }
        let ms = self.decode()?;
        self.clear_from(0, base)?;
        Ok(ms)
    }

    /// The same rows in sequences 0 and 1 of one batch (each after the same
    /// prefix): both must give the reference logits.
    fn check_mixed(&mut self, rows: &[LlamaToken], base: usize, reference: &[Vec<f32>], check: &mut InvarianceCheck) -> Result<()> {
        let n = rows.len();
        self.batch.clear();
        for seq in 0..2 {
            for (i, &t) in rows.iter().enumerate() {
                self.add(t, base + i, seq, true)?;
            }
        }
        self.decode()?;
        let same = (0..2 * n).all(|r| check.compare(2 * n, r, &reference[r % n], self.ctx.get_logits_ith(r as i32)));
        if same {
            check.passed_mixed();
        }
        self.clear_from(0, base)?;
        self.clear_from(1, 0)
    }
}
