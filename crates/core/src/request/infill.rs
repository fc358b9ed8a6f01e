//! Fill-in-the-middle: the prompt a code model was trained to complete the
//! gap between a prefix and a suffix from, built the way llama.cpp's server
//! builds it (`/infill`), so that a request gives the same tokens here as
//! there. The repo-level pattern (Qwen2.5-Coder's paper, arXiv 2409.12186),
//! for a vocabulary with a repo-name and a file-separator token:
//!
//! ```text
//! [REP]myproject\n [SEP]file0\n text0 [SEP]file1\n text1 … [SEP]filename\n
//! [BOS] [PRE] prefix prompt [SUF] suffix [MID]
//! ```
//!
//! Without a file separator each extra file is announced by
//! `"\n\n--- snippet ---\n\n"`, and without a repo-name token there is no
//! first line. The prefix keeps its last `3·n_batch/4` tokens and the suffix
//! its first `n_batch/4 − 2 − |prompt|`, so that both fit one batch; the
//! extra files fill what the context has left after a batch and twice the
//! tokens to predict, keeping their end (the files nearest the prefix).
//! Prefix, suffix and the extra files are tokenized as plain text: a
//! special token's text in the user's code stays text; the `prompt` (text
//! the completion must begin with) is tokenized with special tokens parsed.

use super::PromptPart;

/// What a request gives for fill-in-the-middle (`input_prefix`,
/// `input_suffix`, `input_extra`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Infill {
    pub prefix: String,
    pub suffix: String,
    /// Other files of the project: `(filename, text)`.
    pub extra: Vec<(String, String)>,
}

/// The model's fill-in-the-middle tokens: prefix, suffix and middle are
/// required; the repo-name and file-separator tokens are used when the
/// vocabulary has them; `bos` when the model adds one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FimTokens {
    pub pre: i32,
    pub suf: i32,
    pub mid: i32,
    pub rep: Option<i32>,
    pub sep: Option<i32>,
    pub bos: Option<i32>,
}

/// The sizes the budget is taken from: the context of one sequence, the
/// batch and the tokens asked for (`n_predict`, `-1` = no bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InfillBudget {
    pub n_ctx: usize,
    pub n_batch: usize,
    pub n_predict: i32,
}

/// How each piece of text becomes tokens: `special` says whether special
/// tokens' texts are parsed.
pub type Tokenizer<'a> = dyn Fn(&str, bool) -> Vec<i32> + 'a;

/// Project name and current file name in the repo-level pattern (llama.cpp
/// uses these fixed words; the model reads them as placeholders).
const REPO_NAME: &str = "myproject\n";
const CURRENT_FILE: &str = "filename\n";
const SNIPPET: &str = "\n\n--- snippet ---\n\n";

/// The whole prompt, as token ids. `prompt` is the request's own prompt
/// (text parsed with special tokens, ids as given), appended to the prefix.
pub fn infill_tokens(fim: &FimTokens, infill: &Infill, prompt: &[PromptPart], budget: InfillBudget, tokenize: &Tokenizer<'_>) -> Vec<i32> {
    let mut extra: Vec<i32> = Vec::new();
    if let Some(rep) = fim.rep {
        extra.push(rep);
        extra.extend(tokenize(REPO_NAME, false));
    }
    for (filename, text) in &infill.extra {
        match fim.sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(tokenize(&format!("{filename}\n"), false));
            }
            None => extra.extend(tokenize(SNIPPET, false)),
        }
        extra.extend(tokenize(text, false));
    }
    if let Some(sep) = fim.sep {
        extra.push(sep);
        extra.extend(tokenize(CURRENT_FILE, false));
    }

    let mut prompt_tokens: Vec<i32> = Vec::new();
    for part in prompt {
        match part {
            PromptPart::Text(s) | PromptPart::Chat(s) => prompt_tokens.extend(tokenize(s, true)),
            PromptPart::Token(t) => prompt_tokens.push(*t),
        }
    }

    let prefix = tokenize(&infill.prefix, false);
    let suffix = tokenize(&infill.suffix, false);
    let quarter = budget.n_batch / 4;
    let n_prefix = prefix.len().min(3 * quarter);
    let n_suffix = suffix.len().min(quarter.saturating_sub(2 + prompt_tokens.len()));
    let room = budget.n_ctx as i64 - budget.n_batch as i64 - 2 * i64::from(budget.n_predict);
    let n_extra = (room.max(0) as usize).min(extra.len());

    let mut out = Vec::with_capacity(n_extra + n_prefix + n_suffix + prompt_tokens.len() + 4);
    out.extend_from_slice(&extra[extra.len() - n_extra..]);
    out.extend(fim.bos);
    out.push(fim.pre);
    out.extend_from_slice(&prefix[prefix.len() - n_prefix..]);
    out.extend_from_slice(&prompt_tokens);
    out.push(fim.suf);
    out.extend_from_slice(&suffix[..n_suffix]);
    out.push(fim.mid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // A tokenizer of one token per byte, and special texts `<X>` as one
    // token (1000 + X) when parsed: enough to see every rule.
    fn tokenize(text: &str, special: bool) -> Vec<i32> {
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if special && bytes[i] == b'<' && i + 2 < bytes.len() && bytes[i + 2] == b'>' {
                out.push(1000 + i32::from(bytes[i + 1]));
                i += 3;
            } else {
                out.push(i32::from(bytes[i]));
                i += 1;
            }
        }
        out
    }

    const QWEN: FimTokens = FimTokens { pre: -1, suf: -2, mid: -3, rep: Some(-4), sep: Some(-5), bos: None };
    const BARE: FimTokens = FimTokens { pre: -1, suf: -2, mid: -3, rep: None, sep: None, bos: Some(-9) };
    const ROOMY: InfillBudget = InfillBudget { n_ctx: 4096, n_batch: 512, n_predict: -1 };

    fn t(s: &str) -> Vec<i32> {
        tokenize(s, false)
    }

    fn cat(parts: &[&[i32]]) -> Vec<i32> {
        parts.concat()
    }

    #[test]
    fn repo_level_pattern_with_every_piece() {
        let infill = Infill {
            prefix: "def f(".into(),
            suffix: "):".into(),
            extra: vec![("a.py".into(), "x=1".into()), ("b.py".into(), "y".into())],
        };
        let got = infill_tokens(&QWEN, &infill, &[PromptPart::Text("a<Z>".into())], ROOMY, &tokenize);
        let want = cat(&[
            &[-4],
            &t("myproject\n"),
            &[-5],
            &t("a.py\n"),
            &t("x=1"),
            &[-5],
            &t("b.py\n"),
            &t("y"),
            &[-5],
            &t("filename\n"),
            &[-1],
            &t("def f("),
            &t("a"),
            &[1000 + i32::from(b'Z')],
            &[-2],
            &t("):"),
            &[-3],
        ]);
        assert_eq!(got, want);
    }

    #[test]
    fn without_repo_tokens_snippets_are_announced_and_bos_leads_the_prefix() {
        let infill = Infill { prefix: "p".into(), suffix: "s".into(), extra: vec![("ignored".into(), "e".into())] };
        let got = infill_tokens(&BARE, &infill, &[], ROOMY, &tokenize);
        assert_eq!(got, cat(&[&t("\n\n--- snippet ---\n\n"), &t("e"), &[-9, -1], &t("p"), &[-2], &t("s"), &[-3]]));
    }

    #[test]
    fn special_texts_in_code_stay_text() {
        let infill = Infill { prefix: "<A>".into(), suffix: "<B>".into(), extra: vec![("<C>".into(), "<D>".into())] };
        let got = infill_tokens(&QWEN, &infill, &[], ROOMY, &tokenize);
        assert!(got.iter().all(|&t| t < 1000), "no parsed special token: {got:?}");
    }

    #[test]
    fn prefix_keeps_its_end_suffix_its_start_within_a_batch() {
        let prefix: String = (0..100).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let suffix: String = (0..100).map(|i| char::from(b'A' + (i % 26) as u8)).collect();
        let infill = Infill { prefix: prefix.clone(), suffix: suffix.clone(), extra: vec![] };
        let budget = InfillBudget { n_ctx: 4096, n_batch: 64, n_predict: -1 };
        // 3·16 = 48 prefix tokens; 16 − 2 − 3 = 11 suffix tokens.
        let got = infill_tokens(&BARE, &infill, &[PromptPart::Token(7), PromptPart::Token(8), PromptPart::Token(9)], budget, &tokenize);
        let want = cat(&[&[-9, -1], &t(&prefix[52..]), &[7, 8, 9], &[-2], &t(&suffix[..11]), &[-3]]);
        assert_eq!(got, want);
        // A prompt longer than a quarter batch leaves no suffix (never a negative take).
        let long: Vec<PromptPart> = (0..40).map(PromptPart::Token).collect();
        let got = infill_tokens(&BARE, &infill, &long, budget, &tokenize);
        assert_eq!(got[got.len() - 2..], [-2, -3]);
    }

    #[test]
    fn extra_files_fill_what_the_context_leaves_keeping_their_end() {
        let infill = Infill { prefix: "p".into(), suffix: "s".into(), extra: vec![("f".into(), "0123456789".into())] };
        let all = infill_tokens(&QWEN, &infill, &[], ROOMY, &tokenize);
        let extra_len = all.iter().position(|&t| t == -1).unwrap();
        // room = n_ctx − n_batch − 2·n_predict
        for (n_ctx, n_predict, take) in [(80, 4, 8usize), (72, 4, 0), (64, 4, 0), (80, -1, 18), (1000, 10, extra_len)] {
            let budget = InfillBudget { n_ctx, n_batch: 64, n_predict };
            let got = infill_tokens(&QWEN, &infill, &[], budget, &tokenize);
            let take = take.min(extra_len);
            assert_eq!(got[..take], all[extra_len - take..extra_len], "n_ctx {n_ctx} n_predict {n_predict}");
            assert_eq!(got[take], -1);
        }
    }

    #[test]
    fn empty_inputs_still_make_a_prompt() {
        let got = infill_tokens(&QWEN, &Infill::default(), &[], ROOMY, &tokenize);
        assert_eq!(got, cat(&[&[-4], &t("myproject\n"), &[-5], &t("filename\n"), &[-1, -2, -3]]));
    }
}
