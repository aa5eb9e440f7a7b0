//! `infertrace report` against a collector whose API is served over TLS with a client CA and
//! bearer tokens: it connects with `--ca-file`, a client certificate and `INFERTRACE_TOKEN`, and
//! says what is wrong when one of them is missing or does not fit the URL.

mod common;
#[path = "../../collector/tests/support_tls/mod.rs"]
mod support_tls;

use std::process::Output;

use common::{Ports, Process, bin, collect};
use support_tls::TestPki;

const TOKEN: &str = "report-read-token-0123456789";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn report_reads_an_api_served_over_mutual_tls_with_a_token() {
    let pki = TestPki::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "api:\n  tls: {{ cert_file: {}, key_file: {}, client_ca_file: {} }}\n",
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.ca.display()
        ),
    )
    .unwrap();
    let ports = Ports::free();
    let api = ports.api;
    let mut cmd = collect(&ports);
    cmd.args(["--no-store", "--config", config.to_str().unwrap()])
        .current_dir(dir.path())
        .env("INFERTRACE_TOKENS", format!("read {TOKEN}"));
    let mut p = Process::spawn(cmd, dir.path().join("stderr.log"));
    p.wait_log(&format!("API https://127.0.0.1:{api}"));

    // The API's certificate names localhost.
    let url = format!("https://localhost:{api}");
    let report = |args: &[&str], token: Option<&str>| {
        let mut cmd = bin();
        cmd.args(["report", "--format", "json", "--url", &url])
            .args(args)
            // The system's roots, as rustls-native-certs reads them, are another CA's: the
            // same failure on every machine, with or without a CA bundle installed.
            .env("SSL_CERT_FILE", &pki.other_ca)
            .env_remove("SSL_CERT_DIR")
            .env_remove("INFERTRACE_TOKEN");
        if let Some(t) = token {
            cmd.env("INFERTRACE_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let ca = pki.ca.to_str().unwrap();
    let client = [
        "--cert-file",
        pki.client_cert.to_str().unwrap(),
        "--key-file",
        pki.client_key.to_str().unwrap(),
    ];
    let all: Vec<&str> = ["--ca-file", ca].iter().chain(&client).copied().collect();

    let ok = report(&all, Some(TOKEN));
    assert!(ok.status.success(), "report over mTLS: {}", stderr(&ok));
    let json: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(json["source"], url.as_str());
    assert!(json["kpis"].is_object(), "{json}");

    // Without the token: the API's 401, with what to set.
    let no_token = report(&all, None);
    assert!(!no_token.status.success());
    assert!(
        stderr(&no_token).contains("INFERTRACE_TOKEN"),
        "{}",
        stderr(&no_token)
    );

    // Without --ca-file the system's roots (here another CA) do not know the test CA.
    let no_ca = report(&client, Some(TOKEN));
    assert!(!no_ca.status.success());
    assert!(
        stderr(&no_ca).contains("cannot reach")
            && stderr(&no_ca)
                .contains("not trusted here: give the CA that signed it with --ca-file"),
        "{}",
        stderr(&no_ca)
    );

    // Without a client certificate the API's mutual TLS refuses the connection.
    let no_cert = report(&["--ca-file", ca], Some(TOKEN));
    assert!(
        !no_cert.status.success(),
        "report without a client certificate"
    );

    // TLS options with an http:// URL would not apply: refused before connecting.
    let plain = bin()
        .args([
            "report",
            "--url",
            &format!("http://127.0.0.1:{api}"),
            "--ca-file",
            ca,
        ])
        .output()
        .unwrap();
    assert!(!plain.status.success());
    assert!(
        stderr(&plain).contains("are for an https:// URL"),
        "{}",
        stderr(&plain)
    );
}
