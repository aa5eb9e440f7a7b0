//! gRPC over HTTP/2 details the layer needs: recognising gRPC requests, reading `grpc-status`,
//! counting length-prefixed messages in the response body, and the trailers-only rejection.

use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};

/// `grpc-status` code of CANCELLED.
pub(crate) const CANCELLED: i32 = 1;

/// Whether a `content-type` value is `application/grpc…`.
pub(crate) fn is_grpc_content_type(value: &HeaderValue) -> bool {
    value.as_bytes().starts_with(b"application/grpc")
}

pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-status` from headers or trailers; unparsable values count as UNKNOWN (2).
pub(crate) fn status(headers: &HeaderMap) -> Option<i32> {
    headers.get(&GRPC_STATUS).map(status_code)
}

/// A `grpc-status` value as a code; unparsable values count as UNKNOWN (2).
pub(crate) fn status_code(value: &HeaderValue) -> i32 {
    std::str::from_utf8(value.as_bytes())
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(2)
}

/// Whether a gRPC status says the client's request was wrong or not allowed (INVALID_ARGUMENT,
/// NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION, OUT_OF_RANGE,
/// UNAUTHENTICATED): gRPC's 4xx.
pub(crate) fn is_client_error(code: i32) -> bool {
    matches!(code, 3 | 5 | 6 | 7 | 9 | 11 | 16)
}

/// The canonical name of a gRPC status code (used as `error.type`).
pub(crate) fn status_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "_OTHER",
    }
}

/// `rpc.service` and `rpc.method` from a gRPC path `/package.Service/Method`.
pub(crate) fn service_and_method(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (service, method) = rest.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/'))
        .then_some((service, method))
}

/// The response an over-full admission queue sends: HTTP 429, or for gRPC a trailers-only
/// response (HTTP 200, `grpc-status: 8` in the headers, empty body).
pub(crate) fn rejection<B>(grpc: bool, body: B) -> Response<B> {
    let mut response = Response::new(body);
    if grpc {
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert("grpc-status", HeaderValue::from_static("8"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("infertrace%20admission%20queue%20full"),
        );
    } else {
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// Counts gRPC messages (5-byte header: compressed flag + big-endian u32 length, then payload)
/// across arbitrarily split body frames, reading only the headers.
#[derive(Clone, Debug, Default)]
pub(crate) struct MessageCounter {
    header: [u8; 5],
    header_len: u8,
    payload_left: u64,
}

impl MessageCounter {
    /// Feeds one contiguous piece of the body; returns how many messages *started* in it.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut started = 0;
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let skip = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                bytes = &bytes[skip..];
                self.payload_left -= skip as u64;
                continue;
            }
            if self.header_len == 0 {
                started += 1;
            }
            let need = 5 - usize::from(self.header_len);
            let take = need.min(bytes.len());
            let at = usize::from(self.header_len);
            self.header[at..at + take].copy_from_slice(&bytes[..take]);
            self.header_len += take as u8;
            bytes = &bytes[take..];
            if self.header_len == 5 {
                let [_, a, b, c, d] = self.header;
                self.payload_left = u64::from(u32::from_be_bytes([a, b, c, d]));
                self.header_len = 0;
            }
        }
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        m.extend_from_slice(payload);
        m
    }

    #[test]
    fn counts_messages_split_anywhere() {
        let mut body = Vec::new();
        for p in [&b"hello"[..], b"", b"a longer payload of bytes", b"x"] {
            body.extend(message(p));
        }
        for split in 1..body.len() {
            let mut c = MessageCounter::default();
            let n: u64 = body.chunks(split).map(|piece| c.feed(piece)).sum();
            assert_eq!(n, 4, "split every {split} bytes");
        }
    }

    #[test]
    fn parses_status_and_path() {
        let mut h = HeaderMap::new();
        assert_eq!(status(&h), None);
        h.insert("grpc-status", HeaderValue::from_static("13"));
        assert_eq!(status(&h), Some(13));
        h.insert("grpc-status", HeaderValue::from_static("oops"));
        assert_eq!(status(&h), Some(2));
        assert_eq!(status_name(13), "INTERNAL");
        assert_eq!(
            service_and_method("/infer.v1.Generator/Generate"),
            Some(("infer.v1.Generator", "Generate"))
        );
        assert_eq!(service_and_method("/v1/chat/completions"), None);
        assert_eq!(service_and_method("/nope"), None);
    }

    #[test]
    fn rejection_shapes() {
        let r = rejection(false, ());
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let g = rejection(true, ());
        assert_eq!(g.status(), StatusCode::OK);
        assert_eq!(status(g.headers()), Some(8)); // RESOURCE_EXHAUSTED
        assert!(
            g.headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(is_grpc_content_type)
        );
    }
}
