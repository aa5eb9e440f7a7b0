//! [`LoadClient`]: sends one generation request over HTTP/SSE (hyper client) or gRPC and
//! measures what the client sees.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::json;
use tonic::Code;

use super::config::{Api, LoadConfig, Protocol};
use super::request::{Outcome, RequestResult, RequestSpec};
use crate::grpc::{GenerateRequest, GeneratorClient};

/// The prompt text of `tokens` tokens.
pub fn prompt_text(tokens: u32) -> String {
    "tok ".repeat(tokens as usize)
}

#[derive(Deserialize)]
struct ChunkIn {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    choices: Vec<ChoiceIn>,
    #[serde(default)]
    error: Option<serde_json::Value>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct ChoiceIn {
    #[serde(default)]
    delta: Option<DeltaIn>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    message: Option<DeltaIn>,
}

#[derive(Deserialize)]
struct DeltaIn {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct UsageIn {
    #[serde(default)]
    completion_tokens: u32,
}

impl ChunkIn {
    fn has_token(&self) -> bool {
        self.choices.iter().any(|c| {
            c.delta
                .as_ref()
                .and_then(|d| d.content.as_deref())
                .or(c.text.as_deref())
                .is_some_and(|t| !t.is_empty())
        })
    }
}

fn outcome_of_status(status: StatusCode) -> Outcome {
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Outcome::Rejected,
        _ => Outcome::Error,
    }
}

fn outcome_of_code(code: Code) -> Outcome {
    match code {
        Code::ResourceExhausted | Code::Unavailable => Outcome::Rejected,
        Code::DeadlineExceeded => Outcome::Timeout,
        _ => Outcome::Error,
    }
}

/// A client for one target, reusing connections. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LoadClient {
    transport: Transport,
}

#[derive(Clone, Debug)]
enum Transport {
    Http(Box<HttpTarget>),
    Grpc(GeneratorClient),
}

#[derive(Clone, Debug)]
struct HttpTarget {
    client: Client<HttpConnector, Full<Bytes>>,
    url: http::Uri,
    api: Api,
}

impl LoadClient {
    /// Connects (gRPC) or prepares (HTTP) a client for `cfg`'s target.
    pub async fn connect(cfg: &LoadConfig) -> anyhow::Result<Self> {
        match cfg.protocol {
            Protocol::Http => {
                let path = match cfg.api {
                    Api::Chat => "/v1/chat/completions",
                    Api::Completions => "/v1/completions",
                };
                let url: http::Uri = format!("{}{path}", cfg.target.trim_end_matches('/'))
                    .parse()
                    .map_err(|e| anyhow::anyhow!("target `{}` is not a URL: {e}", cfg.target))?;
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                let client = Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(30))
                    .build(connector);
                Ok(LoadClient {
                    transport: Transport::Http(Box::new(HttpTarget {
                        client,
                        url,
                        api: cfg.api,
                    })),
                })
            }
            Protocol::Grpc => {
                let c = GeneratorClient::connect(cfg.target.clone())
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "cannot connect to gRPC target `{}`: {e}; is tonic-server running?",
                            cfg.target
                        )
                    })?;
                Ok(LoadClient {
                    transport: Transport::Grpc(c),
                })
            }
        }
    }

    /// Sends one request and measures it. Never fails: failures are outcomes.
    pub async fn send(&self, spec: &RequestSpec, seq: u64) -> RequestResult {
        match &self.transport {
            Transport::Http(t) => send_http(&t.client, &t.url, t.api, spec, seq).await,
            Transport::Grpc(c) => send_grpc(c.clone(), spec, seq).await,
        }
    }
}

async fn send_http(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &http::Uri,
    api: Api,
    spec: &RequestSpec,
    seq: u64,
) -> RequestResult {
    let prompt = prompt_text(spec.prompt_tokens);
    let body = match api {
        Api::Chat => json!({
            "model": spec.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": spec.max_tokens, "stream": spec.stream, "ignore_eos": spec.ignore_eos,
        }),
        Api::Completions => json!({
            "model": spec.model, "prompt": prompt,
            "max_tokens": spec.max_tokens, "stream": spec.stream, "ignore_eos": spec.ignore_eos,
        }),
    };
    let req = Request::post(url.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())));
    let sent_at = Instant::now();
    let mut res = RequestResult::new(seq, sent_at);
    let req = match req {
        Ok(r) => r,
        Err(e) => return res.fail(Outcome::Error, format!("cannot build request: {e}")),
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => return res.fail(Outcome::Error, format!("request failed: {e}")),
    };
    let status = resp.status();
    res.status = Some(status.as_u16());
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = body
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        return res.fail(outcome_of_status(status), format!("HTTP {status}: {text}"));
    }
    if !spec.stream {
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return res.fail(Outcome::Error, format!("body failed: {e}")),
        };
        res.e2e = sent_at.elapsed();
        match serde_json::from_slice::<ChunkIn>(&bytes) {
            Ok(c) => {
                res.response_id = c.id.clone();
                res.output_tokens = c.usage.map_or(0, |u| u.completion_tokens);
                let has_text = c
                    .choices
                    .iter()
                    .any(|ch| ch.message.is_some() || ch.text.is_some());
                res.outcome = if has_text {
                    Outcome::Ok
                } else {
                    Outcome::Error
                };
            }
            Err(e) => return res.fail(Outcome::Error, format!("bad JSON body: {e}")),
        }
        return res;
    }
    // Server-sent events: `data: …` lines, events separated by a blank line.
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut done = false;
    while !done {
        let frame = match body.frame().await {
            Some(Ok(f)) => f,
            Some(Err(e)) => return res.fail(Outcome::Error, format!("stream broke: {e}")),
            None => break,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            for line in event.split(|b| *b == b'\n') {
                let Some(payload) = line.strip_prefix(b"data:") else {
                    continue;
                };
                let payload = payload.trim_ascii();
                if payload == b"[DONE]" {
                    done = true;
                    continue;
                }
                let chunk: ChunkIn = match serde_json::from_slice(payload) {
                    Ok(c) => c,
                    Err(e) => return res.fail(Outcome::Error, format!("bad SSE event: {e}")),
                };
                if res.response_id.is_none() {
                    res.response_id = chunk.id.clone();
                }
                if let Some(err) = chunk.error {
                    return res.fail(Outcome::Error, format!("error event: {err}"));
                }
                if chunk.has_token() {
                    res.token();
                    if spec.cancel_after_tokens == Some(res.output_tokens) {
                        // Dropping `body` closes the stream: the server sees a disconnect.
                        return res.fail(Outcome::Cancelled, "cancelled by the client".into());
                    }
                }
            }
        }
    }
    res.e2e = sent_at.elapsed();
    if done {
        res.outcome = Outcome::Ok;
    } else {
        res.error = Some("stream ended without [DONE]".into());
    }
    res
}

async fn send_grpc(mut client: GeneratorClient, spec: &RequestSpec, seq: u64) -> RequestResult {
    let msg = GenerateRequest {
        model: spec.model.clone(),
        prompt: String::new(),
        max_tokens: spec.max_tokens,
        ignore_eos: spec.ignore_eos,
        prompt_tokens: spec.prompt_tokens,
    };
    let sent_at = Instant::now();
    let mut res = RequestResult::new(seq, sent_at);
    if !spec.stream {
        return match client.generate(msg).await {
            Ok(r) => {
                let r = r.into_inner();
                res.status = Some(Code::Ok as u16);
                res.e2e = sent_at.elapsed();
                res.response_id = Some(r.id);
                res.output_tokens = r.usage.map_or(0, |u| u.completion_tokens);
                res.outcome = Outcome::Ok;
                res
            }
            Err(s) => {
                res.status = Some(s.code() as u16);
                res.fail(outcome_of_code(s.code()), s.to_string())
            }
        };
    }
    let mut stream = match client.generate_stream(msg).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            res.status = Some(s.code() as u16);
            return res.fail(outcome_of_code(s.code()), s.to_string());
        }
    };
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                if res.response_id.is_none() {
                    res.response_id = Some(m.id.clone());
                }
                if !m.text.is_empty() {
                    res.token();
                    if spec.cancel_after_tokens == Some(res.output_tokens) {
                        return res.fail(Outcome::Cancelled, "cancelled by the client".into());
                    }
                }
            }
            Ok(None) => break,
            Err(s) => {
                res.status = Some(s.code() as u16);
                return res.fail(outcome_of_code(s.code()), s.to_string());
            }
        }
    }
    res.status = Some(Code::Ok as u16);
    res.e2e = sent_at.elapsed();
    res.outcome = Outcome::Ok;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_text_estimates_back_to_its_length() {
        for n in [1, 7, 300] {
            assert_eq!(crate::openai::wire::estimate_tokens(&prompt_text(n)), n);
        }
    }

    #[test]
    fn chunks_with_text_are_tokens() {
        let c: ChunkIn =
            serde_json::from_str(r#"{"id":"x","choices":[{"delta":{"content":" a"}}]}"#).unwrap();
        assert!(c.has_token());
        let c: ChunkIn =
            serde_json::from_str(r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#).unwrap();
        assert!(!c.has_token());
        let c: ChunkIn = serde_json::from_str(r#"{"choices":[{"text":" b"}]}"#).unwrap();
        assert!(c.has_token());
    }

    #[test]
    fn client_tpot() {
        let mut r = RequestResult::new(0, Instant::now());
        r.ttft = Some(Duration::from_millis(100));
        r.last_token = Some(Duration::from_millis(190));
        r.output_tokens = 10;
        assert_eq!(r.tpot(), Some(Duration::from_millis(10)));
        r.output_tokens = 1;
        assert_eq!(r.tpot(), None);
    }
}
