//! The service's contract, `crates/demo/proto/generate.proto`: its name, method paths, and
//! hand-written prost messages (no protoc needed).

/// Fully qualified service name.
pub const SERVICE_NAME: &str = "infertrace.examples.v1.Generator";
/// Path of the unary method.
pub const GENERATE_PATH: &str = "/infertrace.examples.v1.Generator/Generate";
/// Path of the server-streaming method.
pub const GENERATE_STREAM_PATH: &str = "/infertrace.examples.v1.Generator/GenerateStream";

/// `GenerateRequest`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct GenerateRequest {
    /// Model name; must match the served model when set.
    #[prost(string, tag = "1")]
    pub model: ::prost::alloc::string::String,
    /// Prompt text (tokens estimated as ceil(chars / 4)).
    #[prost(string, tag = "2")]
    pub prompt: ::prost::alloc::string::String,
    /// Maximum output tokens (0 = server default).
    #[prost(uint32, tag = "3")]
    pub max_tokens: u32,
    /// Generate exactly `max_tokens` tokens.
    #[prost(bool, tag = "4")]
    pub ignore_eos: bool,
    /// When non-zero, the prompt length in tokens (overrides the estimate).
    #[prost(uint32, tag = "5")]
    pub prompt_tokens: u32,
}

/// `Usage`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct Usage {
    /// Prompt tokens.
    #[prost(uint32, tag = "1")]
    pub prompt_tokens: u32,
    /// Output tokens.
    #[prost(uint32, tag = "2")]
    pub completion_tokens: u32,
}

/// `GenerateResponse`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct GenerateResponse {
    /// Response id (`gen-{simulator id}`).
    #[prost(string, tag = "1")]
    pub id: ::prost::alloc::string::String,
    /// Model that answered.
    #[prost(string, tag = "2")]
    pub model: ::prost::alloc::string::String,
    /// The whole output text.
    #[prost(string, tag = "3")]
    pub text: ::prost::alloc::string::String,
    /// `stop` or `length`.
    #[prost(string, tag = "4")]
    pub finish_reason: ::prost::alloc::string::String,
    /// Token counts.
    #[prost(message, optional, tag = "5")]
    pub usage: ::core::option::Option<Usage>,
}

/// `GenerateStreamResponse`: one per token, then a last one with `finish_reason` and `usage`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct GenerateStreamResponse {
    /// Response id (`gen-{simulator id}`).
    #[prost(string, tag = "1")]
    pub id: ::prost::alloc::string::String,
    /// Index of this token in the output.
    #[prost(uint32, tag = "2")]
    pub index: u32,
    /// Token text (empty on the last message).
    #[prost(string, tag = "3")]
    pub text: ::prost::alloc::string::String,
    /// Empty until the last message.
    #[prost(string, tag = "4")]
    pub finish_reason: ::prost::alloc::string::String,
    /// Only on the last message.
    #[prost(message, optional, tag = "5")]
    pub usage: ::core::option::Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn wire_format_matches_the_proto_tags() {
        let req = GenerateRequest {
            model: "m".into(),
            prompt: String::new(),
            max_tokens: 5,
            ignore_eos: true,
            prompt_tokens: 300,
        };
        // field 1 (len) "m"; field 3 varint 5; field 4 varint 1; field 5 varint 300 (0xAC 0x02)
        assert_eq!(
            req.encode_to_vec(),
            vec![0x0A, 1, b'm', 0x18, 5, 0x20, 1, 0x28, 0xAC, 0x02]
        );
        let back = GenerateRequest::decode(&*req.encode_to_vec()).unwrap();
        assert_eq!(back, req);
    }
}
