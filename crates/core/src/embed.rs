//! Embeddings without a model: the `embed()` request parsed and checked,
//! inputs measured against the engine's limit, token vectors pooled into
//! one vector per input, and L2 normalisation.
//!
//! The engine (`engine/embed.rs`) feeds every input through its own
//! embedding context in chunks of a fixed size, whatever else is queued, and
//! pools the rows here in token order: an input's vector does not depend on
//! the inputs beside it, bit for bit.

use serde_json::Value;

use crate::chat::messages::text_parts;
use crate::error::{EngineError, Result};
use crate::request::media::MediaInput;

/// Inputs per `embed()` call, at most (OpenAI's embeddings API allows 2,048).
pub const MAX_INPUTS: usize = 2048;

/// How the token vectors of an input become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The average of every token's vector.
    Mean,
    /// The first token's vector (BERT's `[CLS]`).
    Cls,
    /// The last token's vector (decoder models trained for it).
    Last,
    /// A reranker's score (llama.cpp's `rank`: the classifier head over the
    /// first token's vector for an encoder, the last one's for a decoder),
    /// computed by llama.cpp; only `rerank()` reads it.
    Rank,
    /// No pooling: every token's vector, one after another (llama.cpp's
    /// `none`), never normalised.
    None,
}

impl Pooling {
    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            "rank" => Some(Pooling::Rank),
            "none" => Some(Pooling::None),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
            Pooling::None => "none",
        }
    }

    /// The pooling a GGUF names (`<arch>.pooling_type`, llama.cpp's
    /// numbering): 1 mean, 2 cls, 3 last, 4 rank; anything else (none,
    /// absent) is not a pooling for one vector per input.
    pub fn from_gguf(value: Option<&str>) -> Option<Pooling> {
        match value?.trim().parse::<i64>().ok()? {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            4 => Some(Pooling::Rank),
            _ => None,
        }
    }
}

/// One input as the caller gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    Text(String),
    Tokens(Vec<i32>),
    /// Content parts (text, images, audio: a chat message's parts): their
    /// text with each media part as `MEDIA_MARKER`, and the media in order.
    Parts(String, Vec<MediaInput>),
}

impl EmbedInput {
    pub fn media(&self) -> &[MediaInput] {
        match self {
            EmbedInput::Parts(_, media) => media,
            _ => &[],
        }
    }
}

/// A checked `embed(input, options)` call.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedRequest {
    pub inputs: Vec<EmbedInput>,
    /// Whether `input` was one input (a string or one token array) rather
    /// than a list: it only changes how errors name the input.
    pub single: bool,
    pub normalize: bool,
    pub truncate: bool,
}

/// Parses `{ input, normalize?, truncate? }`: `input` is a string, token
/// ids, content parts (a chat message's: text, images, audio) or an array
/// of those; nothing empty, token ids in `0..n_vocab`, media checked as in
/// messages (`request::media`), at most `MAX_MEDIA_PARTS` in a call.
pub fn parse_embed_request(value: &Value, n_vocab: i32) -> Result<EmbedRequest> {
    let obj = value.as_object().ok_or_else(|| EngineError::invalid("options", "expected an object"))?;
    let flag = |name: &str, default: bool| match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(EngineError::invalid(name, "expected a boolean")),
    };
    let normalize = flag("normalize", true)?;
    let truncate = flag("truncate", false)?;
    const SHAPE: &str = "expected a string, token ids, content parts ({ type: 'text' | 'image' | 'audio', … }) or an array of those";
    let input = obj.get("input").ok_or_else(|| EngineError::invalid("input", format!("required: {SHAPE}")))?;
    // Images and audio in the whole call, at most MAX_MEDIA_PARTS.
    let mut n_media = 0;
    let (inputs, single) = match input {
        Value::String(s) => (vec![text("input", s)?], true),
        Value::Array(items) if items.is_empty() => return Err(EngineError::invalid("input", format!("is empty: {SHAPE}"))),
        Value::Array(items) if items.iter().all(Value::is_number) => (vec![tokens("input", items, n_vocab)?], true),
        Value::Array(items) if items.iter().all(Value::is_object) => (vec![parts("input", items, &mut n_media)?], true),
        Value::Array(items) => {
            if items.len() > MAX_INPUTS {
                return Err(EngineError::invalid("input", format!("{} inputs; at most {MAX_INPUTS} per call", items.len())));
            }
            let inputs = items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let field = format!("input[{i}]");
                    match item {
                        Value::String(s) => text(&field, s),
                        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
                            parts(&field, items, &mut n_media)
                        }
                        Value::Array(ids) => tokens(&field, ids, n_vocab),
                        _ => Err(EngineError::invalid(&field, "expected a string, token ids or content parts")),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            (inputs, false)
        }
        _ => return Err(EngineError::invalid("input", SHAPE)),
    };
    Ok(EmbedRequest { inputs, single, normalize, truncate })
}

/// Documents per `rerank()` call, at most.
pub const MAX_DOCUMENTS: usize = 2048;

/// A `rerank()` call: a query and the documents to score against it.
#[derive(Debug, Clone, PartialEq)]
pub struct RerankRequest {
    pub query: String,
    pub documents: Vec<String>,
}

/// Parses `{ rerank: { query, documents } }`: a non-empty query string and
/// 1..=MAX_DOCUMENTS document strings (empty documents are allowed: they
/// score as the query against nothing, as llama.cpp scores them).
pub fn parse_rerank_request(value: &Value) -> Result<RerankRequest> {
    let obj =
        value.get("rerank").and_then(Value::as_object).ok_or_else(|| EngineError::invalid("rerank", "expected { query, documents }"))?;
    let query = match obj.get("query") {
        Some(Value::String(q)) if !q.is_empty() => q.clone(),
        Some(Value::String(_)) => return Err(EngineError::invalid("query", "is empty")),
        _ => return Err(EngineError::invalid("query", "required: a string")),
    };
    let docs = match obj.get("documents") {
        Some(Value::Array(d)) if d.is_empty() => return Err(EngineError::invalid("documents", "is empty: expected an array of strings")),
        Some(Value::Array(d)) if d.len() > MAX_DOCUMENTS => {
            return Err(EngineError::invalid("documents", format!("{} documents; at most {MAX_DOCUMENTS} per call", d.len())))
        }
        Some(Value::Array(d)) => d,
        _ => return Err(EngineError::invalid("documents", "required: an array of strings")),
    };
    let documents = docs
        .iter()
        .enumerate()
        .map(|(i, d)| d.as_str().map(str::to_string).ok_or_else(|| EngineError::invalid(&format!("documents[{i}]"), "expected a string")))
        .collect::<Result<Vec<_>>>()?;
    Ok(RerankRequest { query, documents })
}

/// Content parts, as a chat message's: text and media.
fn parts(field: &str, items: &[Value], n_media: &mut usize) -> Result<EmbedInput> {
    let mut media = Vec::new();
    let text = text_parts(items, field, &mut media, n_media)?;
    if text.is_empty() {
        return Err(EngineError::invalid(field, "is empty"));
    }
    Ok(if media.is_empty() { EmbedInput::Text(text) } else { EmbedInput::Parts(text, media) })
}

fn text(field: &str, s: &str) -> Result<EmbedInput> {
    if s.is_empty() {
        return Err(EngineError::invalid(field, "is empty"));
    }
    Ok(EmbedInput::Text(s.to_string()))
}

fn tokens(field: &str, ids: &[Value], n_vocab: i32) -> Result<EmbedInput> {
    if ids.is_empty() {
        return Err(EngineError::invalid(field, "is empty"));
    }
    ids.iter()
        .enumerate()
        .map(|(j, v)| match v.as_i64() {
            Some(t) if (0..n_vocab as i64).contains(&t) => Ok(t as i32),
            _ => Err(EngineError::invalid(&format!("{field}[{j}]"), format!("{v} is not a token id (0..{n_vocab})"))),
        })
        .collect::<Result<Vec<_>>>()
        .map(EmbedInput::Tokens)
}

impl EmbedRequest {
    /// The name errors give input `i`.
    pub fn field(&self, i: usize) -> String {
        if self.single {
            "input".into()
        } else {
            format!("input[{i}]")
        }
    }

    /// Fits each input's tokens to `limit`: longer ones are cut to their
    /// first `limit` tokens with `truncate`, and refused without it.
    pub fn fit(&self, tokenized: &mut [Vec<i32>], limit: usize) -> Result<()> {
        for (i, t) in tokenized.iter_mut().enumerate() {
            if t.is_empty() {
                return Err(EngineError::invalid(&self.field(i), "has no tokens"));
            }
            if t.len() > limit {
                if !self.truncate {
                    return Err(EngineError::invalid(
                        &self.field(i),
                        format!(
                            "too large: {} tokens; the engine embeds at most {limit} per input (its contextSize), or pass truncate: true",
                            t.len()
                        ),
                    ));
                }
                t.truncate(limit);
            }
        }
        Ok(())
    }
}

/// Pools an input's token vectors, fed in token order, into one vector.
#[derive(Debug, Clone)]
pub struct Pooler {
    pooling: Pooling,
    sum: Vec<f64>,
    kept: Vec<f32>,
    rows: usize,
}

impl Pooler {
    pub fn new(pooling: Pooling, dims: usize) -> Self {
        Pooler { pooling, sum: vec![0.0; if pooling == Pooling::Mean { dims } else { 0 }], kept: Vec::new(), rows: 0 }
    }

    pub fn add(&mut self, row: &[f32]) {
        match self.pooling {
            Pooling::Mean => {
                for (s, &x) in self.sum.iter_mut().zip(row) {
                    *s += x as f64;
                }
            }
            Pooling::Cls | Pooling::Rank if self.rows == 0 => self.kept = row.to_vec(),
            Pooling::Cls | Pooling::Rank => {}
            Pooling::Last => {
                self.kept.clear();
                self.kept.extend_from_slice(row);
            }
            Pooling::None => self.kept.extend_from_slice(row),
        }
        self.rows += 1;
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The pooled vector, L2-normalised with `normalize` (never the rows
    /// of `None`).
    pub fn finish(self, normalize: bool) -> Vec<f32> {
        let normalize = normalize && self.pooling != Pooling::None;
        let mut v = match self.pooling {
            Pooling::Mean => {
                let n = self.rows.max(1) as f64;
                self.sum.iter().map(|&s| (s / n) as f32).collect()
            }
            Pooling::Cls | Pooling::Last | Pooling::Rank | Pooling::None => self.kept,
        };
        if normalize {
            l2_normalize(&mut v);
        }
        v
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x = (*x as f64 / norm) as f32;
        }
    }
}

/// Vectors as the binding hands them to JavaScript: each one's
/// little-endian f32 bytes in base64 (exact, and a tenth of JSON numbers).
pub fn to_base64(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of(v: Value) -> String {
        parse_embed_request(&v, 100).unwrap_err().field.unwrap()
    }

    #[test]
    fn inputs_in_each_shape() {
        let r = parse_embed_request(&json!({ "input": "hi" }), 100).unwrap();
        assert_eq!((r.inputs, r.single, r.normalize, r.truncate), (vec![EmbedInput::Text("hi".into())], true, true, false));
        let r = parse_embed_request(&json!({ "input": [1, 2, 3], "normalize": false }), 100).unwrap();
        assert_eq!((r.inputs, r.single, r.normalize), (vec![EmbedInput::Tokens(vec![1, 2, 3])], true, false));
        let r = parse_embed_request(&json!({ "input": ["a", [4, 5]], "truncate": true }), 100).unwrap();
        assert_eq!(r.inputs, vec![EmbedInput::Text("a".into()), EmbedInput::Tokens(vec![4, 5])]);
        assert!(!r.single && r.truncate);
        assert_eq!(r.field(1), "input[1]");
    }

    #[test]
    fn content_parts_with_images() {
        // A 1 x 1 PNG header is enough for the checks.
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAAA=";
        let image = json!({ "type": "image", "data": png });
        let r = parse_embed_request(&json!({ "input": [{ "type": "text", "text": "a cat: " }, image] }), 100).unwrap();
        assert!(r.single);
        match &r.inputs[0] {
            EmbedInput::Parts(text, media) => {
                assert_eq!(text, &format!("a cat: {}", crate::request::media::MEDIA_MARKER));
                assert_eq!(media.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        // Parts without media are text; a list mixes shapes.
        let r = parse_embed_request(&json!({ "input": [[{ "type": "text", "text": "x" }], "y", [image.clone()]] }), 100).unwrap();
        assert_eq!(r.inputs[0], EmbedInput::Text("x".into()));
        assert_eq!(r.inputs[2].media().len(), 1);
        assert_eq!(field_of(json!({ "input": [{ "type": "image", "data": "bm90IGFuIGltYWdl" }] })), "input[0]");
        assert_eq!(
            field_of(json!({ "input": ["a", [{ "type": "text", "text": crate::request::media::MEDIA_MARKER }]] })),
            "input[1][0].text"
        );
        let many: Vec<Value> = (0..9).map(|_| json!([image.clone(), image.clone()])).collect();
        assert!(field_of(json!({ "input": many })).starts_with("input[8]"));
    }

    #[test]
    fn bad_inputs_name_their_field() {
        assert_eq!(field_of(json!({})), "input");
        assert_eq!(field_of(json!({ "input": "" })), "input");
        assert_eq!(field_of(json!({ "input": [] })), "input");
        assert_eq!(field_of(json!({ "input": 5 })), "input");
        assert_eq!(field_of(json!({ "input": ["a", ""] })), "input[1]");
        assert_eq!(field_of(json!({ "input": ["a", []] })), "input[1]");
        assert_eq!(field_of(json!({ "input": ["a", {}] })), "input[1]");
        assert_eq!(field_of(json!({ "input": [1, 100] })), "input[1]");
        assert_eq!(field_of(json!({ "input": [1, -1] })), "input[1]");
        assert_eq!(field_of(json!({ "input": [1, 1.5] })), "input[1]");
        assert_eq!(field_of(json!({ "input": ["a", [1, 2, 300]] })), "input[1][2]");
        assert_eq!(field_of(json!({ "input": "a", "normalize": 1 })), "normalize");
        assert_eq!(field_of(json!({ "input": "a", "truncate": "yes" })), "truncate");
        assert_eq!(field_of(json!({ "input": vec!["a"; MAX_INPUTS + 1] })), "input");
        assert!(parse_embed_request(&json!({ "input": vec!["a"; MAX_INPUTS] }), 100).is_ok());
    }

    #[test]
    fn over_long_inputs_are_refused_or_cut() {
        let r = parse_embed_request(&json!({ "input": ["a", "b"] }), 100).unwrap();
        let mut t = vec![vec![1, 2], vec![1, 2, 3, 4]];
        let e = r.fit(&mut t, 3).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("input[1]"));
        assert!(e.message.contains("4 tokens") && e.message.contains("at most 3"), "{}", e.message);
        let r = EmbedRequest { truncate: true, ..r };
        r.fit(&mut t, 3).unwrap();
        assert_eq!(t, vec![vec![1, 2], vec![1, 2, 3]]);
        assert_eq!(r.fit(&mut [vec![]], 3).unwrap_err().field.as_deref(), Some("input[0]"));
    }

    #[test]
    fn pooling_mean_cls_last_and_normalisation() {
        let rows: [&[f32]; 3] = [&[1.0, 0.0], &[3.0, 4.0], &[2.0, 2.0]];
        let pool = |p, normalize| {
            let mut pooler = Pooler::new(p, 2);
            rows.iter().for_each(|r| pooler.add(r));
            pooler.finish(normalize)
        };
        assert_eq!(pool(Pooling::Mean, false), vec![2.0, 2.0]);
        assert_eq!(pool(Pooling::Cls, false), vec![1.0, 0.0]);
        assert_eq!(pool(Pooling::Last, false), vec![2.0, 2.0]);
        // None: every row, in order, never normalised.
        assert_eq!(pool(Pooling::None, true), vec![1.0, 0.0, 3.0, 4.0, 2.0, 2.0]);
        let v = pool(Pooling::Mean, true);
        assert!((v[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-7 && v[0] == v[1]);
        let mut zero = vec![0.0f32; 3];
        l2_normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 3]);
    }

    #[test]
    fn gguf_pooling_and_names() {
        assert_eq!(Pooling::from_gguf(Some("1")), Some(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(Some("2")), Some(Pooling::Cls));
        assert_eq!(Pooling::from_gguf(Some("3")), Some(Pooling::Last));
        assert_eq!(Pooling::from_gguf(Some("4")), Some(Pooling::Rank));
        for other in [Some("0"), Some("5"), Some("x"), None] {
            assert_eq!(Pooling::from_gguf(other), None);
        }
        for p in [Pooling::Mean, Pooling::Cls, Pooling::Last, Pooling::Rank, Pooling::None] {
            assert_eq!(Pooling::parse(p.as_str()), Some(p));
        }
        assert_eq!(Pooling::parse("max"), None);
    }

    #[test]
    fn base64_is_the_little_endian_bytes() {
        assert_eq!(to_base64(&[]), "");
        assert_eq!(to_base64(&[1.0]), "AACAPw==");
        assert_eq!(to_base64(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(to_base64(&[0.0, 0.0, 0.0]), "AAAAAAAAAAAAAAAA");
    }

    #[test]
    fn rerank_requests_are_checked() {
        let r = parse_rerank_request(&json!({ "rerank": { "query": "q", "documents": ["a", ""] } })).unwrap();
        assert_eq!(r, RerankRequest { query: "q".into(), documents: vec!["a".into(), "".into()] });
        for (bad, field) in [
            (json!({}), "rerank"),
            (json!({ "rerank": { "documents": ["a"] } }), "query"),
            (json!({ "rerank": { "query": "", "documents": ["a"] } }), "query"),
            (json!({ "rerank": { "query": "q", "documents": [] } }), "documents"),
            (json!({ "rerank": { "query": "q", "documents": null } }), "documents"),
            (json!({ "rerank": { "query": "q", "documents": 123 } }), "documents"),
            (json!({ "rerank": { "query": "q", "documents": [1, 2, 3] } }), "documents[0]"),
        ] {
            let e = parse_rerank_request(&bad).unwrap_err();
            assert!(e.message.starts_with(&format!("{field}:")), "{bad}: {}", e.message);
        }
        assert_eq!(Pooling::from_gguf(Some("4")), Some(Pooling::Rank));
        assert_eq!(Pooling::parse("rank"), Some(Pooling::Rank));
    }
}
