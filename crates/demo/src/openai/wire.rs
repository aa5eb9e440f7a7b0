//! The OpenAI-compatible request and response bodies (the subset the example servers speak),
//! the [`Endpoint`] each belongs to, and the error body.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/chat/completions` request body.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ChatRequest {
    /// Model name; must match the served model when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Conversation; the text of every message counts towards the prompt.
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    /// Maximum output tokens (legacy name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Maximum output tokens (current name; wins over `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// vLLM extension: keep generating until the token limit (exact output length).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// One chat message.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, …
    pub role: String,
    /// A string or an array of content parts.
    #[serde(default)]
    pub content: Value,
}

/// `stream_options` of a request.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct StreamOptions {
    /// Send token usage with the last chunk.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/completions` request body.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CompletionRequest {
    /// Model name; must match the served model when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A string, an array of strings, or an array of token ids.
    #[serde(default)]
    pub prompt: Value,
    /// Maximum output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// vLLM extension: keep generating until the token limit (exact output length).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// Estimated prompt tokens of a text: one token per 4 characters (rounded up), the usual rule
/// of thumb for English with BPE tokenizers.
pub fn estimate_tokens(text: &str) -> u32 {
    let chars = text.chars().count();
    u32::try_from(chars.div_ceil(4)).unwrap_or(u32::MAX)
}

/// Prompt tokens of a JSON content value: strings by [`estimate_tokens`], arrays summed
/// (numbers in an array count as one token id each), content-part objects by their `text`.
pub fn value_tokens(v: &Value) -> u32 {
    match v {
        Value::String(s) => estimate_tokens(s),
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Number(_) => 1,
                other => value_tokens(other),
            })
            .fold(0u32, u32::saturating_add),
        Value::Object(map) => map.get("text").map(value_tokens).unwrap_or(0),
        _ => 0,
    }
}

/// Token usage in a response.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct UsageBody {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub completion_tokens: u32,
    /// Sum of both.
    pub total_tokens: u32,
}

impl UsageBody {
    /// Usage from prompt and output counts.
    pub fn new(prompt: u32, completion: u32) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt.saturating_add(completion),
        }
    }
}

/// The error body OpenAI-compatible servers send.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Inside [`ErrorBody`].
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ErrorDetail {
    /// Human-readable message.
    pub message: String,
    /// Error type, e.g. `invalid_request_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// HTTP status code.
    pub code: u16,
}

/// Which completion endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Endpoint {
    /// The endpoint serving `path`, if any.
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            _ => None,
        }
    }

    pub(crate) fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completions => "cmpl-",
        }
    }

    pub(crate) fn object(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
        }
    }

    pub(crate) fn chunk_object(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        }
    }
}

/// An OpenAI error body.
pub fn error_body(code: u16, kind: &str, message: &str) -> ErrorBody {
    ErrorBody {
        error: ErrorDetail {
            message: message.to_owned(),
            kind: kind.to_owned(),
            code,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompt_token_estimates() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(value_tokens(&json!("abcdefgh")), 2);
        assert_eq!(value_tokens(&json!(["abcd", "abcd"])), 2);
        assert_eq!(value_tokens(&json!([1, 2, 3])), 3);
        assert_eq!(
            value_tokens(&json!([{"type": "text", "text": "abcdefgh"}])),
            2
        );
        assert_eq!(value_tokens(&json!(null)), 0);
    }

    #[test]
    fn chat_request_parses_openai_shape() {
        let r: ChatRequest = serde_json::from_value(json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}
        }))
        .unwrap();
        assert_eq!(r.model.as_deref(), Some("m"));
        assert!(r.stream && r.stream_options.unwrap().include_usage);
        assert!(!r.ignore_eos);
    }
}
