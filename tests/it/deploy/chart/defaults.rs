//! The chart's defaults as a cluster meets them: no RuntimeClass unless asked, the priority
//! class dcgm-exporter's users expect, NOTES that name the four reasons a DaemonSet makes no
//! pods, the values schema refusing misspelt and mistyped values by name, both ways to reach
//! NVML, and the namespace's Pod Security level wherever the docs create the namespace.

use crate::deploy::{
    assert_valid, container, documents, helm_tool, python_tools, read, render, repo, CHART, RELEASE,
};
use serde_json::{json, Value};

fn pod_spec(chart: &crate::deploy::Rendered) -> Value {
    chart.one("DaemonSet")["spec"]["template"]["spec"].clone()
}

#[test]
fn no_runtime_class_unless_asked_and_the_node_critical_priority() {
    if !python_tools() {
        return;
    }
    let chart = render(json!({}));
    let spec = pod_spec(&chart);
    assert!(
        spec["runtimeClassName"].is_null(),
        "a RuntimeClass the cluster lacks makes no pod: {}",
        spec["runtimeClassName"]
    );
    assert_eq!(spec["priorityClassName"], "system-node-critical");

    let asked =
        render(json!({"nodeAgent": {"runtimeClassName": "nvidia", "priorityClassName": ""}}));
    let spec = pod_spec(&asked);
    assert_eq!(spec["runtimeClassName"], "nvidia");
    assert!(spec["priorityClassName"].is_null());
}

#[test]
fn notes_name_the_four_reasons_for_no_pods_with_this_release_s_values() {
    if !python_tools() {
        return;
    }
    let notes = render(json!({})).notes;
    for expected in [
        "Node selector: no node is labelled nvidia.com/gpu.present=true",
        "kubectl get nodes -l nvidia.com/gpu.present=true",
        "Tolerations: the agent tolerates nvidia.com/gpu;",
        "Runtime class: none is set",
        "--set nodeAgent.runtimeClassName=nvidia",
        "Pod Security: the agent's pods need the \"privileged\" level (hostPID)",
        "kubectl label namespace gpumem pod-security.kubernetes.io/enforce=privileged",
    ] {
        assert!(
            notes.contains(expected),
            "NOTES lack {expected:?}:\n{notes}"
        );
    }

    // Each reason follows the values: a RuntimeClass asked for, no selector, no hostPID.
    let notes = render(json!({"nodeAgent": {
        "runtimeClassName": "nvidia", "nodeSelector": null, "hostPID": false, "tolerations": []
    }}))
    .notes;
    for expected in [
        "Node selector: none is set",
        "Tolerations: the agent tolerates no taint",
        "the pods ask for RuntimeClass nvidia",
        "kubectl get runtimeclass nvidia",
        "Pod Security: the agent's pods meet the \"baseline\" level",
    ] {
        assert!(
            notes.contains(expected),
            "NOTES lack {expected:?}:\n{notes}"
        );
    }
    // A privileged container and a host directory put the pods above "baseline" too.
    let notes = render(json!({"nodeAgent": {
        "hostPID": false, "nvmlAccess": "privileged", "collectDir": {"enabled": true}
    }}))
    .notes;
    assert!(
        notes.contains("level (a privileged container, a hostPath volume)"),
        "{notes}"
    );
}

/// What Helm says when it refuses `values`: the error of an install (what `helm template` and
/// `helm install` both run), and whether `helm lint` finds an error in values.yaml (its library
/// gives lint's messages without their text).
fn refused_by_lint(values: &Value) -> bool {
    let lint = helm_tool(&json!({"op": "lint", "chart": repo(CHART), "values": values}));
    lint["messages"].as_array().is_some_and(|m| {
        m.iter()
            .any(|m| m["path"] == "values.yaml" && m["severity"] == 3)
    })
}

fn refused(values: &Value) -> (String, bool) {
    let install = helm_tool(&json!({
        "op": "render", "chart": repo(CHART), "release": RELEASE, "namespace": RELEASE,
        "values": values, "operator": true,
    }));
    let lint_refuses = refused_by_lint(values);
    (
        install["error"]
            .as_str()
            .unwrap_or_else(|| panic!("Helm rendered {values} without complaint"))
            .to_string(),
        lint_refuses,
    )
}

#[test]
fn the_values_schema_refuses_a_misspelt_or_mistyped_value_by_name() {
    if !python_tools() {
        return;
    }
    let schema: Value = serde_json::from_str(&read(&format!("{CHART}/values.schema.json")))
        .expect("values.schema.json is JSON");
    assert_eq!(schema["additionalProperties"], false);

    for (values, named) in [
        (
            json!({"nodeAgent": {"nodeselector": {"gpu": "yes"}}}),
            "nodeselector",
        ),
        (json!({"nodeAgnet": {"enabled": false}}), "nodeAgnet"),
        (
            json!({"serviceMonitor": {"label": {"release": "x"}}}),
            "label",
        ),
        (json!({"nodeAgent": {"hostPID": "yes"}}), "hostPID"),
        (json!({"nodeAgent": {"interval": "1 second"}}), "interval"),
        (json!({"nodeAgent": {"nvmlAccess": "mounts"}}), "nvmlAccess"),
        (json!({"service": {"port": "9400"}}), "port"),
    ] {
        let (install, lint_refuses) = refused(&values);
        assert!(
            install.contains(named),
            "helm template with {values} should name {named:?}: {install}"
        );
        assert!(lint_refuses, "helm lint passes {values}");
    }
    // The defaults themselves pass: the lint of every documented combination is `combinations`'.
    assert!(!refused_by_lint(&json!({})));
}

#[test]
fn nvml_through_the_device_list_variable_or_a_privileged_container() {
    if !python_tools() {
        return;
    }
    let variables = |agent: &Value| -> Vec<Value> {
        agent["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("NVIDIA_")))
            .cloned()
            .collect()
    };
    let expected = vec![
        json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}),
        json!({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}),
    ];

    let plain = render(json!({}));
    let spec = pod_spec(&plain);
    let agent = container(&spec, "gpumem");
    assert_eq!(variables(agent), expected);
    assert!(agent["securityContext"]["privileged"].is_null());
    assert_eq!(agent["securityContext"]["allowPrivilegeEscalation"], false);
    assert!(
        agent["resources"]["limits"]["nvidia.com/gpu"].is_null(),
        "no GPU is requested"
    );

    let privileged = render(json!({"nodeAgent": {"nvmlAccess": "privileged"}}));
    assert_valid(&privileged.objects, "the chart with nvmlAccess=privileged");
    let spec = pod_spec(&privileged);
    let agent = container(&spec, "gpumem");
    assert_eq!(
        variables(agent),
        expected,
        "the runtime still injects by them"
    );
    let context = &agent["securityContext"];
    assert_eq!(context["privileged"], true);
    // The API server refuses privileged with allowPrivilegeEscalation false.
    assert_eq!(context["allowPrivilegeEscalation"], true);
    assert_eq!(context["runAsUser"], 10001, "still the image's user");
}

#[test]
fn the_namespace_gets_the_pod_security_level_the_agent_needs() {
    if !python_tools() {
        return;
    }
    // hostPID is past "baseline": the namespace the docs and kustomize make enforce "privileged".
    assert_eq!(pod_spec(&render(json!({})))["hostPID"], true);
    let label = "pod-security.kubernetes.io/enforce";
    let namespace = documents(
        &read("docker/k8s/node-agent/namespace.yaml"),
        "namespace.yaml",
    );
    assert_eq!(namespace[0]["metadata"]["labels"][label], "privileged");
    let command = format!("kubectl label namespace {RELEASE} {label}=privileged");
    for doc in ["docs/kubernetes.md", "README.md"] {
        let text = read(doc);
        let labelled = text.find(&command);
        let installed = text.find("helm install gpumem");
        assert!(
            labelled.is_some() && labelled < installed,
            "{doc} should run `{command}` before its helm install"
        );
    }
}
