//! Token sequences indexed for suffix matching: every position where a
//! short anchor (the `ANCHOR` tokens before it) occurs, so that the longest
//! suffix of a request's history found anywhere in the sequences, and what
//! followed each occurrence, are found in time proportional to the
//! occurrences of its last few tokens, not to the text.
//!
//! The sequences are kept whole (a draft is a copy of what followed a match,
//! as long as the match was), oldest first; past `cap` tokens the oldest
//! sequences are dropped, and index entries of dropped sequences are skipped
//! on reading and swept out once they are as many as the live ones.

use std::collections::{HashMap, VecDeque};

/// Tokens before a position that the index is keyed by.
pub const ANCHOR: usize = 3;
/// Longest match measured: beyond this, a longer match predicts no better.
pub const MAX_MATCH: usize = 64;
/// Occurrences of an anchor examined per lookup, newest first.
const MAX_EXAMINED: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct At {
    seq: u64,
    /// The position right after the anchor.
    pos: u32,
}

#[derive(Debug, Clone)]
pub struct SuffixIndex {
    /// (id, tokens), oldest first; ids count up from `first_id`.
    seqs: VecDeque<(u64, Vec<i32>)>,
    next_id: u64,
    index: HashMap<u64, Vec<At>>,
    n_tokens: usize,
    n_entries: usize,
    n_stale: usize,
    cap: usize,
}

/// One occurrence of the history's suffix: how many tokens matched, and the
/// tokens that followed it (at most the length asked for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub len: usize,
    pub continuation: Vec<i32>,
}

fn anchor_key(tokens: &[i32]) -> u64 {
    // FNV-1a over the anchor's token ids.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

impl Default for SuffixIndex {
    /// The shared index's default size.
    fn default() -> Self {
        SuffixIndex::new(super::DEFAULT_SUFFIX_CACHE_TOKENS)
    }
}

impl SuffixIndex {
    /// An index holding at most `cap` tokens (0: none).
    pub fn new(cap: usize) -> Self {
        SuffixIndex { seqs: VecDeque::new(), next_id: 0, index: HashMap::new(), n_tokens: 0, n_entries: 0, n_stale: 0, cap }
    }

    /// An index without a cap (a request's own history).
    pub fn unbounded() -> Self {
        SuffixIndex::new(usize::MAX)
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn n_sequences(&self) -> usize {
        self.seqs.len()
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    #[cfg(test)]
    pub fn n_entries_for_tests(&self) -> usize {
        self.index.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The sequences, oldest first.
    pub fn sequences(&self) -> impl Iterator<Item = &[i32]> {
        self.seqs.iter().map(|(_, t)| t.as_slice())
    }

    pub fn clear(&mut self) {
        *self = SuffixIndex::new(self.cap);
    }

    /// Adds a sequence; drops the oldest ones while over the cap (a sequence
    /// longer than the cap keeps its last `cap` tokens).
    pub fn push(&mut self, tokens: &[i32]) {
        if self.cap == 0 {
            return;
        }
        let tokens = if tokens.len() > self.cap { &tokens[tokens.len() - self.cap..] } else { tokens };
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.push_back((id, Vec::with_capacity(tokens.len())));
        self.extend_last(tokens);
        while self.n_tokens > self.cap && self.seqs.len() > 1 {
            self.drop_oldest();
        }
    }

    /// Appends to the newest sequence (one being written: a request's
    /// history as it grows), indexing the new positions. Every position
    /// from `ANCHOR` to the end is indexed, the end too: it becomes a
    /// position with a continuation when the sequence grows.
    pub fn extend_last(&mut self, more: &[i32]) {
        let Some((id, tokens)) = self.seqs.back_mut() else {
            return self.push(more);
        };
        let id = *id;
        let start = tokens.len();
        tokens.extend_from_slice(more);
        self.n_tokens += more.len();
        let from = if start >= ANCHOR { start + 1 } else { ANCHOR };
        for pos in from..=tokens.len() {
            let key = anchor_key(&tokens[pos - ANCHOR..pos]);
            self.index.entry(key).or_default().push(At { seq: id, pos: pos as u32 });
            self.n_entries += 1;
        }
    }

    /// The newest sequence (empty when there is none).
    pub fn last(&self) -> &[i32] {
        self.seqs.back().map_or(&[], |(_, t)| t.as_slice())
    }

    /// Drops the oldest sequence (a store that caps several indexes
    /// together chooses which).
    pub fn drop_oldest(&mut self) {
        if let Some((_, tokens)) = self.seqs.pop_front() {
            self.n_tokens -= tokens.len();
            self.n_stale += (tokens.len() + 1).saturating_sub(ANCHOR);
        }
        if self.n_stale * 2 > self.n_entries {
            self.sweep();
        }
    }

    /// Removes the index entries of dropped sequences.
    fn sweep(&mut self) {
        let oldest = self.seqs.front().map_or(self.next_id, |(id, _)| *id);
        self.index.retain(|_, ats| {
            ats.retain(|a| a.seq >= oldest);
            !ats.is_empty()
        });
        self.n_entries = self.index.values().map(Vec::len).sum();
        self.n_stale = 0;
    }

    fn seq(&self, id: u64) -> Option<&[i32]> {
        let first = self.seqs.front()?.0;
        let i = id.checked_sub(first)? as usize;
        self.seqs.get(i).filter(|(sid, _)| *sid == id).map(|(_, t)| t.as_slice())
    }

    /// Every occurrence of `history`'s last `ANCHOR` tokens (newest first,
    /// at most `MAX_EXAMINED`) with how far the match reaches back and up to
    /// `n` tokens that followed it. (The end of a sequence, which has no
    /// continuation, is skipped: the history itself when it is the newest.)
    pub fn matches(&self, history: &[i32], n: usize) -> Vec<Match> {
        let mut out = Vec::new();
        if history.len() < ANCHOR || n == 0 {
            return out;
        }
        let Some(ats) = self.index.get(&anchor_key(&history[history.len() - ANCHOR..])) else { return out };
        for at in ats.iter().rev().take(MAX_EXAMINED) {
            let Some(seq) = self.seq(at.seq) else { continue };
            let pos = at.pos as usize;
            if pos >= seq.len() {
                continue;
            }
            let mut len = 0;
            while len < MAX_MATCH && len < pos && len < history.len() && seq[pos - 1 - len] == history[history.len() - 1 - len] {
                len += 1;
            }
            if len < ANCHOR {
                continue; // an anchor-hash collision
            }
            out.push(Match { len, continuation: seq[pos..(pos + n).min(seq.len())].to_vec() });
        }
        out
    }
}
