//! The Helm chart (deploy/helm/gpumem) and the Kubernetes manifests, checked by real tools:
//! Helm's own library lints and renders the chart (through `helm_tool.py`, which installs it
//! against a recording API server), every object rendered or built by `kubectl kustomize` is
//! validated against the Kubernetes schemas of a current release (kubernetes-validate) or, for
//! the Prometheus Operator's kinds, against their field names (`crd`); the image is built and
//! run with buildah (`image`); the release workflow and its version check (`release`). Without
//! those tools the tests skip, unless CI=true.

mod chart;
mod crd;
mod image;
mod kustomize;
mod release;
mod sidecar;

use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use yaml_rust2::{Yaml, YamlLoader};

/// The chart, relative to the repository.
const CHART: &str = "deploy/helm/gpumem";
/// The release and namespace every render uses, as docs/kubernetes.md installs it.
const RELEASE: &str = "gpumem";

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// Whether Python with helm-sdkpy and kubernetes-validate is here: false (skip) when not,
/// unless CI=true, where .ci/run installs them and their absence is a failure.
fn python_tools() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import helm_sdkpy, kubernetes_validate, yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "helm-sdkpy and kubernetes-validate are required when CI=true (see .ci/run)"
        );
        eprintln!("skipped: python3 with helm-sdkpy and kubernetes-validate is not installed");
    }
    found
}

/// One request to helm_tool.py; its answer, or the tool's own error.
fn helm_tool(request: &Value) -> Value {
    let mut child = Command::new("python3")
        .arg(repo("tests/it/deploy/helm_tool.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())
        .expect("write the request");
    let output = child.wait_with_output().expect("helm_tool.py finishes");
    assert!(
        output.status.success(),
        "helm_tool.py failed on {}:\n{}",
        request["op"],
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("helm_tool.py answers JSON")
}

/// A YAML value as JSON (what the API server would store), so objects compare across files.
fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Hash(hash) => {
            let mut map = Map::new();
            for (key, value) in hash {
                let key = match key {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => panic!("unexpected key {other:?}"),
                };
                map.insert(key, to_json(value));
            }
            Value::Object(map)
        }
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::String(s) => json!(s),
        Yaml::Integer(i) => json!(i),
        Yaml::Real(r) => json!(r.parse::<f64>().expect("a number")),
        Yaml::Boolean(b) => json!(b),
        Yaml::Null => Value::Null,
        other => panic!("unexpected YAML value {other:?}"),
    }
}

/// Every non-empty document of a YAML stream.
pub(crate) fn documents(text: &str, what: &str) -> Vec<Value> {
    YamlLoader::load_from_str(text)
        .unwrap_or_else(|e| panic!("{what} is not valid YAML: {e}"))
        .iter()
        .filter(|doc| !doc.is_null())
        .map(to_json)
        .collect()
}

/// The chart as Helm renders it.
struct Rendered {
    objects: Vec<Value>,
    manifest: String,
    notes: String,
}

impl Rendered {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let all = self.of_kind(kind);
        assert_eq!(all.len(), 1, "expected one {kind}, got {}", all.len());
        all[0]
    }

    fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self
            .objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap_or("?").to_string())
            .collect();
        kinds.sort();
        kinds
    }
}

/// Installs `chart` with `values` against the recording API server (with the Prometheus
/// Operator's API where `operator`), as release "gpumem" in namespace "gpumem".
fn render_chart(chart: &Path, values: &Value, operator: bool) -> Rendered {
    let answer = helm_tool(&json!({
        "op": "render",
        "chart": chart,
        "release": RELEASE,
        "namespace": RELEASE,
        "values": values,
        "operator": operator,
    }));
    if let Some(error) = answer["error"].as_str() {
        panic!("Helm could not install the chart with {values}: {error}");
    }
    let manifest = answer["manifest"].as_str().expect("a manifest").to_string();
    let objects = documents(&manifest, "the rendered chart");
    // Helm sent every object it rendered to the API server, mapped through discovery: a kind
    // the cluster does not serve would have failed the install.
    let created = answer["created"].as_array().expect("created").len();
    assert_eq!(
        created,
        objects.len(),
        "Helm created other objects than it rendered"
    );
    assert_eq!(
        answer["unanswered"],
        json!([]),
        "Helm asked for more than creation"
    );
    Rendered {
        objects,
        manifest,
        notes: answer["notes"].as_str().unwrap_or("").to_string(),
    }
}

fn render(values: Value) -> Rendered {
    render_chart(&repo(CHART), &values, true)
}

/// Validates every object: the built-in kinds against the Kubernetes schemas (strict: unknown
/// fields fail), the Prometheus Operator's kinds against their field names. Panics naming each
/// object that fails.
fn assert_valid(objects: &[Value], what: &str) {
    let answer = helm_tool(&json!({"op": "validate", "objects": objects}));
    let version = answer["version"].as_str().unwrap_or("?");
    let mut failures = Vec::new();
    for (object, result) in objects
        .iter()
        .zip(answer["results"].as_array().expect("results"))
    {
        let name = result["name"].as_str().unwrap_or("?");
        match result["error"].as_str() {
            None => {}
            Some(error) if error.starts_with("no schema") && crd::is_operator_kind(object) => {
                failures.extend(
                    crd::check(object)
                        .into_iter()
                        .map(|e| format!("{name}: {e}")),
                )
            }
            Some(error) => failures.push(format!("{name}: {error}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{what} does not validate against Kubernetes {version}:\n{}",
        failures.join("\n")
    );
}

/// A container of a pod template by name.
fn container<'a>(pod_spec: &'a Value, name: &str) -> &'a Value {
    pod_spec["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The string items of a JSON array.
fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}
