//! Every value combination the README documents, linted by Helm, rendered, validated against the
//! Kubernetes schemas and checked for what it must change.

use crate::deploy::{
    assert_valid, container, helm_tool, python_tools, render, render_chart, repo, strings,
    Rendered, CHART,
};
use crate::sidecar::manifests::{assert_flags_parse, assert_serves_probes};
use crate::sidecar::TempDir;
use serde_json::{json, Value};

/// Value sets each test renders: the defaults, and every option the README describes turned
/// the other way.
fn combinations() -> Vec<(&'static str, Value)> {
    vec![
        ("defaults", json!({})),
        (
            "sidecar PodMonitor",
            json!({"podMonitor": {"enabled": true}}),
        ),
        (
            "host collect directory",
            json!({"nodeAgent": {"collectDir": {"enabled": true}}}),
        ),
        (
            "sidecar shape only",
            json!({"nodeAgent": {"enabled": false}, "podMonitor": {"enabled": true}}),
        ),
        (
            "everything else overridden",
            json!({
                "rbac": {"create": false},
                "serviceAccount": {"create": false, "name": "existing"},
                "nodeAgent": {
                    "runtimeClassName": "nvidia",
                    // null, not {}: Helm merges a map with the default's, so only null clears it.
                    "nodeSelector": null,
                    "hostPID": false,
                    "priorityClassName": "",
                    "nvmlAccess": "privileged",
                    "interval": "5s",
                    "extraArgs": ["--allowed-hosts", "gpumem.gpumem.svc"],
                    "extraEnv": [{"name": "GPUMEM_TOP_TAGS", "value": "20"}],
                    "podAnnotations": {"example.com/team": "ml"},
                    "podLabels": {"team": "ml"},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                        ]}]
                    }}}
                },
                "image": {"tag": "0.2.0", "pullPolicy": "Always"},
                "imagePullSecrets": [{"name": "regcred"}],
                "service": {"annotations": {"example.com/scrape": "false"}},
                "serviceMonitor": {
                    "labels": {"release": "kube-prometheus-stack"},
                    "interval": "1m",
                    "relabelings": [{"targetLabel": "cluster", "replacement": "gpu-east"}],
                    "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "gpumem_collect_.*"}]
                },
                "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}},
                "dashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "GPU"}},
                "fullnameOverride": "gpu-memory"
            }),
        ),
    ]
}

#[test]
fn helm_lints_the_chart_with_every_value_set() {
    if !python_tools() {
        return;
    }
    for (name, values) in combinations() {
        let answer = helm_tool(&json!({"op": "lint", "chart": repo(CHART), "values": values}));
        assert!(answer["error"].is_null(), "{name}: {}", answer["error"]);
        assert_eq!(answer["charts"], 1, "{name}: Helm linted no chart");
        // Severity 1 is information (Helm recommends an icon); 2 is a warning, 3 an error.
        let serious: Vec<&Value> = answer["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["severity"].as_i64() >= Some(2))
            .collect();
        assert!(
            serious.is_empty() && answer["errors"] == 0,
            "{name}: Helm's lint found problems in {serious:?}"
        );
    }
}

#[test]
fn every_value_combination_renders_and_validates() {
    if !python_tools() {
        return;
    }
    for (name, values) in combinations() {
        let chart = render(values.clone());
        assert_valid(&chart.objects, &format!("the chart with {name}"));
        check_combination(name, &chart);
    }
    // Without the Prometheus Operator's API, its objects are left out, and NOTES say so.
    let plain = render_chart(
        &repo(CHART),
        &json!({"podMonitor": {"enabled": true}}),
        false,
    );
    assert_valid(&plain.objects, "the chart without the operator");
    assert_eq!(
        plain.kinds(),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "Service",
            "ServiceAccount"
        ]
    );
    assert!(
        plain.notes.contains("no Prometheus Operator"),
        "{}",
        plain.notes
    );
}

/// What each combination must change.
fn check_combination(name: &str, chart: &Rendered) {
    match name {
        "sidecar PodMonitor" => {
            let monitor = chart.one("PodMonitor");
            let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
            assert_eq!(endpoint["port"], "metrics");
            assert_eq!(endpoint["honorLabels"], true);
            assert_eq!(
                monitor["spec"]["selector"],
                json!({"matchLabels": {"gpumem-sidecar": "true"}})
            );
            assert_eq!(monitor["spec"]["namespaceSelector"], json!({"any": true}));
        }
        "host collect directory" => {
            let spec = &chart.one("DaemonSet")["spec"]["template"]["spec"];
            let agent = container(spec, "gpumem");
            let args = strings(&agent["args"]);
            let at = args
                .iter()
                .position(|a| a == "--collect-dir")
                .expect("--collect-dir");
            assert_eq!(args[at + 1], "/var/run/gpumem");
            assert_eq!(
                agent["volumeMounts"],
                json!([{"name": "gpumem-collect", "mountPath": "/var/run/gpumem"}])
            );
            assert_eq!(
                spec["volumes"],
                json!([{"name": "gpumem-collect",
                        "hostPath": {"path": "/var/run/gpumem", "type": "DirectoryOrCreate"}}])
            );
            assert_flags_parse(&args);
            // Run as the agent would, the host directory standing in as a temporary one.
            let dir = TempDir::new("helm-collect");
            let local: Vec<String> = args
                .iter()
                .map(|a| {
                    if a == "/var/run/gpumem" {
                        dir.str().to_string()
                    } else {
                        a.clone()
                    }
                })
                .collect();
            drop(assert_serves_probes(&local, &dir));
        }
        "sidecar shape only" => {
            assert_eq!(chart.kinds(), ["ConfigMap", "PodMonitor", "PrometheusRule"]);
        }
        "everything else overridden" => {
            assert!(
                chart.of_kind("ClusterRole").is_empty()
                    && chart.of_kind("ServiceAccount").is_empty()
            );
            let daemonset = chart.one("DaemonSet");
            assert_eq!(daemonset["metadata"]["name"], "gpu-memory");
            let spec = &daemonset["spec"]["template"]["spec"];
            assert_eq!(spec["serviceAccountName"], "existing");
            assert_eq!(spec["hostPID"], false);
            for absent in ["priorityClassName", "nodeSelector"] {
                assert!(spec[absent].is_null(), "{absent} should be left out");
            }
            assert_eq!(spec["runtimeClassName"], "nvidia");
            assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
            let agent = container(spec, "gpumem");
            assert_eq!(agent["image"], "ghcr.io/gpumem/gpumem:0.2.0");
            let args = strings(&agent["args"]);
            assert_eq!(
                args,
                [
                    "serve",
                    "--listen",
                    "0.0.0.0:9400",
                    "--interval",
                    "5s",
                    "--allowed-hosts",
                    "gpumem.gpumem.svc"
                ]
            );
            assert_flags_parse(&args);
            let monitor = chart.one("ServiceMonitor");
            assert_eq!(
                monitor["metadata"]["labels"]["release"],
                "kube-prometheus-stack"
            );
            assert_eq!(
                chart.one("ConfigMap")["metadata"]["namespace"],
                "monitoring"
            );
        }
        _ => {}
    }
}
