use std::sync::{Arc, Mutex};

use super::*;
use crate::speculation::drafter::Drafter;

/// A deterministic token stream (xorshift), ids below `vocab`.
fn stream(seed: u64, n: usize, vocab: i32) -> Vec<i32> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as i32
        })
        .collect()
}

#[test]
fn finds_the_longest_match_and_what_followed() {
    let mut idx = SuffixIndex::unbounded();
    idx.push(&[1, 2, 3, 4, 5, 6, 7, 8]);
    idx.push(&[9, 3, 4, 5, 10, 11]);
    let mut m = idx.matches(&[0, 2, 3, 4, 5], 3);
    m.sort_by_key(|m| std::cmp::Reverse(m.len));
    assert_eq!(m, vec![Match { len: 4, continuation: vec![6, 7, 8] }, Match { len: 3, continuation: vec![10, 11] }]);
    // Nothing after the end of a sequence, and fewer than ANCHOR tokens match nothing.
    assert!(idx.matches(&[6, 7, 8], 3).is_empty());
    assert!(idx.matches(&[4, 5], 3).is_empty());
}

#[test]
fn a_growing_sequence_is_indexed_once_per_position() {
    let tokens = stream(7, 500, 50);
    let mut whole = SuffixIndex::unbounded();
    whole.push(&tokens);
    let mut grown = SuffixIndex::unbounded();
    grown.push(&tokens[..1]);
    for chunk in tokens[1..].chunks(7) {
        grown.extend_last(chunk);
    }
    for end in [10, 120, 333, 499] {
        let h = &tokens[..end];
        assert_eq!(whole.matches(h, 8), grown.matches(h, 8), "at {end}");
    }
}

#[test]
fn the_cap_drops_the_oldest_sequences_and_their_entries() {
    let mut idx = SuffixIndex::new(1000);
    let first = stream(1, 400, 1000);
    idx.push(&first);
    for seed in 2..20 {
        idx.push(&stream(seed, 400, 1000));
        assert!(idx.n_tokens() <= 1000, "{} tokens", idx.n_tokens());
    }
    assert_eq!(idx.n_sequences(), 2);
    // The first sequence is gone: its text matches nothing any more.
    assert!(idx.matches(&first[..200], 5).iter().all(|m| m.len < 10));
    // Entries are swept: no more than twice the live positions.
    assert!(idx.n_entries_for_tests() <= 2 * (idx.n_tokens() + 2));
    // A sequence longer than the cap keeps its end.
    let long = stream(99, 3000, 1000);
    idx.push(&long);
    assert_eq!(idx.n_tokens(), 1000);
    assert_eq!(idx.matches(&long[..2500], 4)[0].continuation, long[2500..2504].to_vec());
}

#[test]
fn the_vote_follows_the_longer_matches_and_stops_where_they_part() {
    let a: &[i32] = &[1, 2, 3, 4];
    let b: &[i32] = &[1, 2, 9, 9];
    // Two long matches agree on 1, 2; where they part evenly the draft goes
    // on (ties to the lower id) with the token marked unsure, as is the
    // rest, which one occurrence alone vouches for.
    let (t, c) = vote(&[(20, a), (20, b)], 8);
    assert_eq!(t, vec![1, 2, 3, 4]);
    assert_eq!(c, vec![5, 5, 4, 4]);
    assert_eq!(vote(&[(12, a)], 2), (vec![1, 2], vec![2, 2]));
    assert_eq!(vote(&[(12, a), (12, a), (12, a)], 1), (vec![1], vec![3]));
    // Where no token has MIN_SHARE of the vote, it stops.
    let c3: &[i32] = &[1, 2, 7, 7];
    let d4: &[i32] = &[1, 2, 8, 8];
    assert_eq!(vote(&[(20, a), (20, b), (20, c3), (20, d4)], 8).0, vec![1, 2]);
    // A short match does not outvote a long one; matches under half the longest do not vote.
    let (t, _) = vote(&[(30, a), (4, b), (4, b), (4, b)], 8);
    assert_eq!(t, a.to_vec());
    assert_eq!(vote(&[], 8).0, Vec::<i32>::new());
    assert_eq!(vote(&[(12, a)], 2).0, vec![1, 2]);
}

#[test]
fn the_drafter_copies_within_a_request_and_learns_across_requests() {
    let global = Arc::new(Mutex::new(SuffixIndex::new(DEFAULT_SUFFIX_CACHE_TOKENS)));
    let record: Vec<i32> = stream(3, 40, 500);
    // Request 1: a prompt, then an output that is `record`.
    let prompt: Vec<i32> = stream(4, 30, 500);
    let mut d = SuffixDrafter::new(global.clone());
    d.begin(&prompt);
    let mut history = prompt.clone();
    assert!(d.draft(&history, 8, 0).is_none(), "nothing to copy yet");
    history.extend_from_slice(&record);
    d.draft(&history, 8, 0);
    d.end();
    // Request 2, another prompt: once the output starts like `record`, the rest is drafted.
    let prompt2: Vec<i32> = stream(5, 30, 500);
    let mut d2 = SuffixDrafter::new(global.clone());
    d2.begin(&prompt2);
    let mut h2 = prompt2.clone();
    h2.extend_from_slice(&record[..6]);
    let draft = d2.draft(&h2, 10, 0).expect("a draft from the earlier output");
    assert_eq!(draft.tokens, record[6..16].to_vec());
    assert_eq!(draft.source.0, "suffix");
    // Within a request: text of the prompt is copied.
    let mut d3 = SuffixDrafter::new(Arc::default());
    let doc = stream(6, 200, 500);
    d3.begin(&doc);
    let mut h3 = doc.clone();
    h3.extend_from_slice(&doc[50..60]);
    assert_eq!(d3.draft(&h3, 5, 0).unwrap().tokens, doc[60..65].to_vec());
}

#[test]
fn a_cap_of_zero_keeps_nothing() {
    let mut idx = SuffixIndex::new(0);
    idx.push(&stream(1, 100, 50));
    assert_eq!((idx.n_tokens(), idx.n_sequences()), (0, 0));
}

#[test]
fn a_rewritten_history_starts_the_request_index_over() {
    let mut d = SuffixDrafter::new(Arc::default());
    let a = stream(8, 100, 300);
    d.begin(&a);
    let b = stream(9, 100, 300);
    let mut h = b.clone();
    h.extend_from_slice(&b[10..20]);
    assert_eq!(d.draft(&h, 4, 0).unwrap().tokens, b[20..24].to_vec());
}
