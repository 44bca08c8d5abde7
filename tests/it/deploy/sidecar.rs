//! The sidecar shape from the chart: an inference chart that depends on gpumem includes the
//! named templates "gpumem.sidecar.container" and "gpumem.sidecar.volume" as the chart's README
//! shows; Helm renders that chart, the Deployment validates, and its sidecar container and volume
//! are exactly those of docker/k8s/deployment.yaml, so the kustomize example and the chart are
//! one sidecar.

use super::{assert_valid, container, documents, python_tools, read, render_chart, repo, CHART};
use serde_json::json;

/// The inference chart of the test: an engine, and the sidecar from the gpumem subchart, written
/// as the chart README tells its readers to.
const DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: inference
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: inference
  template:
    metadata:
      labels:
        app.kubernetes.io/name: inference
        gpumem-sidecar: "true"
    spec:
      shareProcessNamespace: true
      securityContext:
        fsGroup: 10001
      containers:
        - name: engine
          image: registry.example.com/inference-engine:latest
          env:
            - name: GPUMEM_PUBLISH_DIR
              value: {{ .Subcharts.gpumem.Values.sidecar.collectDir }}
          volumeMounts:
            - name: gpumem-publish
              mountPath: {{ .Subcharts.gpumem.Values.sidecar.collectDir }}
        {{- include "gpumem.sidecar.container" .Subcharts.gpumem | nindent 8 }}
      volumes:
        {{- include "gpumem.sidecar.volume" .Subcharts.gpumem | nindent 8 }}
"#;

const PARENT_VALUES: &str = "# Only the sidecar and its PodMonitor from gpumem: no node agent here.
gpumem:
  nodeAgent:
    enabled: false
  podMonitor:
    enabled: true
  prometheusRule:
    enabled: false
  dashboard:
    enabled: false
";

#[test]
fn the_sidecar_template_is_the_kustomize_sidecar() {
    if !python_tools() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gpumem-inference-chart-")
        .tempdir()
        .expect("a temporary directory");
    let chart = dir.path().join("inference");
    std::fs::create_dir_all(chart.join("templates")).expect("mkdir");
    std::fs::create_dir_all(chart.join("charts")).expect("mkdir");
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: inference\nversion: 0.1.0\n\
         dependencies:\n  - name: gpumem\n    version: 0.1.0\n",
    )
    .expect("write");
    std::fs::write(chart.join("values.yaml"), PARENT_VALUES).expect("write");
    std::fs::write(chart.join("templates/deployment.yaml"), DEPLOYMENT).expect("write");
    // The subchart as `helm dependency update` would place it (a link: Helm follows it).
    std::os::unix::fs::symlink(repo(CHART), chart.join("charts/gpumem")).expect("link");

    let rendered = render_chart(&chart, &json!({}), true);
    assert_eq!(rendered.kinds(), ["Deployment", "PodMonitor"]);
    assert_valid(
        &rendered.objects,
        "the inference chart with the gpumem sidecar",
    );
    let deployment = rendered.one("Deployment");
    let pod = &deployment["spec"]["template"]["spec"];

    let example = documents(&read("docker/k8s/deployment.yaml"), "deployment.yaml");
    let example_pod = &example[0]["spec"]["template"]["spec"];
    assert_eq!(
        container(pod, "gpumem"),
        container(example_pod, "gpumem"),
        "the chart's sidecar differs from docker/k8s/deployment.yaml's"
    );
    assert_eq!(
        pod["volumes"], example_pod["volumes"],
        "the chart's sidecar volume differs from docker/k8s/deployment.yaml's"
    );
    // The PodMonitor selects the pods labelled as the README says.
    let monitor = rendered.one("PodMonitor");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(
            &labels[key], value,
            "the PodMonitor does not select the pod"
        );
    }

    // The README shows the same includes.
    let readme = read(&format!("{CHART}/README.md"));
    for line in [
        r#"{{- include "gpumem.sidecar.container" .Subcharts.gpumem | nindent 8 }}"#,
        r#"{{- include "gpumem.sidecar.volume" .Subcharts.gpumem | nindent 8 }}"#,
    ] {
        assert!(
            readme.contains(line),
            "the chart's README should show {line}"
        );
    }
}
