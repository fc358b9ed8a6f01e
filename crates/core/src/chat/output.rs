//! Splits a chat answer, as it streams, into what the client shows
//! (`content`), the model's reasoning (`<think>…</think>` →
//! `reasoning_content`) and its tool calls, and says what changed after each
//! piece of text: content and reasoning text, and tool-call deltas in
//! OpenAI's streaming shape (a call's index, id and name first, then its
//! arguments in fragments). Markup never reaches `content`: text that could
//! still become a marker is held back until it is clear, as stop strings are.
//!
//! When calls are constrained (the usual case: `tool_choice` other than
//! `none`) the text after an opener is a valid call by construction; a call
//! cut short by the token limit is left out of the final calls.

use serde_json::Value;

use super::format::{OutputFormat, ReasoningMarkers, ReasoningStart, ToolSyntax};

/// A tool call's change in one step: its first delta carries `id` and
/// `name`, the following ones fragments of `arguments` (a JSON string).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// What one piece of text added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.tool_calls.is_empty()
    }

    fn merge(&mut self, other: Delta) {
        self.content.push_str(&other.content);
        self.reasoning.push_str(&other.reasoning);
        self.tool_calls.extend(other.tool_calls);
    }
}

/// A finished tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// Its arguments, a JSON text.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Before anything but whitespace (a reasoning start or a bare call may come).
    Start,
    Reasoning,
    Content,
    /// Inside one call's JSON (or the array of calls): the JSON so far.
    Call(String),
    /// After a call's JSON: its gap and closing marker are skipped.
    AfterCall,
    /// Whitespace after a call or the reasoning is skipped.
    Gap,
}

pub struct OutputParser {
    format: OutputFormat,
    state: State,
    /// Text not yet classified (a possible marker prefix).
    held: String,
    calls: Vec<ToolCall>,
    /// What was sent of the calls being read: (announced, argument bytes sent).
    sent: Vec<(bool, usize)>,
    content: String,
    reasoning: String,
    id_seed: u64,
    /// `finish` ran: the answer is complete, a second call adds nothing.
    finished: bool,
}

impl OutputParser {
    /// `id_seed` makes the call ids of one answer.
    pub fn new(format: OutputFormat, id_seed: u64) -> Self {
        let state =
            if format.reasoning.is_some() && format.reasoning_start == ReasoningStart::Open { State::Reasoning } else { State::Start };
        OutputParser {
            format,
            state,
            held: String::new(),
            calls: Vec::new(),
            sent: Vec::new(),
            content: String::new(),
            reasoning: String::new(),
            finished: false,
            id_seed,
        }
    }

    /// The content so far (what token events' `content` add up to).
    pub fn content(&self) -> &str {
        &self.content
    }

    pub fn reasoning(&self) -> &str {
        &self.reasoning
    }

    /// The calls that were completed.
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// Feeds text; returns what it added.
    pub fn push(&mut self, text: &str) -> Delta {
        self.held.push_str(text);
        let mut delta = Delta::default();
        loop {
            let before = (self.held.len(), std::mem::discriminant(&self.state));
            let step = self.step(false);
            delta.merge(step);
            if self.held.is_empty() || (self.held.len(), std::mem::discriminant(&self.state)) == before {
                break;
            }
        }
        self.commit(&mut delta);
        delta
    }

    /// The answer ended: what was held back is released (as what it was
    /// read as); a call cut short is dropped.
    pub fn finish(&mut self) -> Delta {
        let mut delta = Delta::default();
        // Once: a second call would read the cut call again (announce it
        // anew and keep it twice).
        if std::mem::replace(&mut self.finished, true) {
            return delta;
        }
        loop {
            let before = (self.held.len(), std::mem::discriminant(&self.state));
            delta.merge(self.step(true));
            if self.held.is_empty() || (self.held.len(), std::mem::discriminant(&self.state)) == before {
                break;
            }
        }
        // Whatever is still held is text, but for the start of an opener
        // cut off by the end: markup, not content.
        let rest = std::mem::take(&mut self.held);
        let opener = self.format.calls.as_ref().map(|s| s.open.as_str()).filter(|o| !o.is_empty());
        match self.state {
            State::Reasoning => delta.reasoning.push_str(&rest),
            State::Call(_) | State::AfterCall | State::Gap => {}
            _ if opener.is_some_and(|o| !rest.is_empty() && o.starts_with(rest.as_str())) => {}
            _ => delta.content.push_str(&rest),
        }
        if let State::Call(json) = &self.state {
            // Cut short (the token limit): the calls announced so far stay,
            // with their arguments as far as the model wrote them — what the
            // deltas sent, not JSON yet; the result says `stopped_limit`.
            let json = json.clone();
            self.keep_cut_calls(&json);
        }
        self.commit(&mut delta);
        delta
    }

    /// The calls of a call's JSON cut short, as far as they were sent.
    fn keep_cut_calls(&mut self, json: &str) {
        let Some(syntax) = self.format.calls.clone() else { return };
        let scanned = scan(json, &syntax);
        let first = self.calls.len();
        for (k, call) in scanned.calls.iter().enumerate() {
            let Some(&(announced, sent)) = self.sent.get(k) else { break };
            if !announced {
                break;
            }
            let arguments = call.args.map(|(start, _)| json[start..start + sent].to_string()).unwrap_or_default();
            let id = call.id.clone().unwrap_or_else(|| self.new_id(first + k));
            self.calls.push(ToolCall { id, name: call.name.clone().unwrap_or_default(), arguments });
        }
        self.sent.clear();
    }

    fn commit(&mut self, delta: &mut Delta) {
        self.content.push_str(&delta.content);
        self.reasoning.push_str(&delta.reasoning);
    }

    fn separate_reasoning(&self) -> Option<&ReasoningMarkers> {
        self.format.reasoning.as_ref()
    }

    /// One move of the state machine over `held`.
    fn step(&mut self, at_end: bool) -> Delta {
        let mut d = Delta::default();
        match std::mem::replace(&mut self.state, State::Content) {
            State::Start => {
                let trimmed = self.held.trim_start();
                if trimmed.is_empty() && !at_end {
                    self.state = State::Start;
                    return d;
                }
                if let Some(m) = self.separate_reasoning().cloned() {
                    if self.format.reasoning_start != ReasoningStart::None {
                        if trimmed.starts_with(m.start.as_str()) {
                            let skip = self.held.len() - trimmed.len() + m.start.len();
                            self.held.drain(..skip);
                            self.state = State::Reasoning;
                            return d;
                        }
                        if m.start.starts_with(trimmed) && !at_end {
                            self.state = State::Start;
                            return d;
                        }
                    }
                }
                // A bare JSON call (no opener) starts the answer, maybe
                // after an alternative marker.
                if let Some(s) = &self.format.calls {
                    if let Some(alt) = s.alt_open.as_deref().filter(|a| s.open.is_empty() && trimmed.starts_with(a)) {
                        let skip = self.held.len() - trimmed.len() + alt.len();
                        self.held.drain(..skip);
                        self.state = State::Call(String::new());
                        return d;
                    }
                    if s.open.is_empty() && s.alt_open.as_deref().is_some_and(|a| a.starts_with(trimmed)) && !at_end {
                        self.state = State::Start;
                        return d;
                    }
                    if s.open.is_empty() && trimmed.starts_with(if s.array { '[' } else { '{' }) {
                        let skip = self.held.len() - trimmed.len();
                        self.held.drain(..skip);
                        self.state = State::Call(String::new());
                        return d;
                    }
                }
                self.state = State::Content;
            }
            State::Reasoning => {
                let Some(end) = self.separate_reasoning().map(|m| m.end.clone()) else {
                    self.state = State::Content;
                    return d;
                };
                match self.held.find(end.as_str()) {
                    Some(i) => {
                        d.reasoning.push_str(&self.held[..i]);
                        self.held.drain(..i + end.len());
                        self.state = State::Gap;
                        // Reasoning happens once.
                        self.format.reasoning_start = ReasoningStart::None;
                    }
                    None => {
                        let keep = if at_end { 0 } else { partial_suffix(&self.held, &end) };
                        let cut = self.held.len() - keep;
                        d.reasoning.push_str(&self.held[..cut]);
                        self.held.drain(..cut);
                        self.state = State::Reasoning;
                    }
                }
            }
            State::Content => {
                let open = self.format.calls.as_ref().map(|s| s.open.clone()).filter(|o| !o.is_empty());
                match open {
                    Some(open) => match self.held.find(open.as_str()) {
                        Some(i) => {
                            d.content.push_str(&self.held[..i]);
                            self.held.drain(..i + open.len());
                            self.open_call();
                        }
                        None => {
                            // (At the end a partial opener stays held: `finish` drops it.)
                            let keep = partial_suffix(&self.held, &open);
                            let cut = self.held.len() - keep;
                            d.content.push_str(&self.held[..cut]);
                            self.held.drain(..cut);
                            self.state = State::Content;
                        }
                    },
                    None => {
                        d.content.push_str(&self.held);
                        self.held.clear();
                        self.state = State::Content;
                    }
                }
            }
            State::Call(mut json) => {
                let Some(syntax) = self.format.calls.clone() else { return d };
                // The gap before the JSON is skipped.
                if json.is_empty() {
                    let trimmed = self.held.trim_start();
                    let skip = self.held.len() - trimmed.len();
                    self.held.drain(..skip);
                }
                let from = json.len();
                json.push_str(&self.held);
                let scanned = scan(&json, &syntax);
                d.tool_calls.extend(self.call_deltas(&json, &scanned, syntax.id_key.is_some()));
                match scanned.end {
                    Some(end) => {
                        // What follows the JSON goes back to be read.
                        let rest = json[end..].to_string();
                        let _ = from;
                        self.held = rest;
                        self.finish_calls(&json, &scanned);
                        self.state = State::AfterCall;
                    }
                    None => {
                        self.held.clear();
                        self.state = State::Call(json);
                    }
                }
            }
            State::AfterCall => {
                let Some(syntax) = self.format.calls.clone() else { return d };
                let trimmed = self.held.trim_start();
                let close = syntax.close.as_str();
                if !close.is_empty() {
                    if let Some(rest) = trimmed.strip_prefix(close) {
                        self.held = rest.to_string();
                        self.state = State::Gap;
                        return d;
                    }
                    if close.starts_with(trimmed) {
                        if at_end {
                            // A closer cut by the end: markup, not content.
                            self.held.clear();
                            self.state = State::Gap;
                        } else {
                            self.state = State::AfterCall;
                        }
                        return d;
                    }
                }
                let skip = self.held.len() - trimmed.len();
                self.held.drain(..skip);
                self.state = State::Gap;
            }
            State::Gap => {
                let skip = self.held.len() - self.held.trim_start().len();
                self.held.drain(..skip);
                self.state = if self.held.is_empty() { State::Gap } else { State::Start };
            }
        }
        d
    }

    fn open_call(&mut self) {
        self.state = State::Call(String::new());
    }

    /// The deltas of the calls in `json` since the last ones sent. A call is
    /// announced (index, id, name) once its name is read, and, when the model
    /// writes the id (`model_ids`), once that is read too.
    fn call_deltas(&mut self, json: &str, scanned: &Scanned, model_ids: bool) -> Vec<ToolCallDelta> {
        let mut out = Vec::new();
        for (k, call) in scanned.calls.iter().enumerate() {
            if self.sent.len() <= k {
                self.sent.push((false, 0));
            }
            let index = self.calls.len() + k;
            if !self.sent[k].0 {
                let Some(name) = &call.name else { break };
                if model_ids && !call.id_known && !call.complete {
                    break;
                }
                let id = call.id.clone().unwrap_or_else(|| self.new_id(index));
                self.sent[k].0 = true;
                out.push(ToolCallDelta { index, id: Some(id), name: Some(name.clone()), arguments: Some(String::new()) });
            }
            if let Some((start, end)) = call.args {
                let upto = end.unwrap_or(json.len());
                let from = start + self.sent[k].1;
                if upto > from {
                    let piece = json[from..upto].to_string();
                    self.sent[k].1 += piece.len();
                    match out.last_mut() {
                        Some(last) if last.index == index => last.arguments.get_or_insert_with(String::new).push_str(&piece),
                        _ => out.push(ToolCallDelta { index, id: None, name: None, arguments: Some(piece) }),
                    }
                }
            }
        }
        out
    }

    /// The calls of a complete JSON join the answer's calls.
    fn finish_calls(&mut self, json: &str, scanned: &Scanned) {
        for (k, call) in scanned.calls.iter().enumerate() {
            let index = self.calls.len();
            let arguments = match call.args {
                Some((s, Some(e))) => json[s..e].to_string(),
                _ => "{}".to_string(),
            };
            // Arguments written as a JSON string: the text inside it.
            let arguments = match serde_json::from_str::<Value>(&arguments) {
                Ok(Value::String(inner)) => inner,
                _ => arguments,
            };
            let id = call.id.clone().unwrap_or_else(|| self.new_id(index));
            let _ = k;
            self.calls.push(ToolCall { id, name: call.name.clone().unwrap_or_default(), arguments });
        }
        self.sent.clear();
    }

    fn new_id(&self, index: usize) -> String {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let mut h = (self.id_seed ^ (index as u64 + 1).wrapping_mul(0x9E3779B97F4A7C15)) | 1;
        let mut s = String::from("call_");
        for _ in 0..24 {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            s.push(ALPHABET[(h % ALPHABET.len() as u64) as usize] as char);
        }
        s
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(text.len());
    (1..=max).rev().find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])).unwrap_or(0)
}

/// One call object as read so far.
#[derive(Debug, Clone, Default, PartialEq)]
struct ScannedCall {
    name: Option<String>,
    id: Option<String>,
    /// Whether the id's value is complete (it streams with the name).
    id_known: bool,
    /// Where its arguments' value starts, and ends once complete.
    args: Option<(usize, Option<usize>)>,
    complete: bool,
}

/// The calls in a call's JSON so far, and where the JSON ends when complete.
#[derive(Debug, Clone, Default, PartialEq)]
struct Scanned {
    calls: Vec<ScannedCall>,
    end: Option<usize>,
}

#[derive(Clone, Copy, PartialEq)]
enum Expect {
    Key,
    Colon,
    Value,
    AfterValue,
}

/// Reads a call's JSON (an object, or an array of objects with `syntax.array`)
/// as far as it goes: each object's name, id and where its arguments are.
fn scan(json: &str, syntax: &ToolSyntax) -> Scanned {
    let object_depth = if syntax.array { 2 } else { 1 };
    let mut out = Scanned::default();
    let mut depth = 0usize;
    let (mut in_string, mut escaped) = (false, false);
    let mut expect = Expect::Key;
    let mut key: Option<String> = None;
    let mut string_start = 0;
    let mut value_start: Option<usize> = None;
    let end_value = |out: &mut Scanned, key: &Option<String>, start: usize, end: usize| {
        let Some(call) = out.calls.last_mut() else { return };
        let raw = json[start..end].trim();
        match key.as_deref() {
            Some(k) if k == syntax.name_key => call.name = serde_json::from_str::<String>(raw).ok(),
            Some(k) if Some(k) == syntax.id_key.as_deref() => {
                call.id = serde_json::from_str::<String>(raw).ok();
                call.id_known = call.id.is_some();
            }
            Some(k) if k == syntax.args_key => call.args = Some((start, Some(start + raw.len()))),
            _ => {}
        }
    };
    for (i, c) in json.char_indices() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                if depth == object_depth {
                    match expect {
                        Expect::Key => {
                            key = serde_json::from_str::<String>(&json[string_start..=i]).ok();
                            expect = Expect::Colon;
                        }
                        Expect::Value => {
                            end_value(&mut out, &key, string_start, i + 1);
                            expect = Expect::AfterValue;
                            value_start = None;
                        }
                        _ => {}
                    }
                }
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                string_start = i;
                if depth == object_depth && expect == Expect::Value {
                    value_start = Some(i);
                    if key.as_deref() == Some(syntax.args_key.as_str()) {
                        if let Some(call) = out.calls.last_mut() {
                            call.args = Some((i, None));
                        }
                    }
                }
            }
            '{' | '[' => {
                if depth == object_depth - 1 && c == '{' {
                    out.calls.push(ScannedCall::default());
                    expect = Expect::Key;
                    key = None;
                } else if depth == object_depth && expect == Expect::Value {
                    value_start = Some(i);
                    if key.as_deref() == Some(syntax.args_key.as_str()) {
                        if let Some(call) = out.calls.last_mut() {
                            call.args = Some((i, None));
                        }
                    }
                }
                depth += 1;
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == object_depth {
                    // A nested value closed.
                    if let Some(s) = value_start.take() {
                        end_value(&mut out, &key, s, i + 1);
                        expect = Expect::AfterValue;
                    }
                } else if depth == object_depth - 1 {
                    // The call object closed (a scalar value ends here too).
                    if let Some(s) = value_start.take() {
                        end_value(&mut out, &key, s, i);
                    }
                    if let Some(call) = out.calls.last_mut() {
                        call.complete = true;
                    }
                    if !syntax.array {
                        out.end = Some(i + 1);
                        return out;
                    }
                } else if depth == 0 && syntax.array {
                    out.end = Some(i + 1);
                    return out;
                }
            }
            ':' if depth == object_depth && expect == Expect::Colon => expect = Expect::Value,
            ',' if depth == object_depth => {
                if let Some(s) = value_start.take() {
                    end_value(&mut out, &key, s, i);
                }
                expect = Expect::Key;
                key = None;
            }
            c if depth == object_depth && expect == Expect::Value && !c.is_whitespace() && value_start.is_none() => {
                value_start = Some(i);
                if key.as_deref() == Some(syntax.args_key.as_str()) {
                    if let Some(call) = out.calls.last_mut() {
                        call.args = Some((i, None));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::format::{Family, ReasoningMarkers, ToolSyntax};

    fn think() -> Option<ReasoningMarkers> {
        Some(ReasoningMarkers { start: "<think>".into(), end: "</think>".into() })
    }

    fn parser(family: Family, reasoning: Option<ReasoningMarkers>, start: ReasoningStart) -> OutputParser {
        OutputParser::new(OutputFormat { calls: Some(ToolSyntax::of_family(family)), reasoning, reasoning_start: start }, 7)
    }

    /// Feeds `text` in pieces of `n` characters; returns every delta and the final one.
    fn run(p: &mut OutputParser, text: &str, n: usize) -> Vec<Delta> {
        let chars: Vec<char> = text.chars().collect();
        let mut out: Vec<Delta> = chars.chunks(n).map(|c| p.push(&c.iter().collect::<String>())).collect();
        out.push(p.finish());
        out
    }

    /// The calls as a client assembles them from the deltas (OpenAI's rules).
    fn assemble(deltas: &[Delta]) -> Vec<(String, String, String)> {
        let mut calls: Vec<(String, String, String)> = Vec::new();
        for d in deltas {
            for t in &d.tool_calls {
                if calls.len() <= t.index {
                    calls.resize(t.index + 1, Default::default());
                }
                let c = &mut calls[t.index];
                if let Some(id) = &t.id {
                    c.0 = id.clone();
                }
                if let Some(name) = &t.name {
                    c.1 = name.clone();
                }
                if let Some(a) = &t.arguments {
                    c.2.push_str(a);
                }
            }
        }
        calls
    }

    const TWO: &str = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, {\"a\": \"}\"}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n</tool_call>";

    #[test]
    fn hermes_calls_stream_in_any_pieces() {
        for n in [1, 2, 3, 7, 1000] {
            let mut p = parser(Family::Hermes, None, ReasoningStart::None);
            let deltas = run(&mut p, TWO, n);
            let content: String = deltas.iter().map(|d| d.content.as_str()).collect();
            assert_eq!(content, "Let me check.", "n = {n}");
            assert_eq!(p.content(), "Let me check.");
            let calls = p.calls();
            assert_eq!(calls.len(), 2);
            assert_eq!(
                (calls[0].name.as_str(), calls[0].arguments.as_str()),
                ("get_weather", "{\"city\": \"Paris\", \"n\": [1, {\"a\": \"}\"}]}")
            );
            assert_eq!((calls[1].name.as_str(), calls[1].arguments.as_str()), ("add", "{\"x\": 1}"));
            assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29 && calls[0].id != calls[1].id);
            // What a client assembles equals the final calls.
            let assembled = assemble(&deltas);
            assert_eq!(assembled, calls.iter().map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone())).collect::<Vec<_>>());
            // The first delta of a call has its id and name.
            let firsts: Vec<&ToolCallDelta> = deltas.iter().flat_map(|d| &d.tool_calls).filter(|t| t.name.is_some()).collect();
            assert_eq!(firsts.len(), 2);
            assert!(firsts.iter().all(|t| t.id.is_some()));
        }
    }

    #[test]
    fn markup_never_reaches_content() {
        let mut p = parser(Family::Hermes, None, ReasoningStart::None);
        // "<tool" could be the start of the opener: held back, then released.
        let a = p.push("a <tool");
        assert_eq!(a.content, "a ");
        let b = p.push("box> b");
        assert_eq!(b.content, "<toolbox> b");
        let c = p.push(" <tool_ca");
        assert_eq!(c.content, " ");
        // Cut off by the end: the start of an opener is markup, not content.
        let d = p.finish();
        assert_eq!(d.content, "");
        assert!(p.calls().is_empty());
    }

    #[test]
    fn reasoning_is_separated() {
        // The model opens it.
        let mut p = parser(Family::Hermes, think(), ReasoningStart::Optional);
        let d = run(&mut p, "<think>\nHmm, weather.\n</think>\n\nSure.<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>", 3);
        assert_eq!(p.reasoning(), "\nHmm, weather.\n");
        assert_eq!(p.content(), "Sure.");
        assert_eq!(p.calls().len(), 1);
        assert_eq!(d.iter().map(|d| d.reasoning.as_str()).collect::<String>(), p.reasoning());
        // The prompt opened it.
        let mut p = parser(Family::Hermes, think(), ReasoningStart::Open);
        run(&mut p, "I think so.</think>Yes.", 2);
        assert_eq!((p.reasoning(), p.content()), ("I think so.", "Yes."));
        // Never closed: all reasoning.
        let mut p = parser(Family::Hermes, think(), ReasoningStart::Open);
        run(&mut p, "still thinking </thi", 4);
        assert_eq!((p.reasoning(), p.content()), ("still thinking </thi", ""));
        // Without separation the text stays content.
        let mut p = OutputParser::new(OutputFormat { calls: None, reasoning: None, reasoning_start: ReasoningStart::None }, 1);
        run(&mut p, "<think>x</think>y", 1);
        assert_eq!(p.content(), "<think>x</think>y");
    }

    #[test]
    fn finishing_twice_keeps_a_cut_call_once() {
        // The engine's end of a request by the token limit once finished the
        // reader twice: the cut call came back a second time, announced anew.
        let mut p = parser(Family::Hermes, None, ReasoningStart::None);
        let text = "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Par";
        let mut deltas = run(&mut p, text, 4);
        let again = p.finish();
        assert!(again.is_empty(), "{again:?}");
        deltas.push(again);
        assert_eq!(p.calls().len(), 2);
        assert_eq!(p.calls()[1].arguments, "{\"city\": \"Par");
        let calls: Vec<_> = p.calls().iter().map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone())).collect();
        assert_eq!(assemble(&deltas), calls);
    }

    #[test]
    fn a_call_cut_short_keeps_what_was_sent() {
        // Cut in its name: nothing was announced, nothing is a call.
        let mut p = parser(Family::Hermes, None, ReasoningStart::None);
        run(&mut p, "ok<tool_call>\n{\"name\": \"wea", 5);
        assert_eq!(p.content(), "ok");
        assert!(p.calls().is_empty());
        // Cut after it: announced, so a call, with no arguments yet.
        let mut p = parser(Family::Hermes, None, ReasoningStart::None);
        let deltas = run(&mut p, "ok<tool_call>\n{\"name\": \"w\", \"argum", 5);
        assert_eq!((p.calls().len(), p.calls()[0].name.as_str(), p.calls()[0].arguments.as_str()), (1, "w", ""));
        assert_eq!(assemble(&deltas).len(), 1);
        // Cut in its arguments: the call as far as the model wrote it, as its deltas sent it.
        for pieces in [1, 3, 7] {
            let mut p = parser(Family::Hermes, None, ReasoningStart::None);
            let deltas = run(&mut p, "ok<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Par", pieces);
            assert_eq!(p.calls().len(), 1);
            let call = &p.calls()[0];
            assert_eq!((call.name.as_str(), call.arguments.as_str()), ("w", "{\"city\": \"Par"));
            assert_eq!(assemble(&deltas), vec![(call.id.clone(), call.name.clone(), call.arguments.clone())]);
        }
    }

    #[test]
    fn a_closer_cut_by_the_end_is_not_content() {
        for cut in ["<", "</tool", "</tool_call"] {
            let mut p = parser(Family::Hermes, None, ReasoningStart::None);
            run(&mut p, &format!("<tool_call>\n{{\"name\": \"w\", \"arguments\": {{}}}}\n{cut}"), 3);
            assert_eq!((p.content(), p.calls().len()), ("", 1), "{cut:?}");
        }
    }

    #[test]
    fn mistral_arrays_with_the_models_ids() {
        let mut p = parser(Family::Mistral, None, ReasoningStart::None);
        let deltas = run(&mut p, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"a1B2c3D4e\"}, {\"name\": \"b\", \"arguments\": {}, \"id\": \"Zz9Zz9Zz9\"}]", 4);
        let calls = p.calls();
        assert_eq!(
            calls.iter().map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())).collect::<Vec<_>>(),
            vec![("a1B2c3D4e", "a", "{\"x\": 1}"), ("Zz9Zz9Zz9", "b", "{}")]
        );
        assert_eq!(assemble(&deltas).len(), 2);
        assert_eq!(assemble(&deltas)[0], ("a1B2c3D4e".into(), "a".into(), "{\"x\": 1}".into()));
        assert_eq!(p.content(), "");
    }

    #[test]
    fn llama_bare_calls_only_at_the_start() {
        let mut p = parser(Family::Llama3, None, ReasoningStart::None);
        run(&mut p, " {\"name\": \"w\", \"parameters\": {\"q\": \"x\"}}", 3);
        assert_eq!(p.calls().len(), 1);
        assert_eq!(p.calls()[0].arguments, "{\"q\": \"x\"}");
        let mut p = parser(Family::Llama3, None, ReasoningStart::None);
        run(&mut p, "<|python_tag|>{\"name\": \"w\", \"parameters\": {}}", 2);
        assert_eq!((p.calls().len(), p.content()), (1, ""));
        let mut p = parser(Family::Llama3, None, ReasoningStart::None);
        run(&mut p, "Use {braces} freely.", 3);
        assert!(p.calls().is_empty());
        assert_eq!(p.content(), "Use {braces} freely.");
    }

    /// Whatever the text and however it is cut into pieces, the parser never
    /// panics, reads the same answer, and never lets an opener into content.
    #[test]
    fn any_text_in_any_pieces_reads_the_same() {
        let pieces = [
            "<tool_call>",
            "</tool_call>",
            "\n",
            " ",
            "{",
            "}",
            "[",
            "]",
            "\"name\": ",
            "\"arguments\": ",
            "\"w\"",
            ", ",
            "\"x\\\"y\"",
            "1",
            "<think>",
            "</think>",
            "<tool",
            "_call>",
            "hello",
            "é",
            "[TOOL_CALLS]",
            ":",
            "\"id\": \"a1B2c3D4e\"",
            "<|python_tag|>",
        ];
        let mut seed = 99u64;
        let mut next = |n: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for round in 0..3000 {
            let text: String = (0..next(30)).map(|_| pieces[next(pieces.len())]).collect();
            let family = [Family::Hermes, Family::Mistral, Family::Llama3][round % 3];
            let reasoning = if round % 2 == 0 { think() } else { None };
            let start = [ReasoningStart::Optional, ReasoningStart::Open, ReasoningStart::None][round % 3];
            let read = |n: usize| {
                let mut p = parser(family, reasoning.clone(), start);
                let deltas = run(&mut p, &text, n);
                let content: String = deltas.iter().map(|d| d.content.as_str()).collect();
                assert_eq!(content, p.content(), "{text:?}");
                (
                    p.content().to_string(),
                    p.reasoning().to_string(),
                    p.calls().iter().map(|c| (c.name.clone(), c.arguments.clone())).collect::<Vec<_>>(),
                )
            };
            let whole = read(10_000);
            for n in [1, 2, 5] {
                assert_eq!(read(n), whole, "{text:?} in pieces of {n}");
            }
            let open = ToolSyntax::of_family(family).open;
            if !open.is_empty() {
                assert!(!whole.0.contains(open.as_str()), "{text:?}: {whole:?}");
            }
        }
    }
}
