//! `otel-config/infertrace.yaml` documents every key with its default: it must parse and equal
//! `CollectorConfig::default()`, and mention every key the schema has.

use std::path::PathBuf;

use infertrace_collector::config::CollectorConfig;

fn shipped() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../otel-config/infertrace.yaml")
}

#[test]
fn shipped_config_is_the_defaults() {
    let c = CollectorConfig::from_file(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c, CollectorConfig::default());
}

/// Every key of the default config, as `a.b.c` paths (list items are not descended into).
fn keys(v: &serde_yaml_ng::Value, prefix: &str, out: &mut Vec<String>) {
    if let serde_yaml_ng::Value::Mapping(m) = v {
        for (k, v) in m {
            let k = k.as_str().unwrap();
            let path = if prefix.is_empty() {
                k.to_owned()
            } else {
                format!("{prefix}.{k}")
            };
            out.push(path.clone());
            keys(v, &path, out);
        }
    }
}

#[test]
fn shipped_config_documents_every_key() {
    let text = std::fs::read_to_string(shipped()).unwrap();
    let shipped: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let default = serde_yaml_ng::to_value(CollectorConfig::default()).unwrap();
    let (mut want, mut have) = (Vec::new(), Vec::new());
    keys(&default, "", &mut want);
    keys(&shipped, "", &mut have);
    let missing: Vec<&String> = want.iter().filter(|k| !have.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "keys missing from infertrace.yaml: {missing:?}"
    );
}

#[test]
fn errors_name_the_file_line_and_column() {
    let dir = std::env::temp_dir().join(format!("infertrace-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "kpi:\n  windows: [1m]\nassembly:\n  grace: 2s\n  idel_timeout: 5s\n",
    )
    .unwrap();
    let e = CollectorConfig::from_file(&path).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}:5:3: ", path.display())), "{e}");
    assert!(e.contains("idel_timeout"), "{e}");

    std::fs::write(
        &path,
        "alerts:\n  rules:\n    - name: Slow\n      expr: e2e.p95 >> 1s\n",
    )
    .unwrap();
    let e = CollectorConfig::from_file(&path).unwrap_err().to_string();
    assert!(e.contains("alert rule 'Slow'"), "{e}");
    assert!(e.contains(":4:"), "points at the expr line: {e}");

    let e = CollectorConfig::from_file(&dir.join("missing.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_partial_file_keeps_the_other_defaults() {
    let c = CollectorConfig::from_yaml_str(
        "receivers:\n  otlp_grpc:\n    enabled: false\n    endpoint: 0.0.0.0:4317\nkpi:\n  slo:\n    ttft: 250ms\n",
    )
    .unwrap();
    let d = CollectorConfig::default();
    assert!(!c.receivers.otlp_grpc.enabled);
    assert_eq!(c.receivers.otlp_http, d.receivers.otlp_http);
    assert_eq!(c.kpi.slo.ttft_seconds, Some(0.25));
    assert_eq!(c.kpi.slo.e2e_seconds, d.kpi.slo.e2e_seconds);
    // The diagnosis threshold tied to the TTFT objective follows it.
    assert_eq!(c.diagnosis_config().ttft_p90_max_seconds, 0.25);
    assert_eq!(d.diagnosis_config().ttft_p90_max_seconds, 1.0);
}
