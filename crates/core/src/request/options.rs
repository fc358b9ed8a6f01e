//! `LlamaEngine.load` options, validated before any model is
//! touched. Wire names are the JavaScript ones (camelCase).

use serde_json::{Map, Value};

use crate::chat::format::Family;
use crate::chat::ChatTemplate;
use crate::embed::Pooling;
use crate::error::{EngineError, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    pub model_path: String,
    pub draft_model_path: Option<String>,
    /// The multimodal projector (`mmproj-*.gguf`) that lets the model read
    /// images and audio.
    pub mmproj_path: Option<String>,
    pub context_size: u32,
    pub batch_size: u32,
    pub threads: i32,
    pub gpu_layers: u32,
    pub draft_gpu_layers: u32,
    pub ngram_cache_path: Option<String>,
    pub static_ngram_cache_path: Option<String>,
    /// Tokens of earlier outputs the suffix drafter keeps (0: none kept).
    pub suffix_cache_tokens: usize,
    /// The suffix drafter's shared indexes: read at load when the file
    /// exists, written by `saveSuffixCache`.
    pub suffix_cache_path: Option<String>,
    /// The namespace of requests that name none (`speculative.namespace`).
    pub suffix_namespace: String,
    /// A Jinja chat template replacing the GGUF's (checked to compile here,
    /// before any model is loaded).
    pub chat_template: Option<String>,
    /// How tool calls are written: detected from the template (`None`) or
    /// this family's syntax (`toolCallFormat`).
    pub tool_call_format: Option<Family>,
    /// Requests decoded together, each in its own slot (KV stream).
    pub parallel: usize,
    /// MiB of host memory for states of prompts that left their slot (0: off).
    pub prompt_cache_mb: usize,
    /// How `embed()` pools token vectors; `None`: the GGUF's pooling, else mean.
    pub pooling: Option<Pooling>,
    /// LoRA adapters, in load order (their ids), with default scales.
    pub loras: Vec<LoraOption>,
    /// The file the load-time self-check's verdicts are kept in across
    /// processes (`cache::verdicts`); `None`: only in this process.
    pub self_check_cache: Option<String>,
    /// ggml RPC workers (`host:port`, `llama-engine rpc-worker`) the model's
    /// layers are spread over.
    pub rpc: Vec<String>,
    /// `determinism: 'portable'`: the CPU back end's portable kernels (the
    /// same bits on every CPU) instead of its fastest ones.
    pub portable: bool,
}

/// RPC workers a model may use at most (llama.cpp's device limit).
pub const MAX_RPC_WORKERS: usize = 16;

/// A LoRA adapter to load, and the scale requests without `lora` use.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraOption {
    pub path: String,
    pub scale: f32,
}

/// The prompt cache's default size, MiB: tens of thousands of tokens of a
/// small model, a few long conversations of an 8B one (see docs/prompt-cache.md).
pub const DEFAULT_PROMPT_CACHE_MB: usize = 1024;

/// Requests decoded together by default, and at most.
pub const DEFAULT_PARALLEL: usize = 4;
pub const MAX_PARALLEL: usize = 64;

pub fn default_threads() -> i32 {
    std::thread::available_parallelism().map(|n| n.get() as i32).unwrap_or(1)
}

pub fn parse_engine_options(value: &Value) -> Result<EngineOptions> {
    let obj = value.as_object().ok_or_else(|| EngineError::invalid("options", "expected an object"))?;
    let model_path = path(obj, "modelPath")?.ok_or_else(|| EngineError::invalid("modelPath", "required"))?;
    Ok(EngineOptions {
        model_path,
        draft_model_path: path(obj, "draftModelPath")?,
        mmproj_path: path(obj, "mmprojPath")?,
        context_size: int(obj, "contextSize", 16, 1 << 20)?.unwrap_or(4096) as u32,
        batch_size: int(obj, "batchSize", 1, 1 << 16)?.unwrap_or(512) as u32,
        threads: int(obj, "threads", 1, 1024)?.map(|t| t as i32).unwrap_or_else(default_threads),
        gpu_layers: int(obj, "gpuLayers", 0, 100_000)?.unwrap_or(0) as u32,
        draft_gpu_layers: int(obj, "draftGpuLayers", 0, 100_000)?.unwrap_or(0) as u32,
        ngram_cache_path: path(obj, "ngramCachePath")?,
        static_ngram_cache_path: path(obj, "staticNgramCachePath")?,
        suffix_cache_tokens: int(obj, "suffixCacheTokens", 0, 1 << 26)?
            .map_or(crate::speculation::suffix::DEFAULT_SUFFIX_CACHE_TOKENS, |n| n as usize),
        suffix_cache_path: path(obj, "suffixCachePath")?,
        suffix_namespace: suffix_namespace(obj)?,
        chat_template: chat_template(obj)?,
        tool_call_format: tool_call_format(obj)?,
        parallel: int(obj, "parallel", 1, MAX_PARALLEL as i64)?.map_or(DEFAULT_PARALLEL, |n| n as usize),
        prompt_cache_mb: int(obj, "promptCacheMB", 0, 1 << 24)?.map_or(DEFAULT_PROMPT_CACHE_MB, |n| n as usize),
        pooling: pooling(obj)?,
        loras: loras(obj)?,
        self_check_cache: match obj.get("selfCheckCache") {
            Some(Value::Bool(false)) => None,
            _ => path(obj, "selfCheckCache")
                .map_err(|e| EngineError::invalid("selfCheckCache", format!("expected a path or false ({})", e.message)))?,
        },
        rpc: rpc(obj)?,
        portable: determinism(obj)?,
    })
    .and_then(|o| {
        // The portable kernels are the CPU back end's: a GPU or an RPC
        // worker would compute layers with its own.
        if o.portable && o.gpu_layers > 0 {
            return Err(EngineError::invalid("gpuLayers", "determinism 'portable' computes on the CPU: gpuLayers must be 0"));
        }
        if o.portable && o.draft_gpu_layers > 0 {
            return Err(EngineError::invalid("draftGpuLayers", "determinism 'portable' computes on the CPU: draftGpuLayers must be 0"));
        }
        if o.portable && !o.rpc.is_empty() {
            return Err(EngineError::invalid(
                "rpc",
                "determinism 'portable' computes on this CPU: RPC workers compute with their own kernels",
            ));
        }
        Ok(o)
    })
}

/// `determinism`: `'default'` (the fastest kernels: the same bits on one
/// machine, batch- and thread-invariant) or `'portable'` (the same bits on
/// every CPU).
fn determinism(obj: &Map<String, Value>) -> Result<bool> {
    match obj.get("determinism") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::String(s)) if s == "default" => Ok(false),
        Some(Value::String(s)) if s == "portable" => Ok(true),
        Some(v) => Err(EngineError::invalid("determinism", format!("expected 'default' or 'portable', got {v}"))),
    }
}

/// `rpc`: `['host:port', …]`, each a host name, an IPv4 address or a
/// bracketed IPv6 address, and a port 1..65535; no worker twice.
fn rpc(obj: &Map<String, Value>) -> Result<Vec<String>> {
    let items = match obj.get("rpc") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(EngineError::invalid("rpc", "expected an array of 'host:port' strings")),
    };
    if items.len() > MAX_RPC_WORKERS {
        return Err(EngineError::invalid("rpc", format!("at most {MAX_RPC_WORKERS} workers, got {}", items.len())));
    }
    let mut out: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("rpc[{i}]");
        let s = item.as_str().ok_or_else(|| EngineError::invalid(&field, "expected a 'host:port' string"))?;
        let endpoint = rpc_endpoint(s).map_err(|why| EngineError::invalid(&field, format!("{why}, got {s:?}")))?;
        if out.contains(&endpoint) {
            return Err(EngineError::invalid(&field, format!("{endpoint} is named twice")));
        }
        out.push(endpoint);
    }
    Ok(out)
}

/// One worker's `host:port`, checked (ggml parses it by its last `:`).
pub fn rpc_endpoint(s: &str) -> std::result::Result<String, String> {
    let (host, port) = s.rsplit_once(':').ok_or("expected 'host:port'")?;
    let port: u16 = port.parse().ok().filter(|&p| p > 0).ok_or("expected a port 1..65535 after the last ':'")?;
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let ok = match bare {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
                && !host.starts_with(['-', '.'])
        }
    };
    if !ok {
        return Err("expected a host name, an IPv4 address or [an IPv6 address] before the port".into());
    }
    Ok(format!("{host}:{port}"))
}

fn loras(obj: &Map<String, Value>) -> Result<Vec<LoraOption>> {
    use crate::request::{MAX_LORAS, MAX_LORA_SCALE};
    let items = match obj.get("loras") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(EngineError::invalid("loras", "expected an array of { path, scale? }")),
    };
    if items.len() > MAX_LORAS {
        return Err(EngineError::invalid("loras", format!("at most {MAX_LORAS} adapters, got {}", items.len())));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = format!("loras[{i}]");
            let o = item.as_object().ok_or_else(|| EngineError::invalid(&field, "expected an object { path, scale? }"))?;
            let path =
                path(o, "path").map_err(|e| EngineError::invalid(&format!("{field}.path"), e.message.trim_start_matches("path: ")))?;
            let path = path.ok_or_else(|| EngineError::invalid(&format!("{field}.path"), "required"))?;
            let scale = match o.get("scale") {
                None | Some(Value::Null) => 1.0,
                Some(v) => v.as_f64().filter(|s| s.is_finite() && s.abs() <= f64::from(MAX_LORA_SCALE)).ok_or_else(|| {
                    EngineError::invalid(&format!("{field}.scale"), format!("expected a finite number within ±{MAX_LORA_SCALE}"))
                })? as f32,
            };
            Ok(LoraOption { path, scale })
        })
        .collect()
}

fn path(obj: &Map<String, Value>, field: &str) -> Result<Option<String>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Err(EngineError::invalid(field, "must not be empty")),
        Some(Value::String(s)) if s.contains('\0') => Err(EngineError::invalid(field, "must not contain NUL")),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(EngineError::invalid(field, "expected a string")),
    }
}

fn suffix_namespace(obj: &Map<String, Value>) -> Result<String> {
    match obj.get("suffixNamespace") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => match crate::speculation::suffix::namespace_problem(s) {
            None => Ok(s.clone()),
            Some(why) => Err(EngineError::invalid("suffixNamespace", why)),
        },
        Some(_) => Err(EngineError::invalid("suffixNamespace", "expected a string")),
    }
}

fn chat_template(obj: &Map<String, Value>) -> Result<Option<String>> {
    match obj.get("chatTemplate") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(source)) => {
            ChatTemplate::new(source, "", "")
                .map_err(|e| EngineError::invalid("chatTemplate", format!("not a usable Jinja template: {e}")))?;
            Ok(Some(source.clone()))
        }
        Some(_) => Err(EngineError::invalid("chatTemplate", "expected a string (a Jinja chat template)")),
    }
}

fn tool_call_format(obj: &Map<String, Value>) -> Result<Option<Family>> {
    let names = || Family::FORCED.iter().map(|f| format!("{:?}", f.as_str())).collect::<Vec<_>>().join(", ");
    match obj.get("toolCallFormat") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s == "auto" => Ok(None),
        Some(Value::String(s)) => Family::parse(s)
            .map(Some)
            .ok_or_else(|| EngineError::invalid("toolCallFormat", format!("expected \"auto\", {}, got {s:?}", names()))),
        Some(_) => Err(EngineError::invalid("toolCallFormat", "expected a string")),
    }
}

fn pooling(obj: &Map<String, Value>) -> Result<Option<Pooling>> {
    match obj.get("pooling") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Pooling::parse(s).map(Some).ok_or_else(|| {
            EngineError::invalid("pooling", format!("expected \"mean\", \"cls\", \"last\", \"rank\" or \"none\", got {s:?}"))
        }),
        Some(_) => Err(EngineError::invalid("pooling", "expected a string")),
    }
}

fn int(obj: &Map<String, Value>, field: &str, min: i64, max: i64) -> Result<Option<i64>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let v = n.as_f64().unwrap_or(f64::NAN);
            if v.fract() != 0.0 || !v.is_finite() {
                return Err(EngineError::invalid(field, "expected an integer"));
            }
            if v < min as f64 || v > max as f64 {
                return Err(EngineError::invalid(field, format!("must be in {min}..={max}")));
            }
            Ok(Some(v as i64))
        }
        Some(_) => Err(EngineError::invalid(field, "expected a number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn determinism() {
        let p = |v: Value| parse_engine_options(&json!({ "modelPath": "m", "determinism": v }));
        assert!(!parse_engine_options(&json!({ "modelPath": "m" })).unwrap().portable);
        assert!(!p(json!("default")).unwrap().portable);
        assert!(p(json!("portable")).unwrap().portable);
        for bad in [json!("Portable"), json!(true), json!(1), json!("exact")] {
            assert_eq!(p(bad).unwrap_err().field.as_deref(), Some("determinism"));
        }
        let both = |k: &str, v: Value| {
            let mut o = json!({ "modelPath": "m", "determinism": "portable" });
            o[k] = v;
            parse_engine_options(&o).unwrap_err().field
        };
        assert_eq!(both("gpuLayers", json!(1)).as_deref(), Some("gpuLayers"));
        assert_eq!(both("draftGpuLayers", json!(2)).as_deref(), Some("draftGpuLayers"));
        assert_eq!(both("rpc", json!(["127.0.0.1:50052"])).as_deref(), Some("rpc"));
    }

    #[test]
    fn rpc_workers() {
        let o = parse_engine_options(&json!({ "modelPath": "m", "rpc": ["127.0.0.1:50052", "worker-2.local:7000", "[::1]:1"] })).unwrap();
        assert_eq!(o.rpc, ["127.0.0.1:50052", "worker-2.local:7000", "[::1]:1"]);
        assert!(parse_engine_options(&json!({ "modelPath": "m" })).unwrap().rpc.is_empty());
        for (bad, field) in [
            (json!("127.0.0.1:1"), "rpc"),
            (json!([1]), "rpc[0]"),
            (json!(["127.0.0.1"]), "rpc[0]"),
            (json!(["127.0.0.1:0"]), "rpc[0]"),
            (json!(["127.0.0.1:65536"]), "rpc[0]"),
            (json!([":80"]), "rpc[0]"),
            (json!(["a b:80"]), "rpc[0]"),
            (json!(["::1:80"]), "rpc[0]"),
            (json!(["[zz]:80"]), "rpc[0]"),
            (json!(["h:1", "h:1"]), "rpc[1]"),
        ] {
            let e = parse_engine_options(&json!({ "modelPath": "m", "rpc": bad })).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{bad}");
        }
        let many: Vec<String> = (1..=17).map(|p| format!("h:{p}")).collect();
        assert!(parse_engine_options(&json!({ "modelPath": "m", "rpc": many })).is_err());
    }

    #[test]
    fn defaults_and_fields() {
        let o = parse_engine_options(&json!({ "modelPath": "m.gguf" })).unwrap();
        assert_eq!(o.context_size, 4096);
        assert_eq!(o.batch_size, 512);
        assert_eq!(o.prompt_cache_mb, DEFAULT_PROMPT_CACHE_MB);
        assert_eq!(parse_engine_options(&json!({ "modelPath": "m", "promptCacheMB": 0 })).unwrap().prompt_cache_mb, 0);
        assert!(o.threads >= 1);
        let o = parse_engine_options(&json!({ "modelPath": "m", "draftModelPath": "d", "contextSize": 256, "threads": 2 })).unwrap();
        assert_eq!(o.draft_model_path.as_deref(), Some("d"));
        assert_eq!((o.context_size, o.threads), (256, 2));
        assert_eq!(o.self_check_cache, None);
        let o = parse_engine_options(&json!({ "modelPath": "m", "selfCheckCache": "/tmp/c.bin" })).unwrap();
        assert_eq!(o.self_check_cache.as_deref(), Some("/tmp/c.bin"));
        assert_eq!(parse_engine_options(&json!({ "modelPath": "m", "selfCheckCache": false })).unwrap().self_check_cache, None);
    }

    #[test]
    fn rejects_bad_options_naming_the_field() {
        for (v, field) in [
            (json!({}), "modelPath"),
            (json!({ "modelPath": 3 }), "modelPath"),
            (json!({ "modelPath": "m", "contextSize": -1 }), "contextSize"),
            (json!({ "modelPath": "m", "threads": 1.5 }), "threads"),
            (json!({ "modelPath": "m", "batchSize": "8" }), "batchSize"),
            (json!({ "modelPath": "m", "draftModelPath": "" }), "draftModelPath"),
            (json!({ "modelPath": "m", "chatTemplate": 1 }), "chatTemplate"),
            (json!({ "modelPath": "m", "parallel": 0 }), "parallel"),
            (json!({ "modelPath": "m", "parallel": 65 }), "parallel"),
            (json!({ "modelPath": "m", "chatTemplate": "{% if %}" }), "chatTemplate"),
            (json!({ "modelPath": "m", "toolCallFormat": "xml" }), "toolCallFormat"),
            (json!({ "modelPath": "m", "promptCacheMB": -1 }), "promptCacheMB"),
            (json!({ "modelPath": "m", "promptCacheMB": 0.5 }), "promptCacheMB"),
            (json!({ "modelPath": "m", "pooling": "max" }), "pooling"),
            (json!({ "modelPath": "m", "pooling": 1 }), "pooling"),
            (json!({ "modelPath": "m", "loras": {} }), "loras"),
            (json!({ "modelPath": "m", "loras": [{}] }), "loras[0].path"),
            (json!({ "modelPath": "m", "loras": [{ "path": "a", "scale": 1e9 }] }), "loras[0].scale"),
            (json!({ "modelPath": "m", "selfCheckCache": true }), "selfCheckCache"),
            (json!({ "modelPath": "m", "selfCheckCache": "" }), "selfCheckCache"),
        ] {
            let e = parse_engine_options(&v).unwrap_err();
            assert!(e.message.starts_with(field), "{v}: {}", e.message);
        }
    }
}
