//! What the layer learns from a request's head at arrival: operation, model, protocol, and the
//! HTTP or RPC semantic-convention attributes of the request span ([`StartAttributes`]).

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, header};
use opentelemetry::{KeyValue, StringValue};

use infertrace_semconv::{gen_ai, net};

use crate::attribute_writer::{AttributeWriter, KeyValues};
use crate::grpc;
use crate::interning::{self, Kind};
use crate::propagation::ContextHeaders;

/// Request header naming the model the client asked for (`gen_ai.request.model`).
pub const MODEL_HEADER: &str = "x-infertrace-model";
/// Request header naming the GenAI operation (`gen_ai.operation.name`), e.g. `chat`.
pub const OPERATION_HEADER: &str = "x-infertrace-operation";

/// The parts of a request a [`describe`](crate::InferenceTraceLayer::describe) or
/// [`skip`](crate::InferenceTraceLayer::skip) function sees.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    /// Request method.
    pub method: &'a Method,
    /// Request URI.
    pub uri: &'a Uri,
    /// Request headers (gRPC metadata included).
    pub headers: &'a HeaderMap,
}

/// What a [`describe`](crate::InferenceTraceLayer::describe) function says about a request.
/// `None` fields fall back to the defaults (headers, path, the layer's default model).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDescription {
    /// `gen_ai.operation.name`, e.g. `chat`.
    pub operation: Option<Cow<'static, str>>,
    /// `gen_ai.request.model`.
    pub model: Option<String>,
}

/// Operation, model and protocol of one request.
#[derive(Clone, Debug)]
pub(crate) struct RequestFacts {
    pub(crate) operation: Cow<'static, str>,
    pub(crate) provider: StringValue,
    pub(crate) request_model: Option<StringValue>,
    pub(crate) grpc: bool,
}

/// The operation a path implies, if it is one of the OpenAI-style routes.
pub(crate) fn operation_for_path(path: &str) -> Option<&'static str> {
    let path = path.trim_end_matches('/').as_bytes();
    let ends_with = |suffix: &str| {
        path.len() >= suffix.len()
            && interning::same_bytes(&path[path.len() - suffix.len()..], suffix.as_bytes())
    };
    if ends_with("/chat/completions") {
        Some(gen_ai::operation::CHAT)
    } else if ends_with("/completions") {
        Some(gen_ai::operation::TEXT_COMPLETION)
    } else if ends_with("/embeddings") {
        Some(gen_ai::operation::EMBEDDINGS)
    } else {
        None
    }
}

/// [`MODEL_HEADER`] as a pre-parsed name (a `&str` lookup would parse it every time).
static MODEL: HeaderName = HeaderName::from_static(MODEL_HEADER);
/// [`OPERATION_HEADER`] as a pre-parsed name.
static OPERATION: HeaderName = HeaderName::from_static(OPERATION_HEADER);

/// A header value as trimmed, non-empty text.
fn header_text(value: Option<&HeaderValue>) -> Option<&str> {
    value
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The request headers the layer reads at arrival, found in one pass over the header map: a
/// `HeaderMap::get` hashes the name (byte by byte for the non-standard ones), and the layer
/// would look up seven names for a request that carries a handful of headers. Each holds the
/// first value of its name, as `HeaderMap::get` gives it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ArrivalHeaders<'a> {
    pub(crate) content_type: Option<&'a HeaderValue>,
    pub(crate) host: Option<&'a HeaderValue>,
    pub(crate) user_agent: Option<&'a HeaderValue>,
    pub(crate) operation: Option<&'a HeaderValue>,
    pub(crate) model: Option<&'a HeaderValue>,
    /// Whether `traceparent` and `baggage` are there.
    pub(crate) context: ContextHeaders,
}

impl<'a> ArrivalHeaders<'a> {
    /// Reads `headers` once.
    pub(crate) fn scan(headers: &'a HeaderMap) -> Self {
        let mut found = Self::default();
        for (name, value) in headers {
            let slot = if name == header::CONTENT_TYPE {
                &mut found.content_type
            } else if name == header::HOST {
                &mut found.host
            } else if name == header::USER_AGENT {
                &mut found.user_agent
            } else if name == OPERATION {
                &mut found.operation
            } else if name == MODEL {
                &mut found.model
            } else {
                found.context.note(name);
                continue;
            };
            slot.get_or_insert(value);
        }
        found
    }

    /// Whether the request says `application/grpc…`.
    pub(crate) fn grpc(&self) -> bool {
        self.content_type.is_some_and(grpc::is_grpc_content_type)
    }
}

/// The route template axum matched (`http.route`), from its `MatchedPath` extension. Other
/// routers leave no such extension, and without the `axum` feature there is none to read.
#[cfg(feature = "axum")]
fn matched_route<B>(req: &Request<B>) -> Option<&str> {
    req.extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|route| route.as_str())
}

/// Without the `axum` feature no router leaves a route template the layer knows how to read.
#[cfg(not(feature = "axum"))]
fn matched_route<B>(_req: &Request<B>) -> Option<&str> {
    None
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
    /// Reads the facts in this order of precedence: `described` (the layer's `describe`
    /// function), the `x-infertrace-*` headers, the path (gRPC → `generate_content`), the
    /// layer's defaults.
    #[expect(
        clippy::ptr_arg,
        reason = "a clone of the `Cow` stays borrowed when the default is a `'static` name"
    )]
    pub(crate) fn read(
        head: &RequestHead<'_>,
        headers: &ArrivalHeaders<'_>,
        described: RequestDescription,
        default_operation: &Cow<'static, str>,
        default_model: Option<&StringValue>,
        provider: &StringValue,
    ) -> Self {
        let grpc = headers.grpc();
        let operation = described
            .operation
            .or_else(|| header_text(headers.operation).map(known_operation))
            .or_else(|| {
                if grpc {
                    Some(Cow::Borrowed(gen_ai::operation::GENERATE_CONTENT))
                } else {
                    operation_for_path(head.uri.path()).map(Cow::Borrowed)
                }
            })
            .unwrap_or_else(|| default_operation.clone());
        let request_model = described
            .model
            .map(|m| StringValue::from(Arc::<str>::from(m)))
            .or_else(|| header_text(headers.model).map(|m| interning::shared_value(Kind::Model, m)))
            .or_else(|| default_model.cloned());
        Self {
            operation,
            provider: provider.clone(),
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

fn method_value(method: &Method) -> &'static str {
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
    known.unwrap_or("_OTHER")
}

/// Splits `host[:port]` / `[v6]:port` (a `Host` header) without the full URI parser.
fn split_host_port(s: &str) -> (&str, Option<u16>) {
    if let Some(rest) = s.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (s, None),
        };
    }
    // Byte searches: `rsplit_once(':')` and `contains(':')` go through the generic char
    // pattern searcher, several times the work for a short `host:port`.
    let bytes = s.as_bytes();
    match bytes.iter().rposition(|&b| b == b':') {
        Some(i) if !bytes[..i].contains(&b':') => (&s[..i], s[i + 1..].parse().ok()),
        _ => (s, None),
    }
}

/// Host and port the request was addressed to: `:authority` (HTTP/2) or `Host` (HTTP/1.1).
fn server_address<'a, B>(
    req: &'a Request<B>,
    headers: &ArrivalHeaders<'a>,
) -> Option<(&'a str, Option<i64>)> {
    if let Some(a) = req.uri().authority() {
        return Some((a.host(), a.port_u16().map(i64::from)));
    }
    let (host, port) = split_host_port(header_text(headers.host)?);
    (!host.is_empty()).then(|| (host, port.map(i64::from)))
}

/// The request span's attributes known at arrival: GenAI operation and model, then HTTP or RPC
/// semantic conventions. Kept as values (interned strings, no `KeyValue` list) and written by
/// [`write`](Self::write) where the span is built.
#[derive(Clone, Debug)]
pub(crate) struct StartAttributes {
    operation: Cow<'static, str>,
    provider: StringValue,
    request_model: Option<StringValue>,
    protocol: Protocol,
    server: Option<(StringValue, Option<i64>)>,
}

#[derive(Clone, Debug)]
enum Protocol {
    Grpc {
        service_and_method: Option<(StringValue, StringValue)>,
    },
    Http {
        method: &'static str,
        path: StringValue,
        route: Option<StringValue>,
        user_agent: Option<StringValue>,
    },
}

/// How many attributes [`StartAttributes::write`] writes at most.
pub(crate) const START_ATTRIBUTES: usize = 9;

/// Room for the request span's attributes after those known at arrival: the end-of-request
/// attributes (at most 25) and a few more (a later model, a sampler's).
pub(crate) const REQUEST_ATTRIBUTE_ROOM: usize = 28;

impl StartAttributes {
    /// Reads them from the request head (`headers`: its headers, read once).
    pub(crate) fn read<B>(
        req: &Request<B>,
        headers: &ArrivalHeaders<'_>,
        facts: &RequestFacts,
    ) -> Self {
        let path = req.uri().path();
        let protocol = if facts.grpc {
            Protocol::Grpc {
                service_and_method: grpc::service_and_method(path).map(|(service, method)| {
                    (
                        interning::shared_value(Kind::RpcService, service),
                        interning::shared_value(Kind::RpcMethod, method),
                    )
                }),
            }
        } else {
            Protocol::Http {
                method: method_value(req.method()),
                path: interning::shared_value(Kind::Path, path),
                route: matched_route(req).map(|route| interning::shared_value(Kind::Route, route)),
                user_agent: header_text(headers.user_agent)
                    .map(|ua| interning::shared_value(Kind::UserAgent, ua)),
            }
        };
        Self {
            operation: facts.operation.clone(),
            provider: facts.provider.clone(),
            request_model: facts.request_model.clone(),
            protocol,
            server: server_address(req, headers)
                .map(|(host, port)| (interning::shared_value(Kind::Host, host), port)),
        }
    }

    /// [`read`](Self::read), scanning the request's headers itself.
    #[cfg(test)]
    pub(crate) fn of_request<B>(req: &Request<B>, facts: &RequestFacts) -> Self {
        Self::read(req, &ArrivalHeaders::scan(req.headers()), facts)
    }

    /// Passes every attribute to `push`, in a fixed order.
    pub(crate) fn write(&self, push: &mut impl FnMut(KeyValue)) {
        self.write_to(&mut KeyValues(push));
    }

    /// Writes every attribute to `out`, in a fixed order (the one order of the request span's
    /// arrival attributes, whatever the destination).
    #[inline]
    pub(crate) fn write_to(&self, out: &mut impl AttributeWriter) {
        out.cow(gen_ai::OPERATION_NAME, &self.operation);
        out.string(gen_ai::PROVIDER_NAME, &self.provider);
        if let Some(m) = &self.request_model {
            out.string(gen_ai::REQUEST_MODEL, m);
        }
        match &self.protocol {
            Protocol::Grpc { service_and_method } => {
                out.static_str(net::RPC_SYSTEM, "grpc");
                if let Some((service, method)) = service_and_method {
                    out.string(net::RPC_SERVICE, service);
                    out.string(net::RPC_METHOD, method);
                }
            }
            Protocol::Http {
                method,
                path,
                route,
                user_agent,
            } => {
                out.static_str(net::HTTP_REQUEST_METHOD, method);
                out.string(net::URL_PATH, path);
                if let Some(route) = route {
                    out.string(net::HTTP_ROUTE, route);
                }
                if let Some(ua) = user_agent {
                    out.string(net::USER_AGENT_ORIGINAL, ua);
                }
            }
        }
        if let Some((host, port)) = &self.server {
            out.string(net::SERVER_ADDRESS, host);
            if let Some(p) = port {
                out.i64(net::SERVER_PORT, *p);
            }
        }
    }

    /// Whether `other` holds the very same values (the same strings in memory, the same
    /// port): then both write the same attributes. A cheap test, not an equality: equal
    /// strings held in different places count as different. (The OTLP encoder's cache.)
    #[cfg(feature = "otlp")]
    pub(crate) fn same_values(&self, other: &Self) -> bool {
        fn same(a: &str, b: &str) -> bool {
            std::ptr::eq(a, b)
        }
        fn same_value(a: &StringValue, b: &StringValue) -> bool {
            same(a.as_str(), b.as_str())
        }
        fn same_option(a: &Option<StringValue>, b: &Option<StringValue>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => same_value(a, b),
                (None, None) => true,
                _ => false,
            }
        }
        let protocol = match (&self.protocol, &other.protocol) {
            (
                Protocol::Grpc {
                    service_and_method: a,
                },
                Protocol::Grpc {
                    service_and_method: b,
                },
            ) => match (a, b) {
                (Some((s1, m1)), Some((s2, m2))) => same_value(s1, s2) && same_value(m1, m2),
                (None, None) => true,
                _ => false,
            },
            (
                Protocol::Http {
                    method: m1,
                    path: p1,
                    route: r1,
                    user_agent: u1,
                },
                Protocol::Http {
                    method: m2,
                    path: p2,
                    route: r2,
                    user_agent: u2,
                },
            ) => same(m1, m2) && same_value(p1, p2) && same_option(r1, r2) && same_option(u1, u2),
            _ => false,
        };
        let server = match (&self.server, &other.server) {
            (Some((h1, p1)), Some((h2, p2))) => same_value(h1, h2) && p1 == p2,
            (None, None) => true,
            _ => false,
        };
        protocol
            && server
            && same(&self.operation, &other.operation)
            && same_value(&self.provider, &other.provider)
            && same_option(&self.request_model, &other.request_model)
    }

    /// The attributes as a list with room for `spare` more.
    pub(crate) fn to_vec(&self, spare: usize) -> Vec<KeyValue> {
        let mut attrs = Vec::with_capacity(START_ATTRIBUTES + spare);
        self.write(&mut |kv| attrs.push(kv));
        attrs
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
    fn host_and_port_split() {
        assert_eq!(
            split_host_port("example.com:8080"),
            ("example.com", Some(8080))
        );
        assert_eq!(split_host_port("example.com"), ("example.com", None));
        assert_eq!(split_host_port("example.com:"), ("example.com", None));
        assert_eq!(split_host_port("example.com:http"), ("example.com", None));
        assert_eq!(split_host_port("[::1]:443"), ("::1", Some(443)));
        assert_eq!(split_host_port("::1"), ("::1", None));
        assert_eq!(split_host_port("ä.example:80"), ("ä.example", Some(80)));
    }

    #[test]
    fn server_address_from_host_header() {
        let req = Request::builder()
            .uri("/v1/completions")
            .header("host", "example.com:8080")
            .body(())
            .unwrap();
        assert_eq!(
            server_address(&req, &ArrivalHeaders::scan(req.headers())),
            Some(("example.com", Some(8080)))
        );
        let req = Request::builder()
            .uri("http://h2.local/x")
            .body(())
            .unwrap();
        assert_eq!(
            server_address(&req, &ArrivalHeaders::scan(req.headers())),
            Some(("h2.local", None))
        );
    }

    #[test]
    #[cfg(feature = "otlp")]
    fn same_values_means_the_same_strings_in_memory() {
        let facts = RequestFacts {
            operation: Cow::Borrowed("chat"),
            provider: "self_hosted".into(),
            request_model: Some("m".into()),
            grpc: false,
        };
        let request = |ua: &str| {
            Request::builder()
                .uri("/v1/chat/completions")
                .header("host", "same-values.example:8080")
                .header("user-agent", ua)
                .body(())
                .unwrap()
        };
        // Interned strings: the same values twice are the same strings.
        let a = StartAttributes::of_request(&request("ua/1"), &facts);
        let b = StartAttributes::of_request(&request("ua/1"), &facts);
        assert!(a.same_values(&b) && b.same_values(&a));
        let c = StartAttributes::of_request(&request("ua/2"), &facts);
        assert!(!a.same_values(&c));
        // Equal text held elsewhere is not the same (the test may say no, never wrongly yes).
        let other_model = RequestFacts {
            request_model: Some(StringValue::from(String::from("m"))),
            ..facts.clone()
        };
        assert!(!a.same_values(&StartAttributes::of_request(&request("ua/1"), &other_model)));
        let grpc = RequestFacts {
            grpc: true,
            ..facts
        };
        assert!(!a.same_values(&StartAttributes::of_request(&request("ua/1"), &grpc)));
    }
}
