//! Streaming a chat answer through a parser that reads a whole answer (or
//! a part of one): llama.cpp's per-family parsers (`engine::chat_native`).
//! After each piece of text the answer so far is read again as a part, and
//! what grew since the last read is sent: content and reasoning text, and
//! tool calls in OpenAI's streaming shape (index, id and name first, then
//! fragments of the arguments). Only growth is ever sent: text a read puts
//! in `content` is sent when a later read still has it there, so a marker
//! that turns out to start a call never reaches `content`; at the end the
//! answer is read whole, and what is sent adds up to that reading.

use super::format::{ParsedMessage, SharedParser};
use super::output::{Delta, ToolCall, ToolCallDelta};

/// Answers longer than this are read again at most every this many bytes
/// of new text while they stream (each read is linear in the answer: a
/// model writing without end must not make each step quadratic).
const REREAD_STRIDE_FROM: usize = 64 << 10;

/// How far back from the end an unclosed `<` may start a marker.
const MARKER_HOLD: usize = 64;

/// Cuts `text` before a trailing `<` that no `>` follows (within the last
/// `MARKER_HOLD` bytes): the start of a marker not yet whole; and trailing
/// white space, which the whole answer's reading may trim.
fn settle(text: &mut String) {
    // Trailing white space too: the whole answer's reading trims it.
    text.truncate(text.trim_end().len());
    let from = text.len().saturating_sub(MARKER_HOLD);
    let from = (from..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    if let Some(i) = text[from..].rfind('<') {
        if !text[from + i..].contains('>') {
            text.truncate(from + i);
        }
    }
}

pub struct ReparseReader {
    parse: SharedParser,
    /// The answer so far.
    text: String,
    /// Where `text` was when it was last read.
    read_at: usize,
    content: String,
    reasoning: String,
    /// Calls announced: (id, name, arguments sent).
    sent: Vec<(String, String, String)>,
    /// The calls of the final reading.
    calls: Vec<ToolCall>,
    /// Ids for calls the parser leaves without one.
    id_seed: u64,
}

impl ReparseReader {
    pub fn new(parse: SharedParser, id_seed: u64) -> Self {
        ReparseReader {
            parse,
            text: String::new(),
            read_at: 0,
            content: String::new(),
            reasoning: String::new(),
            sent: Vec::new(),
            calls: Vec::new(),
            id_seed,
        }
    }

    pub fn content(&self) -> &str {
        &self.content
    }

    pub fn reasoning(&self) -> &str {
        &self.reasoning
    }

    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// Adds text without reading it (an answer read only when it is whole).
    pub fn append(&mut self, text: &str) {
        self.text.push_str(text);
    }

    /// Feeds text; returns what it added.
    pub fn push(&mut self, text: &str) -> Delta {
        self.text.push_str(text);
        if text.is_empty() || (self.text.len() > REREAD_STRIDE_FROM && self.text.len() - self.read_at < REREAD_STRIDE_FROM / 8) {
            return Delta::default();
        }
        self.read_at = self.text.len();
        match (self.parse.0)(&self.text, true) {
            Ok(mut msg) => {
                // A part's reading may end in the first bytes of a marker
                // (`</thi`) that the next read will take away: held back.
                settle(&mut msg.content);
                settle(&mut msg.reasoning);
                for call in &mut msg.calls {
                    settle(&mut call.2);
                }
                self.grow(msg)
            }
            // Not readable as a part yet: wait for more text.
            Err(_) => Delta::default(),
        }
    }

    /// The answer ended: it is read whole. A reading that fails keeps the
    /// last part's reading, and what followed is content.
    pub fn finish(&mut self) -> Delta {
        let msg = match (self.parse.0)(&self.text, false) {
            Ok(msg) => msg,
            Err(_) => match (self.parse.0)(&self.text, true) {
                Ok(msg) => msg,
                Err(_) => ParsedMessage { content: self.text.clone(), ..Default::default() },
            },
        };
        let mut delta = self.grow(msg.clone());
        // Whatever the final reading holds that was not sent as growth
        // (a reading that changed its mind about text already sent) is not
        // sent now; the result is what was sent, plus the final calls.
        if msg.content.starts_with(&self.content) && msg.content.len() > self.content.len() {
            delta.content.push_str(&msg.content[self.content.len()..]);
            self.content = msg.content.clone();
        }
        self.calls = msg
            .calls
            .iter()
            .enumerate()
            .map(|(i, (id, name, args))| ToolCall {
                id: if id.is_empty() { self.sent.get(i).map(|s| s.0.clone()).unwrap_or_else(|| self.new_id(i)) } else { id.clone() },
                name: name.clone(),
                arguments: if args.is_empty() { "{}".into() } else { args.clone() },
            })
            .collect();
        delta
    }

    fn new_id(&self, i: usize) -> String {
        let mut h = self.id_seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut id = String::from("call_");
        for _ in 0..24 {
            h = h.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            id.push(char::from(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[((h >> 32) % 62) as usize]));
        }
        id
    }

    /// What `msg` adds to what was sent.
    fn grow(&mut self, msg: ParsedMessage) -> Delta {
        let mut d = Delta::default();
        if msg.reasoning.len() > self.reasoning.len() && msg.reasoning.starts_with(&self.reasoning) {
            d.reasoning.push_str(&msg.reasoning[self.reasoning.len()..]);
            self.reasoning = msg.reasoning;
        }
        if msg.content.len() > self.content.len() && msg.content.starts_with(&self.content) {
            d.content.push_str(&msg.content[self.content.len()..]);
            self.content = msg.content;
        }
        for (i, (id, name, args)) in msg.calls.into_iter().enumerate() {
            if name.is_empty() {
                break;
            }
            if i == self.sent.len() {
                let id = if id.is_empty() { self.new_id(i) } else { id };
                d.tool_calls.push(ToolCallDelta { index: i, id: Some(id.clone()), name: Some(name.clone()), arguments: None });
                self.sent.push((id, name, String::new()));
            }
            if i >= self.sent.len() {
                break;
            }
            let sent = &mut self.sent[i].2;
            if args.len() > sent.len() && args.starts_with(sent.as_str()) {
                d.tool_calls.push(ToolCallDelta { index: i, id: None, name: None, arguments: Some(args[sent.len()..].to_string()) });
                *sent = args;
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A toy format: `<think>R</think>` then content, then calls written
    /// `<call name>{args}</call>`; a part read holds back any `<` that
    /// could start a marker, and an unclosed call's arguments so far.
    fn toy(text: &str, partial: bool) -> Result<ParsedMessage, String> {
        let mut m = ParsedMessage::default();
        let mut rest = text;
        if let Some(r) = rest.strip_prefix("<think>") {
            match r.find("</think>") {
                Some(i) => {
                    m.reasoning = r[..i].to_string();
                    rest = &r[i + 8..];
                }
                None if partial => {
                    m.reasoning = r.to_string();
                    return Ok(m);
                }
                None => return Err("unclosed".into()),
            }
        } else if partial && "<think>".starts_with(rest) {
            return Ok(m);
        }
        while !rest.is_empty() {
            match rest.find("<call ") {
                Some(i) => {
                    m.content.push_str(&rest[..i]);
                    let call = &rest[i + 6..];
                    let Some(sp) = call.find('>') else { return if partial { Ok(m) } else { Err("cut".into()) } };
                    let name = call[..sp].to_string();
                    let body = &call[sp + 1..];
                    match body.find("</call>") {
                        Some(e) => {
                            m.calls.push((String::new(), name, body[..e].to_string()));
                            rest = &body[e + 7..];
                        }
                        None if partial => {
                            m.calls.push((String::new(), name, body.trim_end_matches(['<', '/']).to_string()));
                            return Ok(m);
                        }
                        None => return Err("cut".into()),
                    }
                }
                None => {
                    let hold = if partial {
                        (1..=rest.len().min(6)).rev().find(|&k| "<call ".starts_with(&rest[rest.len() - k..])).unwrap_or(0)
                    } else {
                        0
                    };
                    m.content.push_str(&rest[..rest.len() - hold]);
                    break;
                }
            }
        }
        Ok(m)
    }

    fn reader() -> ReparseReader {
        ReparseReader::new(SharedParser(Arc::new(toy)), 7)
    }

    const ANSWER: &str =
        "<think>I should call it</think>Let me see. <call get_weather>{\"city\": \"Paris\"}</call><call get_time>{}</call>";

    #[test]
    fn streamed_pieces_add_up_to_the_whole_reading_at_any_cut() {
        let whole = {
            let mut r = reader();
            r.push(ANSWER);
            r.finish();
            (r.content().to_string(), r.reasoning().to_string(), r.calls().to_vec())
        };
        assert_eq!(whole.0, "Let me see. ");
        assert_eq!(whole.1, "I should call it");
        assert_eq!(whole.2.len(), 2);
        for step in 1..8 {
            let mut r = reader();
            let (mut content, mut reasoning) = (String::new(), String::new());
            let mut args: Vec<String> = Vec::new();
            let chars: Vec<char> = ANSWER.chars().collect();
            let mut deltas = Vec::new();
            for chunk in chars.chunks(step) {
                deltas.push(r.push(&chunk.iter().collect::<String>()));
            }
            deltas.push(r.finish());
            for d in deltas {
                assert!(!d.content.contains('<'), "a marker's piece reached content: {:?}", d.content);
                content.push_str(&d.content);
                reasoning.push_str(&d.reasoning);
                for c in d.tool_calls {
                    if c.index == args.len() {
                        assert!(c.name.is_some() && c.id.is_some());
                        args.push(String::new());
                    }
                    args[c.index].push_str(c.arguments.as_deref().unwrap_or(""));
                }
            }
            assert_eq!((content, reasoning), (whole.0.clone(), whole.1.clone()));
            assert_eq!(
                args,
                whole.2.iter().map(|c| if c.arguments == "{}" { "{}".to_string() } else { c.arguments.clone() }).collect::<Vec<_>>()
            );
            assert_eq!(r.calls().iter().map(|c| &c.id).collect::<Vec<_>>(), whole.2.iter().map(|c| &c.id).collect::<Vec<_>>());
        }
    }

    #[test]
    fn an_answer_the_parser_refuses_is_content() {
        let mut r = ReparseReader::new(SharedParser(Arc::new(|_: &str, _| Err("no".into()))), 1);
        assert!(r.push("anything").is_empty());
        let d = r.finish();
        assert_eq!(d.content, "anything");
        assert_eq!(r.content(), "anything");
    }

    #[test]
    fn long_answers_are_read_again_in_strides() {
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = reads.clone();
        let parse = move |t: &str, _| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(ParsedMessage { content: t.to_string(), ..Default::default() })
        };
        let mut r = ReparseReader::new(SharedParser(Arc::new(parse)), 1);
        for _ in 0..200_000 {
            r.push("ab");
        }
        r.finish();
        assert_eq!(r.content().len(), 400_000);
        assert!(reads.load(std::sync::atomic::Ordering::Relaxed) < 70_000, "{:?}", reads);
    }
}
