//! `store:` in the collector's configuration: where the history lives, how often it is
//! written, how long it is kept and how much of each minute.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::human_duration;

/// `store:` — the embedded history store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreOptions {
    /// Keep history at all (`--no-store` sets false: everything stays in memory). Default true.
    pub enabled: bool,
    /// Directory of `infertrace.db` (`--data-dir`). Default `./infertrace-data`.
    pub data_dir: PathBuf,
    /// How often the writer commits what it received; a crash loses at most this much (plus
    /// ≤ 1 s of hand-over). Default 5s.
    #[serde(with = "human_duration")]
    pub flush_interval: Duration,
    /// Rows older than this are deleted, at every flush. Default 7d.
    #[serde(with = "human_duration")]
    pub retention: Duration,
    /// Slowest requests kept per minute (record + critical path). Default 10.
    pub slow_per_minute: usize,
    /// Failed requests (error, rejected) kept per minute, the first ones. Default 100.
    pub failed_per_minute: usize,
    /// Items the writer's queue holds before new ones are dropped (and counted). Default 4096.
    pub queue_capacity: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            data_dir: PathBuf::from("./infertrace-data"),
            flush_interval: Duration::from_secs(5),
            retention: Duration::from_secs(7 * 24 * 3600),
            slow_per_minute: 10,
            failed_per_minute: 100,
            queue_capacity: 4096,
        }
    }
}
