//! The `/metrics` text, within the memory bound. A thousand series with long labels render to
//! hundreds of megabytes (every histogram bucket line repeats the labels), so the text is
//! rendered off the async runtime into chunks of [`CHUNK`] bytes, and shared by the scrapes
//! that overlap: one rendering at a time, handed to every scrape that asks while an answer
//! still sends it (and it is under [`SHARE_FOR`] old). The renderings held at any moment may
//! take [`OUTSIDE_LIMIT`] bytes of the stated overhead, so that a scrape is never refused for
//! an ordinary text, however full the limiter (the metrics matter most then); beyond that each
//! chunk is reserved in the [`MemoryLimiter`] before it is allocated (no buffer doubles and
//! copies), and a text that does not fit is not rendered further: the scrape gets 503 with
//! `Retry-After`.
//!
//! A scrape that accepts gzip (Prometheus always does) gets a rendering gzipped as it is
//! written, held and shared in the same way: the plain text is never held for it, so the
//! review's 290 MB text holds 6 MB.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http_body::{Body, Frame, SizeHint};
use prometheus_client::registry::Registry;

use crate::limiter::{MemoryLimiter, MemoryReservation};

/// How old a rendering still being sent may be and be handed to another scrape.
pub const SHARE_FOR: Duration = Duration::from_secs(1);

/// The size of the text's chunks.
pub const CHUNK: usize = 64 << 10;

/// What the renderings held at once may take outside the memory limiter (part of
/// [`crate::resident::OVERHEAD`]).
pub const OUTSIDE_LIMIT: usize = 8 << 20;

/// Memory a rendering holds: taken from the allowance outside the limiter while it lasts, else
/// reserved in the limiter, always before it is allocated; given back to the allowance when
/// dropped (the reservation gives itself back).
struct Held {
    reservation: MemoryReservation,
    outside: usize,
    outside_of: Arc<AtomicUsize>,
    allowance: usize,
}

impl Held {
    /// Takes `bytes` from the allowance, or else from the limiter; `false` if neither has them.
    fn take(&mut self, bytes: usize) -> bool {
        let allowance = self.allowance;
        let outside = self
            .outside_of
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&h| h <= allowance)
            })
            .is_ok();
        if outside {
            self.outside += bytes;
        }
        outside || self.reservation.try_grow(bytes)
    }

    /// Gives `bytes` no longer allocated back: to the limiter first, then to the allowance.
    fn give_back(&mut self, bytes: usize) {
        let from_limiter = bytes.min(self.reservation.bytes());
        self.reservation.shrink(from_limiter);
        let from_outside = (bytes - from_limiter).min(self.outside);
        self.outside -= from_outside;
        self.outside_of.fetch_sub(from_outside, Ordering::AcqRel);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.outside_of.fetch_sub(self.outside, Ordering::AcqRel);
    }
}

/// Chunks of at most [`CHUNK`] bytes, each [`Held`] before it is allocated; full but for the
/// last.
struct Chunks {
    chunks: Vec<Vec<u8>>,
    held: Held,
}

impl Chunks {
    fn new(held: Held) -> Self {
        Self {
            chunks: Vec::new(),
            held,
        }
    }

    /// The length in bytes.
    fn len(&self) -> usize {
        self.len_from(0)
    }

    /// The bytes of chunks `from..`.
    fn len_from(&self, from: usize) -> usize {
        self.chunks
            .get(from..)
            .map_or(0, |rest| rest.iter().map(Vec::len).sum())
    }

    /// Gives back what the last chunk does not use (while it is sent, what an answer holds is
    /// the bytes).
    fn shrink_last(&mut self) {
        if let Some(last) = self.chunks.last_mut() {
            let before = last.capacity();
            last.shrink_to_fit();
            let freed = before.saturating_sub(last.capacity());
            self.held.give_back(freed);
        }
    }
}

impl io::Write for Chunks {
    /// Fills the last chunk, then takes a new one.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let full = self.chunks.last().is_none_or(|c| c.len() == c.capacity());
        if full && !buf.is_empty() {
            if !self.held.take(CHUNK) {
                return Err(io::Error::other("over the memory limit"));
            }
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let Some(last) = self.chunks.last_mut() else {
            return Ok(0);
        };
        let take = (last.capacity() - last.len()).min(buf.len());
        last.extend_from_slice(&buf[..take]);
        Ok(take)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An [`io::Write`] written to as a [`fmt::Write`], for the text encoder.
struct FmtIo<W>(W);

impl<W: io::Write> fmt::Write for FmtIo<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write_all(s.as_bytes()).map_err(|_| fmt::Error)
    }
}

/// What [`Bytes`] of one chunk of a shared rendering own.
struct ChunkOf(Arc<Chunks>, usize);

impl AsRef<[u8]> for ChunkOf {
    fn as_ref(&self) -> &[u8] {
        &self.0.chunks[self.1]
    }
}

/// Why no text could be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsTextError {
    /// The text passed what the memory limiter could reserve after `rendered` bytes.
    OverMemory {
        /// Bytes rendered when the limiter refused more.
        rendered: usize,
    },
    /// The rendering task failed (a panic in an encoder).
    Failed(String),
}

/// A rendering while any answer still holds it, and when it was made.
type Latest = (Weak<Chunks>, Instant);

/// The `/metrics` renderings of one API (see the module docs).
pub struct MetricsText {
    /// The latest rendering, plain and gzipped, while any answer still holds it, and when it
    /// was made.
    latest: tokio::sync::Mutex<[Option<Latest>; 2]>,
    /// Bytes the renderings hold outside the limiter, at most `allowance`.
    outside: Arc<AtomicUsize>,
    allowance: usize,
}

impl Default for MetricsText {
    fn default() -> Self {
        Self::with_allowance(OUTSIDE_LIMIT)
    }
}

impl fmt::Debug for MetricsText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsText")
            .field("outside", &self.outside.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl MetricsText {
    /// Renderings that may hold `allowance` bytes outside the limiter ([`OUTSIDE_LIMIT`] by
    /// default).
    pub fn with_allowance(allowance: usize) -> Self {
        Self {
            latest: tokio::sync::Mutex::default(),
            outside: Arc::default(),
            allowance,
        }
    }

    fn held(&self, limiter: &MemoryLimiter) -> Held {
        Held {
            reservation: limiter.empty_reservation(),
            outside: 0,
            outside_of: self.outside.clone(),
            allowance: self.allowance,
        }
    }

    /// The OpenMetrics text of `registry`, gzipped if `gzip`: the rendering another scrape
    /// is still sending when it is under [`SHARE_FOR`] old, else a new one.
    pub async fn get(
        &self,
        registry: &Arc<Registry>,
        limiter: &MemoryLimiter,
        gzip: bool,
    ) -> Result<MetricsBody, MetricsTextError> {
        let mut latest = self.latest.lock().await;
        let latest = &mut latest[usize::from(gzip)];
        if let Some((weak, at)) = latest.as_ref()
            && at.elapsed() < SHARE_FOR
            && let Some(rendered) = weak.upgrade()
        {
            return Ok(MetricsBody::new(rendered, gzip));
        }
        let (registry, held) = (registry.clone(), self.held(limiter));
        let rendered = tokio::task::spawn_blocking(move || render(&registry, held, gzip))
            .await
            .map_err(|e| MetricsTextError::Failed(e.to_string()))??;
        let rendered = Arc::new(rendered);
        *latest = Some((Arc::downgrade(&rendered), Instant::now()));
        Ok(MetricsBody::new(rendered, gzip))
    }
}

/// A response body sending one rendering's chunks, plain or gzipped (it holds the rendering,
/// and so its memory, until it is sent or dropped).
pub struct MetricsBody {
    rendered: Arc<Chunks>,
    gzip: bool,
    next: usize,
}

impl MetricsBody {
    fn new(rendered: Arc<Chunks>, gzip: bool) -> Self {
        Self {
            rendered,
            gzip,
            next: 0,
        }
    }

    /// The body's length in bytes (gzipped, if it is).
    pub fn len(&self) -> usize {
        self.rendered.len()
    }

    /// Whether the body is empty (never, for a rendered registry: it ends with `# EOF`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the body is sent gzipped (`Content-Encoding: gzip`).
    pub fn is_gzip(&self) -> bool {
        self.gzip
    }

    /// Whether `other` sends the same rendering.
    pub fn shares_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.rendered, &other.rendered)
    }
}

impl Body for MetricsBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.next >= this.rendered.chunks.len() {
            return Poll::Ready(None);
        }
        let chunk = Bytes::from_owner(ChunkOf(this.rendered.clone(), this.next));
        this.next += 1;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.rendered.chunks.len()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rendered.len_from(self.next) as u64)
    }
}

/// Whether an `Accept-Encoding` header value accepts gzip (`gzip` or `*`, with a non-zero
/// quality, and gzip not refused by name).
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    let mut star = false;
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        let refused = parts.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        if coding.eq_ignore_ascii_case("gzip") {
            return !refused;
        }
        star |= coding == "*" && !refused;
    }
    star
}

/// Renders `registry`, gzipped as it is written if `gzip` (fast compression: the text is
/// repetitive), into chunks held in `held` before they are allocated.
fn render(registry: &Registry, held: Held, gzip: bool) -> Result<Chunks, MetricsTextError> {
    let over = |rendered: usize| MetricsTextError::OverMemory { rendered };
    let mut out = if gzip {
        let mut out = FmtIo(GzEncoder::new(Chunks::new(held), Compression::fast()));
        let encoded = prometheus_client::encoding::text::encode(&mut out, registry);
        let rendered = out.0.get_ref().len();
        encoded.map_err(|_| over(rendered))?;
        out.0.finish().map_err(|_| over(rendered))?
    } else {
        let mut out = FmtIo(Chunks::new(held));
        prometheus_client::encoding::text::encode(&mut out, registry)
            .map_err(|_| over(out.0.len()))?;
        out.0
    };
    out.shrink_last();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Labels {
        model: String,
    }

    /// A registry of `series` counters, each labelled with a model name of `label_len` bytes.
    fn registry_of(series: usize, label_len: usize) -> Arc<Registry> {
        let family = Family::<Labels, Counter>::default();
        for i in 0..series {
            let model = format!("{i:0>width$}", width = label_len);
            family.get_or_create(&Labels { model }).inc();
        }
        let mut registry = Registry::default();
        registry.register("requests", "Requests", family);
        Arc::new(registry)
    }

    async fn text(body: MetricsBody) -> Vec<u8> {
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut out).unwrap();
        out
    }

    #[tokio::test]
    async fn the_text_is_reserved_while_it_is_sent_and_overlapping_scrapes_share_it() {
        // 1,000 series of 256-byte labels: ~290 KB, five chunks; nothing outside the limiter.
        let registry = registry_of(1_000, 256);
        let limiter = MemoryLimiter::new(64 << 20);
        let texts = MetricsText::with_allowance(0);
        let a = texts.get(&registry, &limiter, false).await.unwrap();
        let len = a.len();
        assert!(len > 4 * CHUNK, "{len}");
        // What is held: the text, to within the allocator's rounding of the last chunk.
        let held = limiter.used();
        assert!(held >= len && held < len + 4096, "{held} for {len}");
        // Another scrape while the first is sent: the same rendering, nothing more held.
        let b = texts.get(&registry, &limiter, false).await.unwrap();
        assert!(a.shares_with(&b));
        assert_eq!(limiter.used(), held);
        // The whole text, chunk after chunk, as the encoder writes it in one piece.
        let sent = text(a).await;
        assert_eq!(sent.len(), len);
        assert_eq!(sent, crate::prom_export::encode(&registry).into_bytes());
        assert_eq!(
            limiter.used(),
            held,
            "still held while the other answer sends it"
        );
        drop(b);
        assert_eq!(limiter.used(), 0, "given back once every answer is sent");
        // With no answer holding it, the next scrape renders afresh.
        let c = texts.get(&registry, &limiter, false).await.unwrap();
        assert!(c.len() == len && limiter.used() == held);
    }

    #[tokio::test]
    async fn a_text_past_the_memory_limit_is_refused_not_rendered() {
        let registry = registry_of(1_000, 256);
        let limiter = MemoryLimiter::new(2 * CHUNK + 1000);
        let texts = MetricsText::with_allowance(0);
        match texts.get(&registry, &limiter, false).await {
            Err(MetricsTextError::OverMemory { rendered }) => {
                assert!(rendered > CHUNK && rendered <= 2 * CHUNK, "{rendered}");
            }
            Err(other) => panic!("{other:?}"),
            Ok(body) => panic!("rendered {} bytes", body.len()),
        }
        assert_eq!(limiter.used(), 0, "nothing held after the refusal");
        // Small enough: rendered.
        assert!(texts.get(&registry_of(1, 8), &limiter, false).await.is_ok());
    }

    /// An ordinary text is served from the allowance however full the limiter (the metrics
    /// matter most then); the renderings held at once share one allowance, and a text past
    /// it takes the rest from the limiter.
    #[tokio::test]
    async fn the_allowance_serves_ordinary_texts_at_a_full_limiter_and_is_shared() {
        let registry = registry_of(1_000, 256);
        let full = MemoryLimiter::new(0);
        let texts = MetricsText::with_allowance(8 * CHUNK);
        let a = texts.get(&registry, &full, false).await.unwrap();
        assert!(a.len() > 4 * CHUNK);
        // A rendering still held (a slow reader) while a new one is made a second later: the
        // two together pass the allowance, so the second is refused at a full limiter...
        let later = Instant::now() + SHARE_FOR;
        tokio::time::sleep_until(later.into()).await;
        assert!(matches!(
            texts.get(&registry, &full, false).await,
            Err(MetricsTextError::OverMemory { .. })
        ));
        // ...and takes what the allowance lacks from a limiter with room.
        let roomy = MemoryLimiter::new(64 << 20);
        let b = texts.get(&registry, &roomy, false).await.unwrap();
        assert!(
            roomy.used() > 0 && roomy.used() < b.len(),
            "{}",
            roomy.used()
        );
        drop((a, b));
        assert_eq!(roomy.used(), 0);
        assert_eq!(
            texts.outside.load(Ordering::Relaxed),
            0,
            "the allowance given back"
        );
    }

    #[tokio::test]
    async fn a_gzip_scrape_gets_the_text_gzipped_as_it_is_written_and_shared() {
        let registry = registry_of(1_000, 256);
        let limiter = MemoryLimiter::new(64 << 20);
        let texts = MetricsText::with_allowance(0);
        let plain = texts.get(&registry, &limiter, false).await.unwrap();
        let text_held = limiter.used();
        let a = texts.get(&registry, &limiter, true).await.unwrap();
        assert!(a.is_gzip() && !plain.is_gzip() && !a.shares_with(&plain));
        let gzip_held = limiter.used() - text_held;
        let b = texts.get(&registry, &limiter, true).await.unwrap();
        assert!(a.shares_with(&b));
        assert_eq!(
            limiter.used() - text_held,
            gzip_held,
            "shared, nothing more held"
        );
        let (len, sent) = (a.len(), text(a).await);
        assert_eq!(sent.len(), len);
        // The labels repeat: the gzip form is a small part of the text, and what it holds is
        // its length to within the allocator's rounding.
        assert!(len * 5 < plain.len(), "{len} of {}", plain.len());
        assert!(
            gzip_held >= len && gzip_held < len + 4096,
            "{gzip_held} for {len}"
        );
        assert_eq!(gunzip(&sent), text(plain).await);
        assert_eq!(text(b).await, sent);
        assert_eq!(limiter.used(), 0, "all given back once sent");
    }

    #[tokio::test]
    async fn a_gzip_scrape_never_holds_the_plain_text() {
        // ~290 KB of text, a few KB gzipped: a limit of two chunks refuses the plain text and
        // serves the gzipped one.
        let registry = registry_of(1_000, 256);
        let limiter = MemoryLimiter::new(2 * CHUNK);
        let texts = MetricsText::with_allowance(0);
        assert!(matches!(
            texts.get(&registry, &limiter, false).await,
            Err(MetricsTextError::OverMemory { .. })
        ));
        let body = texts.get(&registry, &limiter, true).await.unwrap();
        assert!(body.is_gzip() && body.len() < CHUNK, "{}", body.len());
        let text = gunzip(&text(body).await);
        assert_eq!(text, crate::prom_export::encode(&registry).into_bytes());
        assert_eq!(limiter.used(), 0);
    }

    #[test]
    fn accept_encoding_is_read_as_http_says() {
        for yes in [
            "gzip",
            "GZIP",
            "deflate, gzip",
            "gzip;q=1.0, identity; q=0.5",
            "*",
            "br, *;q=0.1",
        ] {
            assert!(accepts_gzip(yes), "{yes}");
        }
        for no in [
            "",
            "identity",
            "deflate, br",
            "gzip;q=0",
            "gzip; q=0.0, *",
            "*;q=0",
            "x-gzip",
        ] {
            assert!(!accepts_gzip(no), "{no}");
        }
    }
}
