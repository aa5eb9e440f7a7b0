//! Bearer-token authentication of the receivers and the API, and the API port's Host allowlist.
//!
//! **Scopes.** A token carries one or more scopes: `ingest` (the OTLP receivers: HTTP
//! `Authorization: Bearer <token>`, gRPC `authorization` metadata), `read` (the JSON API under
//! `/api`, which the dashboard reads) and `metrics` (`/metrics`). `/health`, the dashboard's
//! page and its static files stay open (probes; the page holds no data and asks for a token).
//!
//! **Tokens** come from a file (`auth.tokens_file`) and/or an environment variable
//! (`auth.tokens_env`, default `INFERTRACE_TOKENS`), one entry per line (the variable also takes
//! `;` between entries):
//!
//! ```text
//! # scopes (comma-separated: ingest, read, metrics, all)   token (≥ 16 characters)
//! ingest            4f1c0d3e9a8b7c6d5e4f3a2b1c0d9e8f
//! read,metrics      c2d4e6f8a0b1c3d5e7f9a1b2c3d4e5f6
//! ```
//!
//! A token is 16 or more characters of `A-Z a-z 0-9 - . _ ~ + /` (RFC 6750's `b64token`, so
//! `openssl rand -hex 32` or `-base64 32` output fits). A malformed entry stops the start (or
//! the reload) with the file and line; the token itself is never printed or logged.
//!
//! **Checks.** Only SHA-256 digests of the tokens are held in memory. A presented token is
//! hashed once and compared with every digest in constant time (`subtle`), all of them, so the
//! time taken says nothing about which token, or how much of one, matched. With no token
//! configured [`Authenticator::from_config`] returns `None` and the receivers skip the check
//! entirely (one `Option` test per request, nothing allocated); with tokens, a check costs one
//! SHA-256 of the token and an uncontended read lock, and allocates nothing.
//!
//! **Answers.** No or unknown token: HTTP 401 with `WWW-Authenticate: Bearer …`, gRPC
//! `UNAUTHENTICATED`; a known token without the scope: HTTP 403, gRPC `PERMISSION_DENIED`.
//! Every refusal is counted in `infertrace_auth_failures_total{listener,reason}` and logged at
//! warn level, at most one line per 10 s for all refusals together, naming the latest reason
//! and how many since the last line ([`InternalEvents::auth_refused`]).
//!
//! **Reload.** [`Authenticator::reload`] (called on SIGHUP by `infertrace collect`) re-reads
//! the sources; a reload that fails keeps the previous tokens. Each reload is counted in
//! `infertrace_reloads_total{what="tokens",outcome}` (`ok` or `failed`).
//!
//! **Host allowlist** ([`HostAllowlist`], `api.allowed_hosts`): a browser page on another
//! origin can make its own name resolve to this machine (DNS rebinding) and then read an open
//! API as "same origin"; its requests carry the attacker's name in `Host`. The API port answers
//! only the configured names (default `localhost`, `127.0.0.1`, `::1`, plus the listen address)
//! and refuses others with 421 Misdirected Request. A `Host` that is an IP address is always
//! allowed: rebinding needs a name the attacker controls, and a page can only send an IP as
//! `Host` by addressing that IP itself, which is then its own origin, not the attacker's. So
//! Kubernetes probes and Prometheus scraping pod IPs need no configuration.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::Extension;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, HOST, WWW_AUTHENTICATE};
use http::{HeaderValue, StatusCode};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::config::{AuthConfig, CollectorConfig};
use crate::internal_events::InternalEvents;
use crate::listener::CloseConnection;

/// The `listener` label of refusals on the API port.
pub const API_LISTENER: &str = "api";

/// Shortest token accepted, in characters.
pub const MIN_TOKEN_LEN: usize = 16;

/// What a token allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Send OTLP traces to the receivers.
    Ingest,
    /// Read the JSON API under `/api` (the dashboard's data).
    Read,
    /// Scrape `/metrics`.
    Metrics,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 3] = [Scope::Ingest, Scope::Read, Scope::Metrics];

    const fn bit(self) -> u8 {
        match self {
            Self::Ingest => 1,
            Self::Read => 2,
            Self::Metrics => 4,
        }
    }

    /// The scope's name in token files.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ingest => "ingest",
            Self::Read => "read",
            Self::Metrics => "metrics",
        }
    }

    /// The bits of a scope name (`all`: every scope).
    fn parse(name: &str) -> Option<u8> {
        match name {
            "ingest" => Some(Self::Ingest.bit()),
            "read" => Some(Self::Read.bit()),
            "metrics" => Some(Self::Metrics.bit()),
            "all" => Some(Self::ALL.iter().fold(0, |b, s| b | s.bit())),
            _ => None,
        }
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` token (HTTP 401, gRPC `UNAUTHENTICATED`).
    MissingToken,
    /// A token that is not configured (HTTP 401, gRPC `UNAUTHENTICATED`).
    UnknownToken,
    /// A known token without the scope asked for (HTTP 403, gRPC `PERMISSION_DENIED`).
    InsufficientScope,
}

impl Refusal {
    /// The `reason` label of `infertrace_auth_failures_total`.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::MissingToken => "missing_token",
            Self::UnknownToken => "unknown_token",
            Self::InsufficientScope => "insufficient_scope",
        }
    }

    /// The HTTP status, the `WWW-Authenticate` challenge (RFC 6750) and a message saying what
    /// to do, for a refusal of a request that needed `scope`.
    pub fn http_answer(self, scope: Scope) -> (StatusCode, HeaderValue, &'static str) {
        let (status, challenge, message) = match (self, scope) {
            (Self::MissingToken, s) => (
                StatusCode::UNAUTHORIZED,
                "Bearer realm=\"infertrace\"",
                match s {
                    Scope::Ingest => {
                        "authentication required: send `Authorization: Bearer <token>` with a token of scope `ingest` (OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>)"
                    }
                    Scope::Read => {
                        "authentication required: send `Authorization: Bearer <token>` with a token of scope `read`"
                    }
                    Scope::Metrics => {
                        "authentication required: send `Authorization: Bearer <token>` with a token of scope `metrics`"
                    }
                },
            ),
            (Self::UnknownToken, _) => (
                StatusCode::UNAUTHORIZED,
                "Bearer realm=\"infertrace\", error=\"invalid_token\"",
                "unknown bearer token: check the token against the collector's auth.tokens_file / INFERTRACE_TOKENS",
            ),
            (Self::InsufficientScope, Scope::Ingest) => (
                StatusCode::FORBIDDEN,
                "Bearer realm=\"infertrace\", error=\"insufficient_scope\", scope=\"ingest\"",
                "this token lacks the `ingest` scope needed to send traces",
            ),
            (Self::InsufficientScope, Scope::Read) => (
                StatusCode::FORBIDDEN,
                "Bearer realm=\"infertrace\", error=\"insufficient_scope\", scope=\"read\"",
                "this token lacks the `read` scope needed to read the API",
            ),
            (Self::InsufficientScope, Scope::Metrics) => (
                StatusCode::FORBIDDEN,
                "Bearer realm=\"infertrace\", error=\"insufficient_scope\", scope=\"metrics\"",
                "this token lacks the `metrics` scope needed to scrape /metrics",
            ),
        };
        (status, HeaderValue::from_static(challenge), message)
    }
}

/// A token file or variable that cannot be used; says where, never what the token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthError(pub String);

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AuthError {}

struct Entry {
    /// SHA-256 of the token, as four words (compared word-wise, in constant time).
    digest: [u64; 4],
    scopes: u8,
}

/// Parsed tokens: SHA-256 digests and their scopes (the tokens themselves are not kept).
#[derive(Default)]
pub struct TokenSet {
    entries: Vec<Entry>,
}

impl fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSet")
            .field("tokens", &self.entries.len())
            .finish()
    }
}

fn digest(token: &[u8]) -> [u64; 4] {
    let bytes: [u8; 32] = Sha256::digest(token).into();
    std::array::from_fn(|i| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_le_bytes(word)
    })
}

/// Fewest different characters a token must have (a random 16-character token has about 14;
/// `aaaaaaaaaaaaaaaa` or `0000…` are refused).
pub const MIN_TOKEN_DISTINCT: usize = 6;

fn distinct_bytes(t: &str) -> usize {
    let mut seen = [false; 256];
    t.bytes()
        .filter(|&b| !std::mem::replace(&mut seen[usize::from(b)], true))
        .count()
}

/// RFC 6750 `b64token`: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_b64token(t: &str) -> bool {
    let body = t.trim_end_matches('=');
    !body.is_empty()
        && body.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
}

/// The longest unknown scope name an error message quotes: anything longer may be a token.
const MAX_QUOTED_SCOPE_LEN: usize = 12;

impl TokenSet {
    /// Parses entries `scopes token` from `text`, one per line (and, when `semicolons`, also
    /// separated by `;`), `#` starting a comment. `origin` (a file name or `$VAR`) names the
    /// place in error messages, with the line or entry number.
    pub fn parse(text: &str, origin: &str, semicolons: bool) -> Result<Self, AuthError> {
        let mut set = Self::default();
        set.add(text, origin, semicolons)?;
        Ok(set)
    }

    fn add(&mut self, text: &str, origin: &str, semicolons: bool) -> Result<(), AuthError> {
        let separator = |c: char| c == '\n' || (semicolons && c == ';');
        for (i, raw) in text.split(separator).enumerate() {
            let at = if semicolons {
                format!("{origin}: entry {}", i + 1)
            } else {
                format!("{origin}:{}", i + 1)
            };
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(scopes), Some(token), None) = (words.next(), words.next(), words.next())
            else {
                return Err(AuthError(format!(
                    "{at}: expected `scope[,scope...] token` (two fields separated by spaces), e.g. `ingest 4f1c0d3e...`"
                )));
            };
            let mut bits = 0u8;
            for name in scopes.split(',') {
                bits |= Scope::parse(name).ok_or_else(|| {
                    // A long "scope" is most likely a token written first: never echo it.
                    let what = if name.len() <= MAX_QUOTED_SCOPE_LEN {
                        format!("unknown scope {name:?}")
                    } else {
                        "the first field is not a scope (is the token first?)".to_owned()
                    };
                    AuthError(format!(
                        "{at}: {what}: write `scope[,scope...] token`, scopes ingest, read, metrics or all"
                    ))
                })?;
            }
            if !is_b64token(token) {
                return Err(AuthError(format!(
                    "{at}: the token has characters a bearer token cannot carry: use A-Z a-z 0-9 - . _ ~ + / (e.g. `openssl rand -hex 32`)"
                )));
            }
            // `=` padding says nothing; a token of a few repeated characters is no secret.
            let body = token.trim_end_matches('=');
            if body.len() < MIN_TOKEN_LEN {
                return Err(AuthError(format!(
                    "{at}: the token is shorter than {MIN_TOKEN_LEN} characters (not counting `=` padding): use a random one, e.g. `openssl rand -hex 32`"
                )));
            }
            if distinct_bytes(body) < MIN_TOKEN_DISTINCT {
                return Err(AuthError(format!(
                    "{at}: the token repeats fewer than {MIN_TOKEN_DISTINCT} different characters: use a random one, e.g. `openssl rand -hex 32`"
                )));
            }
            let d = digest(token.as_bytes());
            if self.entries.iter().any(|e| e.digest == d) {
                return Err(AuthError(format!(
                    "{at}: this token is already listed: list each token once, with all its scopes"
                )));
            }
            self.entries.push(Entry {
                digest: d,
                scopes: bits,
            });
        }
        Ok(())
    }

    /// How many tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The scopes of the token whose digest is `d` (0 when unknown): every digest is compared,
    /// in constant time.
    fn scopes_of_digest(&self, d: &[u64; 4]) -> u8 {
        let mut scopes = 0u8;
        for e in &self.entries {
            // OR of the XORs is 0 exactly when all four words are equal; no early exit.
            let diff = (0..4).fold(0u64, |acc, i| acc | (e.digest[i] ^ d[i]));
            scopes |= u8::conditional_select(&0, &e.scopes, diff.ct_eq(&0));
        }
        scopes
    }

    /// Checks an `Authorization` header value for `scope`.
    pub fn verify(&self, authorization: Option<&HeaderValue>, scope: Scope) -> Result<(), Refusal> {
        self.verify_id(authorization, scope).map(|_| ())
    }

    /// As [`verify`](Self::verify), returning on success an id of the token: the first 8 bytes
    /// of its SHA-256 (what the memory limiter attributes a request to; not the token).
    pub fn verify_id(
        &self,
        authorization: Option<&HeaderValue>,
        scope: Scope,
    ) -> Result<u64, Refusal> {
        let token = authorization
            .and_then(bearer_token)
            .ok_or(Refusal::MissingToken)?;
        let d = digest(token);
        match self.scopes_of_digest(&d) {
            0 => Err(Refusal::UnknownToken),
            s if s & scope.bit() == 0 => Err(Refusal::InsufficientScope),
            _ => Ok(d[0]),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` value (scheme case-insensitive).
fn bearer_token(value: &HeaderValue) -> Option<&[u8]> {
    let v = value.as_bytes();
    let (scheme, rest) = v.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Where tokens come from.
#[derive(Clone, Debug)]
struct Sources {
    file: Option<PathBuf>,
    env: Option<String>,
}

impl Sources {
    /// Reads and parses every source; `Ok(None)` when none is configured (no file, variable
    /// unset or empty).
    fn load(&self) -> Result<Option<TokenSet>, AuthError> {
        let env_text = self
            .env
            .as_deref()
            .and_then(|var| std::env::var(var).ok().map(|v| (var, v)))
            .filter(|(_, v)| !v.trim().is_empty());
        if self.file.is_none() && env_text.is_none() {
            return Ok(None);
        }
        let mut set = TokenSet::default();
        let mut places = Vec::new();
        if let Some(path) = &self.file {
            let text = read_tokens_file(path)?;
            set.add(&text, &path.display().to_string(), false)?;
            places.push(path.display().to_string());
        }
        if let Some((var, text)) = env_text {
            set.add(&text, &format!("${var}"), true)?;
            places.push(format!("${var}"));
        }
        if set.is_empty() {
            let remove = match (&self.file, &self.env) {
                (None, Some(var)) => format!("unset {var}"),
                _ => "remove auth.tokens_file".to_owned(),
            };
            return Err(AuthError(format!(
                "{} holds no token: add lines `scope[,scope...] token` (see docs/deploy.md, \
                 Security), or {remove}",
                places.join(" and ")
            )));
        }
        Ok(Some(set))
    }
}

fn read_tokens_file(path: &Path) -> Result<String, AuthError> {
    std::fs::read_to_string(path).map_err(|e| {
        AuthError(format!(
            "cannot read the tokens file {} (auth.tokens_file or --tokens-file): {e}",
            path.display()
        ))
    })
}

struct Inner {
    sources: Sources,
    tokens: RwLock<TokenSet>,
    events: InternalEvents,
}

/// The bearer-token check the receivers and the API call; cheap to clone (shared state), and
/// reloadable ([`reload`](Self::reload)).
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("file", &self.inner.sources.file)
            .field("env", &self.inner.sources.env)
            .field("tokens", &self.token_count())
            .finish()
    }
}

impl Authenticator {
    /// Loads the tokens `config` names; `Ok(None)` when it names none (no file and the variable
    /// unset or empty: authentication is off). Refusals are counted in `events`.
    pub fn from_config(
        config: &AuthConfig,
        events: InternalEvents,
    ) -> Result<Option<Self>, AuthError> {
        let sources = Sources {
            file: config.tokens_file.clone(),
            env: config.tokens_env.clone(),
        };
        Ok(sources.load()?.map(|tokens| Self {
            inner: Arc::new(Inner {
                sources,
                tokens: RwLock::new(tokens),
                events,
            }),
        }))
    }

    /// An authenticator holding `tokens` (no source to reload from), for tests and embedding.
    pub fn from_tokens(tokens: TokenSet, events: InternalEvents) -> Self {
        Self {
            inner: Arc::new(Inner {
                sources: Sources {
                    file: None,
                    env: None,
                },
                tokens: RwLock::new(tokens),
                events,
            }),
        }
    }

    /// Re-reads the sources and swaps the tokens in, returning how many there are now. On any
    /// error the previous tokens stay in force.
    /// Counted in `infertrace_reloads_total{what="tokens",outcome}`.
    pub fn reload(&self) -> Result<usize, AuthError> {
        let result = self.load_and_swap();
        self.inner.events.reloaded("tokens", result.is_ok());
        result
    }

    fn load_and_swap(&self) -> Result<usize, AuthError> {
        let Some(tokens) = self.inner.sources.load()? else {
            return Err(AuthError(
                "no token source left (the variable is unset or empty and there is no file): keeping the previous tokens".into(),
            ));
        };
        let n = tokens.len();
        *self.inner.tokens.write().unwrap_or_else(|p| p.into_inner()) = tokens;
        Ok(n)
    }

    /// How many tokens are in force.
    pub fn token_count(&self) -> usize {
        self.inner
            .tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Checks an `Authorization` header value for `scope`; a refusal is counted and logged
    /// (rate-limited) under `listener`.
    pub fn check(
        &self,
        listener: &'static str,
        authorization: Option<&HeaderValue>,
        scope: Scope,
    ) -> Result<(), Refusal> {
        self.check_id(listener, authorization, scope).map(|_| ())
    }

    /// As [`check`](Self::check), returning on success the token's id
    /// ([`TokenSet::verify_id`]), which the receivers attribute a request's memory to.
    pub fn check_id(
        &self,
        listener: &'static str,
        authorization: Option<&HeaderValue>,
        scope: Scope,
    ) -> Result<u64, Refusal> {
        let result = self
            .inner
            .tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .verify_id(authorization, scope);
        if let Err(refusal) = &result {
            self.inner.events.auth_refused(listener, refusal.reason());
        }
        result
    }
}

/// The listeners that will be bound: (config key, address).
fn listeners(config: &CollectorConfig) -> Vec<(&'static str, SocketAddr)> {
    let r = &config.receivers;
    let mut v = Vec::with_capacity(3);
    if r.otlp_grpc.enabled {
        v.push(("receivers.otlp_grpc.endpoint", r.otlp_grpc.endpoint));
    }
    if r.otlp_http.enabled {
        v.push(("receivers.otlp_http.endpoint", r.otlp_http.endpoint));
    }
    v.push(("api.listen", config.api.listen));
    v
}

/// Refuses a start that would listen on a non-loopback address with no token configured
/// (unless `auth.insecure`), naming every such listener; with `insecure`, logs a warning per
/// such listener instead.
pub fn check_exposure(config: &CollectorConfig, authenticated: bool) -> Result<(), String> {
    if authenticated {
        return Ok(());
    }
    let exposed: Vec<(&str, SocketAddr)> = listeners(config)
        .into_iter()
        .filter(|(_, addr)| !addr.ip().is_loopback())
        .collect();
    if exposed.is_empty() {
        return Ok(());
    }
    if config.auth.insecure {
        for (key, addr) in exposed {
            let who = if key == "api.listen" {
                "can read the API, the dashboard and /metrics"
            } else {
                "can send traces"
            };
            tracing::warn!(
                listener = key,
                %addr,
                "INSECURE: listening on a non-loopback address with no authentication (auth.insecure: true): anyone who can reach {addr} {who}"
            );
        }
        return Ok(());
    }
    let listed: Vec<String> = exposed
        .iter()
        .map(|(key, addr)| format!("{addr} ({key})"))
        .collect();
    let variable = match &config.auth.tokens_env {
        Some(name) => format!(", or the {name} variable"),
        None => String::new(),
    };
    Err(format!(
        "refusing to listen on {} without authentication: configure tokens (auth.tokens_file, --tokens-file or INFERTRACE_TOKENS_FILE{variable}; see docs/deploy.md, Security), listen on 127.0.0.1, or set auth.insecure: true to accept anyone",
        listed.join(", ")
    ))
}

/// The host names the API port answers to (`api.allowed_hosts` plus the listen address).
#[derive(Clone, Debug)]
pub struct HostAllowlist {
    any: bool,
    names: Vec<String>,
}

impl HostAllowlist {
    /// From `api.allowed_hosts` (`*` allows any) and the listen address.
    pub fn new(configured: &[String], listen: SocketAddr) -> Self {
        let mut names: Vec<String> = configured
            .iter()
            .map(|h| {
                h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_ascii_lowercase()
            })
            .collect();
        names.push(listen.ip().to_string());
        Self {
            any: configured.iter().any(|h| h == "*"),
            names,
        }
    }

    /// Why a request's host is refused, if it is. The request must name its host once: by
    /// `Host`, by its URI's authority (HTTP/2's `:authority`, HTTP/1's absolute form), or both,
    /// and every name it gives must be allowed (an absolute-form URI is what HTTP/1 servers
    /// read, the `Host` what a proxy in front may read). `*` turns the check off.
    pub fn refused<'a>(
        &self,
        headers: &'a http::HeaderMap,
        uri: &'a http::Uri,
    ) -> Option<HostRefusal<'a>> {
        if self.any {
            return None;
        }
        let mut hosts = headers.get_all(HOST).iter();
        // A Host that is not visible ASCII is no allowed name either (rather than no Host).
        let host = hosts
            .next()
            .map(|h| h.to_str().unwrap_or("(not visible ASCII)"));
        if hosts.next().is_some() {
            return Some(HostRefusal::Malformed("several Host headers"));
        }
        let authority = uri.authority().map(|a| a.as_str());
        if host.is_none() && authority.is_none() {
            return Some(HostRefusal::Malformed("no Host header"));
        }
        [authority, host]
            .into_iter()
            .flatten()
            .find(|name| !self.allows(name))
            .map(HostRefusal::NotAllowed)
    }

    /// Whether a `Host` header value (or URI authority) is allowed: any IP address, or a listed
    /// name; the port is ignored.
    pub fn allows(&self, authority: &str) -> bool {
        if self.any {
            return true;
        }
        let Some(host) = host_of(authority) else {
            return false;
        };
        host.parse::<IpAddr>().is_ok() || self.names.iter().any(|n| n.eq_ignore_ascii_case(host))
    }
}

/// Why [`HostAllowlist::refused`] refuses a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HostRefusal<'a> {
    /// No host named, or `Host` given twice: a malformed request (400).
    Malformed(&'static str),
    /// A host not on the list (421 Misdirected Request).
    NotAllowed(&'a str),
}

impl HostRefusal<'_> {
    /// The HTTP status to answer.
    pub fn status(self) -> StatusCode {
        match self {
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::NotAllowed(_) => StatusCode::MISDIRECTED_REQUEST,
        }
    }

    /// The answer's message; `setting` names what lists the allowed hosts.
    pub fn message(self, setting: &str) -> String {
        match self {
            Self::Malformed(why) => format!("{why}: a request names its host once"),
            Self::NotAllowed(host) => format!(
                "the Host {host:?} is not served here: add it to {setting} (a guard against DNS \
                 rebinding)"
            ),
        }
    }
}

/// The host part of `host[:port]`, `[v6][:port]` or a bare IPv6 address, without a trailing
/// dot; `None` when what follows the host is not a port of digits (`localhost:abc`,
/// `127.0.0.1:9464.evil.example`, `[::1]x`), which no browser sends and no name matches.
fn host_of(authority: &str) -> Option<&str> {
    let port_ok = |port: Option<&str>| {
        port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    let host = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            after => Some(after.strip_prefix(':')?),
        };
        port_ok(port).then_some(host)?
    } else if authority.parse::<IpAddr>().is_ok() {
        authority
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        port_ok(port).then_some(host)?
    };
    Some(host.strip_suffix('.').unwrap_or(host))
}

/// The scope a path of the API port needs (`None`: open).
pub fn scope_of_path(path: &str) -> Option<Scope> {
    if path == "/metrics" {
        Some(Scope::Metrics)
    } else if path == "/api" || path.starts_with("/api/") {
        Some(Scope::Read)
    } else {
        None
    }
}

/// The state of [`guard_api`]: the Host allowlist and, when on, the token check.
#[derive(Clone, Debug)]
pub struct ApiGuard {
    /// Token check (`None`: authentication off).
    pub auth: Option<Authenticator>,
    /// The Host allowlist.
    pub hosts: HostAllowlist,
    /// Where refusals are counted.
    pub events: InternalEvents,
}

/// The API router's middleware (`axum::middleware::from_fn_with_state`): refuses a `Host`
/// that is not allowed (421), then a request without a token of the path's scope (401/403).
/// `/health` answers whatever the `Host`: it holds nothing a rebinding page could read, and
/// probes name the host as they please (the image's HEALTHCHECK says `localhost`, which a
/// user's own `allowed_hosts` may leave out).
pub async fn guard_api(State(guard): State<ApiGuard>, req: Request, next: Next) -> Response {
    if req.uri().path() != "/health"
        && let Some(refusal) = guard.hosts.refused(req.headers(), req.uri())
    {
        guard.events.auth_refused(API_LISTENER, "host_not_allowed");
        let message = refusal.message("api.allowed_hosts");
        return (
            refusal.status(),
            [(CACHE_CONTROL, HeaderValue::from_static("no-store"))],
            Extension(CloseConnection),
            axum::Json(serde_json::json!({ "error": message })),
        )
            .into_response();
    }
    if let (Some(auth), Some(scope)) = (&guard.auth, scope_of_path(req.uri().path()))
        && let Err(refusal) = auth.check(API_LISTENER, req.headers().get(AUTHORIZATION), scope)
    {
        let (status, challenge, message) = refusal.http_answer(scope);
        return (
            status,
            [
                (WWW_AUTHENTICATE, challenge),
                (CONTENT_TYPE, HeaderValue::from_static("application/json")),
                (CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ],
            Extension(CloseConnection),
            axum::Json(serde_json::json!({ "error": message })).into_response(),
        )
            .into_response();
    }
    let scoped = scope_of_path(req.uri().path()).is_some();
    let mut response = next.run(req).await;
    // KPIs, traces and metrics are read live and may be private: no cache keeps a copy.
    if scoped {
        response
            .headers_mut()
            .entry(CACHE_CONTROL)
            .or_insert(HeaderValue::from_static("no-store"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "token-a-0123456789";
    const B: &str = "token-b-9876543210";

    fn header(v: &str) -> HeaderValue {
        HeaderValue::from_str(v).unwrap()
    }

    #[test]
    fn parses_scopes_comments_and_checks_tokens() {
        let text = format!("# tokens\n\ningest {A}   # the senders\nread,metrics {B}\n");
        let set = TokenSet::parse(&text, "t", false).unwrap();
        assert_eq!(set.len(), 2);
        let a = header(&format!("Bearer {A}"));
        assert_eq!(set.verify(Some(&a), Scope::Ingest), Ok(()));
        assert_eq!(
            set.verify(Some(&a), Scope::Read),
            Err(Refusal::InsufficientScope)
        );
        let b = header(&format!("bearer  {B} "));
        assert_eq!(set.verify(Some(&b), Scope::Metrics), Ok(()));
        assert_eq!(set.verify(Some(&b), Scope::Read), Ok(()));
        assert_eq!(
            set.verify(Some(&header("Bearer cccccccccccccccccccc")), Scope::Read),
            Err(Refusal::UnknownToken)
        );
        assert_eq!(set.verify(None, Scope::Read), Err(Refusal::MissingToken));
        assert_eq!(
            set.verify(Some(&header(&format!("Basic {A}"))), Scope::Ingest),
            Err(Refusal::MissingToken)
        );
        assert_eq!(
            set.verify(Some(&header("Bearer ")), Scope::Ingest),
            Err(Refusal::MissingToken)
        );
        // A prefix of a token is not the token.
        assert_eq!(
            set.verify(
                Some(&header(&format!("Bearer {}", &A[..17]))),
                Scope::Ingest
            ),
            Err(Refusal::UnknownToken)
        );
        let all = TokenSet::parse(&format!("all {A}"), "t", false).unwrap();
        for s in Scope::ALL {
            assert_eq!(all.verify(Some(&a), s), Ok(()));
        }
    }

    #[test]
    fn malformed_entries_name_the_line_not_the_token() {
        let cases = [
            (format!("ingest {A}\nread\n"), "f:2:", "two fields"),
            (format!("ingest {A}\nwrite {B}\n"), "f:2:", "unknown scope"),
            (
                format!("ingest {A}\n{B} ingest\n"),
                "f:2:",
                "is the token first?",
            ),
            ("ingest short-token\n".to_owned(), "f:1:", "shorter than 16"),
            (
                "ingest a===============\n".to_owned(),
                "f:1:",
                "shorter than 16",
            ),
            (
                "all 0000000000000000\n".to_owned(),
                "f:1:",
                "fewer than 6 different",
            ),
            (format!("ingest {A}\"x\n"), "f:1:", "characters"),
            (format!("ingest {A}\nread {A}\n"), "f:2:", "already listed"),
            (format!("ingest {A} extra\n"), "f:1:", "two fields"),
        ];
        for (text, at, what) in cases {
            let e = TokenSet::parse(&text, "f", false).unwrap_err().0;
            assert!(e.starts_with(at) && e.contains(what), "{text:?}: {e}");
            assert!(!e.contains(A) && !e.contains(B), "token leaked: {e}");
        }
        let e = TokenSet::parse(&format!("ingest {A}; read x"), "$V", true)
            .unwrap_err()
            .0;
        assert!(e.starts_with("$V: entry 2:"), "{e}");
    }

    #[test]
    fn env_and_file_sources_load_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, format!("ingest {A}\n")).unwrap();
        let config = AuthConfig {
            tokens_file: Some(file.clone()),
            tokens_env: Some("INFERTRACE_TEST_TOKENS_UNSET_VARIABLE".into()),
            insecure: false,
        };
        let events = InternalEvents::default();
        let auth = Authenticator::from_config(&config, events.clone())
            .unwrap()
            .unwrap();
        let a = header(&format!("Bearer {A}"));
        let b = header(&format!("Bearer {B}"));
        assert_eq!(auth.check("otlp_http", Some(&a), Scope::Ingest), Ok(()));
        std::fs::write(&file, format!("all {B}\n")).unwrap();
        assert_eq!(auth.reload(), Ok(1));
        assert_eq!(
            auth.check("otlp_http", Some(&a), Scope::Ingest),
            Err(Refusal::UnknownToken)
        );
        assert_eq!(auth.check("otlp_http", Some(&b), Scope::Ingest), Ok(()));
        // A broken file keeps the tokens in force.
        std::fs::write(&file, "all\n").unwrap();
        let e = auth.reload().unwrap_err();
        assert!(e.0.contains(":1:"), "{e}");
        assert_eq!(auth.check("otlp_http", Some(&b), Scope::Ingest), Ok(()));
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(auth.reload().unwrap_err().0.contains("holds no token"));
        assert_eq!(events.auth_refusals("otlp_http", "unknown_token"), 1);
        // No source at all: authentication off.
        let off = AuthConfig {
            tokens_file: None,
            ..config
        };
        assert!(Authenticator::from_config(&off, events).unwrap().is_none());
    }

    #[test]
    fn hosts_ignore_port_case_and_brackets() {
        let hosts = HostAllowlist::new(
            &crate::config::default_allowed_hosts(),
            "10.1.2.3:9464".parse().unwrap(),
        );
        for ok in [
            "localhost",
            "LOCALHOST:9464",
            "localhost.:80",
            "127.0.0.1:9464",
            "[::1]:9464",
            "::1",
            "10.1.2.3:9464",
            // Any IP: a rebinding page sends its own name, never an IP.
            "10.9.9.9:9464",
            "[fd00::1]:9464",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9464",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "",
            // What follows the host must be a port of digits.
            "127.0.0.1:9464.evil.example",
            "localhost:abc",
            "localhost:",
            "localhost:80:80",
            "[::1]x",
            "[::1]:",
            "[::1",
        ] {
            assert!(!hosts.allows(bad), "{bad}");
        }
        let any = HostAllowlist::new(&["*".into()], "127.0.0.1:1".parse().unwrap());
        assert!(any.allows("evil.example"));
    }

    #[test]
    fn a_request_names_one_allowed_host_by_every_means_it_uses() {
        let hosts = HostAllowlist::new(
            &crate::config::default_allowed_hosts(),
            "127.0.0.1:9464".parse().unwrap(),
        );
        let request = |uri: &str, host: &[&str]| {
            let mut headers = http::HeaderMap::new();
            for h in host {
                headers.append(HOST, header(h));
            }
            (headers, uri.parse::<http::Uri>().unwrap())
        };
        let refused = |(headers, uri): (http::HeaderMap, http::Uri)| {
            hosts
                .refused(&headers, &uri)
                .map(|r| (r.status(), format!("{r:?}")))
        };
        assert_eq!(refused(request("/api/kpis", &["localhost:9464"])), None);
        // HTTP/2's :authority (the URI's) without a Host.
        assert_eq!(
            refused(request("http://localhost:9464/api/kpis", &[])),
            None
        );
        let misdirected = Some((
            StatusCode::MISDIRECTED_REQUEST,
            "NotAllowed(\"evil.example\")".to_string(),
        ));
        // An absolute-form target names the host an HTTP/1 server reads; a Host beside an
        // authority must be allowed too.
        assert_eq!(
            refused(request("http://evil.example/api/kpis", &["localhost"])),
            misdirected
        );
        assert_eq!(
            refused(request("http://localhost/api/kpis", &["evil.example"])),
            misdirected
        );
        for (uri, host, why) in [
            ("/api/kpis", &[][..], "no Host header"),
            (
                "/api/kpis",
                &["localhost", "evil.example"][..],
                "several Host headers",
            ),
            (
                "/api/kpis",
                &["evil.example", "localhost"][..],
                "several Host headers",
            ),
        ] {
            let r = refused(request(uri, host));
            assert_eq!(
                r,
                Some((StatusCode::BAD_REQUEST, format!("Malformed({why:?})"))),
                "{host:?}"
            );
        }
        let any = HostAllowlist::new(&["*".into()], "127.0.0.1:1".parse().unwrap());
        let (headers, uri) = request("/api/kpis", &[]);
        assert_eq!(any.refused(&headers, &uri), None);
    }

    #[test]
    fn exposure_needs_auth_or_insecure() {
        let mut c = CollectorConfig::default();
        assert!(check_exposure(&c, false).is_ok());
        c.receivers.otlp_http.endpoint = "0.0.0.0:4318".parse().unwrap();
        let e = check_exposure(&c, false).unwrap_err();
        assert!(
            e.contains("0.0.0.0:4318") && e.contains("receivers.otlp_http.endpoint"),
            "{e}"
        );
        assert!(check_exposure(&c, true).is_ok());
        c.auth.insecure = true;
        assert!(check_exposure(&c, false).is_ok());
        c.auth.insecure = false;
        c.receivers.otlp_http.enabled = false;
        assert!(check_exposure(&c, false).is_ok());
        // Every exposed listener is named at once, with the variable the config reads tokens
        // from.
        c.receivers.otlp_http.enabled = true;
        c.receivers.otlp_grpc.endpoint = "0.0.0.0:4317".parse().unwrap();
        c.api.listen = "0.0.0.0:9464".parse().unwrap();
        c.auth.tokens_env = Some("MY_TOKENS".into());
        let e = check_exposure(&c, false).unwrap_err();
        assert!(
            e.starts_with(
                "refusing to listen on 0.0.0.0:4317 (receivers.otlp_grpc.endpoint), \
                 0.0.0.0:4318 (receivers.otlp_http.endpoint), 0.0.0.0:9464 (api.listen) \
                 without authentication"
            ),
            "{e}"
        );
        assert!(
            e.contains("the MY_TOKENS variable") && !e.contains("INFERTRACE_TOKENS "),
            "{e}"
        );
    }

    #[test]
    fn paths_map_to_scopes() {
        assert_eq!(scope_of_path("/metrics"), Some(Scope::Metrics));
        assert_eq!(scope_of_path("/api/kpis"), Some(Scope::Read));
        assert_eq!(scope_of_path("/api"), Some(Scope::Read));
        assert_eq!(scope_of_path("/apix"), None);
        for open in ["/health", "/", "/index.html", "/assets/dashboard.js"] {
            assert_eq!(scope_of_path(open), None, "{open}");
        }
    }
}
