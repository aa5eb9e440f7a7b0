//! The optional built-in admission queue: a FIFO semaphore with a bounded number of waiters,
//! and its settings ([`AdmissionConfig`]).
//!
//! Its wait is the `queue` phase in [`PhaseSource::Derived`](crate::PhaseSource::Derived) mode.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use opentelemetry::metrics::UpDownCounter;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// Settings of the optional built-in admission queue.
///
/// At most `max_concurrent` requests run the inner service at once; up to `max_queue` more wait in
/// FIFO order (their wait is the `queue` phase). A request arriving when both are full is answered
/// at once with `429 Too Many Requests` (HTTP) or a trailers-only `RESOURCE_EXHAUSTED` (gRPC), and
/// its span says `infer.outcome = rejected`. A slot is held until the response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Requests served at once (at least 1).
    pub max_concurrent: usize,
    /// Requests allowed to wait for a slot.
    pub max_queue: usize,
}

impl AdmissionConfig {
    /// An admission queue with `max_concurrent` slots and room for `max_queue` waiters.
    pub fn new(max_concurrent: usize, max_queue: usize) -> Self {
        Self {
            max_concurrent,
            max_queue,
        }
    }
}

/// A FIFO limit on concurrent requests with a bounded waiting line.
#[derive(Debug)]
pub(crate) struct AdmissionQueue {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    config: AdmissionConfig,
}

/// The boxed wait for a slot (only built on the slow path, when the request has to queue).
pub(crate) type SlotWait =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// What the queue says to an arriving request.
pub(crate) enum Admission {
    /// A slot was free.
    Admitted(OwnedSemaphorePermit),
    /// The request waits; dropping the [`QueueTicket`] leaves the line.
    Wait(SlotWait, QueueTicket),
    /// Slots and line are full: reject.
    Full,
}

/// A place in the waiting line; leaving it (admitted or cancelled) frees the place.
#[derive(Debug)]
pub(crate) struct QueueTicket {
    queue: Arc<AdmissionQueue>,
    /// `infer.server.queue.size`, decremented when the ticket goes.
    size: UpDownCounter<i64>,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
        self.size.add(-1, &[]);
    }
}

impl AdmissionQueue {
    pub(crate) fn new(config: AdmissionConfig) -> Self {
        let slots = config.max_concurrent.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(slots)),
            waiting: AtomicUsize::new(0),
            config,
        }
    }

    pub(crate) fn config(&self) -> AdmissionConfig {
        self.config
    }

    /// Requests waiting for a slot right now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Admits, queues or rejects an arriving request.
    /// `size` is the `infer.server.queue.size` instrument, kept up to date while a request waits.
    pub(crate) fn enter(self: &Arc<Self>, size: &UpDownCounter<i64>) -> Admission {
        // tokio's semaphore is fair: `try_acquire` fails while anyone waits, so no barging.
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Admission::Admitted(permit);
        }
        let joined = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < self.config.max_queue).then_some(w + 1)
            });
        if joined.is_err() {
            return Admission::Full;
        }
        size.add(1, &[]);
        let ticket = QueueTicket {
            queue: Arc::clone(self),
            size: size.clone(),
        };
        Admission::Wait(Box::pin(self.permits.clone().acquire_owned()), ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider;

    fn gauge() -> UpDownCounter<i64> {
        opentelemetry::metrics::noop::NoopMeterProvider::new()
            .meter("test")
            .i64_up_down_counter("q")
            .build()
    }

    #[tokio::test]
    async fn admits_queues_then_rejects() {
        let q = Arc::new(AdmissionQueue::new(AdmissionConfig::new(1, 1)));
        let g = gauge();
        let Admission::Admitted(first) = q.enter(&g) else {
            panic!("first request must be admitted")
        };
        let Admission::Wait(wait, ticket) = q.enter(&g) else {
            panic!("second request must queue")
        };
        assert_eq!(q.waiting(), 1);
        assert!(matches!(q.enter(&g), Admission::Full));
        drop(first);
        let permit = wait.await.unwrap();
        drop(ticket);
        assert_eq!(q.waiting(), 0);
        assert!(matches!(q.enter(&g), Admission::Wait(..)));
        drop(permit);
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_the_line() {
        let q = Arc::new(AdmissionQueue::new(AdmissionConfig::new(1, 1)));
        let g = gauge();
        let Admission::Admitted(_first) = q.enter(&g) else {
            panic!("first request must be admitted")
        };
        let waiter = q.enter(&g);
        assert_eq!(q.waiting(), 1);
        drop(waiter);
        assert_eq!(q.waiting(), 0);
        assert!(matches!(q.enter(&g), Admission::Wait(..)));
    }
}
