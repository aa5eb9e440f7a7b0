//! The shutdown signals are listened for from the moment they are asked for, not from the
//! first poll: a SIGTERM sent before anything awaits them is received, not left to its default
//! action (which would kill this test process, failing it). Its own test binary, as it signals
//! its own process.

#![cfg(unix)]

use std::process::Command;
use std::time::Duration;

use infertrace_demo::{ShutdownSignals, shutdown_signal};

/// Sends SIGTERM to this process and waits for `kill` to return.
fn sigterm_self() {
    let ok = Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -TERM failed");
}

#[tokio::test]
async fn a_sigterm_before_the_first_poll_is_received() {
    let stop = shutdown_signal();
    sigterm_self();
    // Give the signal time to be delivered before the future is polled at all.
    std::thread::sleep(Duration::from_millis(200));
    tokio::time::timeout(Duration::from_secs(10), stop)
        .await
        .expect("the SIGTERM sent before the first poll completes shutdown_signal");

    // ShutdownSignals keeps a second signal for a second recv (collect's "stop at once").
    let mut signals = ShutdownSignals::install();
    sigterm_self();
    std::thread::sleep(Duration::from_millis(200));
    tokio::time::timeout(Duration::from_secs(10), signals.recv())
        .await
        .expect("the first signal");
    sigterm_self();
    tokio::time::timeout(Duration::from_secs(10), signals.recv())
        .await
        .expect("the second signal");
}
