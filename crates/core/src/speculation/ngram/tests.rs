//! Tests of the n-gram caches, lookup and drafter.

use super::cache::*;
use super::drafter::*;
use super::lookup::*;
use crate::error::{ErrorCode, Result};
use crate::speculation::drafter::Drafter;
use crate::text::events::TokenSource;
use std::fs;
use std::sync::{Arc, Mutex};

fn ng(tokens: &[i32]) -> Ngram {
    Ngram::new(tokens)
}

fn full(tokens: &[i32]) -> NgramCache {
    let mut c = NgramCache::new();
    c.update(tokens, NGRAM_MIN, NGRAM_MAX, tokens.len());
    c
}

/// llama.cpp's record layout, built by hand.
fn record(ngram: [i32; 4], followers: &[(i32, i32)]) -> Vec<u8> {
    let mut b = Vec::new();
    for t in ngram {
        b.extend_from_slice(&t.to_le_bytes());
    }
    b.extend_from_slice(&(followers.len() as i32).to_le_bytes());
    for &(t, c) in followers {
        b.extend_from_slice(&t.to_le_bytes());
        b.extend_from_slice(&c.to_le_bytes());
    }
    b
}

fn read(bytes: &[u8]) -> Result<NgramCache> {
    NgramCache::read_from(&mut &bytes[..])
}

#[test]
fn ngram_shape() {
    let g = ng(&[5, 6]);
    assert_eq!(g.0, [5, 6, -1, -1]);
    assert_eq!(g.len(), 2);
    assert_eq!(g.tokens(), &[5, 6]);
    assert!(g.is_well_formed());
    assert!(!Ngram([-1; 4]).is_well_formed());
    assert!(!Ngram([1, -1, 2, -1]).is_well_formed());
}

#[test]
fn update_counts() {
    // 1 2 3 1 2 4
    let c = full(&[1, 2, 3, 1, 2, 4]);
    assert_eq!(c.followers(&ng(&[1])), vec![(2, 2)]);
    assert_eq!(c.followers(&ng(&[2])), vec![(3, 1), (4, 1)]);
    assert_eq!(c.followers(&ng(&[1, 2])), vec![(3, 1), (4, 1)]);
    assert_eq!(c.count(&ng(&[3, 1, 2]), 4), 1);
    assert_eq!(c.count(&ng(&[2, 3, 1, 2]), 4), 1);
    assert_eq!(c.count(&ng(&[4]), 1), 0);
    // 1-grams: 1,2,3,1,2 -> {1,2,3} ; 2-grams: 12,23,31,12 -> 3 ; 3-grams: 3 ; 4-grams: 2
    assert_eq!(c.len(), 3 + 3 + 3 + 2);
    assert_eq!(NgramCache::new().len(), 0);
    assert!(NgramCache::new().is_empty());
}

#[test]
fn incremental_update_equals_one_shot() {
    let tokens = [7, 8, 9, 7, 8, 9, 10, 7, 8, 11, 7, 8, 9];
    let mut inc = NgramCache::new();
    inc.update(&tokens[..3], 1, 4, 3);
    for end in 4..=tokens.len() {
        inc.update(&tokens[..end], 1, 4, 1);
    }
    assert_eq!(inc, full(&tokens));

    let mut chunked = NgramCache::new();
    chunked.update(&tokens[..5], 1, 4, 5);
    chunked.update(&tokens[..9], 1, 4, 4);
    chunked.update(&tokens, 1, 4, 4);
    assert_eq!(chunked, full(&tokens));

    // n_new larger than the input is the whole input
    let mut big = NgramCache::new();
    big.update(&tokens, 1, 4, 1000);
    assert_eq!(big, full(&tokens));
}

#[test]
fn update_respects_sizes_and_skips_invalid_tokens() {
    let mut c = NgramCache::new();
    c.update(&[1, 2, 3], 2, 2, 3);
    assert_eq!(c.len(), 1);
    assert_eq!(c.count(&ng(&[1, 2]), 3), 1);

    let mut c = NgramCache::new();
    c.update(&[1, -1, 2, 3], 1, 4, 4);
    assert_eq!(c.len(), 1);
    assert_eq!(c.count(&ng(&[2]), 3), 1);
}

#[test]
fn drafts_a_repeated_passage() {
    let passage: Vec<i32> = (100..120).collect();
    let empty = NgramCache::new();
    let params = NgramParams::default();

    // ... A B C -> D E F ...: a 3-gram seen once is enough (lax table).
    let mut history = passage.clone();
    history.extend_from_slice(&[1, 2, 3]);
    history.extend_from_slice(&passage[..3]);
    let ctx = full(&history);
    let draft = draft_tokens(&history, 8, &params, &ctx, &empty, &empty);
    assert_eq!(draft, passage[3..11].to_vec());
    // The rest of the passage, then what followed it, then the passage
    // again: the lookup goes round the cycle until n_draft.
    let draft = draft_tokens(&history, 60, &params, &ctx, &empty, &empty);
    let cycle = [&passage[..], &[1, 2, 3][..]].concat();
    let expected: Vec<i32> = cycle.iter().cycle().skip(3).take(60).copied().collect();
    assert_eq!(draft, expected);

    // ... A B: a 2-gram seen once is not (llama.cpp wants two samples).
    history.pop();
    let ctx = full(&history);
    assert!(draft_tokens(&history, 8, &params, &ctx, &empty, &empty).is_empty());
}

#[test]
fn drafted_tokens_carry_the_cache_and_ngram_size_that_matched() {
    let passage: Vec<i32> = (100..120).collect();
    let empty = NgramCache::new();
    let params = NgramParams::default();
    let mut history = passage.clone();
    history.extend_from_slice(&[1, 2, 3]);
    history.extend_from_slice(&passage[..3]);
    // Context cache: the first token follows a 3-gram (class 2), the
    // rest 4-grams (class 3); same tokens as draft_tokens.
    let (tokens, classes) = draft_tokens_classified(&history, 8, &params, &full(&history), &empty, &empty);
    assert_eq!(tokens, draft_tokens(&history, 8, &params, &full(&history), &empty, &empty));
    assert_eq!(classes, vec![2, 3, 3, 3, 3, 3, 3, 3]);
    // From the dynamic cache alone (strict thresholds: seen twice).
    let mut dynamic = full(&passage);
    dynamic.merge(&full(&passage));
    let (tokens, classes) = draft_tokens_classified(&passage[..6], 3, &params, &empty, &dynamic, &empty);
    assert_eq!(tokens, passage[6..9].to_vec());
    assert_eq!(classes, vec![NGRAM_MAX as u8 + 3; 3]);
    assert!(classes.iter().all(|&c| (c as usize) < DRAFT_CLASSES));
}

#[test]
fn no_draft_from_too_little_history() {
    let ctx = full(&[5, 6, 5]);
    let empty = NgramCache::new();
    assert!(draft_tokens(&[5], 4, &NgramParams::default(), &ctx, &empty, &empty).is_empty());
    assert!(draft_tokens(&[], 4, &NgramParams::default(), &ctx, &empty, &empty).is_empty());
    assert!(draft_tokens(&[6, 5], 0, &NgramParams::default(), &ctx, &empty, &empty).is_empty());
}

#[test]
fn rare_continuations_are_not_drafted() {
    let empty = NgramCache::new();
    let params = NgramParams::default();
    // 1-gram "9" seen once: fewer than the 2 samples the lax table wants.
    let ctx = full(&[9, 4, 0, 0, 9]);
    assert!(draft_tokens(&[0, 9], 4, &params, &ctx, &empty, &empty).is_empty());

    // "5" followed by 1, 2, 3, 1: best share 50% < 66% for 1-grams.
    let ctx = full(&[5, 1, 5, 2, 5, 3, 5, 1]);
    assert!(draft_tokens(&[0, 5], 1, &params, &ctx, &empty, &empty).is_empty());
    // ... while 2 of 3 passes (66.7% >= 66%).
    let ctx = full(&[5, 1, 5, 2, 5, 1]);
    assert_eq!(draft_tokens(&[0, 5], 1, &params, &ctx, &empty, &empty), vec![1]);

    // The dynamic cache is strict: 3 of 4 passes 75%, 2 of 3 does not.
    let dynamic = full(&[5, 1, 5, 2, 5, 1]);
    assert!(draft_tokens(&[0, 5], 1, &params, &empty, &dynamic, &empty).is_empty());
    let dynamic = full(&[5, 1, 5, 2, 5, 1, 5, 1]);
    assert_eq!(draft_tokens(&[0, 5], 1, &params, &empty, &dynamic, &empty), vec![1]);
}

#[test]
fn longest_ngram_wins_then_shorter_fallback() {
    let empty = NgramCache::new();
    let params = NgramParams::default();
    // after "7 8" came 9 (once); after "8" came 3 twice and 9 once.
    // The 2-gram [7,8] has one sample (< 2): fall back to the 1-gram.
    let ctx = full(&[8, 3, 8, 3, 7, 8, 9]);
    assert_eq!(draft_tokens(&[7, 8], 1, &params, &ctx, &empty, &empty), vec![3]);
    // The 3-gram [6,7,8] needs only one sample: it wins.
    let ctx = full(&[8, 3, 8, 3, 6, 7, 8, 9]);
    assert_eq!(draft_tokens(&[6, 7, 8], 1, &params, &ctx, &empty, &empty), vec![9]);
}

#[test]
fn static_cache_breaks_ties_and_drafts_last() {
    let empty = NgramCache::new();
    let params = NgramParams::default();
    // "2 5" followed by 1 and by 3 once each: 50% passes the lax 2-gram
    // threshold; the tie goes to the smaller token without a static cache ...
    let ctx = full(&[2, 5, 1, 0, 2, 5, 3]);
    assert_eq!(draft_tokens(&[2, 5], 1, &params, &ctx, &empty, &empty), vec![1]);
    // ... and to the token the static cache knows with one.
    let mut stat = NgramCache::new();
    stat.update(&[2, 5, 3, 2, 5, 3], NGRAM_STATIC, NGRAM_STATIC, 6);
    assert_eq!(draft_tokens(&[2, 5], 1, &params, &ctx, &empty, &stat), vec![3]);
    // Alone, the static cache drafts with the lax 2-gram thresholds.
    assert_eq!(draft_tokens(&[2, 5], 1, &params, &empty, &empty, &stat), vec![3]);
    let mut thin = NgramCache::new();
    thin.update(&[2, 5, 3], NGRAM_STATIC, NGRAM_STATIC, 3);
    assert!(draft_tokens(&[2, 5], 1, &params, &empty, &empty, &thin).is_empty());
}

#[test]
fn merge_adds_counts() {
    let mut a = full(&[1, 2, 3]);
    let b = full(&[1, 2, 4, 1, 2, 3]);
    a.merge(&b);
    assert_eq!(a.followers(&ng(&[1, 2])), vec![(3, 2), (4, 1)]);
    assert_eq!(a.count(&ng(&[2, 4]), 1), 1);
    assert_eq!(a.count(&ng(&[1]), 2), 3);

    let mut empty = NgramCache::new();
    empty.merge(&b);
    assert_eq!(empty, b);
    let mut owned = full(&[1, 2, 3]);
    owned.merge_capped(b.clone(), usize::MAX);
    assert_eq!(owned, a);
}

#[test]
fn file_round_trip() {
    let c = full(&[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]);
    let mut bytes = Vec::new();
    c.write_to(&mut bytes).unwrap();
    let back = read(&bytes).unwrap();
    assert_eq!(back, c);
    // deterministic bytes
    let mut again = Vec::new();
    back.write_to(&mut again).unwrap();
    assert_eq!(again, bytes);

    let dir = std::env::temp_dir().join(format!("ngram-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache.bin");
    c.save(&path).unwrap();
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(NgramCache::load(&path).unwrap(), c);
    NgramCache::new().save(&path).unwrap(); // overwrite
    assert!(NgramCache::load(&path).unwrap().is_empty());
    let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary files left behind");

    let missing = NgramCache::load(&dir.join("nope.bin")).unwrap_err();
    assert_eq!(missing.code, ErrorCode::InvalidRequest);
    assert!(missing.message.starts_with("ngram cache: "));
    let bad = NgramCache::new().save(&dir.join("no-such-dir").join("x.bin")).unwrap_err();
    assert_eq!(bad.code, ErrorCode::InvalidRequest);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reads_llama_cpp_bytes() {
    let mut bytes = record([10, 20, -1, -1], &[(30, 5), (31, 2)]);
    bytes.extend(record([7, -1, -1, -1], &[(8, 1)]));
    let c = read(&bytes).unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(c.followers(&ng(&[10, 20])), vec![(30, 5), (31, 2)]);
    assert_eq!(c.followers(&ng(&[7])), vec![(8, 1)]);
    // and drafts from it as a dynamic cache: 5 of 7 = 71% >= 66%, 7 >= 3.
    let empty = NgramCache::new();
    let d = draft_tokens(&[10, 20], 1, &NgramParams::default(), &empty, &c, &empty);
    assert_eq!(d, vec![30]);
    // and writes the same bytes back (records sorted: [7] first)
    let mut out = Vec::new();
    c.write_to(&mut out).unwrap();
    let mut expected = record([7, -1, -1, -1], &[(8, 1)]);
    expected.extend(record([10, 20, -1, -1], &[(30, 5), (31, 2)]));
    assert_eq!(out, expected);
}

#[test]
fn empty_input_is_an_empty_cache() {
    assert!(read(&[]).unwrap().is_empty());
}

#[test]
fn duplicate_records_add_up() {
    let mut bytes = record([1, -1, -1, -1], &[(2, 3)]);
    bytes.extend(record([1, -1, -1, -1], &[(2, 4), (5, 1)]));
    let c = read(&bytes).unwrap();
    assert_eq!(c.followers(&ng(&[1])), vec![(2, 7), (5, 1)]);
}

fn rejected(bytes: &[u8]) -> String {
    let e = read(bytes).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(e.message.starts_with("ngram cache: "), "{}", e.message);
    e.message
}

#[test]
fn rejects_truncated_files() {
    let mut bytes = record([10, 20, -1, -1], &[(30, 5), (31, 2)]);
    let second = bytes.len(); // 36
    bytes.extend(record([7, -1, -1, -1], &[(8, 1)]));
    // mid-follower of the second record
    let m = rejected(&bytes[..bytes.len() - 3]);
    assert!(m.contains("truncated") && m.contains(&format!("byte {}", second + 20)), "{m}");
    assert!(m.contains(&format!("record at byte {second}")), "{m}");
    // mid-head of the second record
    let m = rejected(&bytes[..second + 7]);
    assert!(m.contains(&format!("truncated record at byte {second}")), "{m}");
    // after the head, before any follower
    let m = rejected(&bytes[..second + 20]);
    assert!(m.contains("follower 1 of 1"), "{m}");
    // a stray byte
    rejected(&[0]);
}

#[test]
fn rejects_corrupt_values() {
    let mut bytes = record([1, -1, -1, -1], &[(2, 3)]);
    bytes[16..20].copy_from_slice(&(-2i32).to_le_bytes());
    let m = rejected(&bytes);
    assert!(m.contains("invalid follower count -2 at byte 16"), "{m}");

    let zero = record([1, -1, -1, -1], &[]);
    assert!(rejected(&zero).contains("invalid follower count 0"));

    let mut absurd = record([1, -1, -1, -1], &[(2, 3)]);
    absurd[16..20].copy_from_slice(&i32::MAX.to_le_bytes());
    assert!(rejected(&absurd).contains("invalid follower count"));

    let m = rejected(&record([1, -1, -1, -1], &[(2, 3), (4, -1)]));
    assert!(m.contains("non-positive count -1 at byte 32"), "{m}");
    let m = rejected(&record([1, -1, -1, -1], &[(-5, 1)]));
    assert!(m.contains("negative follower token -5 at byte 20"), "{m}");
    let m = rejected(&record([-1, -1, -1, -1], &[(2, 1)]));
    assert!(m.contains("malformed n-gram"), "{m}");
    let m = rejected(&record([1, -1, 3, -1], &[(2, 1)]));
    assert!(m.contains("malformed n-gram"), "{m}");
}

#[test]
fn default_params_are_consistent() {
    let p = NgramParams::default();
    assert!((NGRAM_MIN..=NGRAM_MAX).contains(&p.ngram_max));
    assert!((NGRAM_MIN..=p.ngram_max).contains(&p.ngram_min));
    assert!(p.draft_min_percent_lax.iter().chain(&p.draft_min_percent_strict).all(|&pc| pc <= 100));
}

#[test]
fn drafter_begin_draft_end() {
    let dynamic = Arc::new(Mutex::new(full(&[50, 51])));
    let mut d = NgramDrafter::new(NgramParams::default(), dynamic.clone(), None);
    assert_eq!(d.name(), "ngram");

    let prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3];
    d.begin(&prompt);
    assert_eq!(d.context(), &full(&prompt));

    let draft = d.draft(&prompt, 3, 0).expect("a draft");
    assert_eq!(draft.tokens, vec![4, 5, 6]);
    assert_eq!(draft.source, TokenSource("ngram"));
    d.accept(2);

    // history grows by the accepted tokens plus a correction
    let mut history = prompt.to_vec();
    history.extend_from_slice(&[4, 5, 9]);
    assert!(d.draft(&history, 4, 0).is_none(), "nothing follows 9");
    assert_eq!(d.context(), &full(&history), "incremental = one-shot");
    d.accept(0);
    assert_eq!(d.counts(), (3, 2));
    assert!(d.draft(&history, 0, 0).is_none());

    // a rewritten history (context shift) rebuilds the context cache
    let shifted = [1, 2, 4, 9, 1, 2];
    let _ = d.draft(&shifted, 2, 0);
    assert_eq!(d.context(), &full(&shifted));
    let mut same_len = shifted;
    same_len[5] = 7;
    let _ = d.draft(&same_len, 2, 0);
    assert_eq!(d.context(), &full(&same_len));

    // begin starts over; end merges the context into the dynamic cache
    d.begin(&prompt);
    assert_eq!(d.context(), &full(&prompt));
    let _ = d.draft(&history, 1, 0);
    assert_eq!(d.context(), &full(&history));
    d.end();
    assert!(d.context().is_empty());
    let mut expected = full(&[50, 51]);
    expected.merge(&full(&history));
    assert_eq!(*dynamic.lock().unwrap(), expected);
    d.end(); // nothing more to merge
    assert_eq!(*dynamic.lock().unwrap(), expected);

    // The next request drafts from the dynamic cache alone (strict
    // thresholds): [1,2,3] -> 4 and [1,2,3,4] -> 5 were seen twice, but
    // [2,3,4,5] was followed once by 6 and once by 9 (50% < 66%).
    let mut d2 = NgramDrafter::new(NgramParams::default(), dynamic.clone(), None);
    d2.begin(&[40, 1, 2, 3]);
    assert_eq!(d2.draft(&[40, 1, 2, 3], 8, 0).expect("a draft").tokens, vec![4, 5]);
}

#[test]
fn shareable_across_threads() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<NgramDrafter>();
    sync::<NgramCache>();
}

#[test]
fn drafter_uses_static_cache() {
    let mut stat = NgramCache::new();
    stat.update(&[8, 9, 10, 8, 9, 10], NGRAM_STATIC, NGRAM_STATIC, 6);
    let dynamic = Arc::new(Mutex::new(NgramCache::new()));
    let mut d = NgramDrafter::new(NgramParams::default(), dynamic, Some(Arc::new(stat)));
    d.begin(&[8, 9]);
    let draft = d.draft(&[8, 9], 4, 0).expect("static draft");
    assert_eq!(draft.tokens[0], 10);
}

#[test]
fn merge_capped_stops_adding_ngrams_at_the_cap() {
    let mut a = NgramCache::new();
    a.update(&[1, 2, 3], 1, 1, 3); // [1]->2, [2]->3
    let mut b = NgramCache::new();
    b.update(&[1, 2, 7, 8, 9], 1, 1, 5); // [1]->2, [2]->7, [7]->8, [8]->9
    a.merge_capped(b.clone(), 3);
    assert_eq!(a.len(), 3);
    assert_eq!(a.followers(&Ngram::new(&[1])), vec![(2, 2)]);
    assert_eq!(a.followers(&Ngram::new(&[2])), vec![(3, 1), (7, 1)]);
    // Under the cap it equals merge.
    let mut c = NgramCache::new();
    c.update(&[1, 2, 3], 1, 1, 3);
    let mut d = c.clone();
    c.merge_capped(b.clone(), usize::MAX);
    d.merge(&b);
    assert_eq!(c, d);
    // An empty cache takes a small one whole, and a big one only up to the cap.
    let mut e = NgramCache::new();
    e.merge_capped(b.clone(), 2);
    assert_eq!(e.len(), 2);
}
