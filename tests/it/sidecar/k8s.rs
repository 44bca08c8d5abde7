//! docker/k8s checked against the binary: the Deployment runs the sidecar next to the engine
//! with a shared emptyDir, shared PIDs, probes on /healthz:9400, requests and limits; the Service
//! and the PodMonitor reach /metrics on that port; kubectl builds the kustomization.

use super::manifests::{
    assert_flags_parse, assert_serves_probes, flag_value, repo, strings, text, yaml, PORT,
    PUBLISH_DIR,
};
use super::TempDir;
use std::process::Command;
use yaml_rust2::{Yaml, YamlLoader};

fn k8s_documents() -> Vec<(String, Yaml)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(repo("docker/k8s")).expect("docker/k8s") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            let relative = format!(
                "docker/k8s/{}",
                path.file_name().expect("name").to_string_lossy()
            );
            for doc in yaml(&relative) {
                all.push((relative.clone(), doc));
            }
        }
    }
    all
}

fn of_kind<'a>(docs: &'a [(String, Yaml)], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|(_, d)| d["kind"].as_str() == Some(kind))
        .map(|(_, d)| d)
        .collect()
}

/// The container port a probe or endpoint names (a number, or a named port of `container`).
fn resolve_port(container: &Yaml, port: &Yaml) -> i64 {
    if let Some(number) = port.as_i64() {
        return number;
    }
    let name = text(port);
    container["ports"]
        .as_vec()
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p["name"].as_str() == Some(name.as_str()))
        })
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("port {name} is not declared by the container"))
}

fn labels_match(selector: &Yaml, labels: &Yaml) -> bool {
    let Some(wanted) = selector.as_hash() else {
        return false;
    };
    !wanted.is_empty() && wanted.iter().all(|(k, v)| &labels[text(k).as_str()] == v)
}

#[test]
fn the_kubernetes_example_runs_the_sidecar_next_to_the_engine() {
    let docs = k8s_documents();
    let kustomization = of_kind(&docs, "Kustomization");
    for resource in kustomization.iter().flat_map(|k| strings(&k["resources"])) {
        assert!(
            repo(&format!("docker/k8s/{resource}")).exists(),
            "{resource}"
        );
    }
    let deployment = of_kind(&docs, "Deployment");
    let deployment = deployment.first().expect("a Deployment");
    let pod = &deployment["spec"]["template"];
    assert!(labels_match(
        &deployment["spec"]["selector"]["matchLabels"],
        &pod["metadata"]["labels"]
    ));
    let spec = &pod["spec"];
    assert_eq!(
        spec["shareProcessNamespace"].as_bool(),
        Some(true),
        "pids must map"
    );
    let containers = spec["containers"].as_vec().expect("containers");
    let sidecar = containers
        .iter()
        .find(|c| c["image"].as_str().is_some_and(|i| i.contains("gpumem")))
        .expect("a gpumem container");
    let engine = containers
        .iter()
        .find(|c| c["image"].as_str().is_some_and(|i| !i.contains("gpumem")))
        .expect("an engine container");

    let args = strings(&sidecar["args"]);
    assert_eq!(args[0], "serve");
    assert_flags_parse(&args);
    assert_eq!(flag_value(&args, "--listen"), Some("0.0.0.0:9400"));
    let collect_dir = flag_value(&args, "--collect-dir").expect("--collect-dir");
    assert!(
        sidecar["ports"]
            .as_vec()
            .is_some_and(|p| p.iter().any(|p| p["containerPort"].as_i64() == Some(PORT))),
        "the sidecar must declare port {PORT}"
    );
    let get = &sidecar["livenessProbe"]["httpGet"];
    assert_eq!(get["path"].as_str(), Some("/healthz"), "livenessProbe");
    assert_eq!(resolve_port(sidecar, &get["port"]), PORT, "livenessProbe");
    // A sidecar's readiness is the pod's: it must not take the engine out of its Service.
    assert!(
        sidecar["readinessProbe"].is_badvalue(),
        "the sidecar must not have a readinessProbe"
    );
    for bound in ["requests", "limits"] {
        let resources = &sidecar["resources"][bound];
        assert!(
            !resources["cpu"].is_badvalue() && !resources["memory"].is_badvalue(),
            "{bound}"
        );
    }
    let security = &sidecar["securityContext"];
    assert_eq!(security["runAsNonRoot"].as_bool(), Some(true));
    // The pod's fsGroup is the sidecar's group: the shared volume is always readable to it.
    let pod_security = &deployment["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(
        pod_security["fsGroup"].as_i64(),
        security["runAsGroup"].as_i64(),
        "fsGroup should be the sidecar's group"
    );
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));

    // The shared emptyDir: mounted where the sidecar collects and where the engine publishes.
    let mount_of = |container: &Yaml| -> (String, String) {
        let mounts = container["volumeMounts"].as_vec().expect("volumeMounts");
        let mount = mounts
            .iter()
            .find(|m| m["mountPath"].as_str() == Some(PUBLISH_DIR))
            .unwrap_or_else(|| panic!("no mount at {PUBLISH_DIR}"));
        (text(&mount["name"]), text(&mount["mountPath"]))
    };
    let (sidecar_volume, sidecar_path) = mount_of(sidecar);
    let (engine_volume, _) = mount_of(engine);
    assert_eq!(sidecar_volume, engine_volume, "one volume shared by both");
    assert_eq!(collect_dir, sidecar_path);
    let volume = spec["volumes"]
        .as_vec()
        .and_then(|v| {
            v.iter()
                .find(|v| v["name"].as_str() == Some(sidecar_volume.as_str()))
        })
        .expect("the volume is declared");
    assert!(!volume["emptyDir"].is_badvalue(), "an emptyDir");
    let publish_env = engine["env"]
        .as_vec()
        .and_then(|e| {
            e.iter()
                .find(|e| e["name"].as_str() == Some("GPUMEM_PUBLISH_DIR"))
        })
        .map(|e| text(&e["value"]));
    assert_eq!(publish_env.as_deref(), Some(PUBLISH_DIR));

    // The Service and the PodMonitor reach the sidecar's port and /metrics.
    let service = of_kind(&docs, "Service");
    let service = service.first().expect("a Service");
    assert!(labels_match(
        &service["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    let metrics_port = service["spec"]["ports"]
        .as_vec()
        .and_then(|ports| ports.iter().find(|p| p["port"].as_i64() == Some(PORT)))
        .expect("the Service exposes 9400");
    assert_eq!(resolve_port(sidecar, &metrics_port["targetPort"]), PORT);
    let monitors: Vec<&Yaml> = of_kind(&docs, "PodMonitor")
        .into_iter()
        .chain(of_kind(&docs, "ServiceMonitor"))
        .collect();
    let monitor = monitors.first().expect("a PodMonitor or ServiceMonitor");
    let endpoints = ["podMetricsEndpoints", "endpoints"]
        .iter()
        .find_map(|key| monitor["spec"][*key].as_vec())
        .expect("endpoints");
    assert!(labels_match(
        &monitor["spec"]["selector"]["matchLabels"],
        &pod["metadata"]["labels"]
    ));
    for endpoint in endpoints {
        assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
        assert_eq!(resolve_port(sidecar, &endpoint["port"]), PORT);
    }

    let dir = TempDir::new("k8s-args");
    drop(assert_serves_probes(&args, &dir));
}

#[test]
fn kubectl_builds_the_kustomization() {
    // Skipped without kubectl, even on CI: the manifests are checked field by field above, and
    // deploy::kustomize, which .ci/run installs kubectl for, builds and validates them there.
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("skipped: kubectl is not installed");
        return;
    }
    let output = Command::new("kubectl")
        .args(["kustomize", repo("docker/k8s").to_str().expect("utf-8")])
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let built = YamlLoader::load_from_str(&String::from_utf8_lossy(&output.stdout)).expect("YAML");
    assert_eq!(built.len(), 3, "Deployment, Service, PodMonitor");
}
