//! The Prometheus Operator's kinds (ServiceMonitor, PodMonitor, PrometheusRule) have no schema
//! in kubernetes-validate, so their shape is checked here, minimally: the field names the
//! operator's v1 CRDs define (a misspelt field is dropped by the API server without a word),
//! the types of the fields the chart sets, durations in the operator's format, and relabel
//! actions it accepts. Not the CRDs themselves: what a field means is left to the operator.

use serde_json::{json, Value};

const GROUP_VERSION: &str = "monitoring.coreos.com/v1";

pub(super) fn is_operator_kind(object: &Value) -> bool {
    object["apiVersion"] == GROUP_VERSION
        && ["ServiceMonitor", "PodMonitor", "PrometheusRule"]
            .contains(&object["kind"].as_str().unwrap_or(""))
}

/// Field names of the v1 CRDs, by the object they belong to. The two monitors' specs share all
/// but their endpoints' key and a few fields of ServiceMonitor's own.
const MONITOR_SPEC: &[&str] = &[
    "attachMetadata",
    "bodySizeLimit",
    "convertClassicHistogramsToNHCB",
    "fallbackScrapeProtocol",
    "jobLabel",
    "keepDroppedTargets",
    "labelLimit",
    "labelNameLengthLimit",
    "labelValueLengthLimit",
    "namespaceSelector",
    "nativeHistogramBucketLimit",
    "nativeHistogramMinBucketFactor",
    "podTargetLabels",
    "sampleLimit",
    "scrapeClass",
    "scrapeClassicHistograms",
    "scrapeProtocols",
    "selector",
    "selectorMechanism",
    "targetLimit",
];
const SERVICE_MONITOR_ONLY: &[&str] = &["endpoints", "serviceDiscoveryRole", "targetLabels"];
const POD_MONITOR_ONLY: &[&str] = &["podMetricsEndpoints"];
/// An endpoint of either monitor (PodMonitor's adds portNumber; ServiceMonitor's adds
/// bearerTokenFile).
const ENDPOINT: &[&str] = &[
    "authorization",
    "basicAuth",
    "bearerTokenFile",
    "bearerTokenSecret",
    "enableHttp2",
    "filterRunning",
    "followRedirects",
    "honorLabels",
    "honorTimestamps",
    "interval",
    "metricRelabelings",
    "noProxy",
    "oauth2",
    "params",
    "path",
    "port",
    "portNumber",
    "proxyConnectHeader",
    "proxyFromEnvironment",
    "proxyUrl",
    "relabelings",
    "scheme",
    "scrapeTimeout",
    "targetPort",
    "tlsConfig",
    "trackTimestampsStaleness",
];
const RELABEL: &[&str] = &[
    "action",
    "modulus",
    "regex",
    "replacement",
    "separator",
    "sourceLabels",
    "targetLabel",
];
const RELABEL_ACTIONS: &[&str] = &[
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
];
const NAMESPACE_SELECTOR: &[&str] = &["any", "matchNames"];
const LABEL_SELECTOR: &[&str] = &["matchExpressions", "matchLabels"];
const RULE_GROUP: &[&str] = &[
    "interval",
    "labels",
    "limit",
    "name",
    "partial_response_strategy",
    "query_offset",
    "rules",
];
const RULE: &[&str] = &[
    "alert",
    "annotations",
    "expr",
    "for",
    "keep_firing_for",
    "labels",
    "record",
];
const METADATA: &[&str] = &["name", "namespace", "labels", "annotations"];

/// What is wrong with an object of the operator's kinds; empty when nothing is.
pub(super) fn check(object: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let mut at = Checker {
        errors: &mut errors,
    };
    at.keys("", object, &["apiVersion", "kind", "metadata", "spec"]);
    at.keys("metadata", &object["metadata"], METADATA);
    at.string("metadata.name", &object["metadata"]["name"]);
    let spec = &object["spec"];
    match object["kind"].as_str() {
        Some("ServiceMonitor") => {
            at.keys("spec", spec, &[MONITOR_SPEC, SERVICE_MONITOR_ONLY].concat());
            at.monitor(spec, "endpoints");
        }
        Some("PodMonitor") => {
            at.keys("spec", spec, &[MONITOR_SPEC, POD_MONITOR_ONLY].concat());
            at.monitor(spec, "podMetricsEndpoints");
        }
        Some("PrometheusRule") => at.rules(spec),
        other => at.error("kind", format!("not an operator kind: {other:?}")),
    }
    errors
}

fn is_duration(text: &str) -> bool {
    const UNITS: [&str; 7] = ["y", "w", "d", "h", "m", "s", "ms"];
    if text == "0" {
        return true;
    }
    let mut rest = text;
    let mut allowed = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        // "m" must not take the "m" of "ms".
        let unit = (allowed..UNITS.len())
            .find(|&i| rest.starts_with(UNITS[i]) && !(UNITS[i] == "m" && rest.starts_with("ms")));
        let Some(unit) = unit else {
            return false;
        };
        rest = &rest[UNITS[unit].len()..];
        allowed = unit + 1;
    }
    !text.is_empty()
}

struct Checker<'a> {
    errors: &'a mut Vec<String>,
}

impl Checker<'_> {
    fn error(&mut self, path: &str, message: String) {
        self.errors.push(format!("{path}: {message}"));
    }

    /// An object whose every field is one of `allowed`.
    fn keys(&mut self, path: &str, value: &Value, allowed: &[&str]) {
        let Some(map) = value.as_object() else {
            return self.error(path, format!("should be an object, is {value}"));
        };
        for key in map.keys() {
            if !allowed.contains(&key.as_str()) {
                self.error(path, format!("unknown field {key:?}"));
            }
        }
    }

    fn string(&mut self, path: &str, value: &Value) {
        if value.as_str().is_none_or(str::is_empty) {
            self.error(path, format!("should be a non-empty string, is {value}"));
        }
    }

    /// The operator's Duration: a number and a unit, units from years down to milliseconds,
    /// each at most once and in that order ("1h30m", not "30m1h").
    fn duration(&mut self, path: &str, value: &Value) {
        if !value.as_str().is_some_and(is_duration) {
            self.error(path, format!("{value} is not a duration"));
        }
    }

    fn selector(&mut self, path: &str, value: &Value) {
        self.keys(path, value, LABEL_SELECTOR);
        for (key, label) in value["matchLabels"].as_object().into_iter().flatten() {
            self.string(&format!("{path}.matchLabels.{key}"), label);
        }
    }

    fn monitor(&mut self, spec: &Value, endpoints_key: &str) {
        self.selector("spec.selector", &spec["selector"]);
        if !spec["namespaceSelector"].is_null() {
            self.keys(
                "spec.namespaceSelector",
                &spec["namespaceSelector"],
                NAMESPACE_SELECTOR,
            );
        }
        let Some(endpoints) = spec[endpoints_key].as_array().filter(|e| !e.is_empty()) else {
            return self.error(&format!("spec.{endpoints_key}"), "needs an endpoint".into());
        };
        for (i, endpoint) in endpoints.iter().enumerate() {
            let path = format!("spec.{endpoints_key}[{i}]");
            self.keys(&path, endpoint, ENDPOINT);
            if !endpoint["port"].is_null() {
                self.string(&format!("{path}.port"), &endpoint["port"]);
            }
            for field in ["interval", "scrapeTimeout"] {
                if !endpoint[field].is_null() {
                    self.duration(&format!("{path}.{field}"), &endpoint[field]);
                }
            }
            if !endpoint["honorLabels"].is_null() && !endpoint["honorLabels"].is_boolean() {
                self.error(&format!("{path}.honorLabels"), "should be a boolean".into());
            }
            for list in ["relabelings", "metricRelabelings"] {
                for (j, relabel) in endpoint[list].as_array().into_iter().flatten().enumerate() {
                    let path = format!("{path}.{list}[{j}]");
                    self.keys(&path, relabel, RELABEL);
                    let action = relabel["action"]
                        .as_str()
                        .unwrap_or("replace")
                        .to_lowercase();
                    if !RELABEL_ACTIONS.contains(&action.as_str()) {
                        self.error(&path, format!("unknown action {action:?}"));
                    }
                    if !relabel["sourceLabels"].is_null()
                        && !relabel["sourceLabels"]
                            .as_array()
                            .is_some_and(|l| l.iter().all(Value::is_string))
                    {
                        self.error(&path, "sourceLabels should be a list of strings".into());
                    }
                }
            }
        }
    }

    fn rules(&mut self, spec: &Value) {
        self.keys("spec", spec, &["groups"]);
        let Some(groups) = spec["groups"].as_array().filter(|g| !g.is_empty()) else {
            return self.error("spec.groups", "needs a group".into());
        };
        for (i, group) in groups.iter().enumerate() {
            let path = format!("spec.groups[{i}]");
            self.keys(&path, group, RULE_GROUP);
            self.string(&format!("{path}.name"), &group["name"]);
            for (j, rule) in group["rules"].as_array().into_iter().flatten().enumerate() {
                let path = format!("{path}.rules[{j}]");
                self.keys(&path, rule, RULE);
                if rule["alert"].is_string() == rule["record"].is_string() {
                    self.error(&path, "needs exactly one of alert and record".into());
                }
                self.string(&format!("{path}.expr"), &rule["expr"]);
                if !rule["for"].is_null() {
                    self.duration(&format!("{path}.for"), &rule["for"]);
                }
                for map in ["labels", "annotations"] {
                    for (key, value) in rule[map].as_object().into_iter().flatten() {
                        self.string(&format!("{path}.{map}.{key}"), value);
                    }
                }
            }
        }
    }
}

/// The checks can fail: each kind of mistake they are for is caught.
#[test]
fn the_operator_shape_check_catches_misspelt_and_mistyped_fields() {
    let good = json!({
        "apiVersion": GROUP_VERSION, "kind": "ServiceMonitor",
        "metadata": {"name": "gpumem", "namespace": "gpumem"},
        "spec": {
            "selector": {"matchLabels": {"app": "gpumem"}},
            "namespaceSelector": {"matchNames": ["gpumem"]},
            "endpoints": [{"port": "metrics", "interval": "1m30s", "honorLabels": true,
                           "relabelings": [{"action": "labeldrop", "regex": "pod"}]}]
        }
    });
    assert_eq!(check(&good), Vec::<String>::new());
    let broken = |pointer: &str, value: Value| {
        let mut object = good.clone();
        *object.pointer_mut(pointer).expect("the field exists") = value;
        let errors = check(&object);
        assert!(
            !errors.is_empty(),
            "{pointer} = {} passed",
            object.pointer(pointer).unwrap()
        );
    };
    broken("/spec/endpoints/0/interval", json!("30 seconds"));
    broken("/spec/endpoints/0/interval", json!("1s30m"));
    broken("/spec/endpoints/0/honorLabels", json!("true"));
    broken(
        "/spec/endpoints/0/relabelings/0/action",
        json!("labeldelete"),
    );
    broken("/spec/namespaceSelector", json!({"matchName": ["gpumem"]}));
    broken("/spec/endpoints", json!([]));
    let mut misspelt = good.clone();
    misspelt["spec"]["endpoint"] = misspelt["spec"]["endpoints"].clone();
    assert!(!check(&misspelt).is_empty(), "spec.endpoint passed");

    let mut pod_monitor = good.clone();
    pod_monitor["kind"] = json!("PodMonitor");
    assert!(
        !check(&pod_monitor).is_empty(),
        "a PodMonitor with a ServiceMonitor's endpoints passed"
    );
    let endpoints = pod_monitor["spec"]
        .as_object_mut()
        .and_then(|spec| spec.remove("endpoints"))
        .expect("endpoints");
    pod_monitor["spec"]["podMetricsEndpoints"] = endpoints;
    assert_eq!(check(&pod_monitor), Vec::<String>::new());

    let rule = json!({
        "apiVersion": GROUP_VERSION, "kind": "PrometheusRule", "metadata": {"name": "r"},
        "spec": {"groups": [{"name": "g", "rules": [
            {"alert": "A", "expr": "up == 0", "for": "5m", "labels": {"severity": "warning"}}
        ]}]}
    });
    assert_eq!(check(&rule), Vec::<String>::new());
    let mut both = rule.clone();
    both["spec"]["groups"][0]["rules"][0]["record"] = json!("a:b");
    assert!(!check(&both).is_empty(), "alert and record together passed");
    let mut number = rule.clone();
    number["spec"]["groups"][0]["rules"][0]["labels"]["severity"] = json!(2);
    assert!(!check(&number).is_empty(), "a number as a label passed");
    assert!(is_operator_kind(&rule));
    assert!(!is_operator_kind(
        &json!({"apiVersion": "v1", "kind": "ConfigMap"})
    ));
}
