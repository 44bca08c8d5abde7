//! The node agent as the chart renders it by default: a DaemonSet on every GPU node, narrow
//! RBAC, a Service and a ServiceMonitor relabelled by node, and its command run here for real.

use crate::deploy::{container, documents, python_tools, read, render, strings, CHART, RELEASE};
use crate::sidecar::manifests::{assert_flags_parse, assert_serves_probes};
use crate::sidecar::TempDir;
use serde_json::{json, Value};

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
    assert!(spec["runtimeClassName"].is_null(), "none unless asked");
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
