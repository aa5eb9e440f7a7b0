//! The one connection-serving loop of every listener (OTLP/gRPC, OTLP/HTTP, API): hyper's auto
//! builder (HTTP/1.1 and HTTP/2) over plain TCP or TLS, with a limit on open connections, an idle
//! timeout, a header read timeout, HTTP/2 keep-alive pings and a shutdown deadline.
//!
//! What [`serve`] enforces, per listener ([`ListenerSettings`], from
//! [`ConnectionsConfig`] and [`TlsConfig`](crate::config::TlsConfig)):
//! - **connection limit**: at most `max` connections open; a further connection is closed as soon
//!   as it is accepted (`infertrace_connections_refused_total{listener}`). The open ones are in
//!   the gauge `infertrace_connections_open{listener}`.
//! - **header read timeout**: a client must finish the TLS handshake and send its first complete
//!   request head within `header_read_timeout` of connecting (for HTTP/2: the preface, SETTINGS
//!   and a request's HEADERS); on HTTP/1 hyper applies the same timeout to the head of every
//!   later request on the connection, which also bounds how long an HTTP/1 keep-alive
//!   connection may wait between requests.
//! - **idle timeout**: a connection with no request in flight (a request is in flight from its
//!   head until its response body has been sent) for `idle_timeout` is closed. Only requests
//!   count as activity, so HTTP/2 pings and stray bytes do not keep a connection open.
//! - **send timeout**: a connection whose answered requests' responses have waited for
//!   `idle_timeout` with none of them sent (a client that leaves its HTTP/2 window at 0, or does
//!   not read its socket) is cut (reason `send_timeout`): the request body's read is bounded by
//!   the receivers' `body_read_timeout` and the handlers are short, so only an answer the
//!   client does not take could hold a connection for longer.
//! - **HTTP/1 read buffer** of at most [`H1_MAX_BUF`] (128 KiB; the API's
//!   [`API_H1_MAX_BUF`], 16 KiB) a connection: a request head must fit in it (HTTP/2 heads:
//!   16 KiB), so half-sent heads hold at most that per connection.
//! - **HTTP/2 keep-alive**: a ping every `http2_keepalive_interval`; a connection whose ping is
//!   not answered within `http2_keepalive_timeout` is closed (dead peers, half-open TCP).
//! - **shutdown**: when the `shutdown` future resolves with a deadline, the listener stops
//!   accepting, every connection is asked to finish (HTTP/1: no keep-alive; HTTP/2: GOAWAY), and
//!   at the deadline every connection still open is cut
//!   (`infertrace_connections_closed_total{reason="shutdown"}`). [`serve`] returns then.
//!
//! - **refused clients let go**: a response carrying [`CloseConnection`] (the receivers and the
//!   API put it on authentication and Host refusals) closes its HTTP/1 connection once sent (no
//!   keep-alive), and on HTTP/2 is no activity (the idle timeout closes a connection whose
//!   requests are all refused), so a client without a valid token cannot hold a connection
//!   slot by sending refused requests.
//!
//! Closes are counted in `infertrace_connections_closed_total{listener,reason}` with reason
//! `idle_timeout`, `header_timeout`, `send_timeout`, `keepalive_timeout` (an HTTP/2 ping went unanswered),
//! `tls_handshake` (failed or timed-out handshakes, including mutual-TLS clients without an
//! accepted certificate), `refused` (after a [`CloseConnection`] answer) or `shutdown`.
//!
//! The service is any hyper service (the receivers' `service_fn`s, or an axum `Router` through
//! [`hyper_util::service::TowerToHyperService`]); request-level checks (authentication and the
//! like) belong in the service, which sees every request, and need nothing from this loop.

use std::error::Error as StdError;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::config::ConnectionsConfig;
use crate::internal_events::InternalEvents;
use crate::server_tls::ServerTls;

/// The largest read buffer of an HTTP/1 connection by default (OTLP/HTTP): a request head must
/// fit in it, and a body is read in pieces of at most this size. hyper's default (~400 KiB)
/// let a client that sends half a head hold that much per connection, outside the memory
/// limit; bodies are read in more, smaller pieces for it (the cost: docs/PERFORMANCE.md).
/// HTTP/2 heads are bounded at 16 KiB by hyper's default.
pub const H1_MAX_BUF: usize = 128 * 1024;

/// The API's HTTP/1 read buffer: its requests are heads and small bodies.
pub const API_H1_MAX_BUF: usize = 16 * 1024;

/// HTTP/2 flow-control windows and frame size: large enough that a 16-connection client sending
/// ~300 KB requests is never stalled on window updates.
pub const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// The HTTP/2 connection window of every listener (see [`H2_STREAM_WINDOW`]).
pub const H2_CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;
/// The largest HTTP/2 frame every listener accepts (see [`H2_STREAM_WINDOW`]).
pub const H2_MAX_FRAME: u32 = 256 * 1024;

/// How long connections cut at the shutdown deadline get to let go of their tasks.
const CUT_GRACE: Duration = Duration::from_secs(1);

/// The `listener` label of the API's connection metrics.
pub const API_LISTENER: &str = "api";

/// How one listener serves its connections.
#[derive(Clone, Debug)]
pub struct ListenerSettings {
    /// The `listener` label of its metrics and log lines (`otlp_grpc`, `otlp_http`, `api`).
    pub name: &'static str,
    /// Connection limit and timeouts.
    pub connections: ConnectionsConfig,
    /// TLS, when the listener has `tls:`: each connection's handshake uses the configuration
    /// in force when it is accepted ([`ServerTls::current`]), so a reload on SIGHUP applies to
    /// new connections only.
    pub tls: Option<ServerTls>,
    /// Serve HTTP/2 only (gRPC); otherwise HTTP/1.1 and HTTP/2 (prior knowledge or ALPN).
    pub http2_only: bool,
    /// The HTTP/1 read buffer's limit ([`H1_MAX_BUF`] unless set).
    pub h1_max_buf: usize,
}

impl ListenerSettings {
    /// Settings named `name` with the default limits, no TLS, HTTP/1.1 and HTTP/2.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            connections: ConnectionsConfig::default(),
            tls: None,
            http2_only: false,
            h1_max_buf: H1_MAX_BUF,
        }
    }

    /// With this HTTP/1 read buffer limit (at least 8 KiB, hyper's minimum).
    pub fn with_h1_max_buf(mut self, bytes: usize) -> Self {
        self.h1_max_buf = bytes.max(8 * 1024);
        self
    }

    /// With these limits and timeouts.
    pub fn with_connections(mut self, connections: ConnectionsConfig) -> Self {
        self.connections = connections;
        self
    }

    /// With (or without) TLS.
    pub fn with_tls(mut self, tls: Option<ServerTls>) -> Self {
        self.tls = tls;
        self
    }

    /// HTTP/2 only.
    pub fn http2_only(mut self) -> Self {
        self.http2_only = true;
        self
    }
}

/// A future that resolves with `Instant::now() + grace` once `stop` resolves: the usual
/// `shutdown` argument of [`serve`].
pub async fn deadline_after(stop: impl Future<Output = ()>, grace: Duration) -> Instant {
    stop.await;
    Instant::now() + grace
}

type BoxError = Box<dyn StdError + Send + Sync>;

struct Shared<S> {
    name: &'static str,
    connections: ConnectionsConfig,
    tls: Option<ServerTls>,
    builder: auto::Builder<TokioExecutor>,
    service: S,
    events: InternalEvents,
    open: Gauge,
}

/// Serves `listener` with `service` until `shutdown` resolves with a deadline, then stops
/// accepting, lets in-flight requests finish until the deadline and cuts what is left; see the
/// [module documentation](self).
pub async fn serve<S, B>(
    listener: TcpListener,
    settings: ListenerSettings,
    events: InternalEvents,
    service: S,
    shutdown: impl Future<Output = Instant> + Send,
) -> std::io::Result<()>
where
    S: hyper::service::Service<::http::Request<Incoming>, Response = ::http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let c = &settings.connections;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(c.header_read_timeout)
        .max_buf_size(settings.h1_max_buf);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(c.http2_keepalive_interval)
        .keep_alive_timeout(c.http2_keepalive_timeout)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_frame_size(H2_MAX_FRAME);
    let builder = if settings.http2_only {
        builder.http2_only()
    } else {
        builder
    };
    let max = c.max.clamp(1, Semaphore::MAX_PERMITS);
    let shared = Arc::new(Shared {
        name: settings.name,
        connections: settings.connections.clone(),
        tls: settings.tls.clone(),
        builder,
        service,
        open: events.connections_open_gauge(settings.name),
        events,
    });
    let permits = Arc::new(Semaphore::new(max));
    let (drain_tx, drain_rx) = watch::channel(false);
    let (cut_tx, cut_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let deadline = loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            deadline = &mut shutdown => break deadline,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                shared.events.accept_failed(shared.name, &error);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            shared.events.connection_refused(shared.name, max);
            drop(stream);
            continue;
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        tokio::spawn(connection(
            stream,
            peer,
            shared.clone(),
            permit,
            drain_rx.clone(),
            cut_rx.clone(),
        ));
    };
    drop(listener);
    let _ = drain_tx.send(true);
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout_at(deadline.into(), permits.acquire_many(all)).await;
    if drained.is_err() {
        let open = max - permits.available_permits();
        tracing::warn!(
            listener = shared.name,
            open,
            "shutdown deadline reached: cutting the connections still open (shutdown_timeout)"
        );
        let _ = cut_tx.send(true);
        let _ = tokio::time::timeout(CUT_GRACE, permits.acquire_many(all)).await;
    }
    Ok(())
}

/// Holds a connection's permit and its place in the open-connections gauge.
struct OpenConnection {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.open.dec();
    }
}

async fn connection<S, B>(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared<S>>,
    permit: OwnedSemaphorePermit,
    drain: watch::Receiver<bool>,
    mut cut: watch::Receiver<bool>,
) where
    S: hyper::service::Service<::http::Request<Incoming>, Response = ::http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    shared.open.inc();
    let _open = OpenConnection {
        _permit: permit,
        open: shared.open.clone(),
    };
    let accepted_at = Instant::now();
    let Some(tls) = &shared.tls else {
        serve_io(TokioIo::new(stream), peer, &shared, accepted_at, drain, cut).await;
        return;
    };
    // The configuration in force now (it may have been reloaded since the last connection).
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    let handshake = tokio::select! {
        r = tokio::time::timeout(shared.connections.header_read_timeout, acceptor.accept(stream)) => r,
        _ = cut.wait_for(|v| *v) => {
            shared.events.connection_closed(shared.name, "shutdown");
            return;
        }
    };
    match handshake {
        Ok(Ok(tls)) => serve_io(TokioIo::new(tls), peer, &shared, accepted_at, drain, cut).await,
        Ok(Err(error)) => {
            tracing::debug!(listener = shared.name, %error, "TLS handshake failed");
            shared
                .events
                .connection_closed(shared.name, "tls_handshake");
        }
        Err(_) => shared
            .events
            .connection_closed(shared.name, "tls_handshake"),
    }
}

async fn serve_io<I, S, B>(
    io: TokioIo<I>,
    peer: SocketAddr,
    shared: &Shared<S>,
    accepted_at: Instant,
    mut drain: watch::Receiver<bool>,
    mut cut: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<::http::Request<Incoming>, Response = ::http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let activity = Arc::new(Activity::new(accepted_at));
    let service = Tracked {
        inner: shared.service.clone(),
        activity: activity.clone(),
        peer: PeerAddr(peer),
    };
    let conn = shared.builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let c = &shared.connections;
    let mut draining = false;
    // Set once the idle timeout closed the connection gracefully: when to cut it if the
    // client has not let go by then.
    let mut closing_until: Option<Instant> = None;
    // Set when an answer refused the client: when to cut it whatever it does meanwhile.
    let mut cut_at: Option<Instant> = None;
    loop {
        let check = closing_until
            .unwrap_or_else(|| activity.next_check(c.header_read_timeout, c.idle_timeout));
        let next_check = cut_at.map_or(check, |at| at.min(check));
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    match timeout_reason(&*error, &activity) {
                        Some(reason) => shared.events.connection_closed(shared.name, reason),
                        None => tracing::debug!(
                            listener = shared.name,
                            %error,
                            "connection ended with an error"
                        ),
                    }
                }
                return;
            }
            _ = drain.wait_for(|v| *v), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            () = activity.close.notified(), if cut_at.is_none() => {
                shared.events.connection_closed(shared.name, "refused");
                // A client that keeps sending regardless is cut after a grace for the answer
                // and the body read past.
                cut_at = Some(Instant::now() + REFUSED_CUT_AFTER);
                if !draining {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = cut.wait_for(|v| *v) => {
                shared.events.connection_closed(shared.name, "shutdown");
                return;
            }
            () = tokio::time::sleep_until(next_check.into()) => {
                if cut_at.is_some_and(|at| Instant::now() >= at) {
                    return;
                }
                if closing_until.take().is_some() {
                    if activity.in_flight.load(Ordering::Acquire) == 0 {
                        // Idle, told to go, and still open: cut.
                        return;
                    }
                    // A request came in before the client saw the GOAWAY: hyper's graceful
                    // close ends the connection once it is answered.
                    continue;
                }
                match activity.expired(c.header_read_timeout, c.idle_timeout) {
                    // Idle: closed gracefully (an HTTP/2 client gets a GOAWAY and opens a new
                    // connection for its next export rather than meeting a reset).
                    Some(reason @ "idle_timeout") => {
                        if !draining {
                            shared.events.connection_closed(shared.name, reason);
                            draining = true;
                            conn.as_mut().graceful_shutdown();
                        }
                        closing_until = Some(Instant::now() + IDLE_CLOSE_GRACE);
                    }
                    // A head not sent in time, or an answer the client does not take (an
                    // HTTP/2 window left at 0, a socket not read, which would hold the
                    // connection for ever): cut.
                    Some(reason) => {
                        shared.events.connection_closed(shared.name, reason);
                        return;
                    }
                    None => continue,
                }
            }
        }
    }
}

/// How long an idle connection closed gracefully (HTTP/2 GOAWAY) may take to let go before it
/// is cut.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long a connection closed after a refusal ([`CloseConnection`]) may stay open, whatever
/// it does meanwhile: time to send the answer and read past an unneeded body.
const REFUSED_CUT_AFTER: Duration = Duration::from_secs(5);

/// The close reason of a connection that hyper ended with `error`, when it was a timeout:
/// `keepalive_timeout` (an HTTP/2 ping went unanswered) or `header_timeout` (HTTP/1 head) —
/// `idle_timeout` when the head timeout ran between requests: hyper runs it while a kept-alive
/// HTTP/1 connection waits for its next request (an exporter's idle connection).
fn timeout_reason(error: &(dyn StdError + 'static), activity: &Activity) -> Option<&'static str> {
    let hyper_error = error.downcast_ref::<hyper::Error>()?;
    // hyper exposes no kind for the keep-alive timeout; its cause says it.
    let mut source = hyper_error.source();
    while let Some(cause) = source {
        if cause.to_string() == "keep-alive timed out" {
            return Some("keepalive_timeout");
        }
        source = cause.source();
    }
    match hyper_error.is_timeout() {
        false => None,
        true if activity.between_requests() => Some("idle_timeout"),
        true => Some("header_timeout"),
    }
}

/// What a connection is doing, for the idle, first-request and send timeouts.
struct Activity {
    start: Instant,
    /// Requests whose response body has not been sent yet.
    in_flight: AtomicUsize,
    /// Of those, the ones already answered (their response is being sent).
    answering: AtomicUsize,
    /// Since when answers are waiting with none sent, in milliseconds after `start`: set when
    /// the first answer starts waiting, and at every answer sent while others wait.
    waiting_since_ms: AtomicU64,
    /// Whether any request head arrived.
    started: AtomicBool,
    /// When the last request ended, in milliseconds after `start`.
    last_end_ms: AtomicU64,
    /// Told when an answer asks for its connection to be closed ([`CloseConnection`]).
    close: tokio::sync::Notify,
}

impl Activity {
    fn new(start: Instant) -> Self {
        Self {
            start,
            in_flight: AtomicUsize::new(0),
            answering: AtomicUsize::new(0),
            waiting_since_ms: AtomicU64::new(0),
            started: AtomicBool::new(false),
            last_end_ms: AtomicU64::new(0),
            close: tokio::sync::Notify::new(),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.started.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            activity: self.clone(),
            answering: false,
            refused: false,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the connection has served a request and holds none now.
    fn between_requests(&self) -> bool {
        self.started.load(Ordering::Relaxed) && self.in_flight.load(Ordering::Acquire) == 0
    }

    fn waiting_since(&self) -> Instant {
        self.start + Duration::from_millis(self.waiting_since_ms.load(Ordering::Relaxed))
    }

    fn last_end(&self) -> Instant {
        self.start + Duration::from_millis(self.last_end_ms.load(Ordering::Relaxed))
    }

    /// When to look again.
    fn next_check(&self, header: Duration, idle: Duration) -> Instant {
        let now = Instant::now();
        if !self.started.load(Ordering::Relaxed) {
            return (self.start + header.min(idle)).max(now);
        }
        if self.answering.load(Ordering::Acquire) > 0 {
            return (self.waiting_since() + idle).max(now);
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return now + idle;
        }
        (self.last_end() + idle).max(now)
    }

    /// Why the connection should be closed now, if it should.
    fn expired(&self, header: Duration, idle: Duration) -> Option<&'static str> {
        let now = Instant::now();
        if !self.started.load(Ordering::Relaxed) {
            if now >= self.start + header {
                return Some("header_timeout");
            }
            if now >= self.start + idle {
                return Some("idle_timeout");
            }
            return None;
        }
        if self.answering.load(Ordering::Acquire) > 0 && now >= self.waiting_since() + idle {
            return Some("send_timeout");
        }
        if self.in_flight.load(Ordering::Acquire) == 0 && now >= self.last_end() + idle {
            return Some("idle_timeout");
        }
        None
    }
}

/// One request in flight; its end is recorded when dropped (with the response body).
struct InFlight {
    activity: Arc<Activity>,
    /// Answered: its response is being sent.
    answering: bool,
    /// Refused ([`CloseConnection`] on HTTP/2): its end is no activity.
    refused: bool,
}

impl InFlight {
    /// The request is answered: from now its response waits for the client to take it.
    fn answered(&mut self) {
        let a = &self.activity;
        // The time first: a check between the two sees no answer waiting, rather than one
        // waiting since an old time.
        let now = a.now_ms();
        if a.answering.load(Ordering::Acquire) == 0 {
            a.waiting_since_ms.store(now, Ordering::Relaxed);
        }
        a.answering.fetch_add(1, Ordering::AcqRel);
        self.answering = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.activity;
        let ms = a.now_ms();
        if self.answering {
            // An answer sent: the client takes answers; the others wait from now.
            a.waiting_since_ms.store(ms, Ordering::Relaxed);
            a.answering.fetch_sub(1, Ordering::AcqRel);
        }
        if !self.refused {
            a.last_end_ms.fetch_max(ms, Ordering::Relaxed);
        }
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response extension: close the HTTP/1 connection this response goes out on once it is sent
/// (no keep-alive; counted as `infertrace_connections_closed_total{reason="refused"}`); on
/// HTTP/2 the request counts as no activity instead (a GOAWAY would fail the client's other
/// streams), so the idle timeout closes a connection whose requests are all refused. Put on
/// authentication and Host refusals, so that a client without a valid token cannot hold a
/// connection slot with refused requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloseConnection;

/// The peer address of the connection a request came on, in every request's extensions (the
/// receivers attribute a request's memory to it when authentication is off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The service of one connection: counts its requests in flight and tells each request its
/// peer address ([`PeerAddr`]).
#[derive(Clone)]
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    peer: PeerAddr,
}

impl<S, B> hyper::service::Service<::http::Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<::http::Request<Incoming>, Response = ::http::Response<B>>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
{
    type Response = ::http::Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, mut req: ::http::Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.peer);
        let in_flight = Some(self.activity.begin());
        let http2 = req.version() == ::http::Version::HTTP_2;
        let head = req.method() == ::http::Method::HEAD;
        TrackedFuture {
            inner: self.inner.call(req),
            in_flight,
            http2,
            head,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of a [`Tracked`] service: hands the request's [`InFlight`] on to
    /// the response body (or drops it with the future).
    struct TrackedFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
        http2: bool,
        head: bool,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<::http::Response<B>, E>>,
{
    type Output = Result<::http::Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let mut in_flight = this.in_flight.take();
        if let Some(f) = &mut in_flight {
            f.answered();
            if response.extensions().get::<CloseConnection>().is_some() {
                if *this.http2 {
                    // Not closed: a GOAWAY fails the client's other streams (tonic reports
                    // them as errors); the idle timeout closes a connection of refusals.
                    f.refused = true;
                } else {
                    // A permit is kept if the connection's loop is not waiting right now.
                    f.activity.close.notify_one();
                }
            }
        }
        let head = *this.head;
        Poll::Ready(Ok(response.map(|inner| TrackedBody {
            inner,
            head,
            _in_flight: in_flight,
        })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request in flight until it is sent (or dropped). The
    /// answer to a `HEAD` sends none of it: hyper leaves that out on HTTP/1 only, and HTTP/2
    /// clients take DATA on a `HEAD` answer as a protocol error (axum strips it on matched
    /// routes only, not on refusals and fallbacks).
    struct TrackedBody<B> {
        #[pin]
        inner: B,
        head: bool,
        _in_flight: Option<InFlight>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if *this.head {
            return Poll::Ready(None);
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
