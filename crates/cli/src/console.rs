//! Lines printed to standard error for the operator whatever `INFERTRACE_LOG` says — where the
//! collector listens, what a SIGHUP reloaded, that it stopped, a fatal error: plain text, or
//! with `INFERTRACE_LOG_FORMAT=json` one JSON object a line in the shape of the logs' own
//! (`timestamp`, `level`, `fields.message`, `target`), so that a pipeline reading JSON logs
//! (Loki, Elasticsearch) gets every line.

use std::time::SystemTime;

/// Whether logs are written as JSON (`INFERTRACE_LOG_FORMAT=json`).
pub fn json_logs() -> bool {
    std::env::var("INFERTRACE_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"))
}

/// Prints `message` at `level` (`INFO`, `ERROR`): as JSON or as it is, see the module docs.
/// A standard error that cannot be written (a log pipe that closed) loses the line and nothing
/// else: `eprintln!` would panic, and a panic in the signal handling would leave the collector
/// deaf to SIGTERM.
pub fn say(level: &str, message: &str) {
    use std::io::Write;
    let line = if json_logs() {
        json_line(level, message, SystemTime::now())
    } else {
        message.to_owned()
    };
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// One JSON log line, as `tracing-subscriber`'s JSON format writes an event.
fn json_line(level: &str, message: &str, at: SystemTime) -> String {
    serde_json::json!({
        "timestamp": humantime::format_rfc3339_micros(at).to_string(),
        "level": level,
        "fields": { "message": message },
        "target": "infertrace",
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_has_the_shape_of_the_logs() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_700_000_000_123_456);
        let v: serde_json::Value =
            serde_json::from_str(&json_line("INFO", "a \"quoted\"\nline", at)).unwrap();
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.123456Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["fields"]["message"], "a \"quoted\"\nline");
        assert_eq!(v["target"], "infertrace");
    }
}
