//! Request bodies: reading with a size limit, gunzip with a limit on the inflated size, and the
//! gRPC response body (one message, then trailers).

use std::convert::Infallible;
use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::limiter::{MemoryReservation, Refused};

/// Why a body could not be read.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Over the limit (declared or actual).
    TooLarge,
    /// The connection failed or the client went away mid-body.
    Broken(String),
    /// The memory limiter could not reserve the body's bytes: retry later.
    OverMemory,
    /// The body is larger than the memory limiter could ever reserve (its room: the limit less
    /// the aggregates): retrying cannot help.
    NeverFits,
}

/// Reads the whole length of a body from its first bytes (gRPC's message prefix), when they
/// hold it.
pub(crate) type LengthFromStart = fn(&[u8]) -> Option<usize>;

/// Reads a whole body, refusing it as soon as it passes `limit` bytes (or declares more).
/// With a `reservation`, every byte of buffer is reserved before it is allocated (the declared
/// length first, then as frames arrive): a body the limiter cannot cover is refused mid-read
/// with [`BodyError::OverMemory`], and the caller's reservation holds exactly the buffer.
/// A body that declares no length is sized by `length_from_start` when the caller gives one, so
/// that it is read into one buffer of its size instead of one grown by doubling and copied.
pub(crate) async fn read_body(
    body: &mut Incoming,
    limit: usize,
    mut reservation: Option<&mut MemoryReservation>,
    length_from_start: Option<LengthFromStart>,
) -> Result<Bytes, BodyError> {
    let declared = body.size_hint().lower();
    if declared > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    // `declared` is at most `limit`, so this allocation is bounded too.
    let declared = declared as usize;
    grow_to(&mut reservation, declared)?;
    let mut buf = BytesMut::with_capacity(declared);
    let mut pieces = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Broken(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            // HTTP/2 may end a stream with an empty data frame: not a piece of the body.
            if data.is_empty() {
                continue;
            }
            pieces += 1;
            let mut needed = buf.len() + data.len();
            if pieces == 1
                && declared == 0
                && let Some(length) = length_from_start.and_then(|read_length| read_length(&data))
            {
                needed = needed.max(length);
            }
            if needed > limit {
                return Err(BodyError::TooLarge);
            }
            if buf.capacity() < needed {
                // Grow like a vector would (doubling), but reserve before allocating.
                let capacity = needed.max(buf.capacity() * 2).min(limit);
                grow_to(&mut reservation, capacity)?;
                buf.reserve(capacity - buf.len());
            }
            buf.extend_from_slice(&data);
        }
    }
    // A body that grew past its declared size (or declared none) may have up to half its
    // buffer spare; the forwarder's queue may hold it and reserves its length, so it is copied
    // to its size rather than kept with the slack.
    if buf.capacity() - buf.len() > buf.len() / 8 {
        return Ok(Bytes::copy_from_slice(&buf));
    }
    if pieces > 1 {
        warm(&buf);
    }
    Ok(buf.freeze())
}

/// Reads one byte of every cache line of `buf`, so that decoding finds it in the core's cache.
///
/// A body read in several pieces was copied off its socket while other connections' bodies
/// were read too; by the time it is complete its first pieces have left the cache. The decoder
/// reads a body one dependent load after another and would wait on each line in turn; this loop's
/// independent loads fetch them in parallel (what it gains: docs/PERFORMANCE.md). The copy to
/// size above does the same as a side effect.
fn warm(buf: &[u8]) {
    let sum = buf
        .iter()
        .step_by(64)
        .fold(0u8, |sum, &byte| sum.wrapping_add(byte));
    std::hint::black_box(sum);
}

/// Reads and discards what is left of a request body that its answer did not need, at most
/// `limit` bytes and for at most `timeout` (past either it gives up: the connection closes).
///
/// Over HTTP/1 a server that closes its connection with request bytes unread makes the kernel
/// reset it, and a client still sending sees a broken connection instead of the answer (a
/// 429's `Retry-After`, a 401's reason). Reading the rest keeps the connection open and the
/// answer readable; the bytes pass through the connection's capped read buffer, never held.
pub(crate) async fn drain_body(body: &mut Incoming, limit: usize, timeout: Duration) {
    let drain = async {
        let mut read = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                read = read.saturating_add(data.len());
                if read > limit {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(timeout, drain).await;
}

/// Grows `reservation` (when there is one) to at least `bytes`.
fn grow_to(
    reservation: &mut Option<&mut MemoryReservation>,
    bytes: usize,
) -> Result<(), BodyError> {
    match reservation {
        Some(r) if r.bytes() < bytes => match r.try_grow(bytes - r.bytes()) {
            true => Ok(()),
            false if r.refused() == Some(Refused::NeverFits) => Err(BodyError::NeverFits),
            false => Err(BodyError::OverMemory),
        },
        _ => Ok(()),
    }
}

/// Why a gzip body could not be inflated.
#[derive(Debug)]
pub(crate) enum InflateError {
    /// The inflated body passes the limit.
    TooLarge,
    /// Not valid gzip.
    Corrupt(String),
    /// The memory limiter could not reserve the inflated bytes: retry later.
    OverMemory,
    /// The inflated body is larger than the memory limiter could ever reserve.
    NeverFits,
}

/// The first inflate step; later ones double the output (each reserved before it is written).
const INFLATE_STEP: usize = 256 * 1024;

/// How a compressed body is encoded (`Content-Encoding`, gRPC's `grpc-encoding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coding {
    /// gzip (RFC 1952), members concatenated or not.
    Gzip,
    /// HTTP's `deflate`: the zlib format (RFC 1950), as the OpenTelemetry SDKs send it.
    Deflate,
}

impl Coding {
    /// The coding a header names: `Ok(None)` for none or `identity`, `Err(())` for one not
    /// taken.
    pub(crate) fn of_header(value: Option<&[u8]>) -> Result<Option<Coding>, ()> {
        match value {
            None => Ok(None),
            Some(v) if v.eq_ignore_ascii_case(b"identity") => Ok(None),
            Some(v) if v.eq_ignore_ascii_case(b"gzip") => Ok(Some(Coding::Gzip)),
            Some(v) if v.eq_ignore_ascii_case(b"deflate") => Ok(Some(Coding::Deflate)),
            Some(_) => Err(()),
        }
    }

    /// Its name in the headers.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
        }
    }
}

/// Inflates a compressed body, stopping (without allocating further) once it passes `limit` bytes.
/// With a `reservation`, the output is reserved step by step before it is allocated. A step
/// refused for now is [`InflateError::OverMemory`]. A step refused because it passes the room
/// (the doubling may ask for more than the body needs) finishes inflating without keeping the
/// rest, to learn the size: a body that could never fit is [`InflateError::NeverFits`] (413, not
/// a retry), one that fits is inflated once more into exactly its size.
pub(crate) fn inflate_limited(
    data: &[u8],
    coding: Coding,
    limit: usize,
    mut reservation: Option<&mut MemoryReservation>,
) -> Result<Bytes, InflateError> {
    let mut out: Vec<u8> = Vec::new();
    let mut decoder = inflater(data, coding, limit);
    let base = reservation.as_ref().map_or(0, |r| r.bytes());
    loop {
        // Grows like a vector would (doubling), but reserves before allocating.
        let capacity = (out.len() * 2).max(INFLATE_STEP).min(limit + 1);
        if let Some(r) = reservation.as_deref_mut()
            && r.bytes() < base + capacity
            && !r.try_grow(base + capacity - r.bytes())
        {
            if r.refused() != Some(Refused::NeverFits) {
                return Err(InflateError::OverMemory);
            }
            // `out` stays reserved while the rest is counted, and is freed before the exact
            // reservation is asked for.
            let room = r.room().saturating_sub(base);
            let cap = room.min(limit).saturating_sub(out.len()) as u64 + 1;
            let rest = count_to_end((&mut decoder).take(cap))?;
            let size = out.len().saturating_add(rest);
            drop(out);
            r.shrink(r.bytes().saturating_sub(base));
            return inflate_exactly(data, coding, limit, size, r);
        }
        out.reserve_exact(capacity - out.len());
        let wanted = capacity - out.len();
        let read = (&mut decoder)
            .take(wanted as u64)
            .read_to_end(&mut out)
            .map_err(corrupt)?;
        if out.len() > limit {
            return Err(InflateError::TooLarge);
        }
        if read < wanted {
            break;
        }
    }
    // The forwarder may queue it: no spare capacity.
    out.shrink_to_fit();
    if let Some(r) = reservation {
        r.shrink(r.bytes().saturating_sub(base + out.len()));
    }
    Ok(Bytes::from(out))
}

/// A reader of at most `limit + 1` inflated bytes (one more than allowed, to tell).
fn inflater(data: &[u8], coding: Coding, limit: usize) -> impl Read + '_ {
    let reader: Box<dyn Read + '_> = match coding {
        Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
        Coding::Deflate => Box::new(flate2::read::ZlibDecoder::new(data)),
    };
    reader.take(limit as u64 + 1)
}

fn corrupt(e: std::io::Error) -> InflateError {
    InflateError::Corrupt(e.to_string())
}

/// Reads to the end, keeping nothing; returns how many bytes there were.
fn count_to_end(mut reader: impl Read) -> Result<usize, InflateError> {
    let n = std::io::copy(&mut reader, &mut std::io::sink()).map_err(corrupt)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// After a step refused for the room: `size` is the inflated size as far as it was counted (at
/// most one byte past the room or the limit). Refuses what could never fit, else reserves
/// exactly `size` in `reservation` (which holds only what was there before the body) and
/// inflates into it.
fn inflate_exactly(
    data: &[u8],
    coding: Coding,
    limit: usize,
    size: usize,
    reservation: &mut MemoryReservation,
) -> Result<Bytes, InflateError> {
    if size > limit {
        return Err(InflateError::TooLarge);
    }
    if !reservation.try_grow(size) {
        return Err(match reservation.refused() {
            Some(Refused::NeverFits) => InflateError::NeverFits,
            _ => InflateError::OverMemory,
        });
    }
    let mut out = Vec::with_capacity(size);
    inflater(data, coding, limit)
        .read_to_end(&mut out)
        .map_err(corrupt)?;
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
        assert_eq!(
            &inflate_limited(&z, Coding::Gzip, 10_000, None).unwrap()[..],
            &plain[..]
        );
        assert!(matches!(
            inflate_limited(&z, Coding::Gzip, 9_999, None),
            Err(InflateError::TooLarge)
        ));
        assert!(matches!(
            inflate_limited(b"not gzip", Coding::Gzip, 100, None),
            Err(InflateError::Corrupt(_))
        ));
    }

    /// A reservation whose limiter has `room` bytes left for requests, `held` of them taken
    /// by another request.
    fn reservation(room: usize, held: usize) -> (MemoryReservation, Option<MemoryReservation>) {
        let limiter = crate::limiter::MemoryLimiter::new(room);
        let other = (held > 0).then(|| limiter.try_reserve(held).unwrap());
        (limiter.empty_reservation(), other)
    }

    #[test]
    fn gunzip_that_fits_only_exactly_is_inflated_into_its_size() {
        // 700,000 bytes fit a 1,000,000-byte room, but the doubling step after 524,288 asks
        // for 1,048,576: the exact size is measured and reserved instead.
        let plain = vec![b'a'; 700_000];
        let (mut r, _) = reservation(1_000_000, 0);
        let out = inflate_limited(&gzip(&plain), Coding::Gzip, 16 << 20, Some(&mut r)).unwrap();
        assert_eq!(&out[..], &plain[..]);
        assert_eq!(r.bytes(), plain.len());
    }

    #[test]
    fn gunzip_larger_than_the_room_never_fits_and_one_that_fits_later_is_over_memory() {
        let z = gzip(&vec![b'a'; 2_000_000]);
        let (mut r, _) = reservation(1_000_000, 0);
        assert!(matches!(
            inflate_limited(&z, Coding::Gzip, 16 << 20, Some(&mut r)),
            Err(InflateError::NeverFits)
        ));
        assert_eq!(r.bytes(), 0, "nothing stays reserved");
        // 300,000 bytes fit the room, but another request holds 900,000 of it now.
        let z = gzip(&vec![b'a'; 300_000]);
        let (mut r, other) = reservation(1_000_000, 900_000);
        assert!(matches!(
            inflate_limited(&z, Coding::Gzip, 16 << 20, Some(&mut r)),
            Err(InflateError::OverMemory)
        ));
        drop(other);
        assert_eq!(
            inflate_limited(&z, Coding::Gzip, 16 << 20, Some(&mut r))
                .unwrap()
                .len(),
            300_000
        );
        // Over the size limit is still TooLarge, whatever the room.
        let (mut r, _) = reservation(1_000_000, 0);
        assert!(matches!(
            inflate_limited(&z, Coding::Gzip, 200_000, Some(&mut r)),
            Err(InflateError::TooLarge)
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
