//! The chart rendered by Helm's library and checked object by object: the node agent as the
//! issue asks for it (DaemonSet, narrow RBAC, Service, ServiceMonitor relabelled by node), its
//! command run here for real, the PrometheusRule and dashboard ConfigMap equal to the files under
//! grafana/ they are read from, the packaged chart carrying those files, and every value
//! combination the README documents linted and validated.

use super::{
    assert_valid, container, documents, helm_tool, python_tools, read, render, render_chart, repo,
    strings, Rendered, CHART, RELEASE,
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
                    "runtimeClassName": "",
                    // null, not {}: Helm merges a map with the default's, so only null clears it.
                    "nodeSelector": null,
                    "hostPID": false,
                    "priorityClassName": "system-node-critical",
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

fn app_version() -> String {
    let chart = documents(&read(&format!("{CHART}/Chart.yaml")), "Chart.yaml");
    chart[0]["appVersion"]
        .as_str()
        .expect("appVersion")
        .to_string()
}

/// The gpumem container of docker/k8s/deployment.yaml: the sidecar the agent's container
/// settings are taken from.
fn kustomize_sidecar() -> Value {
    let deployment = documents(&read("docker/k8s/deployment.yaml"), "deployment.yaml");
    container(&deployment[0]["spec"]["template"]["spec"], "gpumem").clone()
}

fn env_of(container: &Value) -> Vec<(String, Value)> {
    container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let source = if e["value"].is_null() {
                e["valueFrom"]["fieldRef"]["fieldPath"].clone()
            } else {
                e["value"].clone()
            };
            (e["name"].as_str().expect("name").to_string(), source)
        })
        .collect()
}

/// Whether every label `selector` asks for is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
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
fn the_node_agent_runs_on_every_gpu_node_with_narrow_rbac() {
    if !python_tools() {
        return;
    }
    let chart = render(json!({}));
    assert_eq!(
        chart.kinds(),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "PrometheusRule",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ]
    );
    for object in &chart.objects {
        if !object["kind"].as_str().unwrap_or("").starts_with("Cluster") {
            assert_eq!(
                object["metadata"]["namespace"], RELEASE,
                "{}",
                object["kind"]
            );
        }
    }
    let daemonset = chart.one("DaemonSet");
    let pod = &daemonset["spec"]["template"];
    assert!(selects(
        &daemonset["spec"]["selector"]["matchLabels"],
        &pod["metadata"]["labels"]
    ));
    let spec = &pod["spec"];
    let agent = container(spec, "gpumem");
    assert_eq!(
        agent["image"],
        format!("ghcr.io/gpumem/gpumem:{}", app_version()),
        "the image defaults to the project's, at the chart's appVersion"
    );
    let args = strings(&agent["args"]);
    assert_eq!(
        args,
        ["serve", "--listen", "0.0.0.0:9400", "--interval", "1s"]
    );
    assert_flags_parse(&args);
    let env = env_of(agent);
    for (name, source) in [
        ("GPUMEM_NODE_NAME", json!("spec.nodeName")),
        ("GPUMEM_POD_NAME", json!("metadata.name")),
        ("GPUMEM_POD_NAMESPACE", json!("metadata.namespace")),
        ("GPUMEM_POD_SOURCE", json!("kubernetes")),
        ("NVIDIA_VISIBLE_DEVICES", json!("all")),
        ("NVIDIA_DRIVER_CAPABILITIES", json!("utility")),
    ] {
        assert!(
            env.contains(&(name.to_string(), source.clone())),
            "{name} should be {source}: {env:?}"
        );
    }
    assert_eq!(spec["hostPID"], true, "NVML's pids are the host's");
    assert_eq!(spec["runtimeClassName"], "nvidia");
    assert_eq!(
        spec["nodeSelector"],
        json!({"nvidia.com/gpu.present": "true"})
    );
    assert!(
        spec["tolerations"]
            .as_array()
            .expect("tolerations")
            .contains(
                &json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
            ),
        "tolerates the GPU taint"
    );
    // The agent runs as locked down as the sidecar of docker/k8s, with the same budget.
    let sidecar = kustomize_sidecar();
    assert_eq!(agent["securityContext"], sidecar["securityContext"]);
    assert_eq!(agent["resources"], sidecar["resources"]);
    let probe = &agent["livenessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/healthz");
    let port = agent["ports"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == probe["port"]))
        .expect("the probe's port is declared");
    assert_eq!(port["containerPort"], 9400);
    assert!(agent["readinessProbe"].is_null());

    // Reading pods is all it may do, as its own ServiceAccount.
    let account = chart.one("ServiceAccount");
    assert_eq!(spec["serviceAccountName"], account["metadata"]["name"]);
    let role = chart.one("ClusterRole");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])
    );
    let binding = chart.one("ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": RELEASE}])
    );

    // The Service reaches the agents' port; the ServiceMonitor finds the Service and labels
    // series by node.
    let service = chart.one("Service");
    assert!(selects(
        &service["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}])
    );
    let monitor = chart.one("ServiceMonitor");
    assert!(selects(
        &monitor["spec"]["selector"]["matchLabels"],
        &service["metadata"]["labels"]
    ));
    assert_eq!(
        monitor["spec"]["namespaceSelector"],
        json!({"matchNames": [RELEASE]})
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["honorLabels"], true, "the agent's pod labels win");
    let relabelings = endpoint["relabelings"].as_array().expect("relabelings");
    for target in ["node", "instance"] {
        assert!(
            relabelings.contains(&json!({
                "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": target
            })),
            "{target} should be the node's name"
        );
    }
    assert!(
        relabelings.contains(&json!({"action": "labeldrop", "regex": "namespace|pod|container"}))
    );
    assert!(
        chart.notes.contains("port-forward"),
        "NOTES: {}",
        chart.notes
    );

    // The agent's command, started here: it serves /healthz and /metrics where they look.
    let dir = TempDir::new("helm-agent");
    drop(assert_serves_probes(&args, &dir));
}

#[test]
fn the_prometheus_rule_and_the_dashboard_are_the_files_under_grafana() {
    if !python_tools() {
        return;
    }
    let chart = render(json!({}));
    let alerts = documents(&read("grafana/alerts.yml"), "grafana/alerts.yml");
    let rule = chart.one("PrometheusRule");
    assert_eq!(
        rule["spec"]["groups"], alerts[0]["groups"],
        "the PrometheusRule's groups differ from grafana/alerts.yml"
    );
    // Inserted, not evaluated: Prometheus's own templates reach it as written.
    assert!(chart.manifest.contains("{{ $labels.gpu }}"));

    let map = chart.one("ConfigMap");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(map["data"]["gpumem.json"].as_str().expect("data"))
        .expect("the ConfigMap's dashboard is JSON");
    let dashboard: Value =
        serde_json::from_str(&read("grafana/dashboard.json")).expect("dashboard.json");
    assert_eq!(
        shipped, dashboard,
        "the dashboard ConfigMap differs from grafana/dashboard.json"
    );

    // Turned off, they are gone.
    let without =
        render(json!({"prometheusRule": {"enabled": false}, "dashboard": {"enabled": false}}));
    assert!(
        without.of_kind("PrometheusRule").is_empty() && without.of_kind("ConfigMap").is_empty()
    );
}

/// `helm package` (what a chart repository serves) carries the files under grafana/ that the
/// chart links to, byte for byte, not the links.
#[test]
fn the_packaged_chart_carries_the_grafana_files() {
    if !python_tools() {
        return;
    }
    let answer = helm_tool(&json!({"op": "package", "chart": repo(CHART)}));
    assert!(answer["error"].is_null(), "{}", answer["error"]);
    for (inside, source) in [
        ("gpumem/files/alerts.yml", "grafana/alerts.yml"),
        ("gpumem/files/dashboard.json", "grafana/dashboard.json"),
    ] {
        assert_eq!(
            answer["files"][inside].as_str(),
            Some(read(source).as_str()),
            "{inside} in the package is not {source}"
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
            for absent in ["runtimeClassName", "nodeSelector"] {
                assert!(spec[absent].is_null(), "{absent} should be left out");
            }
            assert_eq!(spec["priorityClassName"], "system-node-critical");
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

/// The values of values.yaml a user sets, as dotted paths: a key whose comment starts with
/// `# --` is one value (whatever it holds); a key without is a section of values, and one
/// holding a value on its own line is a value nobody commented (the second list).
fn documented_values() -> (Vec<String>, Vec<String>) {
    let text = read(&format!("{CHART}/values.yaml"));
    let lines: Vec<&str> = text.lines().collect();
    let mut values = Vec::new();
    let mut uncommented = Vec::new();
    let mut sections: Vec<(usize, String)> = Vec::new();
    let mut inside_value: Option<usize> = None;
    for (at, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if inside_value.is_some_and(|outer| indent > outer) {
            continue;
        }
        inside_value = None;
        let Some((key, rest)) = trimmed.split_once(':') else {
            continue;
        };
        sections.retain(|(depth, _)| *depth < indent);
        let path: Vec<&str> = sections
            .iter()
            .map(|(_, name)| name.as_str())
            .chain([key])
            .collect();
        let path = path.join(".");
        // The comment block right above the key.
        let comment = lines[..at]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with('#'))
            .last()
            .map_or("", |l| l.trim());
        if comment.starts_with("# --") {
            values.push(path);
            inside_value = Some(indent);
        } else if rest.trim().is_empty() {
            sections.push((indent, key.to_string()));
        } else {
            uncommented.push(path);
            inside_value = Some(indent);
        }
    }
    (values, uncommented)
}

/// Every value in values.yaml has a comment there and a row in the README's table, and every
/// row names a value that exists.
#[test]
fn every_value_is_commented_and_documented() {
    let (values, uncommented) = documented_values();
    assert!(
        uncommented.is_empty(),
        "values without a `# --` comment: {uncommented:?}"
    );
    assert!(
        values.len() >= 40,
        "only {} values found: {values:?}",
        values.len()
    );
    for must in [
        "nodeAgent.hostPID",
        "nodeAgent.collectDir.enabled",
        "sidecar.resources",
    ] {
        assert!(
            values.iter().any(|v| v == must),
            "{must} is not a commented value"
        );
    }
    let readme = read(&format!("{CHART}/README.md"));
    let rows: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name))
        .collect();
    for value in &values {
        assert!(
            rows.contains(&value.as_str()),
            "README.md does not document {value}"
        );
    }
    for row in &rows {
        assert!(
            values.iter().any(|v| v == row),
            "README.md documents {row}, which values.yaml lacks"
        );
    }
}
