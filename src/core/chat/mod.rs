//! Chat: OpenAI-style `messages`, checked (`messages`), and rendered into a
//! prompt with the model's own Jinja template (`template`).

pub mod messages;
pub mod template;

pub use messages::{parse_messages, ChatMessage};
pub use template::ChatTemplate;
