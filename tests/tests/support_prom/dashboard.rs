//! The Grafana dashboard's PromQL: every panel target and variable query, with Grafana's
//! variables substituted so Prometheus can run them as instant queries.

use std::path::Path;

/// Reads and parses a dashboard JSON file.
pub fn load(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Substitutes Grafana's variables for an instant query.
pub fn to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "5m")
        .replace("${model}", ".*")
        .replace("$model", ".*")
        .replace("${instance}", ".*")
        .replace("$instance", ".*")
}

/// One PromQL expression of a dashboard.
#[derive(Clone, Debug)]
pub struct Query {
    /// The panel title, or `variable <name>`.
    pub title: String,
    /// The expression, Grafana variables not yet substituted.
    pub expr: String,
    /// Whether it comes from a template variable.
    pub is_variable: bool,
}

/// Every PromQL expression of the dashboard: panel targets and `label_values(metric, label)`
/// variable queries (as `count by (label) (metric)`).
pub fn exprs(dashboard: &serde_json::Value) -> Vec<Query> {
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<Query>) {
        if let Some(panels) = v["panels"].as_array() {
            for p in panels {
                let title = p["title"].as_str().unwrap_or("").to_owned();
                for t in p["targets"].as_array().into_iter().flatten() {
                    if let Some(e) = t["expr"].as_str() {
                        out.push(Query {
                            title: title.clone(),
                            expr: e.to_owned(),
                            is_variable: false,
                        });
                    }
                }
                walk(p, out);
            }
        }
    }
    walk(dashboard, &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] != "query" {
            continue;
        }
        let q = var["query"]["query"]
            .as_str()
            .or_else(|| var["query"].as_str())
            .unwrap_or("");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {} is not label_values(...): {q}", var["name"]));
        let (metric, label) = inner
            .rsplit_once(',')
            .unwrap_or_else(|| panic!("label_values without a metric: {q}"));
        out.push(Query {
            title: format!("variable {}", var["name"]),
            expr: format!("count by ({}) ({})", label.trim(), metric.trim()),
            is_variable: true,
        });
    }
    out
}

/// Whether a dashboard expression must return data after this test's traffic: it reads only
/// families every collector exposes once requests flowed (not GPU, alert, drop or forward
/// families, nor the middleware's own metrics, which this test does not produce).
pub fn must_have_data(expr: &str) -> bool {
    expr.contains("infertrace_")
        && ![
            "DCGM_",
            "hw_",
            "gen_ai_server_",
            "infer_server_",
            "infertrace_gpu_",
            "infertrace_alerts_active",
            "infertrace_dropped_spans",
            "infertrace_exported_spans",
            "infertrace_store_dropped",
        ]
        .iter()
        .any(|f| expr.contains(f))
}
