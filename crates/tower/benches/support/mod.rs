//! What the layer's benchmarks share (`layer_overhead`, `layer_callgrind`): the request they
//! serve, the engine that answers it, the streamed response body, one request served and
//! drained, and the local OTLP/HTTP receiver they export to, run in a child process.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use infertrace_tower::RequestRecorder;
use tower::Service;

/// A response body of `n` chunks, each its own frame.
pub struct Chunks {
    /// Chunks still to send.
    pub left: usize,
}

/// One SSE chunk.
pub static CHUNK: Bytes =
    Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n");

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(CHUNK.clone()))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// `POST /v1/chat/completions` with host, user agent and content type, as a client sends it.
pub fn request() -> Request<Full<Bytes>> {
    Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("host", "localhost:8080")
        .header("user-agent", "bench/1.0")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap_or_default()
}

/// The inner service: marks the engine phases when a recorder is there, answers at once with
/// `chunks` SSE chunks.
#[derive(Clone, Copy)]
pub struct Engine {
    /// Chunks in each response.
    pub chunks: usize,
}

impl<B> Service<Request<B>> for Engine {
    type Response = Response<Chunks>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Chunks>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if let Some(rec) = req.extensions().get::<RequestRecorder>() {
            rec.scheduled();
            rec.tokens(1);
            rec.tokens(self.chunks.max(2) as u64 - 1);
            rec.usage(128, self.chunks.max(2) as u64);
            rec.finish("stop");
        }
        let mut r = Response::new(Chunks { left: self.chunks });
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("text/event-stream"),
        );
        ready(Ok(r))
    }
}

/// One request through `svc`, polled to completion on this thread, body drained.
pub fn one<S, B>(svc: &mut S)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    B: Body,
{
    let mut cx = Context::from_waker(Waker::noop());
    let _ = svc.poll_ready(&mut cx);
    let mut call = pin!(svc.call(request()));
    let response = loop {
        if let Poll::Ready(r) = call.as_mut().poll(&mut cx) {
            break r;
        }
    };
    let Ok(response) = response else {
        return;
    };
    let mut body = pin!(response.into_body());
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        black_box(&frame);
    }
}

/// Set in the child process that plays the local OTLP/HTTP receiver.
pub const RECEIVER_ENV: &str = "INFERTRACE_BENCH_RECEIVER";

/// The receiver: answers every request with `200 OK` and an empty body, reading (not decoding)
/// what it is sent. Prints its address, then serves until killed.
pub fn run_receiver() {
    use std::io::{BufRead, BufReader, Read, Write};
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else {
        return;
    };
    let Ok(address) = listener.local_addr() else {
        return;
    };
    println!("{address}");
    let _ = std::io::stdout().flush();
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let Ok(mut writer) = stream.try_clone() else {
                return;
            };
            let mut reader = BufReader::new(stream);
            loop {
                let mut length = 0usize;
                let mut line = String::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    if line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                if writer.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            }
        });
    }
}

/// Starts the receiver in a child process (this binary again), before any pinning, so its
/// CPU time is not the benchmark's. Returns the child and its base URL.
pub fn start_receiver() -> Option<(std::process::Child, String)> {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(std::env::current_exe().ok()?)
        .env(RECEIVER_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take()?)
        .read_line(&mut line)
        .ok()?;
    Some((child, format!("http://{}", line.trim())))
}
