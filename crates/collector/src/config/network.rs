//! Connection limits, timeouts and TLS of the collector's three listeners (OTLP/gRPC, OTLP/HTTP,
//! API), and the shutdown deadline.
//!
//! Each listener has the same two optional sections:
//!
//! ```yaml
//! receivers:
//!   otlp_grpc:
//!     connections: { max: 1024, idle_timeout: 60s, header_read_timeout: 10s }
//!     tls: { cert_file: server.pem, key_file: server.key, client_ca_file: clients-ca.pem }
//! api:
//!   connections: { max: 256 }
//! shutdown_timeout: 15s
//! ```
//!
//! Over `max` open connections a new connection is closed at once and counted
//! (`infertrace_connections_refused_total{listener}`); a connection with no request in flight
//! for `idle_timeout` is closed; a connection that has not sent a complete request head within
//! `header_read_timeout` (HTTP/1 headers, or the HTTP/2 preface and first request, or the TLS
//! handshake) is closed. An idle HTTP/1 keep-alive connection is therefore closed after
//! `min(idle_timeout, header_read_timeout)`: hyper starts its header read timeout as soon as such
//! a connection waits for its next request (counted with reason `idle_timeout` all the same);
//! HTTP/2 connections use `idle_timeout`. HTTP/2 connections are pinged every
//! `http2_keepalive_interval`, and closed when a ping is not answered within
//! `http2_keepalive_timeout`.
//!
//! With `tls:` the listener speaks TLS only (rustls, TLS 1.2 and 1.3, ring provider), offering
//! ALPN `h2` (and `http/1.1` except on the gRPC receiver). With `client_ca_file` it asks every
//! client for a certificate and refuses the handshake of a client without one signed by that CA
//! (mutual TLS).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

use crate::duration::human_duration;

/// Default most open connections per listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default idle timeout of a connection with no request in flight.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default time a client has to send a complete request head (and finish the TLS handshake).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default interval of HTTP/2 keep-alive pings.
pub const DEFAULT_H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Default time an HTTP/2 ping may go unanswered before the connection is closed.
pub const DEFAULT_H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest accepted `connections.max` (a semaphore's permits are bounded).
pub const MAX_CONNECTIONS_LIMIT: usize = 1 << 24;
/// Default shutdown deadline.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// `connections:` of one listener — how many connections it holds and for how long.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionsConfig {
    /// Most connections open at once; a further one is closed as soon as it is accepted and
    /// counted in `infertrace_connections_refused_total{listener}`. Default 1024.
    pub max: usize,
    /// A connection with no request in flight for this long is closed (HTTP/2 keep-alive pings
    /// do not count as activity). An idle HTTP/1 keep-alive connection is closed sooner when
    /// `header_read_timeout` is shorter, after `min(idle_timeout, header_read_timeout)`: hyper
    /// starts its header read timeout as soon as such a connection waits for its next request
    /// (counted as reason `idle_timeout` all the same); HTTP/2 connections use `idle_timeout`.
    /// Default 60s.
    #[serde(with = "human_duration")]
    pub idle_timeout: Duration,
    /// Time a client has to complete the TLS handshake and send a complete request head: HTTP/1
    /// headers (for every request of a keep-alive connection), or the HTTP/2 preface and first
    /// request. Default 10s.
    #[serde(with = "human_duration")]
    pub header_read_timeout: Duration,
    /// Interval of HTTP/2 keep-alive pings, which detect dead peers. Default 30s.
    #[serde(with = "human_duration")]
    pub http2_keepalive_interval: Duration,
    /// An HTTP/2 connection whose ping is not answered within this is closed. Default 20s.
    #[serde(with = "human_duration")]
    pub http2_keepalive_timeout: Duration,
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        Self {
            max: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            http2_keepalive_interval: DEFAULT_H2_KEEPALIVE_INTERVAL,
            http2_keepalive_timeout: DEFAULT_H2_KEEPALIVE_TIMEOUT,
        }
    }
}

impl ConnectionsConfig {
    /// Checks the values: `Err((field, what is wrong))`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.max == 0 || self.max > MAX_CONNECTIONS_LIMIT {
            return Err((
                "max",
                format!(
                    "must be between 1 and {MAX_CONNECTIONS_LIMIT} (got {})",
                    self.max
                ),
            ));
        }
        for (name, value) in [
            ("idle_timeout", self.idle_timeout),
            ("header_read_timeout", self.header_read_timeout),
            ("http2_keepalive_interval", self.http2_keepalive_interval),
            ("http2_keepalive_timeout", self.http2_keepalive_timeout),
        ] {
            if value.is_zero() {
                return Err((name, "must be more than 0".to_owned()));
            }
        }
        Ok(())
    }
}

/// `tls:` of one listener — serve TLS only, optionally asking clients for certificates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the server certificate chain (leaf first).
    pub cert_file: PathBuf,
    /// PEM file with the server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM file with the CA certificate(s) client certificates must be signed by. When set,
    /// every client must present such a certificate (mutual TLS). Default: none (no client
    /// certificate asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
}

/// Which protocols a TLS listener offers in ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` only (gRPC).
    H2Only,
    /// `h2` and `http/1.1`.
    H2AndHttp1,
}

/// A TLS file that could not be used.
#[derive(Debug)]
pub struct TlsError {
    /// The config key of the file, e.g. `api.tls.key_file`.
    pub key: String,
    /// The file.
    pub file: PathBuf,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.key,
            self.file.display(),
            self.message
        )
    }
}

impl std::error::Error for TlsError {}

fn pem_error(key: &str, file: &Path, what: &str, error: rustls_pki_types::pem::Error) -> TlsError {
    TlsError {
        key: key.to_owned(),
        file: file.to_owned(),
        message: pem_message(file, what, error),
    }
}

/// Why `file` gave no `what` (e.g. "private key"), said for its most likely cause: an
/// unreadable file, an encrypted key (which rustls skips, finding none), no PEM block.
pub(crate) fn pem_message(file: &Path, what: &str, error: rustls_pki_types::pem::Error) -> String {
    match error {
        rustls_pki_types::pem::Error::Io(e) => format!("cannot read the file: {e}"),
        rustls_pki_types::pem::Error::NoItemsFound if encrypted_key(file) => {
            "the private key is encrypted (-----BEGIN ENCRYPTED PRIVATE KEY-----), which is not \
             supported: decrypt it (openssl pkey -in KEY -out PLAIN) and protect the file by its \
             permissions"
                .to_owned()
        }
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!("no {what} found; the file must hold PEM (-----BEGIN ...-----) {what} blocks")
        }
        other => format!("not a valid PEM file: {other:?}"),
    }
}

/// Whether `file` holds an encrypted PKCS#8 PEM private key, which rustls cannot read (and
/// skips, finding no key).
fn encrypted_key(file: &Path) -> bool {
    const LABEL: &[u8] = b"-----BEGIN ENCRYPTED PRIVATE KEY-----";
    std::fs::read(file).is_ok_and(|b| b.windows(LABEL.len()).any(|w| w == LABEL))
}

fn read_certs(key: &str, file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| pem_error(key, file, "certificate", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(key, file, "certificate", e))?;
    if certs.is_empty() {
        return Err(pem_error(
            key,
            file,
            "certificate",
            rustls_pki_types::pem::Error::NoItemsFound,
        ));
    }
    Ok(certs)
}

/// The ring crypto provider every TLS listener uses.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How long before its end a server certificate is warned about.
const CERTIFICATE_EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

impl TlsConfig {
    /// A warning when the server's own certificate (the first of `cert_file`) is not valid at
    /// `now` — expired or not yet valid, which rustls serves without a word and every client
    /// then refuses — or ends within 14 days. `None` when it is fine or
    /// cannot be read (loading the files reports those). `key` is the section's place.
    pub fn validity_warning(&self, key: &str, now: std::time::SystemTime) -> Option<String> {
        let certs = read_certs(key, &self.cert_file).ok()?;
        let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?).ok()?;
        let validity = cert.validity();
        let now = now.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
        let file = self.cert_file.display();
        let (from, until) = (validity.not_before, validity.not_after);
        let left = until.timestamp() - now;
        if left < 0 {
            Some(format!(
                "{key}.cert_file {file}: the certificate expired on {until}: clients refuse \
                 every handshake; replace the file and send SIGHUP"
            ))
        } else if now < from.timestamp() {
            Some(format!(
                "{key}.cert_file {file}: the certificate is not valid before {from}: clients \
                 refuse every handshake until then (is the clock right?)"
            ))
        } else if left < CERTIFICATE_EXPIRY_WARNING.as_secs() as i64 {
            let days = left / 86_400;
            Some(format!(
                "{key}.cert_file {file}: the certificate expires on {until} (in {days} days): \
                 replace the file and send SIGHUP"
            ))
        } else {
            None
        }
    }

    /// Reads and checks the files and builds the rustls server configuration; `key` is where the
    /// section lives (e.g. `receivers.otlp_grpc.tls`), named in every error with the file.
    pub fn server_config(
        &self,
        key: &str,
        alpn: Alpn,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let cert_key = format!("{key}.cert_file");
        let key_key = format!("{key}.key_file");
        let certs = read_certs(&cert_key, &self.cert_file)?;
        let private = PrivateKeyDer::from_pem_file(&self.key_file)
            .map_err(|e| pem_error(&key_key, &self.key_file, "private key", e))?;
        let provider = crypto_provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError {
                key: key.to_owned(),
                file: self.cert_file.clone(),
                message: format!("TLS setup failed: {e}"),
            })?;
        let builder = match &self.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(ca_file) => {
                let ca_key = format!("{key}.client_ca_file");
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(&ca_key, ca_file)? {
                    roots.add(cert).map_err(|e| TlsError {
                        key: ca_key.clone(),
                        file: ca_file.clone(),
                        message: format!("not a usable CA certificate: {e}"),
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| TlsError {
                            key: ca_key.clone(),
                            file: ca_file.clone(),
                            message: format!("cannot verify clients with these CAs: {e}"),
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, private)
            .map_err(|e| TlsError {
                key: key_key,
                file: self.key_file.clone(),
                message: format!(
                    "the key does not fit the certificate of {} or is not supported: {e}",
                    self.cert_file.display()
                ),
            })?;
        config.alpn_protocols = match alpn {
            Alpn::H2Only => vec![b"h2".to_vec()],
            Alpn::H2AndHttp1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        Ok(Arc::new(config))
    }
}
