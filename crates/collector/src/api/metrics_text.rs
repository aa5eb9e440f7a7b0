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

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
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

/// One rendering and the memory it holds: in the limiter, and outside it (given back to the
/// allowance when dropped).
struct Rendered {
    chunks: Vec<String>,
    reservation: MemoryReservation,
    outside: usize,
    outside_of: Arc<AtomicUsize>,
}

impl Rendered {
    /// The text's length in bytes.
    fn len(&self) -> usize {
        self.chunks.iter().map(String::len).sum()
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

impl Drop for Rendered {
    fn drop(&mut self) {
        self.outside_of.fetch_sub(self.outside, Ordering::AcqRel);
    }
}

/// What [`Bytes`] of one chunk of a shared rendering own.
struct ChunkOf(Arc<Rendered>, usize);

impl AsRef<[u8]> for ChunkOf {
    fn as_ref(&self) -> &[u8] {
        self.0.chunks[self.1].as_bytes()
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

/// The `/metrics` renderings of one API (see the module docs).
pub struct MetricsText {
    /// The latest rendering while any answer still holds it, and when it was made.
    latest: tokio::sync::Mutex<Option<(Weak<Rendered>, Instant)>>,
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

    /// The OpenMetrics text of `registry`: the rendering another scrape is still sending when
    /// it is under [`SHARE_FOR`] old, else a new one.
    pub async fn get(
        &self,
        registry: &Arc<Registry>,
        limiter: &MemoryLimiter,
    ) -> Result<MetricsBody, MetricsTextError> {
        let mut latest = self.latest.lock().await;
        if let Some((weak, at)) = latest.as_ref()
            && at.elapsed() < SHARE_FOR
            && let Some(rendered) = weak.upgrade()
        {
            return Ok(MetricsBody::new(rendered));
        }
        let out = Rendered {
            chunks: Vec::new(),
            reservation: limiter.empty_reservation(),
            outside: 0,
            outside_of: self.outside.clone(),
        };
        let (registry, allowance) = (registry.clone(), self.allowance);
        let rendered = tokio::task::spawn_blocking(move || render(&registry, out, allowance))
            .await
            .map_err(|e| MetricsTextError::Failed(e.to_string()))??;
        let rendered = Arc::new(rendered);
        *latest = Some((Arc::downgrade(&rendered), Instant::now()));
        Ok(MetricsBody::new(rendered))
    }
}

/// A response body sending one rendering's chunks (it holds the rendering, and so its
/// memory, until it is sent or dropped).
pub struct MetricsBody {
    rendered: Arc<Rendered>,
    next: usize,
}

impl MetricsBody {
    fn new(rendered: Arc<Rendered>) -> Self {
        Self { rendered, next: 0 }
    }

    /// The text's length in bytes.
    pub fn len(&self) -> usize {
        self.rendered.len()
    }

    /// Whether the text is empty (never, for a rendered registry: it ends with `# EOF`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let left: usize = self.rendered.chunks[self.next.min(self.rendered.chunks.len())..]
            .iter()
            .map(String::len)
            .sum();
        SizeHint::with_exact(left as u64)
    }
}

/// Renders `registry` into `out`'s chunks, each taken from the `allowance` outside the limiter
/// while it lasts, else reserved in the limiter, before it is allocated.
fn render(
    registry: &Registry,
    out: Rendered,
    allowance: usize,
) -> Result<Rendered, MetricsTextError> {
    let mut out = Chunked { out, allowance };
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        return Err(MetricsTextError::OverMemory {
            rendered: out.out.len(),
        });
    }
    let mut out = out.out;
    // The last chunk is mostly empty: what the answer holds while it is sent is the text.
    if let Some(last) = out.chunks.last_mut() {
        let before = last.capacity();
        last.shrink_to_fit();
        let freed = before.saturating_sub(last.capacity());
        out.give_back(freed);
    }
    Ok(out)
}

/// A rendering being written: a new chunk is taken from the allowance or reserved in the
/// limiter first, and writing past both fails.
struct Chunked {
    out: Rendered,
    allowance: usize,
}

impl Chunked {
    /// Takes `bytes` from the allowance outside the limiter, if it has them.
    fn take_outside(&mut self, bytes: usize) -> bool {
        let allowance = self.allowance;
        let taken = self
            .out
            .outside_of
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&h| h <= allowance)
            })
            .is_ok();
        if taken {
            self.out.outside += bytes;
        }
        taken
    }
}

impl fmt::Write for Chunked {
    /// Fills the last chunk, then takes new ones: chunks are full but for the last, and at most
    /// 3 bytes where a character did not fit.
    fn write_str(&mut self, mut s: &str) -> fmt::Result {
        while !s.is_empty() {
            let room = self.out.chunks.last().map_or(0, |c| c.capacity() - c.len());
            let mut take = room.min(s.len());
            while !s.is_char_boundary(take) {
                take -= 1;
            }
            if take == 0 {
                if !self.take_outside(CHUNK) && !self.out.reservation.try_grow(CHUNK) {
                    return Err(fmt::Error);
                }
                self.out.chunks.push(String::with_capacity(CHUNK));
                continue;
            }
            if let Some(chunk) = self.out.chunks.last_mut() {
                chunk.push_str(&s[..take]);
            }
            s = &s[take..];
        }
        Ok(())
    }
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

    #[tokio::test]
    async fn the_text_is_reserved_while_it_is_sent_and_overlapping_scrapes_share_it() {
        // 1,000 series of 256-byte labels: ~290 KB, five chunks; nothing outside the limiter.
        let registry = registry_of(1_000, 256);
        let limiter = MemoryLimiter::new(64 << 20);
        let texts = MetricsText::with_allowance(0);
        let a = texts.get(&registry, &limiter).await.unwrap();
        let len = a.len();
        assert!(len > 4 * CHUNK, "{len}");
        // What is held: the text, to within the allocator's rounding of the last chunk.
        let held = limiter.used();
        assert!(held >= len && held < len + 4096, "{held} for {len}");
        // Another scrape while the first is sent: the same rendering, nothing more held.
        let b = texts.get(&registry, &limiter).await.unwrap();
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
        let c = texts.get(&registry, &limiter).await.unwrap();
        assert!(c.len() == len && limiter.used() == held);
    }

    #[tokio::test]
    async fn a_text_past_the_memory_limit_is_refused_not_rendered() {
        let registry = registry_of(1_000, 256);
        let limiter = MemoryLimiter::new(2 * CHUNK + 1000);
        let texts = MetricsText::with_allowance(0);
        match texts.get(&registry, &limiter).await {
            Err(MetricsTextError::OverMemory { rendered }) => {
                assert!(rendered > CHUNK && rendered <= 2 * CHUNK, "{rendered}");
            }
            Err(other) => panic!("{other:?}"),
            Ok(body) => panic!("rendered {} bytes", body.len()),
        }
        assert_eq!(limiter.used(), 0, "nothing held after the refusal");
        // Small enough: rendered.
        assert!(texts.get(&registry_of(1, 8), &limiter).await.is_ok());
    }

    /// An ordinary text is served from the allowance however full the limiter (the metrics
    /// matter most then); the renderings held at once share one allowance, and a text past
    /// it takes the rest from the limiter.
    #[tokio::test]
    async fn the_allowance_serves_ordinary_texts_at_a_full_limiter_and_is_shared() {
        let registry = registry_of(1_000, 256);
        let full = MemoryLimiter::new(0);
        let texts = MetricsText::with_allowance(8 * CHUNK);
        let a = texts.get(&registry, &full).await.unwrap();
        assert!(a.len() > 4 * CHUNK);
        // A rendering still held (a slow reader) while a new one is made a second later: the
        // two together pass the allowance, so the second is refused at a full limiter...
        let later = Instant::now() + SHARE_FOR;
        tokio::time::sleep_until(later.into()).await;
        assert!(matches!(
            texts.get(&registry, &full).await,
            Err(MetricsTextError::OverMemory { .. })
        ));
        // ...and takes what the allowance lacks from a limiter with room.
        let roomy = MemoryLimiter::new(64 << 20);
        let b = texts.get(&registry, &roomy).await.unwrap();
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
}
