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
    let global = Arc::new(Mutex::new(SuffixStore::new(DEFAULT_SUFFIX_CACHE_TOKENS)));
    let record: Vec<i32> = stream(3, 40, 500);
    // Request 1: a prompt, then an output that is `record`.
    let prompt: Vec<i32> = stream(4, 30, 500);
    let mut d = SuffixDrafter::new(global.clone(), String::new());
    d.begin(&prompt);
    let mut history = prompt.clone();
    assert!(d.draft(&history, 8, 0).is_none(), "nothing to copy yet");
    history.extend_from_slice(&record);
    d.draft(&history, 8, 0);
    d.end();
    // Request 2, another prompt: once the output starts like `record`, the rest is drafted.
    let prompt2: Vec<i32> = stream(5, 30, 500);
    let mut d2 = SuffixDrafter::new(global.clone(), String::new());
    d2.begin(&prompt2);
    let mut h2 = prompt2.clone();
    h2.extend_from_slice(&record[..6]);
    let draft = d2.draft(&h2, 10, 0).expect("a draft from the earlier output");
    assert_eq!(draft.tokens, record[6..16].to_vec());
    assert_eq!(draft.source.0, "suffix");
    // Within a request: text of the prompt is copied.
    let mut d3 = SuffixDrafter::new(Arc::default(), String::new());
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
    let mut d = SuffixDrafter::new(Arc::default(), String::new());
    let a = stream(8, 100, 300);
    d.begin(&a);
    let b = stream(9, 100, 300);
    let mut h = b.clone();
    h.extend_from_slice(&b[10..20]);
    assert_eq!(d.draft(&h, 4, 0).unwrap().tokens, b[20..24].to_vec());
}

#[test]
fn namespaces_keep_their_outputs_apart() {
    let global = Arc::new(Mutex::new(SuffixStore::new(DEFAULT_SUFFIX_CACHE_TOKENS)));
    let record = stream(3, 40, 500);
    let mut d = SuffixDrafter::new(global.clone(), "agent-a".into());
    d.begin(&stream(4, 30, 500));
    let mut h = stream(4, 30, 500);
    h.extend_from_slice(&record);
    d.draft(&h, 8, 0);
    d.end();
    let follow = |ns: &str| {
        let mut d = SuffixDrafter::new(global.clone(), ns.into());
        let mut h = stream(5, 30, 500);
        d.begin(&h);
        h.extend_from_slice(&record[..6]);
        d.draft(&h, 10, 0).map(|d| d.tokens)
    };
    assert_eq!(follow("agent-a"), Some(record[6..16].to_vec()));
    assert_eq!(follow("agent-b"), None, "another namespace does not see agent-a's output");
    assert_eq!(follow(""), None);
    let store = global.lock().unwrap();
    assert_eq!((store.n_namespaces(), store.n_sequences()), (1, 1));
    assert!(store.space("agent-a").is_some() && store.space("agent-b").is_none());
    assert!(namespace_problem(&"x".repeat(MAX_NAMESPACE_BYTES)).is_none());
    assert!(namespace_problem(&"x".repeat(MAX_NAMESPACE_BYTES + 1)).is_some());
}

#[test]
fn the_cap_counts_every_namespace_and_drops_the_oldest_output() {
    let mut store = SuffixStore::new(250);
    store.push("a", &stream(1, 100, 50));
    store.push("b", &stream(2, 100, 50));
    store.push("a", &stream(3, 40, 50));
    assert_eq!((store.n_tokens(), store.n_sequences(), store.n_namespaces()), (240, 3, 2));
    // 60 more: "a"'s first output (the oldest) goes, "b"'s stays.
    store.push("c", &stream(4, 60, 50));
    assert_eq!((store.n_tokens(), store.n_sequences(), store.n_namespaces()), (200, 3, 3));
    assert_eq!(store.space("a").unwrap().sequences().next().unwrap(), &stream(3, 40, 50)[..]);
    // Another 100 drops "b" entirely: an empty namespace is forgotten.
    store.push("a", &stream(5, 100, 50));
    assert!(store.space("b").is_none());
    assert_eq!((store.n_tokens(), store.n_namespaces()), (200, 2));
    // An output longer than the cap keeps its end, and is all that is left.
    let long = stream(6, 400, 50);
    store.push("d", &long);
    assert_eq!((store.n_tokens(), store.n_sequences()), (250, 1));
    assert_eq!(store.space("d").unwrap().last(), &long[150..]);
    let mut none = SuffixStore::new(0);
    none.push("a", &long);
    assert!(none.is_empty());
}

const VOCAB: VocabId = VocabId { n_vocab: 500, hash: 0x1234_5678_9abc_def0 };

fn sample_store() -> SuffixStore {
    let mut store = SuffixStore::new(10_000);
    store.push("", &stream(1, 300, 500));
    store.push("agent-ü", &stream(2, 50, 500));
    store.push("", &stream(3, 7, 500));
    store.push("project/x", &stream(4, 1, 500));
    store
}

fn bytes_of(store: &SuffixStore) -> Vec<u8> {
    let mut out = Vec::new();
    store.write_to(&mut out, VOCAB).unwrap();
    out
}

/// Namespaces, outputs in the order kept, and the same drafts.
fn same(a: &SuffixStore, b: &SuffixStore) {
    assert_eq!((a.n_tokens(), a.n_sequences(), a.n_namespaces()), (b.n_tokens(), b.n_sequences(), b.n_namespaces()));
    for ns in ["", "agent-ü", "project/x", "other"] {
        let seqs = |s: &SuffixStore| s.space(ns).map(|i| i.sequences().map(<[i32]>::to_vec).collect::<Vec<_>>());
        assert_eq!(seqs(a), seqs(b), "namespace {ns:?}");
    }
    let h = stream(1, 300, 500)[100..120].to_vec();
    assert_eq!(a.matches("", &h, 8), b.matches("", &h, 8));
}

#[test]
fn a_saved_store_reads_back_the_same() {
    let store = sample_store();
    let bytes = bytes_of(&store);
    let back = SuffixStore::read_from(&mut bytes.as_slice(), 10_000, VOCAB).unwrap();
    same(&store, &back);
    // The same store always writes the same bytes.
    assert_eq!(bytes_of(&back), bytes);
    // An empty store round-trips too.
    let empty = bytes_of(&SuffixStore::new(10));
    assert!(SuffixStore::read_from(&mut empty.as_slice(), 10, VOCAB).unwrap().is_empty());
    // Read into a smaller cap, the oldest outputs go first, as they would have.
    let small = SuffixStore::read_from(&mut bytes.as_slice(), 60, VOCAB).unwrap();
    assert_eq!((small.n_tokens(), small.n_sequences()), (58, 3));
    // Through a file, atomically.
    let dir = std::env::temp_dir().join(format!("suffix-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.suffix");
    store.save(&path, VOCAB).unwrap();
    same(&store, &SuffixStore::load(&path, 10_000, VOCAB).unwrap());
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    let missing = SuffixStore::load(&dir.join("none"), 10, VOCAB).unwrap_err();
    assert!(missing.message.contains("cannot open"), "{}", missing.message);
    assert!(store.save(&dir.join("no/such/dir/f"), VOCAB).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_or_foreign_file_is_refused() {
    let bytes = bytes_of(&sample_store());
    let refuse = |b: &[u8], vocab: VocabId, why: &str| {
        let e = SuffixStore::read_from(&mut &b[..], 10_000, vocab).unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::InvalidRequest);
        assert!(e.message.contains(why), "{why:?} not in {:?}", e.message);
    };
    refuse(&bytes, VocabId { n_vocab: 501, ..VOCAB }, "another vocabulary");
    refuse(&bytes, VocabId { hash: 1, ..VOCAB }, "another vocabulary");
    refuse(b"", VOCAB, "truncated at byte 0");
    refuse(b"GGUF\x03\0\0\0", VOCAB, "bad magic");
    let mut v2 = bytes.clone();
    v2[8] = 2;
    refuse(&v2, VOCAB, "version 2");
    for cut in [12, 30, bytes.len() / 2, bytes.len() - 8, bytes.len() - 1] {
        refuse(&bytes[..cut], VOCAB, "truncated");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    refuse(&longer, VOCAB, "trailing bytes");
    // One flipped bit in a token: the checksum catches it.
    let mut flipped = bytes.clone();
    // (Header 24 bytes, names 37, the output count 4, the first output's namespace and length 8.)
    let at = 24 + 37 + 4 + 8 + 40;
    flipped[at] ^= 1;
    refuse(&flipped, VOCAB, "checksum");
    // A token outside the vocabulary is named, even before the checksum.
    let small = VocabId { n_vocab: 100, ..VOCAB };
    let mut s = Vec::new();
    sample_store().write_to(&mut s, small).unwrap_or(());
    refuse(&s, small, "outside the vocabulary");
}

/// Random damage to a valid file: every read ends in a store or a clean
/// `INVALID_REQUEST`, never a panic or an allocation the file does not back.
#[test]
fn fuzzed_files_never_panic() {
    let bytes = bytes_of(&sample_store());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut refused = 0;
    for _ in 0..3000 {
        let mut b = bytes.clone();
        match next() % 4 {
            0 => {
                let i = next() as usize % b.len();
                b[i] = next() as u8;
            }
            1 => b.truncate(next() as usize % b.len()),
            2 => {
                // A huge count or length somewhere.
                let i = (next() as usize % (b.len() - 4)) & !3;
                b[i..i + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            }
            _ => {
                let i = next() as usize % b.len();
                b.insert(i, next() as u8);
            }
        }
        match SuffixStore::read_from(&mut b.as_slice(), 10_000, VOCAB) {
            Ok(s) => assert!(s.n_tokens() <= 10_000),
            Err(e) => {
                assert_eq!(e.code, crate::error::ErrorCode::InvalidRequest);
                refused += 1;
            }
        }
    }
    // Only a change that leaves the bytes as they were reads back.
    assert!(refused > 2900, "{refused} of 3000 refused");
}
