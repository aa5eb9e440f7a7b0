//! The TLS of the three listeners as it is in force now, and its reload on SIGHUP.
//!
//! Each TLS listener holds a [`ServerTls`]: the rustls [`ServerConfig`](rustls::ServerConfig)
//! built from its `tls:` files, behind a lock. Every accepted connection takes the configuration
//! in force at that moment ([`ServerTls::current`], one uncontended read lock and an `Arc`
//! clone) for its handshake; [`ServerTls::reload`] reads the files again and builds a whole new
//! configuration — certificate chain, key, and the client CA verifier for mutual TLS — and only
//! when all of it loads does it swap it in. So:
//! - new handshakes use the new certificate (and the new client CA);
//! - connections already open keep the configuration they were accepted with, untouched;
//! - a bad rotation (a file unreadable, garbage PEM, a key that does not fit the certificate)
//!   changes nothing: the previous configuration stays in force, and the error names the key
//!   and the file, exactly as at start.
//!
//! A new configuration brings a new TLS session cache and ticketer, so a client cannot resume a
//! session from before the reload: after a client-CA rotation every client is checked against
//! the new CA. Each reload is counted in `infertrace_reloads_total{what,outcome}` with `what` =
//! `tls_otlp_grpc`, `tls_otlp_http` or `tls_api` and `outcome` = `ok` or `failed`.

use std::sync::{Arc, RwLock};

use crate::config::{Alpn, CollectorConfig, TlsConfig, TlsError};
use crate::internal_events::InternalEvents;

/// Where a reloadable configuration comes from.
#[derive(Debug)]
struct Source {
    /// The listener's `tls:` section.
    tls: TlsConfig,
    /// The config key of the section (`api.tls`), named in errors.
    key: &'static str,
    /// Its ALPN protocols.
    alpn: Alpn,
}

#[derive(Debug)]
struct Inner {
    source: Option<Source>,
    current: RwLock<Arc<rustls::ServerConfig>>,
}

/// The TLS configuration a listener hands its new connections; cheap to clone (shared), and
/// reloadable from its files ([`reload`](Self::reload)). See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct ServerTls {
    inner: Arc<Inner>,
}

impl ServerTls {
    /// Reads `tls`'s files and builds the configuration (`key`: where the section is, named in
    /// errors with the file; `alpn`: the protocols offered).
    pub fn load(tls: &TlsConfig, key: &'static str, alpn: Alpn) -> Result<Self, TlsError> {
        let config = tls.server_config(key, alpn)?;
        warn_of_validity(tls, key);
        Ok(Self {
            inner: Arc::new(Inner {
                source: Some(Source {
                    tls: tls.clone(),
                    key,
                    alpn,
                }),
                current: RwLock::new(config),
            }),
        })
    }

    /// A fixed configuration (no files to reload from: [`reload`](Self::reload) keeps it), for
    /// tests and embedding.
    pub fn fixed(config: Arc<rustls::ServerConfig>) -> Self {
        Self {
            inner: Arc::new(Inner {
                source: None,
                current: RwLock::new(config),
            }),
        }
    }

    /// The configuration in force: what a handshake starting now uses.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.inner
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the files again and, when everything in them loads, makes the new configuration
    /// the one in force. On any error the previous configuration stays in force. A fixed
    /// configuration has nothing to reload: `Ok`.
    pub fn reload(&self) -> Result<(), TlsError> {
        let Some(source) = &self.inner.source else {
            return Ok(());
        };
        let config = source.tls.server_config(source.key, source.alpn)?;
        warn_of_validity(&source.tls, source.key);
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }

    /// The certificate file, when the configuration comes from files (for log lines).
    pub fn cert_file(&self) -> Option<&std::path::Path> {
        self.inner
            .source
            .as_ref()
            .map(|s| s.tls.cert_file.as_path())
    }
}

/// Logs (warn) a certificate expired, not yet valid or about to expire
/// ([`TlsConfig::validity_warning`]): it is served all the same, as an operator may have no
/// other at hand, but its clients will fail.
fn warn_of_validity(tls: &TlsConfig, key: &str) {
    if let Some(warning) = tls.validity_warning(key, std::time::SystemTime::now()) {
        tracing::warn!("{warning}");
    }
}

/// The reloadable TLS of the three listeners; `None` where a listener has no `tls:`.
#[derive(Clone, Debug, Default)]
pub struct ListenersTls {
    /// `receivers.otlp_grpc.tls`.
    pub otlp_grpc: Option<ServerTls>,
    /// `receivers.otlp_http.tls`.
    pub otlp_http: Option<ServerTls>,
    /// `api.tls`.
    pub api: Option<ServerTls>,
}

/// The outcome of one listener's TLS reload.
#[derive(Debug)]
pub struct TlsReload {
    /// The listener (`otlp_grpc`, `otlp_http`, `api`).
    pub listener: &'static str,
    /// `Ok` with the certificate file now in force, or why the previous configuration stays.
    pub result: Result<Option<std::path::PathBuf>, TlsError>,
}

impl ListenersTls {
    /// Reads every listener's TLS files (the same sections and checks as
    /// [`CollectorConfig::tls_server_configs`], which `check-config` runs).
    pub fn load(config: &CollectorConfig) -> Result<Self, TlsError> {
        let mut out = Self::default();
        for (listener, key, tls, alpn) in config.tls_sections() {
            let Some(tls) = tls else { continue };
            let loaded = Some(ServerTls::load(tls, key, alpn)?);
            match listener {
                "otlp_grpc" => out.otlp_grpc = loaded,
                "otlp_http" => out.otlp_http = loaded,
                _ => out.api = loaded,
            }
        }
        Ok(out)
    }

    /// Whether any listener has TLS.
    pub fn any(&self) -> bool {
        self.otlp_grpc.is_some() || self.otlp_http.is_some() || self.api.is_some()
    }

    /// Reloads every TLS listener's files (on SIGHUP), each on its own: one bad listener does
    /// not hold the others back. Each outcome is counted in
    /// `infertrace_reloads_total{what="tls_<listener>",outcome}`; the caller logs them.
    pub fn reload(&self, events: &InternalEvents) -> Vec<TlsReload> {
        [
            ("otlp_grpc", "tls_otlp_grpc", &self.otlp_grpc),
            ("otlp_http", "tls_otlp_http", &self.otlp_http),
            ("api", "tls_api", &self.api),
        ]
        .into_iter()
        .filter_map(|(listener, what, tls)| {
            let tls = tls.as_ref()?;
            let result = tls
                .reload()
                .map(|()| tls.cert_file().map(std::path::Path::to_path_buf));
            events.reloaded(what, result.is_ok());
            Some(TlsReload { listener, result })
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_certificate_out_of_its_validity_is_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["a.example".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 2, 1);
        let cert = params.self_signed(&key).unwrap();
        let tls = TlsConfig {
            cert_file: dir.path().join("c.pem"),
            key_file: dir.path().join("k.pem"),
            client_ca_file: None,
        };
        std::fs::write(&tls.cert_file, cert.pem()).unwrap();
        std::fs::write(&tls.key_file, key.serialize_pem()).unwrap();
        // Midnights (UTC) as Unix seconds.
        let at = |secs: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let warning = |when| tls.validity_warning("api.tls", when);
        assert_eq!(warning(at(1_578_614_400)), None); // 2020-01-10
        let soon = warning(at(1_579_910_400)).unwrap(); // 2020-01-25
        assert!(
            soon.contains("expires on") && soon.contains("in 7 days"),
            "{soon}"
        );
        let expired = warning(at(1_796_515_200)).unwrap(); // 2026-12-06
        assert!(
            expired.starts_with("api.tls.cert_file ") && expired.contains("expired on"),
            "{expired}"
        );
        let early = warning(at(1_559_347_200)).unwrap(); // 2019-06-01
        assert!(early.contains("not valid before"), "{early}");
        // Served all the same: an operator may have no other at hand.
        ServerTls::load(&tls, "api.tls", Alpn::H2AndHttp1).unwrap();
    }

    #[test]
    fn a_bad_rotation_keeps_the_configuration_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_file, key_file) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let (a_cert, a_key) = cert("a.example");
        let (b_cert, b_key) = cert("b.example");
        std::fs::write(&cert_file, &a_cert).unwrap();
        std::fs::write(&key_file, &a_key).unwrap();
        let tls = TlsConfig {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            client_ca_file: None,
        };
        let s = ServerTls::load(&tls, "api.tls", Alpn::H2AndHttp1).unwrap();
        let first = s.current();

        // A good rotation: a new configuration is in force.
        std::fs::write(&cert_file, &b_cert).unwrap();
        std::fs::write(&key_file, &b_key).unwrap();
        s.reload().unwrap();
        let second = s.current();
        assert!(!Arc::ptr_eq(&first, &second));

        // B's certificate with A's key: refused, naming the key file; B stays.
        std::fs::write(&key_file, &a_key).unwrap();
        let e = s.reload().unwrap_err().to_string();
        assert!(
            e.contains("api.tls.key_file") && e.contains("does not fit"),
            "{e}"
        );
        assert!(Arc::ptr_eq(&second, &s.current()));

        // Garbage and a missing file: refused, B stays.
        std::fs::write(&cert_file, "not PEM at all").unwrap();
        let e = s.reload().unwrap_err().to_string();
        assert!(e.contains("api.tls.cert_file"), "{e}");
        std::fs::remove_file(&cert_file).unwrap();
        let e = s.reload().unwrap_err().to_string();
        assert!(e.contains("cannot read the file"), "{e}");
        assert!(Arc::ptr_eq(&second, &s.current()));

        // Counted per listener and outcome.
        let events = InternalEvents::default();
        let all = ListenersTls {
            api: Some(s.clone()),
            ..ListenersTls::default()
        };
        let out = all.reload(&events);
        assert_eq!(out.len(), 1);
        assert!(out[0].result.is_err());
        assert_eq!(events.reloads("tls_api", false), 1);
        assert_eq!(events.reloads("tls_api", true), 0);
    }
}
