//! The kustomizations under docker/k8s: `kubectl kustomize` builds each, and every object it
//! builds validates; the node agent's is the chart rendered with its default values, so the two
//! cannot drift apart.

use super::{assert_valid, documents, python_tools, read, render, repo};
use serde_json::{json, Value};
use std::process::Command;

const REGENERATE: &str =
    "python3 tests/it/deploy/helm_tool.py template > docker/k8s/node-agent/gpumem.yaml";

/// `kubectl kustomize DIR`'s objects; None (skip) without kubectl, unless CI=true.
fn kustomize(dir: &str) -> Option<Vec<Value>> {
    let output = match Command::new("kubectl")
        .args(["kustomize", repo(dir).to_str().expect("UTF-8")])
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "kubectl is required when CI=true (see .ci/run): {error}"
            );
            eprintln!("skipped: kubectl is not installed");
            return None;
        }
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(documents(&String::from_utf8_lossy(&output.stdout), dir))
}

fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

#[test]
fn the_node_agent_kustomization_is_the_chart_with_default_values() {
    if !python_tools() {
        return;
    }
    let committed = documents(&read("docker/k8s/node-agent/gpumem.yaml"), "gpumem.yaml");
    let chart = render(json!({}));
    assert_eq!(
        names(&committed),
        names(&chart.objects),
        "docker/k8s/node-agent/gpumem.yaml has other objects than the chart: {REGENERATE}"
    );
    for (file, rendered) in committed.iter().zip(&chart.objects) {
        assert_eq!(
            file, rendered,
            "docker/k8s/node-agent/gpumem.yaml differs from the chart: {REGENERATE}"
        );
    }
    let kustomization = documents(
        &read("docker/k8s/node-agent/kustomization.yaml"),
        "kustomization",
    );
    assert_eq!(
        kustomization[0]["resources"],
        json!(["namespace.yaml", "gpumem.yaml"])
    );
}

#[test]
fn kubectl_builds_every_kustomization_and_its_objects_validate() {
    if !python_tools() {
        return;
    }
    let Some(sidecar) = kustomize("docker/k8s") else {
        return;
    };
    assert_eq!(
        names(&sidecar),
        [
            "Service/inference",
            "Deployment/inference",
            "PodMonitor/inference-gpumem"
        ]
    );
    assert_valid(&sidecar, "kubectl kustomize docker/k8s");

    let agent = kustomize("docker/k8s/node-agent").expect("kubectl ran a moment ago");
    assert_valid(&agent, "kubectl kustomize docker/k8s/node-agent");
    // What kubectl applies is the chart's objects and their namespace, nothing else.
    let mut built = names(&agent);
    built.sort();
    let mut expected = names(&render(json!({})).objects);
    expected.push("Namespace/gpumem".to_string());
    expected.sort();
    assert_eq!(built, expected);
}
