//! The host-memory prompt cache: states of prompts that left their slot
//! (another request needed the slot), kept in RAM up to a byte limit, least
//! recently used first out, and restored when a later prompt starts with
//! one of them. Knows tokens and bytes only; the engine reads and writes
//! the states.

use super::positions::Positions;
use super::state::Cells;

/// How many last tokens a state may differ in from a newer one and still be
/// replaced by it (see `PromptCache::insert`).
const SIBLING_TAIL: usize = 64;

/// A prompt's state.
pub struct Entry {
    pub tokens: Vec<i32>,
    pub cells: Cells,
    /// Holds only a sliding window of some layers' cells: usable only to go
    /// on after its last token.
    pub windowed: bool,
    /// The LoRA adapters that computed the cells (`core::request::lora_tag`;
    /// 0: none): reused only by requests with the same.
    pub tag: u64,
    /// Where its cells sit (M-RoPE media shift the text after them).
    pub positions: Positions,
    used: u64,
}

impl Entry {
    pub fn bytes(&self) -> usize {
        self.cells.len() + 4 * self.tokens.len()
    }
}

/// How many tokens of a state of `held` can be reused for `prompt`: the
/// common prefix, less one when it is the whole prompt (the last token is
/// evaluated again for its logits, which a state does not keep); a
/// windowed state only from its last token on (all of it, or all but its
/// last token), or nothing.
pub fn reusable(held: &[i32], windowed: bool, prompt: &[i32]) -> usize {
    let common = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let n = common.min(prompt.len().saturating_sub(1));
    if windowed && n + 1 < held.len() {
        return 0;
    }
    n
}

#[derive(Default)]
pub struct PromptCache {
    entries: Vec<Entry>,
    limit: usize,
    bytes: usize,
    hits: u64,
    clock: u64,
}

/// What `status()` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub entries: usize,
    pub bytes: usize,
    pub hits: u64,
    pub limit: usize,
}

impl PromptCache {
    /// A cache of at most `limit` bytes (0: off).
    pub fn new(limit: usize) -> Self {
        PromptCache { limit, ..Default::default() }
    }

    pub fn is_on(&self) -> bool {
        self.limit > 0
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats { entries: self.entries.len(), bytes: self.bytes, hits: self.hits, limit: self.limit }
    }

    /// Whether a state that starts with all of `tokens` (computed with the
    /// adapters of `tag`) is held already.
    pub fn holds(&self, tokens: &[i32], tag: u64) -> bool {
        self.entries.iter().any(|e| e.tag == tag && e.tokens.starts_with(tokens))
    }

    /// Keeps a state of `tokens`. States it extends (their tokens are a
    /// prefix of these) go, and so do its near-copies: states that share
    /// at least half their tokens with it and differ only in their last
    /// `SIBLING_TAIL` tokens at most (the same prompt with another short
    /// answer, a request cut early) — the newest keeps what they share,
    /// recomputing the rest costs less than a prefill step, and a stream of
    /// requests on the same prompts does not fill the cache with copies.
    /// Then the least recently used go, until it fits. A state larger than
    /// the whole cache is not kept.
    pub fn insert(&mut self, tokens: Vec<i32>, cells: Cells, windowed: bool, tag: u64, positions: Positions) {
        self.clock += 1;
        let entry = Entry { tokens, cells, windowed, tag, positions, used: self.clock };
        let size = entry.bytes();
        if size > self.limit || self.holds(&entry.tokens, tag) {
            return;
        }
        self.entries.retain(|e| {
            if e.tag != entry.tag {
                return true;
            }
            let common = e.tokens.iter().zip(&entry.tokens).take_while(|(a, b)| a == b).count();
            let near_copy = 2 * common >= e.tokens.len() && e.tokens.len() - common <= SIBLING_TAIL;
            !near_copy
        });
        self.bytes = self.entries.iter().map(Entry::bytes).sum();
        while self.bytes + size > self.limit {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else { break };
            self.bytes -= self.entries.swap_remove(oldest).bytes();
        }
        self.bytes += size;
        self.entries.push(entry);
    }

    /// The entry with the most tokens reusable for `prompt` with the
    /// adapters of `tag`, and how many.
    pub fn best(&self, prompt: &[i32], tag: u64) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, if e.tag == tag { reusable(&e.tokens, e.windowed, prompt) } else { 0 }))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].used))
    }

    /// Entry `i`, used now (a hit).
    pub fn hit(&mut self, i: usize) -> &Entry {
        self.clock += 1;
        self.hits += 1;
        let e = &mut self.entries[i];
        e.used = self.clock;
        e
    }

    /// Drops entry `i` (its state failed to restore).
    pub fn remove(&mut self, i: usize) {
        if i < self.entries.len() {
            self.bytes -= self.entries.swap_remove(i).bytes();
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::state::tests::fake_blob;

    fn cells(n: u32) -> Cells {
        Cells::from_blob(&fake_blob(n, 0, 1, None)).unwrap()
    }

    fn toks(r: std::ops::Range<i32>) -> Vec<i32> {
        r.collect()
    }

    #[test]
    fn reuse_leaves_one_token_to_evaluate_and_windows_only_go_on() {
        assert_eq!(reusable(&[1, 2, 3], false, &[1, 2, 3, 4]), 3);
        assert_eq!(reusable(&[1, 2, 3], false, &[1, 2, 3]), 2);
        assert_eq!(reusable(&[1, 2, 3], false, &[1, 9]), 1);
        assert_eq!(reusable(&[1, 2, 3], true, &[1, 2, 3, 4]), 3);
        assert_eq!(reusable(&[1, 2, 3], true, &[1, 2, 7]), 2);
        assert_eq!(reusable(&[1, 2, 3], true, &[1, 9, 3]), 0);
    }

    #[test]
    fn the_longest_prefix_wins_and_hits_are_counted() {
        let mut c = PromptCache::new(1 << 20);
        c.insert(toks(0..10), cells(10), false, 0, Positions::default());
        c.insert(toks(100..120), cells(20), false, 0, Positions::default());
        assert_eq!(c.best(&toks(0..30), 0), Some((0, 10)));
        assert_eq!(c.best(&toks(100..105), 0), Some((1, 4)));
        assert_eq!(c.best(&[7], 0), None);
        c.hit(1);
        assert_eq!(c.stats().hits, 1);
        assert_eq!(c.stats().entries, 2);
    }

    #[test]
    fn an_extended_prompt_replaces_its_prefix_and_a_contained_one_is_not_kept_twice() {
        let mut c = PromptCache::new(1 << 20);
        c.insert(toks(0..10), cells(10), false, 0, Positions::default());
        c.insert(toks(0..20), cells(20), false, 0, Positions::default());
        assert_eq!(c.stats().entries, 1);
        c.insert(toks(0..5), cells(5), false, 0, Positions::default());
        assert_eq!(c.stats().entries, 1);
        assert_eq!(c.stats().bytes, c.entries[0].bytes());
    }

    #[test]
    fn siblings_give_way_to_the_newest_so_repeats_do_not_fill_the_cache() {
        let mut c = PromptCache::new(1 << 24);
        let answer =
            |prompt: std::ops::Range<i32>, answer: i32| -> Vec<i32> { toks(prompt).into_iter().chain([answer, answer + 1]).collect() };
        // The same 30-token prompt answered ten ways: one entry, the newest.
        for a in 0..10 {
            c.insert(answer(0..30, 1000 + 10 * a), cells(32), false, 0, Positions::default());
        }
        assert_eq!(c.stats().entries, 1);
        assert_eq!(c.entries[0].tokens[30], 1090);
        // A different prompt sharing less than half stays apart.
        c.insert(toks(0..10).into_iter().chain(500..540).collect(), cells(50), false, 0, Positions::default());
        assert_eq!(c.stats().entries, 2);
        // Two users after one long system prompt, with turns of 100 tokens:
        // both kept (recomputing a turn is not free).
        let mut c = PromptCache::new(1 << 24);
        c.insert(toks(0..1000).into_iter().chain(2000..2100).collect(), cells(1100), false, 0, Positions::default());
        c.insert(toks(0..1000).into_iter().chain(3000..3100).collect(), cells(1100), false, 0, Positions::default());
        assert_eq!(c.stats().entries, 2);
        assert_eq!(c.stats().bytes, c.entries.iter().map(Entry::bytes).sum::<usize>());
    }

    #[test]
    fn least_recently_used_goes_first_and_the_limit_holds() {
        let one =
            Entry { tokens: toks(0..10), cells: cells(10), windowed: false, tag: 0, positions: Positions::default(), used: 0 }.bytes();
        let mut c = PromptCache::new(2 * one + one / 2);
        c.insert(toks(0..10), cells(10), false, 0, Positions::default());
        c.insert(toks(100..110), cells(10), false, 0, Positions::default());
        c.hit(0); // the first is now the more recent
        c.insert(toks(200..210), cells(10), false, 0, Positions::default());
        assert_eq!(c.stats().entries, 2);
        assert!(c.stats().bytes <= c.stats().limit);
        assert!(c.best(&toks(0..20), 0).is_some() && c.best(&toks(100..120), 0).is_none());
        // Larger than the whole cache: not kept; off: nothing kept.
        c.insert(toks(300..400), cells(100), false, 0, Positions::default());
        assert!(c.best(&toks(300..400), 0).is_none());
        let mut off = PromptCache::new(0);
        off.insert(toks(0..10), cells(10), false, 0, Positions::default());
        assert!(!off.is_on() && off.stats().entries == 0);
    }

    /// States computed with other LoRA adapters are neither reused nor
    /// replaced by a prompt's state with none.
    #[test]
    fn adapters_keep_states_apart() {
        let mut c = PromptCache::new(1 << 20);
        c.insert(toks(0..20), cells(20), false, 7, Positions::default());
        assert_eq!(c.best(&toks(0..30), 0), None);
        assert_eq!(c.best(&toks(0..30), 7), Some((0, 20)));
        assert!(!c.holds(&toks(0..10), 0) && c.holds(&toks(0..10), 7));
        c.insert(toks(0..20), cells(20), false, 0, Positions::default());
        assert_eq!(c.stats().entries, 2);
    }
}
