//! The chart's Grafana dashboard and PrometheusRule alerts are built on metric names the
//! operator really exports: a running operator's `/metrics` is scraped, and every
//! `sandbox_operator_*` name in every dashboard query and alert expression must be one of the
//! series it exposes (counters as `_total`, histograms as `_bucket`/`_sum`/`_count`). The chart
//! is rendered with both enabled to check they ship as promised.

mod harness;

use std::collections::BTreeSet;
use std::time::Duration;

use harness::cluster::{apply_yaml_ok, namespace};
use harness::docker::{Purge, base_image};
use harness::operator::{Operator, OperatorOptions};
use harness::tools::helm;
use harness::{repo, wait_for};

/// Every series name the exposition declares, from its `# TYPE` lines.
fn exported(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "info" => &["_info"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{}{s}", name.trim_end_matches("_total")));
        }
    }
    names
}

/// The `sandbox_operator_*` names an expression uses.
fn used(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("sandbox_operator_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every query of the dashboard (panels' targets and templating queries).
fn dashboard_exprs() -> Vec<String> {
    let path = repo().join("charts/sandbox-operator/dashboards/sandbox-operator.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(q) = v["query"]["query"].as_str() {
            exprs.push(q.to_string());
        }
    }
    exprs
}

/// Renders the chart with the dashboard and the alerts enabled.
fn rendered() -> String {
    let chart = repo().join("charts/sandbox-operator");
    let out = helm(&[
        "template",
        "ops",
        chart.to_str().expect("path"),
        "--namespace",
        "monitoring-test",
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
    ]);
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The alert expressions of the rendered PrometheusRule.
fn alert_exprs(manifests: &str) -> Vec<String> {
    let mut exprs = Vec::new();
    for doc in manifests.split("\n---") {
        let Ok(value) = serde_yaml::from_str::<serde_json::Value>(doc) else {
            continue;
        };
        if value["kind"] != "PrometheusRule" {
            continue;
        }
        for group in value["spec"]["groups"].as_array().into_iter().flatten() {
            for rule in group["rules"].as_array().into_iter().flatten() {
                if let Some(e) = rule["expr"].as_str() {
                    exprs.push(format!("{}: {e}", rule["alert"].as_str().unwrap_or("?")));
                }
            }
        }
    }
    exprs
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_query_and_alert_uses_metrics_the_operator_exports() {
    let manifests = rendered();
    assert!(
        manifests.contains("grafana_dashboard: \"1\"")
            && manifests.contains("sandbox-operator.json"),
        "the dashboard ConfigMap follows the grafana_dashboard convention"
    );
    let alerts = alert_exprs(&manifests);
    let names: BTreeSet<String> = alerts
        .iter()
        .map(|a| a.split(':').next().unwrap_or_default().to_string())
        .collect();
    for wanted in [
        "SandboxOperatorReconcileErrors",
        "SandboxOperatorLeaderAbsent",
        "SandboxOperatorSweepAborted",
        "SandboxOperatorProviderUnavailable",
    ] {
        assert!(names.contains(wanted), "alert {wanted} missing: {names:?}");
    }
    let exprs: Vec<String> = dashboard_exprs().into_iter().chain(alerts).collect();
    assert!(exprs.len() > 10, "{exprs:?}");

    let ns = namespace("dashboards").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    // One Sandbox, so the series of provider calls (labelled by provider and operation,
    // which are not known in advance) exist too.
    let manifest = format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: probe\nspec:\n  image: {}\n",
        base_image()
    );
    apply_yaml_ok(&manifest, &ns);
    let metrics = wait_for(
        "a provider call on /metrics",
        Duration::from_secs(90),
        || async {
            op.http_get("/metrics")
                .filter(|m| {
                    m.contains("sandbox_operator_leader 1")
                        && m.contains("operation=\"start\",outcome=\"ok\"")
                })
                .ok_or_else(|| format!("no provider call yet (log {})", op.log.display()))
        },
    )
    .await;
    let exported = exported(&metrics);
    let mut missing = Vec::new();
    for expr in &exprs {
        let uses = used(expr);
        assert!(
            !uses.is_empty() || expr.contains("label_values"),
            "no metric in {expr}"
        );
        for name in uses {
            if !exported.contains(&name) {
                missing.push(format!("{name} (in {expr})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not exported by the operator: {missing:#?}\nexported: {exported:#?}"
    );
}
