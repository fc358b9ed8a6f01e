//! The suffix drafter: the longest suffix of a request's history found in
//! its own history (the prompt and the output so far) or in the outputs of
//! earlier requests (one index shared by every slot of the engine), and
//! what followed its occurrences, voted by how long each match is. Agents
//! repeat themselves — the same JSON keys, the same file re-emitted with one
//! change, the same call shapes — and a match of 20 tokens predicts the
//! next ones far better than the 4-gram of prompt lookup.

use std::sync::{Arc, Mutex};

use super::index::{SuffixIndex, ANCHOR};
use super::store::SuffixStore;
use crate::speculation::controller::DraftController;
use crate::speculation::drafter::{Draft, Drafter};
use crate::speculation::entry::{DrafterEntry, DrafterHost, Runs};
use crate::text::events::TokenSource;

/// In `auto`; needs only the index every engine has. First of the lookup
/// drafters: where it matches, its match is longer than an n-gram's. Its
/// controller is kept across requests: how far a match of each class can be
/// trusted is a property of the workload (an agent's records, its edits),
/// learnt over requests that are each too short to learn it alone.
pub const ENTRY: DrafterEntry = DrafterEntry {
    name: "suffix",
    runs: Runs::Named { in_auto: true, needs_draft_model: false },
    prior: 0.6,
    keeps_controller: true,
    make,
};

/// Classes of a drafted token: how long the match was (under 8, 16, 32
/// tokens, or more) × whether the token had at least `SURE` of the vote,
/// counted with `EVIDENCE` more tokens of match against it (one occurrence
/// alone is not sure; several that agree are).
pub const SUFFIX_CLASSES: usize = 8;
/// Acceptance assumed for each class before a request has measured its
/// own: a long match with a clear vote is a copy in progress.
pub const SUFFIX_PRIORS: [f64; SUFFIX_CLASSES] = [0.25, 0.45, 0.35, 0.65, 0.45, 0.8, 0.5, 0.9];
const SURE: f64 = 0.75;
const EVIDENCE: f64 = 12.0;
/// A token with less of the vote than this ends the draft.
const MIN_SHARE: f64 = 0.3;

fn make<'m>(e: &DrafterEntry, host: &mut dyn DrafterHost<'m>) -> Option<(Box<dyn Drafter + 'm>, DraftController)> {
    let ctl = host.kept_controller(e.name).unwrap_or_else(|| {
        DraftController::new(host.n_max(), host.adaptive(), e.prior).with_loss_check(false).with_classes(&SUFFIX_PRIORS)
    });
    let (store, namespace) = host.suffix_store();
    Some((Box::new(SuffixDrafter::new(store, namespace)), ctl))
}

pub struct SuffixDrafter {
    /// This request's history: its prompt, then its output as it grows.
    local: SuffixIndex,
    /// Outputs of earlier requests, shared by the engine's slots, and the
    /// namespace this request reads and adds to.
    global: Arc<Mutex<SuffixStore>>,
    namespace: String,
    n_prompt: usize,
    last_draft: usize,
}

impl SuffixDrafter {
    pub fn new(global: Arc<Mutex<SuffixStore>>, namespace: String) -> Self {
        SuffixDrafter { local: SuffixIndex::unbounded(), global, namespace, n_prompt: 0, last_draft: 0 }
    }

    /// Indexes what `history` adds to what the local index holds; starts
    /// over when it is not an extension (a context shift rewrote it).
    fn catch_up(&mut self, history: &[i32]) {
        let seen = self.local.last();
        let tail = seen.len().min(ANCHOR + 1);
        let extends = history.len() >= seen.len() && history[seen.len() - tail..seen.len()] == seen[seen.len() - tail..];
        if !extends {
            self.local.clear();
            self.local.push(history);
            self.n_prompt = self.n_prompt.min(history.len());
            return;
        }
        let n = seen.len();
        if history.len() > n {
            self.local.extend_last(&history[n..]);
        }
    }
}

/// The draft the matches vote for: at each depth, among the matches that
/// agree with the draft so far, the token with the largest share of the
/// vote (each match weighs its length); it stops at `n_max`, where no match
/// goes on, or where the leading token's share falls below `MIN_SHARE`.
/// Each token's class: its match length and whether its share was `SURE`.
pub fn vote(matches: &[(usize, &[i32])], n_max: usize) -> (Vec<i32>, Vec<u8>) {
    let longest = matches.iter().map(|m| m.0).max().unwrap_or(0);
    // Matches much shorter than the longest are other contexts.
    let floor = (longest / 2).max(ANCHOR);
    let mut alive: Vec<&(usize, &[i32])> = matches.iter().filter(|m| m.0 >= floor).collect();
    let bucket = match longest {
        0..=7 => 0,
        8..=15 => 1,
        16..=31 => 2,
        _ => 3,
    };
    let (mut tokens, mut classes) = (Vec::new(), Vec::new());
    for depth in 0..n_max {
        let mut votes: Vec<(i32, f64)> = Vec::new();
        let mut total = 0.0;
        for m in &alive {
            if let Some(&t) = m.1.get(depth) {
                let w = m.0 as f64;
                total += w;
                match votes.iter_mut().find(|(v, _)| *v == t) {
                    Some(v) => v.1 += w,
                    None => votes.push((t, w)),
                }
            }
        }
        let Some(&(best, w)) = votes.iter().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0))) else { break };
        let share = w / total;
        if share < MIN_SHARE {
            break;
        }
        tokens.push(best);
        classes.push((bucket * 2 + usize::from(w / (total + EVIDENCE) >= SURE)) as u8);
        alive.retain(|m| m.1.get(depth) == Some(&best));
    }
    (tokens, classes)
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> &'static str {
        ENTRY.name
    }

    fn begin(&mut self, prompt: &[i32]) {
        self.local.clear();
        self.local.push(prompt);
        self.n_prompt = prompt.len();
        self.last_draft = 0;
    }

    fn draft(&mut self, history: &[i32], n_max: usize, _position: usize) -> Option<Draft> {
        self.catch_up(history);
        self.last_draft = 0;
        if n_max == 0 {
            return None;
        }
        let mut found = self.local.matches(history, n_max);
        found.extend(self.global.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).matches(&self.namespace, history, n_max));
        let matches: Vec<(usize, &[i32])> = found.iter().map(|m| (m.len, m.continuation.as_slice())).collect();
        let (tokens, classes) = vote(&matches, n_max);
        if tokens.is_empty() {
            return None;
        }
        self.last_draft = tokens.len();
        Some(Draft::new(tokens, TokenSource(ENTRY.name), classes))
    }

    fn accept(&mut self, _n_accepted: usize) {
        self.last_draft = 0;
    }

    /// The request's output (what it generated, as far as its last draft
    /// saw it) joins the shared index, for the requests that follow.
    fn end(&mut self) {
        let history = self.local.last();
        if history.len() > self.n_prompt + ANCHOR {
            let output = history[self.n_prompt.saturating_sub(ANCHOR)..].to_vec();
            self.global.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(&self.namespace, &output);
        }
        self.local.clear();
        self.n_prompt = 0;
    }

    fn is_cheap(&self) -> bool {
        true
    }

    fn ms_per_token(&self) -> Option<f64> {
        // Hash lookups and a few hundred short comparisons per draft.
        Some(0.02)
    }
}
