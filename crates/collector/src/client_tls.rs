//! TLS and headers of the collector's outgoing connections — the forwarder's
//! (`forward.endpoint: https://…`) and the Alertmanager client's — built the same way for
//! `check-config` (which only builds them, so it refuses exactly what `collect` could not use)
//! and for `collect`.
//!
//! - rustls with the ring provider; the server is verified against the system's root
//!   certificates (`rustls-native-certs`: the OS store, or `SSL_CERT_FILE` / `SSL_CERT_DIR`), or,
//!   when `ca_file` is set, against the CA certificates of that PEM file only (a private CA).
//! - `cert_file` + `key_file` (PEM): a client certificate for mutual TLS.
//! - Headers (`forward.headers`) are sent with every request (gRPC metadata or HTTP headers);
//!   `${NAME}` in a value is replaced by the environment variable `NAME` when the config is
//!   checked or the collector starts (an unset variable is an error), so that an API key need
//!   not be written in the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

/// The connector of outgoing `http://` and `https://` connections ([`https_connector`]).
pub type HttpsConnector = hyper_rustls::HttpsConnector<HttpConnector>;

/// TLS of an outgoing `https://` connection (`forward.tls`, `alerts.alertmanager_tls`); see
/// this module. Relative paths are relative to the working directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsClientConfig {
    /// PEM file of the CA certificate(s) to verify the server with, instead of the system's
    /// root certificates (a private CA). Default: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mutual TLS (with `key_file`). Default none.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`. Default none.
    pub key_file: Option<PathBuf>,
}

/// What the three options of a [`TlsClientConfig`] are called where the user set them, so
/// that an error names what to fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionNames {
    /// The CA file's name.
    pub ca_file: &'static str,
    /// The client certificate's name.
    pub cert_file: &'static str,
    /// The client key's name.
    pub key_file: &'static str,
}

impl OptionNames {
    /// The forwarder's keys in the config file (`forward.tls.ca_file`, …).
    pub const FORWARD: Self = Self {
        ca_file: "forward.tls.ca_file",
        cert_file: "forward.tls.cert_file",
        key_file: "forward.tls.key_file",
    };
    /// The Alertmanager client's keys in the config file (`alerts.alertmanager_tls.ca_file`, …).
    pub const ALERTMANAGER: Self = Self {
        ca_file: "alerts.alertmanager_tls.ca_file",
        cert_file: "alerts.alertmanager_tls.cert_file",
        key_file: "alerts.alertmanager_tls.key_file",
    };
    /// Command-line flags (`--ca-file`, …), as `infertrace report` has them.
    pub const FLAGS: Self = Self {
        ca_file: "--ca-file",
        cert_file: "--cert-file",
        key_file: "--key-file",
    };
}

/// Reads every PEM certificate of `path`; an error (saying what to fix) when the file cannot be
/// read or holds none.
pub fn read_certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "{what} {}: cannot read PEM certificates: {e}",
                path.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The rustls client configuration of `tls` for an `https://` URL; errors call the options
/// `names`.
pub fn rustls_config(tls: &TlsClientConfig, names: OptionNames) -> Result<ClientConfig, String> {
    let OptionNames {
        ca_file,
        cert_file,
        key_file,
    } = names;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(path) => {
            for cert in read_certificates(path, ca_file)? {
                roots.add(cert).map_err(|e| {
                    format!(
                        "{ca_file} {}: not a usable CA certificate: {e}",
                        path.display()
                    )
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!(
                    "no system root certificates could be loaded ({} errors); install the \
                     system's CA bundle (ca-certificates), set SSL_CERT_FILE, or set {ca_file}",
                    found.errors.len()
                ));
            }
        }
    }
    let builder = builder.with_root_certificates(roots);
    match (&tls.cert_file, &tls.key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = read_certificates(cert, cert_file)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                format!(
                    "{key_file} {}: {}",
                    key.display(),
                    crate::config::network::pem_message(key, "private key", e)
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!("{cert_file} and {key_file}: unusable client certificate: {e}")
            })
        }
        _ => Err(format!(
            "{cert_file} and {key_file} go together (mutual TLS): set both or neither"
        )),
    }
}

/// Whether `tls` sets anything (then the URL must be `https://`).
pub fn is_set(tls: &TlsClientConfig) -> bool {
    tls.ca_file.is_some() || tls.cert_file.is_some() || tls.key_file.is_some()
}

/// A connector for `http://` and `https://` URLs (HTTP/1.1), wrapping `http`; TLS configured
/// by `tls` when `https` (otherwise no certificate is loaded), its errors calling the options
/// `names`.
pub fn https_connector(
    mut http: HttpConnector,
    tls: &TlsClientConfig,
    https: bool,
    names: OptionNames,
) -> Result<HttpsConnector, String> {
    let config = if https {
        rustls_config(tls, names)?
    } else {
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth()
    };
    http.enforce_http(false);
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// Headers a client may not set: the protocol's own.
const RESERVED: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "host",
    "te",
    "transfer-encoding",
    "connection",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
];

/// The most of a downstream's answer that is read: a partial-success message or an error text
/// is far smaller, and a misbehaving server must not grow the collector's memory.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// An answer's body, read up to [`MAX_ANSWER_BYTES`]; `None` when it is longer or broken.
pub async fn read_answer<B>(body: B) -> Option<bytes::Bytes>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt;
    http_body_util::Limited::new(body, MAX_ANSWER_BYTES)
        .collect()
        .await
        .ok()
        .map(|c| c.to_bytes())
}

/// `headers` as a header map, with `${NAME}` in values replaced by the environment variable
/// `NAME`; an error names every header that is wrong and says what is wrong with it.
pub fn header_map(headers: &BTreeMap<String, String>) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    let mut problems = Vec::new();
    for (name, value) in headers {
        match header(name, value) {
            Ok((header, value)) => {
                map.append(header, value);
            }
            Err(e) => problems.push(e),
        }
    }
    if problems.is_empty() {
        Ok(map)
    } else {
        Err(problems.join("; "))
    }
}

/// One header of [`header_map`].
fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let header = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid header name"))?;
    if RESERVED.contains(&header.as_str()) || header.as_str().starts_with(':') {
        return Err(format!(
            "{name:?} is set by the protocol and cannot be overridden"
        ));
    }
    if header.as_str().ends_with("-bin") {
        return Err(format!(
            "{name:?}: binary (-bin) gRPC metadata is not supported"
        ));
    }
    let expanded = expand_env(value).map_err(|e| format!("{name}: {e}"))?;
    let mut value = HeaderValue::from_str(&expanded)
        .map_err(|_| format!("{name}: the value has characters a header cannot hold"))?;
    value.set_sensitive(true);
    Ok((header, value))
}

/// `value` with every `${NAME}` replaced by the environment variable `NAME`.
fn expand_env(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err("\"${\" without a closing \"}\"".to_owned());
        };
        let name = &after[..end];
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("${{{name}}} is not an environment variable name"));
        }
        let v = std::env::var(name)
            .map_err(|_| format!("the environment variable {name} is not set (or not UTF-8)"))?;
        out.push_str(&v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_is_read_up_to_its_bound() {
        use http_body_util::Full;
        let small = Full::new(bytes::Bytes::from(vec![b'a'; MAX_ANSWER_BYTES]));
        assert_eq!(
            read_answer(small).await.map(|b| b.len()),
            Some(MAX_ANSWER_BYTES)
        );
        let large = Full::new(bytes::Bytes::from(vec![b'a'; MAX_ANSWER_BYTES + 1]));
        assert_eq!(read_answer(large).await, None);
    }

    #[test]
    fn headers_expand_the_environment_and_refuse_what_cannot_be_sent() {
        // PATH is set wherever tests run (setting a variable would race other threads).
        let path = std::env::var("PATH").unwrap();
        let mut h = BTreeMap::new();
        h.insert("X-Api-Key".to_owned(), "Bearer ${PATH}!".to_owned());
        let map = header_map(&h).unwrap();
        assert_eq!(map["x-api-key"], format!("Bearer {path}!").as_str());
        assert!(map["x-api-key"].is_sensitive());
        let bad = |k: &str, v: &str| {
            let mut h = BTreeMap::new();
            h.insert(k.to_owned(), v.to_owned());
            header_map(&h).unwrap_err()
        };
        assert!(bad("x key", "v").contains("not a valid header name"));
        assert!(bad("content-type", "v").contains("cannot be overridden"));
        assert!(bad("x", "a\nb").contains("cannot hold"));
        assert!(bad("x", "${INFERTRACE_TEST_UNSET_VAR}").contains("is not set"));
        assert!(bad("x", "${oops").contains("closing"));
        assert!(bad("x", "${1A}").contains("not an environment variable name"));
        // Every header that is wrong is named, not only the first.
        let mut h = BTreeMap::new();
        h.insert("X-A".to_owned(), "${INFERTRACE_TEST_UNSET_A}".to_owned());
        h.insert("X-B".to_owned(), "${INFERTRACE_TEST_UNSET_B}".to_owned());
        let e = header_map(&h).unwrap_err();
        assert!(
            e.contains("INFERTRACE_TEST_UNSET_A") && e.contains("INFERTRACE_TEST_UNSET_B"),
            "{e}"
        );
    }

    #[test]
    fn tls_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate").unwrap();
        let with = |ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>| TlsClientConfig {
            ca_file: ca.map(Path::to_path_buf),
            cert_file: cert.map(Path::to_path_buf),
            key_file: key.map(Path::to_path_buf),
        };
        let config = |tls: &TlsClientConfig| rustls_config(tls, OptionNames::FORWARD);
        let e = config(&with(Some(&dir.path().join("missing.pem")), None, None)).unwrap_err();
        assert!(
            e.contains("forward.tls.ca_file") && e.contains("missing.pem"),
            "{e}"
        );
        let e = config(&with(Some(&empty), None, None)).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca.cert.pem()).unwrap();
        assert!(config(&with(Some(&ca_pem), None, None)).is_ok());
        let e = config(&with(Some(&ca_pem), Some(&ca_pem), None)).unwrap_err();
        assert!(e.contains("set both or neither"), "{e}");
        let e = config(&with(Some(&ca_pem), Some(&ca_pem), Some(&empty))).unwrap_err();
        assert!(e.contains("forward.tls.key_file"), "{e}");
        // The same problems named as report's flags.
        let e = rustls_config(
            &with(Some(&ca_pem), Some(&ca_pem), None),
            OptionNames::FLAGS,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "--cert-file and --key-file go together (mutual TLS): set both or neither"
        );
        let key_pem = dir.path().join("key.pem");
        std::fs::write(&key_pem, ca.signing_key.serialize_pem()).unwrap();
        assert!(config(&with(Some(&ca_pem), Some(&ca_pem), Some(&key_pem))).is_ok());
    }
}
