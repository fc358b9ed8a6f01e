//! Turns the byte pieces of generated tokens into text that is safe to stream.
//!
//! A token's piece may end in the middle of a UTF-8 character, and a stop
//! string may be spread over several tokens. [`TextStream`] therefore holds
//! back (a) trailing bytes that do not yet form a whole character and (b) a
//! trailing run of text that could still grow into a stop string, and emits
//! everything else at once. Stop handling follows the legacy llama.cpp server
//! (`findStoppingStrings` / `find_partial_stop_string`): a full match ends the
//! stream and is never shown; a partial match is held until it is decided.

/// What one [`TextStream::push`] made safe to show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Text that became safe to emit (may be empty).
    pub text: String,
    /// The stop string that just matched; reported once, by the push that hit it.
    pub stop: Option<String>,
}

/// Accumulates generated token bytes; yields text that can be shown now.
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    stops: Vec<String>,
    /// Bytes of an incomplete trailing character (at most 3), not yet text.
    pending: Vec<u8>,
    /// Decoded text not yet emitted: always a possible stop prefix, except
    /// transiently inside `push`.
    held: String,
    /// Everything emitted so far.
    content: String,
    stopped: Option<String>,
}

impl TextStream {
    /// `stops` are matched literally; empty strings are ignored (they would
    /// match everywhere).
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self { stops, ..Self::default() }
    }

    /// Appends one token's bytes and returns the text that became safe to
    /// emit. After a stop string matched, returns empty and ignores input.
    pub fn push(&mut self, piece: &[u8]) -> Pushed {
        if self.stopped.is_some() {
            return Pushed::default();
        }
        self.decode(piece);
        self.release(false)
    }

    /// Generation ended without more tokens: releases everything held back.
    /// A held stop prefix is plain text after all, and an incomplete trailing
    /// character can never be completed, so it becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        if !self.pending.is_empty() {
            // `decode` leaves only the prefix of one possibly-valid sequence
            // here; like `from_utf8_lossy`, that is a single replacement char.
            self.pending.clear();
            self.held.push(char::REPLACEMENT_CHARACTER);
        }
        // Still check for a full stop: the replacement character is new text.
        self.release(true).text
    }

    /// All text emitted so far (the concatenation of every returned text).
    pub fn content(&self) -> &str {
        &self.content
    }

    /// The stop string that ended the stream, if any.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Bytes received but not yet emitted, decoded or not.
    pub fn held_bytes(&self) -> usize {
        self.held.len() + self.pending.len()
    }

    /// Moves every whole character from `pending` into `held`. Bytes that can
    /// never start or continue a valid sequence become U+FFFD right away so a
    /// bad byte never stalls the stream; only a valid-so-far tail is kept.
    fn decode(&mut self, piece: &[u8]) {
        self.pending.extend_from_slice(piece);
        let mut rest = &self.pending[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    self.held.push_str(text);
                    rest = &[];
                    break;
                }
                Err(err) => {
                    let (valid, after) = rest.split_at(err.valid_up_to());
                    // `valid` is known to be UTF-8, so this borrows without
                    // replacing anything.
                    self.held.push_str(&String::from_utf8_lossy(valid));
                    match err.error_len() {
                        Some(bad) => {
                            self.held.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // Incomplete at the end: the next piece may finish it.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let done = self.pending.len() - rest.len();
        self.pending.drain(..done);
    }

    /// Emits what `held` can give up now. All of `held` is searched: earlier
    /// text was emitted only because it held no live stop prefix.
    fn release(&mut self, at_end: bool) -> Pushed {
        // Earliest full match wins; at equal positions, the longest word.
        let full = self
            .stops
            .iter()
            .filter_map(|word| self.held.find(word.as_str()).map(|pos| (pos, word)))
            .min_by_key(|&(pos, word)| (pos, std::cmp::Reverse(word.len())));
        if let Some((pos, word)) = full {
            let word = word.clone();
            let text = self.held[..pos].to_owned();
            self.content.push_str(&text);
            self.held.clear();
            self.pending.clear();
            self.stopped = Some(word.clone());
            return Pushed { text, stop: Some(word) };
        }
        let cut = if at_end {
            self.held.len()
        } else {
            self.stops.iter().filter_map(|word| find_partial_stop(word, &self.held)).min().unwrap_or(self.held.len())
        };
        let text: String = self.held.drain(..cut).collect();
        self.content.push_str(&text);
        Pushed { text, stop: None }
    }
}

/// Byte offset in `text` where a suffix of `text` begins that is a proper
/// prefix of `stop` (the legacy `find_partial_stop_string`, minus the full
/// match, which callers find with a plain search); `None` if no suffix is.
///
/// Prefixes are tried longest first, so the result is the earliest such
/// offset. Only prefixes ending on a char boundary of `stop` are tried, so the
/// offset is always a char boundary of `text`.
pub fn find_partial_stop(stop: &str, text: &str) -> Option<usize> {
    stop.char_indices()
        .rev()
        .map(|(len, _)| len)
        .filter(|&len| len > 0)
        .find(|&len| text.ends_with(&stop[..len]))
        .map(|len| text.len() - len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stops: &[&str]) -> TextStream {
        TextStream::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Pushes every piece, collecting the emitted texts.
    fn feed(s: &mut TextStream, pieces: &[&[u8]]) -> Vec<String> {
        pieces.iter().map(|p| s.push(p).text).collect()
    }

    #[test]
    fn ascii_without_stops_streams_immediately() {
        let mut s = stream(&[]);
        assert_eq!(feed(&mut s, &[b"Hello", b", ", b"world"]), ["Hello", ", ", "world"]);
        assert_eq!(s.held_bytes(), 0);
        assert_eq!(s.finish(), "");
        assert_eq!(s.content(), "Hello, world");
        assert_eq!(s.stopped(), None);
    }

    #[test]
    fn emoji_split_across_pieces() {
        let emoji = "😀".as_bytes(); // F0 9F 98 80
        for cuts in [&[2][..], &[1, 3], &[1, 2, 3]] {
            let mut s = stream(&[]);
            let mut start = 0;
            for &cut in cuts {
                assert_eq!(s.push(&emoji[start..cut]).text, "");
                assert_eq!(s.held_bytes(), cut);
                start = cut;
            }
            assert_eq!(s.push(&emoji[start..]).text, "😀");
            assert_eq!(s.held_bytes(), 0);
            assert_eq!(s.content(), "😀");
        }
    }

    #[test]
    fn cjk_split_mid_character() {
        let bytes = "你好世界".as_bytes(); // 3 bytes per char
        let mut s = stream(&[]);
        let out = feed(&mut s, &[&bytes[..4], &bytes[4..5], &bytes[5..10], &bytes[10..]]);
        // The middle pieces are a lone continuation byte, then the rest of
        // "好" plus "世" plus the first byte of "界".
        assert_eq!(out, ["你", "", "好世", "界"]);
        assert_eq!(s.content(), "你好世界");
    }

    #[test]
    fn invalid_bytes_become_replacement_and_stream_continues() {
        let mut s = stream(&[]);
        assert_eq!(s.push(b"a\xFFb").text, "a\u{FFFD}b");
        // A lead byte followed by a non-continuation byte is invalid at once.
        assert_eq!(s.push(b"\xE4").text, "");
        assert_eq!(s.push(b"x").text, "\u{FFFD}x");
        // A lone continuation byte can never become valid.
        assert_eq!(s.push(b"\x80").text, "\u{FFFD}");
        assert_eq!(s.push("é".as_bytes()).text, "é");
        assert_eq!(s.content(), "a\u{FFFD}b\u{FFFD}x\u{FFFD}é");
    }

    #[test]
    fn stop_split_across_tokens_is_never_emitted() {
        let mut s = stream(&["###"]);
        assert_eq!(s.push(b"Answer ").text, "Answer ");
        assert_eq!(s.push(b"#").text, "");
        assert_eq!(s.push(b"#").text, "");
        assert_eq!(s.held_bytes(), 2);
        let last = s.push(b"# tail");
        assert_eq!(last, Pushed { text: String::new(), stop: Some("###".into()) });
        assert_eq!(s.content(), "Answer ");
        assert_eq!(s.stopped(), Some("###"));
        assert_eq!(s.held_bytes(), 0);
    }

    #[test]
    fn partial_stop_that_is_not_a_stop_is_released() {
        let mut s = stream(&["##"]);
        assert_eq!(s.push(b"x#").text, "x");
        assert_eq!(s.push(b"a").text, "#a");
        assert_eq!(s.content(), "x#a");
        assert_eq!(s.stopped(), None);
    }

    #[test]
    fn text_before_stop_in_same_piece_is_emitted() {
        let mut s = stream(&["</s>"]);
        let p = s.push(b"done</s>junk");
        assert_eq!(p.text, "done");
        assert_eq!(p.stop.as_deref(), Some("</s>"));
    }

    #[test]
    fn earliest_of_two_stops_wins() {
        let mut s = stream(&["END", "STOP"]);
        let p = s.push(b"a STOP b END");
        assert_eq!((p.text.as_str(), p.stop.as_deref()), ("a ", Some("STOP")));

        // Held back from the earliest partial, then the later full match wins
        // only because the earlier candidate died.
        let mut s = stream(&["abc", "bx"]);
        assert_eq!(s.push(b"_ab").text, "_");
        let p = s.push(b"x");
        assert_eq!((p.text.as_str(), p.stop.as_deref()), ("a", Some("bx")));

        // Equal positions: the longest word.
        let mut s = stream(&["ab", "abc"]);
        let p = s.push(b"zabc");
        assert_eq!((p.text.as_str(), p.stop.as_deref()), ("z", Some("abc")));
    }

    #[test]
    fn multibyte_stop_split_across_pieces() {
        let mut s = stream(&["«end»"]);
        let bytes = "ok «end» more".as_bytes();
        // Cut inside '«' (bytes 3..5) and inside '»' (bytes 8..10).
        let out = feed(&mut s, &[&bytes[..4], &bytes[4..8], &bytes[8..9]]);
        assert_eq!(out, ["ok ", "", ""]);
        assert_eq!(s.held_bytes(), "«end".len() + 1);
        let p = s.push(&bytes[9..]);
        assert_eq!(p.text, "");
        assert_eq!(p.stop.as_deref(), Some("«end»"));
        assert_eq!(s.content(), "ok ");
    }

    #[test]
    fn finish_releases_partial_prefix_and_incomplete_bytes() {
        let mut s = stream(&["###"]);
        assert_eq!(s.push(b"hi ##").text, "hi ");
        assert_eq!(s.finish(), "##");
        assert_eq!(s.content(), "hi ##");

        let mut s = stream(&[]);
        assert_eq!(s.push(b"x\xF0\x9F").text, "x");
        assert_eq!(s.held_bytes(), 2);
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.held_bytes(), 0);
        assert_eq!(s.content(), "x\u{FFFD}");

        let mut s = stream(&["<|end|>"]);
        assert_eq!(s.push(b"<|e\xE2\x82").text, "");
        assert_eq!(s.finish(), "<|e\u{FFFD}");
    }

    #[test]
    fn input_after_stop_is_ignored() {
        let mut s = stream(&["\n\n"]);
        assert_eq!(s.push(b"line\n").text, "line");
        assert_eq!(s.push(b"\n").stop.as_deref(), Some("\n\n"));
        assert_eq!(s.push(b"more"), Pushed::default());
        assert_eq!(s.finish(), "");
        assert_eq!(s.content(), "line");
        assert_eq!(s.held_bytes(), 0);
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let mut s = stream(&[""]);
        assert_eq!(s.push(b"abc").text, "abc");
        assert_eq!(s.stopped(), None);
    }

    #[test]
    fn find_partial_stop_cases() {
        assert_eq!(find_partial_stop("###", "abc#"), Some(3));
        assert_eq!(find_partial_stop("###", "abc##"), Some(3));
        assert_eq!(find_partial_stop("###", "abc"), None);
        // A full match is not a proper prefix; "##" at the end is.
        assert_eq!(find_partial_stop("###", "a###"), Some(2));
        assert_eq!(find_partial_stop("abab", "xaba"), Some(1));
        assert_eq!(find_partial_stop("", "abc"), None);
        assert_eq!(find_partial_stop("abc", ""), None);
        // Multi-byte: offsets are byte offsets on char boundaries.
        assert_eq!(find_partial_stop("«end»", "x «en"), Some(2));
        assert_eq!(find_partial_stop("世界", "你好世"), Some(6));
    }
}
