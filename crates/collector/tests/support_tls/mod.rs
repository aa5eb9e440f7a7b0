//! Test certificates generated at test time with rcgen (no keys are committed): a CA, a server
//! certificate for `localhost` / `127.0.0.1` signed by it, and a client certificate signed by it
//! (for mutual TLS), written as PEM files into a temporary directory. Shared by the collector's,
//! the CLI's and the end-to-end tests (`#[path]`).

#![allow(dead_code)] // each test crate uses a different subset

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// PEM files of a throw-away PKI; the directory is removed when this is dropped.
pub struct TestPki {
    /// Holds the files.
    pub dir: tempfile::TempDir,
    /// The CA certificate (trust anchor of the server and of client certificates).
    pub ca: PathBuf,
    /// Server certificate (SANs `localhost`, `127.0.0.1`).
    pub server_cert: PathBuf,
    /// Server private key (PKCS#8).
    pub server_key: PathBuf,
    /// Client certificate (for mutual TLS).
    pub client_cert: PathBuf,
    /// Client private key.
    pub client_key: PathBuf,
    /// A second CA, which signed nothing the server trusts.
    pub other_ca: PathBuf,
    /// A client certificate signed by `other_ca` (refused by a server trusting `ca`).
    pub other_client_cert: PathBuf,
    /// Its key.
    pub other_client_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA cert")
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    sans: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = CertificateParams::new(sans).expect("leaf params");
    params
        .distinguished_name
        .push(DnType::CommonName, "infertrace test");
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("leaf cert");
    (cert.pem(), key.serialize_pem())
}

impl TestPki {
    /// Generates the certificates and writes them.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, pem: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).expect("write PEM");
            path
        };
        let ca_a = ca("infertrace test CA");
        let (server_cert, server_key) = leaf(
            &ca_a,
            vec!["localhost".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(&ca_a, vec![], ExtendedKeyUsagePurpose::ClientAuth);
        let ca_b = ca("some other CA");
        let (other_cert, other_key) = leaf(&ca_b, vec![], ExtendedKeyUsagePurpose::ClientAuth);
        Self {
            ca: write("ca.pem", &ca_a.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            other_ca: write("other-ca.pem", &ca_b.pem()),
            other_client_cert: write("other-client.pem", &other_cert),
            other_client_key: write("other-client.key", &other_key),
            dir,
        }
    }

    /// `tls:` of a listener with this server certificate, with mutual TLS when `mtls`.
    pub fn server_tls(&self, mtls: bool) -> infertrace_collector::config::TlsConfig {
        infertrace_collector::config::TlsConfig {
            cert_file: self.server_cert.clone(),
            key_file: self.server_key.clone(),
            client_ca_file: mtls.then(|| self.ca.clone()),
        }
    }
}
