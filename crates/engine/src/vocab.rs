//! What text work needs of a model — its vocabulary and chat template —
//! shared by the engine and by a vocabulary-only handle (the parent side
//! of `isolation: 'process'`, which tokenizes and renders synchronously
//! while the weights live in the child). Callable from any thread.

use std::path::Path;
use std::sync::{Arc, RwLock};

use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::chat::{self, Chat};
use super::llama_log;
use super::model::{self, EngineOptions};
use llama_engine_core::chat::format::ChatFormat;
use llama_engine_core::error::{EngineError, ErrorCode, Result};
use llama_engine_core::gguf;
use llama_engine_core::request::{parse_request_json, CompletionRequest, RequestLimits};

/// Longest answer `parseChatOutput` reads (a million-token context's
/// answer is about this long; reading is linear in it, on the caller's thread).
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

pub struct Vocab {
    /// Taken at dispose: later calls answer DISPOSED.
    model: RwLock<Option<Arc<LlamaModel>>>,
    /// What `messages` are rendered with (see `model::chat_template`).
    chat: Option<std::result::Result<Chat, String>>,
    pub limits: RequestLimits,
    /// The BOS and EOS tokens' text.
    pub bos: String,
    pub eos: String,
}

impl Vocab {
    /// Over a loaded model; `Err` when `chatTemplate` does not compile.
    pub fn new(model: Arc<LlamaModel>, opts: &EngineOptions, limits: RequestLimits) -> Result<Vocab> {
        let (bos, eos) = model::bos_eos_text(&model);
        let chat = model::chat_template(&model, opts.chat_template.as_deref())?
            .map(|c| c.map(|(template, source)| Chat::new(template, &source, opts.tool_call_format, &bos, &eos)));
        Ok(Vocab { model: RwLock::new(Some(model)), chat, limits, bos, eos })
    }

    /// The vocabulary and metadata of the model at `opts.model_path`, without
    /// its weights (checked as a whole model is first).
    pub fn load(opts: &EngineOptions) -> Result<Vocab> {
        let path = &opts.model_path;
        let fail = |why: String| EngineError::new(ErrorCode::ModelLoadFailed, format!("{path}: {why}"));
        let file = gguf::read_gguf(Path::new(path)).map_err(|e| fail(e.0))?;
        gguf::check_model(&file).map_err(fail)?;
        let backend = model::backend()?;
        let params = LlamaModelParams::default().with_vocab_only(true).with_devices(&[]).map_err(|e| fail(e.to_string()))?;
        let (loaded, log) = llama_log::capture(|| LlamaModel::load_from_file(backend, path, &params));
        let model = loaded.map_err(|e| fail(llama_log::reason(&log).unwrap_or_else(|| e.to_string())))?;
        let limits = RequestLimits { n_vocab: model.n_vocab(), n_ctx: opts.context_size };
        Vocab::new(Arc::new(model), opts, limits)
    }

    pub fn model(&self) -> Result<Arc<LlamaModel>> {
        self.model.read().unwrap_or_else(|p| p.into_inner()).clone().ok_or_else(EngineError::disposed)
    }

    pub fn close(&self) {
        self.model.write().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// The chat template and formats, or why `messages` cannot be used.
    pub fn chat(&self) -> Result<&Chat> {
        match &self.chat {
            Some(Ok(chat)) => Ok(chat),
            Some(Err(why)) => Err(EngineError::invalid(
                "messages",
                format!("the model's chat template (tokenizer.chat_template) cannot be used ({why}); load the engine with the chatTemplate option"),
            )),
            None => Err(EngineError::invalid(
                "messages",
                "this model has no chat template (no tokenizer.chat_template in its GGUF); load the engine with the chatTemplate option to use messages",
            )),
        }
    }

    /// The chat template's source, when it is usable (`status().chatTemplate`).
    pub fn chat_source(&self) -> Option<&str> {
        self.chat.as_ref().and_then(|c| c.as_ref().ok()).map(|c| c.source.as_str())
    }

    /// The family the answers are read as (`status().toolCallFormat`).
    pub fn chat_family(&self) -> Option<&'static str> {
        self.chat.as_ref().and_then(|c| c.as_ref().ok()).map(|c| c.family())
    }

    /// What was learnt of the chat template (for `status()`).
    pub fn chat_format(&self) -> Option<&ChatFormat> {
        self.chat.as_ref().and_then(|c| c.as_ref().ok()).map(|c| &c.format)
    }

    pub fn tokenize(&self, text: &str, add_bos: bool, special: bool) -> Result<Vec<i32>> {
        let model = self.model()?;
        Ok(model.vocab().tokenize(text.as_bytes(), add_bos, special).into_iter().map(|t| t.0).collect())
    }

    pub fn detokenize(&self, tokens: &[i32]) -> Result<String> {
        let model = self.model()?;
        let n_vocab = self.limits.n_vocab;
        if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t < 0 || t >= n_vocab) {
            return Err(EngineError::invalid(&format!("tokens[{i}]"), format!("{t} is not a token id (0..{n_vocab})")));
        }
        if tokens.is_empty() {
            return Ok(String::new());
        }
        let ids: Vec<LlamaToken> = tokens.iter().map(|&t| LlamaToken(t)).collect();
        let bytes = model.vocab().detokenize(&ids, false, false);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Each token's own text.
    pub fn pieces(&self, tokens: &[i32]) -> Result<Vec<String>> {
        tokens.iter().map(|&t| self.detokenize(&[t])).collect()
    }

    /// The text a chat request renders to: its `messages` with its tools
    /// and template variables (the other fields play no part).
    pub fn apply_chat_template(&self, request: &CompletionRequest, add_generation_prompt: bool) -> Result<String> {
        let messages = request.messages.as_deref().unwrap_or_default();
        chat::render(self.chat()?, messages, &request.chat, add_generation_prompt)
    }

    /// `text` read as the answer to a chat request with these fields
    /// (`tools`, `parallel_tool_calls`, `chat_template_kwargs`,
    /// `reasoning_format`, as JSON): `{ content, reasoning_content?,
    /// tool_calls? }` (`parseChatOutput`).
    pub fn parse_output(&self, request_json: &str, text: &str) -> Result<serde_json::Value> {
        if text.len() > MAX_ANSWER_BYTES {
            return Err(EngineError::invalid("text", format!("at most {MAX_ANSWER_BYTES} bytes of answer are read, got {}", text.len())));
        }
        let request = parse_request_json(request_json, &self.limits)?;
        let (content, reasoning, calls) = chat::read_answer(self.chat()?, &request.chat, text)?;
        let mut out = serde_json::json!({ "content": content });
        if let Some(r) = reasoning {
            out["reasoning_content"] = r.into();
        }
        if !calls.is_empty() {
            out["tool_calls"] = calls
                .iter()
                .map(|c| serde_json::json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": c.arguments } }))
                .collect();
        }
        Ok(out)
    }

    /// The same from the request's JSON (`applyChatTemplate`).
    pub fn render_json(&self, request_json: &str, add_generation_prompt: bool) -> Result<String> {
        let request = parse_request_json(request_json, &self.limits)?;
        self.apply_chat_template(&request, add_generation_prompt)
    }
}
