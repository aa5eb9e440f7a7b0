//! `otlp-null-receiver`: the baseline for receiver benchmarks.
//!
//! `--decoder prost` (default): a tonic gRPC `TraceService` and a hyper HTTP `/v1/traces` that
//! decode every request with prost into `opentelemetry-proto`'s types and drop it — what a
//! generic Rust OTLP receiver does before any processing. `--decoder lean`: infertrace's own
//! receivers ([`serve_grpc`], [`serve_http`]) with an `Ingest` that only counts, to compare the
//! receive path alone. TCP_NODELAY is set on every accepted socket and the HTTP/2 windows are the
//! collector's in both modes. Prints the
//! spans it received once a second while any arrive; with `--decoder prost`, `GET /spans` on
//! the HTTP address answers the count so far. Stops on Ctrl-C.
//!
//! ```text
//! otlp-null-receiver [--decoder prost|lean] [--grpc 127.0.0.1:4317] [--http 127.0.0.1:4318]
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use infertrace_collector::listener::{H2_CONNECTION_WINDOW, H2_MAX_FRAME, H2_STREAM_WINDOW};
use infertrace_collector::receiver::{ReceiverLimits, serve_grpc, serve_http};
use infertrace_collector::{Ingest, IngestBatch, IngestError, InternalEvents};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::net::TcpListener;

#[derive(Clone, Copy, PartialEq)]
enum Decoder {
    Prost,
    Lean,
}

struct Args {
    decoder: Decoder,
    grpc: SocketAddr,
    http: SocketAddr,
}

/// `--help`.
const HELP: &str = "\
otlp-null-receiver: the baseline of the ingest benchmarks. Receives OTLP traces over gRPC and
HTTP, decodes each request and drops it; prints the spans received once a second while any
arrive. Stops on Ctrl-C.

usage: otlp-null-receiver [OPTIONS]

  --decoder prost|lean   prost (default): tonic and hyper decoding with prost into
                         opentelemetry-proto's types, as a generic Rust receiver does
                         (GET /spans on the HTTP address answers the count so far);
                         lean: infertrace's own receivers with an ingest that only counts
  --grpc HOST:PORT       the OTLP/gRPC address (default 127.0.0.1:4317)
  --http HOST:PORT       the OTLP/HTTP address (default 127.0.0.1:4318)
  -h, --help             this text

Both modes use the collector's HTTP/2 windows. See scripts/bench-ingest.sh.
";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        decoder: Decoder::Prost,
        grpc: SocketAddr::from(([127, 0, 0, 1], 4317)),
        http: SocketAddr::from(([127, 0, 0, 1], 4318)),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--decoder" => {
                args.decoder = match value()?.as_str() {
                    "prost" => Decoder::Prost,
                    "lean" => Decoder::Lean,
                    other => return Err(format!("--decoder must be prost or lean, not {other}")),
                }
            }
            "--grpc" => args.grpc = value()?.parse().map_err(|e| format!("--grpc: {e}"))?,
            "--http" => args.http = value()?.parse().map_err(|e| format!("--http: {e}"))?,
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    Ok(args)
}

fn count_spans(req: &ExportTraceServiceRequest) -> u64 {
    req.resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len() as u64)
        .sum()
}

/// The prost gRPC service: decode (done by tonic + prost), count, drop.
struct NullTraceService {
    spans: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for NullTraceService {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.spans
            .fetch_add(count_spans(request.get_ref()), Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The prost HTTP handler: read, decode with prost, count, drop.
async fn null_http(
    spans: Arc<AtomicU64>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-protobuf"),
        );
        Ok(r)
    };
    if req.uri().path() == "/spans" {
        // The count so far, for benchmarks that sample it (scripts/bench-ingest.sh).
        let count = spans.load(Ordering::Relaxed).to_string().into_bytes();
        return reply(StatusCode::OK, count);
    }
    if req.uri().path() != "/v1/traces" {
        return reply(StatusCode::NOT_FOUND, Vec::new());
    }
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, Vec::new()),
    };
    match ExportTraceServiceRequest::decode(body) {
        Ok(decoded) => {
            spans.fetch_add(count_spans(&decoded), Ordering::Relaxed);
            reply(
                StatusCode::OK,
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
        Err(_) => reply(StatusCode::BAD_REQUEST, Vec::new()),
    }
}

async fn serve_prost_http(listener: TcpListener, spans: Arc<AtomicU64>) {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_frame_size(H2_MAX_FRAME);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let spans = spans.clone();
        let service = hyper::service::service_fn(move |req| null_http(spans.clone(), req));
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(conn);
    }
}

/// The lean mode's pipeline stand-in: counts spans and drops them.
struct CountingIngest {
    spans: Arc<AtomicU64>,
}

impl Ingest for CountingIngest {
    fn ingest(&self, batch: IngestBatch) -> Result<u64, IngestError> {
        self.spans
            .fetch_add(batch.spans.len() as u64, Ordering::Relaxed);
        Ok(0)
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e} (is something else using it?)"))
}

async fn run(args: Args) -> Result<(), String> {
    let spans = Arc::new(AtomicU64::new(0));
    let grpc = bind(args.grpc).await?;
    let http = bind(args.http).await?;
    let mode = match args.decoder {
        Decoder::Prost => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc);
            let service = TraceServiceServer::new(NullTraceService {
                spans: spans.clone(),
            });
            tokio::spawn(
                // The collector's HTTP/2 windows, so that flow control favours neither.
                tonic::transport::Server::builder()
                    .tcp_nodelay(true)
                    .initial_stream_window_size(H2_STREAM_WINDOW)
                    .initial_connection_window_size(H2_CONNECTION_WINDOW)
                    .max_frame_size(H2_MAX_FRAME)
                    .add_service(service)
                    .serve_with_incoming(tokio_stream::StreamExt::map(incoming, |s| {
                        s.inspect(|s| {
                            let _ = s.set_nodelay(true);
                        })
                    })),
            );
            tokio::spawn(serve_prost_http(http, spans.clone()));
            "prost"
        }
        Decoder::Lean => {
            let ingest: Arc<dyn Ingest> = Arc::new(CountingIngest {
                spans: spans.clone(),
            });
            let events = InternalEvents::default();
            let never = std::future::pending::<()>;
            tokio::spawn(serve_grpc(
                grpc,
                ingest.clone(),
                events.clone(),
                ReceiverLimits::default(),
                never(),
            ));
            tokio::spawn(serve_http(
                http,
                ingest,
                events,
                ReceiverLimits::default(),
                never(),
            ));
            "lean"
        }
    };
    eprintln!(
        "otlp-null-receiver ({mode}): gRPC on {}, HTTP on {}; Ctrl-C to stop",
        args.grpc, args.http
    );
    let mut last = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = spans.load(Ordering::Relaxed);
                if now != last {
                    eprintln!("spans received: {now} (+{}/s)", now - last);
                    last = now;
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    println!("spans_received={}", spans.load(Ordering::Relaxed));
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("otlp-null-receiver: {message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("otlp-null-receiver: {message}");
            ExitCode::FAILURE
        }
    }
}

/// mimalloc: the decoder and the pipeline allocate many small strings and vectors, which glibc's
/// malloc handles markedly slower (measured in docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
