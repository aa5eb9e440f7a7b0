//! `infertrace collect` as a process with bearer tokens: SIGHUP reloads the tokens file (the new
//! token works, the removed one is refused, a broken file keeps the old tokens and logs an error
//! naming the line, never a token), and a start on a non-loopback address is refused without
//! tokens unless `auth.insecure: true` — by `collect` and, before any start, by `check-config`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Process, WAIT, bin, free_port, traces};

const TOKEN_A: &str = "token-a-0123456789abcdef";
const TOKEN_B: &str = "token-b-fedcba9876543210";

/// One HTTP/1.1 exchange with an optional bearer token: the status.
fn request(port: u16, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// `collect --no-store` with the API on `listen_api` (a wildcard address, for some tests).
fn collect(dir: &Path, listen_api: &str, http: u16, extra: &[&str]) -> Command {
    let mut cmd = bin();
    cmd.args(["collect", "--no-store"])
        .args(["--otlp-grpc", &format!("127.0.0.1:{}", free_port())])
        .args(["--otlp-http", &format!("127.0.0.1:{http}")])
        .args(["--listen", listen_api])
        .args(extra)
        .current_dir(dir);
    cmd
}

/// Polls `GET /api/kpis` with `token` until it answers `want` (a reload is asynchronous).
fn until_status(api: u16, token: &str, want: u16) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = request(api, "GET", "/api/kpis", Some(token), b"");
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "still {got}, want {want}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_reloads_the_tokens_file() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("# the first token\nall {TOKEN_A}\n")).unwrap();
    let (api, http) = (free_port(), free_port());
    let cmd = collect(
        dir.path(),
        &format!("127.0.0.1:{api}"),
        http,
        &["--tokens-file", tokens.to_str().unwrap()],
    );
    let mut p = Process::spawn(cmd, dir.path().join("stderr.log"));
    p.wait_log(&format!("API http://127.0.0.1:{api}"));

    assert_eq!(request(api, "GET", "/health", None, b""), 200);
    assert_eq!(request(api, "GET", "/api/kpis", None, b""), 401);
    assert_eq!(request(api, "GET", "/api/kpis", Some(TOKEN_A), b""), 200);
    assert_eq!(request(api, "GET", "/metrics", Some(TOKEN_A), b""), 200);
    let body = traces(3, 0x7000).to_string();
    assert_eq!(
        request(http, "POST", "/v1/traces", None, body.as_bytes()),
        401
    );
    assert_eq!(
        request(http, "POST", "/v1/traces", Some(TOKEN_A), body.as_bytes()),
        200
    );

    // `infertrace report` sends INFERTRACE_TOKEN as a bearer token.
    let report = |token: Option<&str>| {
        let mut cmd = bin();
        cmd.args(["report", "--url", &format!("http://127.0.0.1:{api}")])
            .args(["--window", "1m", "--format", "json"])
            .env_remove("INFERTRACE_TOKEN");
        if let Some(t) = token {
            cmd.env("INFERTRACE_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let out = report(None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("401") && err.contains("INFERTRACE_TOKEN"),
        "{err}"
    );
    let out = report(Some(TOKEN_A));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Rotate: B replaces A (read only).
    std::fs::write(&tokens, format!("read {TOKEN_B}\n")).unwrap();
    p.hangup();
    until_status(api, TOKEN_B, 200);
    p.wait_log("1 bearer tokens reloaded");
    assert_eq!(request(api, "GET", "/api/kpis", Some(TOKEN_A), b""), 401);
    assert_eq!(request(api, "GET", "/metrics", Some(TOKEN_B), b""), 403);
    assert_eq!(
        request(http, "POST", "/v1/traces", Some(TOKEN_B), body.as_bytes()),
        403
    );

    // A broken file: the reload fails, says where, and B stays in force.
    std::fs::write(&tokens, format!("read {TOKEN_A}\nread\n")).unwrap();
    p.hangup();
    let log = p.wait_log("reloading the bearer tokens failed");
    assert!(log.contains(&format!("{}:2:", tokens.display())), "{log}");
    assert_eq!(request(api, "GET", "/api/kpis", Some(TOKEN_B), b""), 200);
    assert_eq!(request(api, "GET", "/api/kpis", Some(TOKEN_A), b""), 401);
    let log = p.log();
    assert!(
        !log.contains(TOKEN_A) && !log.contains(TOKEN_B),
        "a token was logged:\n{log}"
    );
    // The refusals were logged (rate-limited) and counted.
    assert!(log.contains("requests refused by authentication"), "{log}");
}

/// A tokens file whose read hangs (here a FIFO no one writes, as a stuck network mount would)
/// stalls only the reload: the listeners answer, the old tokens stay in force, a second SIGHUP
/// waits its turn, and SIGTERM still stops the process within its deadline.
#[test]
fn a_reload_that_hangs_stalls_neither_the_listeners_nor_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("all {TOKEN_A}\n")).unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "shutdown_timeout: 2s\n").unwrap();
    let (api, http) = (free_port(), free_port());
    let cmd = collect(
        dir.path(),
        &format!("127.0.0.1:{api}"),
        http,
        &[
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let mut p = Process::spawn(cmd, dir.path().join("stderr.log"));
    p.wait_log(&format!("API http://127.0.0.1:{api}"));

    std::fs::remove_file(&tokens).unwrap();
    let made = Command::new("mkfifo").arg(&tokens).status().unwrap();
    assert!(made.success(), "mkfifo failed");
    // The first SIGHUP's reload hangs on the FIFO, the second queues one more; from the third
    // on they fold into it and say so. (The runtime may merge signals that arrive together:
    // send until the line shows.)
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.log().contains("is folded into that one") {
        assert!(Instant::now() < deadline, "no fold logged:\n{}", p.log());
        p.hangup();
        std::thread::sleep(Duration::from_millis(200));
    }
    let body = traces(2, 0x7100).to_string();
    for _ in 0..3 {
        assert_eq!(request(api, "GET", "/health", None, b""), 200);
        assert_eq!(request(api, "GET", "/api/kpis", Some(TOKEN_A), b""), 200);
        assert_eq!(
            request(http, "POST", "/v1/traces", Some(TOKEN_A), body.as_bytes()),
            200
        );
    }

    let started = Instant::now();
    let pid = p.child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let status = loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            break status;
        }
        // The 2 s deadline plus a generous margin for a busy machine.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM while a reload hangs:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}:\n{}", p.log());
}

#[test]
fn non_loopback_listener_needs_tokens_or_insecure() {
    let dir = tempfile::tempdir().unwrap();
    // No token: refused, one line saying what to do.
    let out = collect(dir.path(), "0.0.0.0:0", free_port(), &[])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 (api.listen) without authentication")
            && err.contains("auth.insecure: true"),
        "{err}"
    );

    // insecure: starts, with a loud warning.
    let config = dir.path().join("insecure.yaml");
    std::fs::write(&config, "auth:\n  insecure: true\n").unwrap();
    let mut p = Process::spawn(
        collect(
            dir.path(),
            "0.0.0.0:0",
            free_port(),
            &["--config", config.to_str().unwrap()],
        ),
        dir.path().join("insecure.log"),
    );
    let log = p.wait_log("API http://0.0.0.0:");
    assert!(log.contains("INSECURE"), "{log}");
    drop(p);

    // Tokens from the environment: starts, and the API asks for them.
    let api = free_port();
    let mut cmd = collect(dir.path(), &format!("0.0.0.0:{api}"), free_port(), &[]);
    cmd.env(
        "INFERTRACE_TOKENS",
        format!("read {TOKEN_A}; metrics {TOKEN_B}"),
    );
    let mut p = Process::spawn(cmd, dir.path().join("env.log"));
    let log = p.wait_log(&format!("API http://0.0.0.0:{api}"));
    assert!(!log.contains("INSECURE"), "{log}");
    assert_eq!(request(api, "GET", "/api/kpis", None, b""), 401);
    assert_eq!(request(api, "GET", "/api/kpis", Some(TOKEN_A), b""), 200);
    assert_eq!(request(api, "GET", "/metrics", Some(TOKEN_B), b""), 200);
    assert_eq!(request(api, "GET", "/metrics", Some(TOKEN_A), b""), 403);

    // A malformed tokens file stops the start, naming the line.
    let tokens = dir.path().join("bad-tokens");
    std::fs::write(&tokens, format!("ingest {TOKEN_A}\nwrite {TOKEN_B}\n")).unwrap();
    let out = collect(
        dir.path(),
        "127.0.0.1:0",
        free_port(),
        &["--tokens-file", tokens.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:2: unknown scope \"write\"", tokens.display())),
        "{err}"
    );
    assert!(!err.contains(TOKEN_B), "a token was printed: {err}");
}

#[test]
fn check_config_reads_the_tokens_and_refuses_what_collect_refuses() {
    use std::ffi::OsStr;
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // `check-config args…` from the repository root, with INFERTRACE_TOKENS_FILE set to
    // `tokens_variable` and no other token variable: whether it passed, and its stderr.
    let check_config = |args: &[&OsStr], tokens_variable: Option<&std::path::Path>| {
        let mut cmd = bin();
        cmd.current_dir(&root)
            .arg("check-config")
            .args(args)
            .env_remove("INFERTRACE_TOKENS")
            .env_remove("INFERTRACE_TOKENS_FILE");
        if let Some(file) = tokens_variable {
            cmd.env("INFERTRACE_TOKENS_FILE", file);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let check = |yaml: &str| {
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, yaml).unwrap();
        check_config(&[file.as_os_str()], None)
    };
    let exposed = "api:\n  listen: 0.0.0.0:9464\n";

    let (ok, err) = check(exposed);
    assert!(!ok, "a non-loopback listener without tokens");
    assert!(
        err.contains("refusing to listen on 0.0.0.0:9464 (api.listen)"),
        "{err}"
    );

    let (ok, err) = check(&format!("{exposed}auth:\n  insecure: true\n"));
    assert!(ok, "insecure is the operator's explicit choice: {err}");

    let missing = dir.path().join("no-such-tokens");
    let (ok, err) = check(&format!(
        "{exposed}auth:\n  tokens_file: {}\n",
        missing.display()
    ));
    assert!(!ok, "a tokens file that cannot be read");
    assert!(err.contains("cannot read the tokens file"), "{err}");

    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("ingest,read,metrics {TOKEN_A}\n")).unwrap();
    let (ok, err) = check(&format!(
        "{exposed}auth:\n  tokens_file: {}\n",
        tokens.display()
    ));
    assert!(ok, "{err}");
    assert!(!err.contains(TOKEN_A), "a token is never printed");

    // The tokens file `collect` takes from its flag or INFERTRACE_TOKENS_FILE counts here too.
    let file = dir.path().join("exposed.yaml");
    std::fs::write(&file, exposed).unwrap();
    let (ok, err) = check_config(&[file.as_os_str()], Some(&tokens));
    assert!(ok, "{err}");
    let flag = [
        file.as_os_str(),
        OsStr::new("--tokens-file"),
        tokens.as_os_str(),
    ];
    let (ok, err) = check_config(&flag, None);
    assert!(ok, "{err}");

    // Listen addresses given on `collect`'s command line (as the container image gives them)
    // are checked as `collect` runs them.
    let loopback = dir.path().join("loopback.yaml");
    std::fs::write(&loopback, "store:\n  enabled: false\n").unwrap();
    let wildcard = [
        loopback.as_os_str(),
        OsStr::new("--otlp-grpc"),
        OsStr::new("0.0.0.0:4317"),
    ];
    let (ok, err) = check_config(&wildcard, None);
    assert!(!ok, "a wildcard given on the command line without tokens");
    assert!(err.contains("refusing to listen on 0.0.0.0:4317"), "{err}");
    let (ok, err) = check_config(&wildcard, Some(&tokens));
    assert!(ok, "{err}");
    // So is the data directory: one that cannot be a directory is refused.
    let not_a_dir = dir.path().join("a-file");
    std::fs::write(&not_a_dir, "").unwrap();
    let with_store = dir.path().join("with-store.yaml");
    std::fs::write(&with_store, "api:\n  listen: 127.0.0.1:9464\n").unwrap();
    let data_dir = [
        with_store.as_os_str(),
        OsStr::new("--data-dir"),
        not_a_dir.as_os_str(),
    ];
    let (ok, err) = check_config(&data_dir, None);
    assert!(!ok, "a data directory that is a file: {err}");
    let data_dir = [
        with_store.as_os_str(),
        OsStr::new("--data-dir"),
        dir.path().as_os_str(),
    ];
    let (ok, err) = check_config(&data_dir, None);
    assert!(ok, "{err}");

    // A variable that holds no token names itself as the thing to fix.
    let out = bin()
        .current_dir(&root)
        .arg("check-config")
        .arg(&loopback)
        .env("INFERTRACE_TOKENS", " ; ;")
        .env_remove("INFERTRACE_TOKENS_FILE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("holds no token") && err.contains("or unset INFERTRACE_TOKENS"),
        "{err}"
    );

    // The compose files' configs, with the tokens file they mount given on a host (their store
    // directory is the container's: not looked at here).
    for config in [
        "docker/infertrace.compose.yaml",
        "docker/infertrace.scale.yaml",
    ] {
        let args = [
            config,
            "--tokens-file",
            "otel-config/infertrace-tokens",
            "--no-store",
        ]
        .map(OsStr::new);
        let (ok, err) = check_config(&args, None);
        assert!(ok, "{config}: {err}");
    }
}
