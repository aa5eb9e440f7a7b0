//! Request bodies: reading with a size limit, gunzip with a limit on the inflated size, and the
//! gRPC response body (one message, then trailers).

use std::convert::Infallible;
use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// Why a body could not be read.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Over the limit (declared or actual).
    TooLarge,
    /// The connection failed or the client went away mid-body.
    Broken(String),
}

/// Reads a whole body, refusing it as soon as it passes `limit` bytes (or declares more).
pub(crate) async fn read_body(mut body: Incoming, limit: usize) -> Result<Bytes, BodyError> {
    let declared = body.size_hint().lower();
    if declared > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    // `declared` is at most `limit`, so this allocation is bounded too.
    let mut buf = BytesMut::with_capacity(declared as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Broken(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(BodyError::TooLarge);
            }
            if buf.is_empty() && buf.capacity() < data.len() {
                buf.reserve(data.len());
            }
            buf.extend_from_slice(&data);
        }
    }
    // A body that grew past its declared size (gRPC declares none) may have up to half its
    // buffer spare; the forwarder's queue may hold it and reserves its length, so it is copied
    // to its size rather than kept with the slack.
    if buf.capacity() - buf.len() > buf.len() / 8 {
        return Ok(Bytes::copy_from_slice(&buf));
    }
    Ok(buf.freeze())
}

/// Why a gzip body could not be inflated.
#[derive(Debug)]
pub(crate) enum InflateError {
    /// The inflated body passes the limit.
    TooLarge,
    /// Not valid gzip.
    Corrupt(String),
}

/// Inflates a gzip body, stopping (without allocating further) once it passes `limit` bytes.
pub(crate) fn gunzip_limited(data: &[u8], limit: usize) -> Result<Bytes, InflateError> {
    let mut out = Vec::with_capacity(data.len().saturating_mul(4).min(limit));
    let mut decoder = flate2::read::MultiGzDecoder::new(data).take(limit as u64 + 1);
    decoder
        .read_to_end(&mut out)
        .map_err(|e| InflateError::Corrupt(e.to_string()))?;
    if out.len() > limit {
        return Err(InflateError::TooLarge);
    }
    // The forwarder may queue it: no spare capacity.
    out.shrink_to_fit();
    Ok(Bytes::from(out))
}

/// A gRPC response body: at most one data frame, then trailers.
#[derive(Debug, Default)]
pub(crate) struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl GrpcBody {
    /// A body carrying one framed message followed by `trailers`.
    pub(crate) fn message(data: Bytes, trailers: HeaderMap) -> Self {
        Self {
            data: Some(data),
            trailers: Some(trailers),
        }
    }
    /// An empty body (trailers-only responses carry the status in the headers).
    pub(crate) fn empty() -> Self {
        Self::default()
    }
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// Percent-encodes a `grpc-message` value as the gRPC HTTP/2 protocol requires.
pub(crate) fn grpc_percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gunzip_enforces_the_inflated_limit() {
        let plain = vec![b'a'; 10_000];
        let z = gzip(&plain);
        assert_eq!(&gunzip_limited(&z, 10_000).unwrap()[..], &plain[..]);
        assert!(matches!(
            gunzip_limited(&z, 9_999),
            Err(InflateError::TooLarge)
        ));
        assert!(matches!(
            gunzip_limited(b"not gzip", 100),
            Err(InflateError::Corrupt(_))
        ));
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(grpc_percent_encode("a b%c\né"), "a b%25c%0A%C3%A9");
    }

    #[test]
    fn grpc_body_yields_data_then_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = GrpcBody::message(Bytes::from_static(b"x"), trailers);
        let collected = futures_util::FutureExt::now_or_never(body.collect())
            .unwrap()
            .unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(&collected.to_bytes()[..], b"x");
        assert!(GrpcBody::empty().is_end_stream());
    }
}
