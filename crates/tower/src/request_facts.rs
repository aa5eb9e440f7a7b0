//! What the layer learns from a request's head at arrival: operation, model, protocol, and the
//! HTTP or RPC semantic-convention attributes.

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, Request, header};
use opentelemetry::{KeyValue, StringValue};

use infertrace_semconv::{gen_ai, net};

use crate::grpc;
use crate::interning::{self, Kind};
use crate::layer::{MODEL_HEADER, OPERATION_HEADER, RequestHead, Shared};

/// Operation, model and protocol of one request.
#[derive(Clone, Debug)]
pub(crate) struct RequestFacts {
    pub(crate) operation: Cow<'static, str>,
    pub(crate) request_model: Option<StringValue>,
    pub(crate) grpc: bool,
}

/// The operation a path implies, if it is one of the OpenAI-style routes.
pub(crate) fn operation_for_path(path: &str) -> Option<&'static str> {
    let path = path.trim_end_matches('/');
    if path.ends_with("/chat/completions") {
        Some(gen_ai::operation::CHAT)
    } else if path.ends_with("/completions") {
        Some(gen_ai::operation::TEXT_COMPLETION)
    } else if path.ends_with("/embeddings") {
        Some(gen_ai::operation::EMBEDDINGS)
    } else {
        None
    }
}

/// [`MODEL_HEADER`] as a pre-parsed name (a `&str` lookup would parse it every time).
static MODEL: HeaderName = HeaderName::from_static(MODEL_HEADER);
/// [`OPERATION_HEADER`] as a pre-parsed name.
static OPERATION: HeaderName = HeaderName::from_static(OPERATION_HEADER);

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Operation names the layer knows, as `'static` strings (no allocation).
fn known_operation(name: &str) -> Cow<'static, str> {
    match name {
        gen_ai::operation::CHAT => Cow::Borrowed(gen_ai::operation::CHAT),
        gen_ai::operation::TEXT_COMPLETION => Cow::Borrowed(gen_ai::operation::TEXT_COMPLETION),
        gen_ai::operation::EMBEDDINGS => Cow::Borrowed(gen_ai::operation::EMBEDDINGS),
        gen_ai::operation::GENERATE_CONTENT => Cow::Borrowed(gen_ai::operation::GENERATE_CONTENT),
        other => Cow::Owned(other.to_owned()),
    }
}

impl RequestFacts {
    /// Reads the facts in this order of precedence: the layer's `describe` function, the
    /// `x-infertrace-*` headers, the path (gRPC → `generate_content`), the layer's defaults.
    pub(crate) fn read(head: &RequestHead<'_>, shared: &Shared) -> Self {
        let grpc = grpc::is_grpc(head.headers);
        let described = shared
            .describe
            .as_ref()
            .map(|f| f(head))
            .unwrap_or_default();
        let operation = described
            .operation
            .or_else(|| header_str(head.headers, &OPERATION).map(known_operation))
            .or_else(|| {
                if grpc {
                    Some(Cow::Borrowed(gen_ai::operation::GENERATE_CONTENT))
                } else {
                    operation_for_path(head.uri.path()).map(Cow::Borrowed)
                }
            })
            .unwrap_or_else(|| shared.default_operation.clone());
        let request_model = described
            .model
            .map(|m| StringValue::from(Arc::<str>::from(m)))
            .or_else(|| header_str(head.headers, &MODEL).map(|m| StringValue::from(m.to_owned())))
            .or_else(|| shared.default_model.clone());
        Self {
            operation,
            request_model,
            grpc,
        }
    }

    /// `"{operation} {model}"`, or the operation alone while no model is known.
    pub(crate) fn span_name(&self) -> Cow<'static, str> {
        match &self.request_model {
            Some(m) => interning::span_name(&self.operation, m.as_str()),
            None => self.operation.clone(),
        }
    }
}

fn method_value(method: &Method) -> StringValue {
    let known: Option<&'static str> = match *method {
        Method::GET => Some("GET"),
        Method::POST => Some("POST"),
        Method::PUT => Some("PUT"),
        Method::DELETE => Some("DELETE"),
        Method::HEAD => Some("HEAD"),
        Method::OPTIONS => Some("OPTIONS"),
        Method::PATCH => Some("PATCH"),
        Method::CONNECT => Some("CONNECT"),
        Method::TRACE => Some("TRACE"),
        _ => None,
    };
    // The conventions ask for `_OTHER` for methods outside the registry.
    StringValue::from(known.unwrap_or("_OTHER"))
}

/// Splits `host[:port]` / `[v6]:port` (a `Host` header) without the full URI parser.
fn split_host_port(s: &str) -> (&str, Option<u16>) {
    if let Some(rest) = s.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (s, None),
        };
    }
    match s.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, port.parse().ok()),
        _ => (s, None),
    }
}

/// Host and port the request was addressed to: `:authority` (HTTP/2) or `Host` (HTTP/1.1).
fn server_address<B>(req: &Request<B>) -> Option<(&str, Option<i64>)> {
    if let Some(a) = req.uri().authority() {
        return Some((a.host(), a.port_u16().map(i64::from)));
    }
    let (host, port) = split_host_port(header_str(req.headers(), &header::HOST)?);
    (!host.is_empty()).then(|| (host, port.map(i64::from)))
}

/// Appends the request-side attributes: GenAI operation and model, then HTTP or RPC semconv.
pub(crate) fn request_attributes<B>(
    req: &Request<B>,
    facts: &RequestFacts,
    attrs: &mut Vec<KeyValue>,
) {
    attrs.push(KeyValue::new(
        gen_ai::OPERATION_NAME,
        facts.operation.clone(),
    ));
    if let Some(m) = &facts.request_model {
        attrs.push(KeyValue::new(gen_ai::REQUEST_MODEL, m.clone()));
    }
    let path = req.uri().path();
    if facts.grpc {
        attrs.push(KeyValue::new(net::RPC_SYSTEM, "grpc"));
        if let Some((service, method)) = grpc::service_and_method(path) {
            attrs.push(KeyValue::new(
                net::RPC_SERVICE,
                interning::shared(Kind::RpcService, service),
            ));
            attrs.push(KeyValue::new(
                net::RPC_METHOD,
                interning::shared(Kind::RpcMethod, method),
            ));
        }
    } else {
        attrs.push(KeyValue::new(
            net::HTTP_REQUEST_METHOD,
            method_value(req.method()),
        ));
        attrs.push(KeyValue::new(
            net::URL_PATH,
            interning::shared(Kind::Path, path),
        ));
        if let Some(route) = req.extensions().get::<axum::extract::MatchedPath>() {
            attrs.push(KeyValue::new(
                net::HTTP_ROUTE,
                interning::shared(Kind::Route, route.as_str()),
            ));
        }
        if let Some(ua) = header_str(req.headers(), &header::USER_AGENT) {
            attrs.push(KeyValue::new(
                net::USER_AGENT_ORIGINAL,
                interning::shared(Kind::UserAgent, ua),
            ));
        }
    }
    if let Some((host, port)) = server_address(req) {
        attrs.push(KeyValue::new(
            net::SERVER_ADDRESS,
            interning::shared(Kind::Host, host),
        ));
        if let Some(p) = port {
            attrs.push(KeyValue::new(net::SERVER_PORT, p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_from_paths() {
        assert_eq!(operation_for_path("/v1/chat/completions"), Some("chat"));
        assert_eq!(
            operation_for_path("/v1/completions"),
            Some("text_completion")
        );
        assert_eq!(operation_for_path("/v1/embeddings/"), Some("embeddings"));
        assert_eq!(operation_for_path("/health"), None);
    }

    #[test]
    fn server_address_from_host_header() {
        let req = Request::builder()
            .uri("/v1/completions")
            .header("host", "example.com:8080")
            .body(())
            .unwrap();
        assert_eq!(server_address(&req), Some(("example.com", Some(8080))));
        let req = Request::builder()
            .uri("http://h2.local/x")
            .body(())
            .unwrap();
        assert_eq!(server_address(&req), Some(("h2.local", None)));
    }
}
