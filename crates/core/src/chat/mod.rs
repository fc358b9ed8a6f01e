//! Chat: OpenAI-style `messages`, checked (`messages`), rendered into a
//! prompt with the model's own Jinja template (`template`); the tools and
//! response formats a request asks for (`tools`), how the model writes calls
//! and reasoning and what constrains them (`format`), and the answer split
//! into content, reasoning and tool calls as it streams (`output`; with a
//! parser that reads whole answers, such as llama.cpp's, `reparse`; its
//! call grammars made fit for llguidance, `call_grammar`; where a
//! tag-delimited argument value ends, `closing`).

pub mod call_grammar;
pub mod closing;
pub mod format;
pub mod messages;
pub mod output;
pub mod reparse;
pub mod template;
pub mod tools;

pub use messages::{parse_messages, ChatMessage};
pub use template::ChatTemplate;
