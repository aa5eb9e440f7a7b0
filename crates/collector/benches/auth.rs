//! Per-request cost of the bearer-token check on the ingest path:
//! - `check_3_tokens_ok` / `check_100_tokens_ok`: an accepted `Authorization: Bearer` header
//!   against 3 and 100 configured tokens (one SHA-256 of the token, then a constant-time
//!   comparison with every digest, under an uncontended read lock);
//! - `check_3_tokens_refused`: an unknown token (the same work, plus the refusal counter; the
//!   rate-limited log stays quiet after its first line).
//!
//! With no token configured the receivers hold `None` and skip the check: one branch.
//!
//! `cargo bench -p infertrace-collector --bench auth`

use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderValue;
use infertrace_collector::auth::{Authenticator, Scope, TokenSet};
use infertrace_collector::internal_events::InternalEvents;

fn authenticator(n: usize) -> Authenticator {
    let text: String = (0..n)
        .map(|i| format!("ingest,read token-{i:04}-0123456789abcdef0123456789abcdef\n"))
        .collect();
    let tokens = TokenSet::parse(&text, "bench", false).expect("tokens parse");
    Authenticator::from_tokens(tokens, InternalEvents::default())
}

fn bench(c: &mut Criterion) {
    let ok = HeaderValue::from_static("Bearer token-0001-0123456789abcdef0123456789abcdef");
    let bad = HeaderValue::from_static("Bearer token-9999-0123456789abcdef0123456789abcdef");
    for n in [3, 100] {
        let auth = authenticator(n);
        c.bench_function(&format!("check_{n}_tokens_ok"), |b| {
            b.iter(|| auth.check("otlp_http", Some(std::hint::black_box(&ok)), Scope::Ingest))
        });
    }
    let auth = authenticator(3);
    c.bench_function("check_3_tokens_refused", |b| {
        b.iter(|| auth.check("otlp_http", Some(std::hint::black_box(&bad)), Scope::Ingest))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
