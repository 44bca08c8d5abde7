//! `grafana/alerts.yml` and the recording rules of `grafana/recording.yml` checked: `promtool
//! check rules` and `promtool test rules` on `grafana/tests/*.yml`, every alert tested both
//! firing and quiet, every alert with a severity,
//! a summary, a description and a runbook link to a section of `docs/runbook.md` that exists,
//! every alert firing on the series recorded from the demo's alerts scenario — and the copy
//! with `for:` shortened that the end-to-end test loads into Prometheus.

use super::{read_repo_file, repo_file};
use crate::web::tool_available;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use yaml_rust2::{Yaml, YamlLoader};

pub(super) const RULES_FILE: &str = "grafana/alerts.yml";
/// The fleet's recording rules (docs/fleet-scale.md), as the unit tests name them.
const RECORDING_FILE: &str = "grafana/recording.yml";
const RECORDING_FILE_FROM_TESTS: &str = "../recording.yml";
const RUNBOOK: &str = "docs/runbook.md";

/// One alerting rule, as the rules file states it.
pub(super) struct AlertRule {
    pub name: String,
    pub expr: String,
    /// Its `for:` as written ("5m").
    pub for_: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

fn string_map(yaml: &Yaml) -> BTreeMap<String, String> {
    yaml.as_hash()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
        .collect()
}

fn load_yaml(relative: &str) -> Yaml {
    let text = read_repo_file(relative);
    let mut docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"));
    assert_eq!(docs.len(), 1, "{relative} should hold one YAML document");
    docs.remove(0)
}

/// Every alerting rule of the rules file.
pub(super) fn alert_rules() -> Vec<AlertRule> {
    let doc = load_yaml(RULES_FILE);
    let groups = doc["groups"].as_vec().expect("a `groups` list");
    groups
        .iter()
        .flat_map(|group| group["rules"].as_vec().cloned().unwrap_or_default())
        .filter_map(|rule| {
            Some(AlertRule {
                name: rule["alert"].as_str()?.to_string(),
                expr: rule["expr"]
                    .as_str()
                    .expect("every rule has an expr")
                    .to_string(),
                for_: rule["for"].as_str().unwrap_or("0s").to_string(),
                labels: string_map(&rule["labels"]),
                annotations: string_map(&rule["annotations"]),
            })
        })
        .collect()
}

/// The rules file with every `for:` cut to `duration`, so a test sees alerts fire in seconds.
pub(super) fn rules_with_short_for(duration: &str) -> String {
    read_repo_file(RULES_FILE)
        .lines()
        .map(|line| match line.split_once("for:") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: {duration}"),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The promtool unit-test files, sorted.
fn unit_test_files() -> Vec<String> {
    let dir = repo_file("grafana/tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yml"))
        .map(|name| format!("grafana/tests/{name}"))
        .collect();
    files.sort();
    files
}

fn promtool(args: &[&str]) -> (bool, String) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    if !tool_available("promtool") {
        return;
    }
    let (ok, said) = promtool(&["check", "rules", RECORDING_FILE]);
    assert!(ok, "promtool check rules {RECORDING_FILE} failed:\n{said}");
    let (ok, said) = promtool(&["check", "rules", RULES_FILE]);
    assert!(ok, "promtool check rules {RULES_FILE} failed:\n{said}");
    assert!(
        said.contains(&format!("SUCCESS: {} rules found", alert_rules().len())),
        "promtool did not find every rule:\n{said}"
    );
    let files = unit_test_files();
    assert!(!files.is_empty(), "no promtool unit tests in grafana/tests");
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    let (ok, said) = promtool(&args);
    assert!(ok, "promtool test rules failed:\n{said}");
}

/// Each alert needs a case where it fires and one where it stays quiet, in some unit-test file.
#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() {
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for file in unit_test_files() {
        let doc = load_yaml(&file);
        let rule_files = doc["rule_files"].as_vec().expect("rule_files");
        let tests_alerts = rule_files
            .iter()
            .any(|f| f.as_str() == Some("../alerts.yml"));
        let tests_recording = rule_files
            .iter()
            .any(|f| f.as_str() == Some(RECORDING_FILE_FROM_TESTS));
        assert!(
            tests_alerts || tests_recording,
            "{file} should test ../alerts.yml or {RECORDING_FILE_FROM_TESTS}"
        );
        for test in doc["tests"].as_vec().expect("tests") {
            for case in test["alert_rule_test"].as_vec().into_iter().flatten() {
                let name = case["alertname"].as_str().expect("alertname").to_string();
                let fired = case["exp_alerts"].as_vec().is_some_and(|a| !a.is_empty());
                let cases = if fired { &mut fires } else { &mut quiet };
                cases.insert(name);
            }
        }
    }
    for rule in alert_rules() {
        assert!(
            fires.contains(&rule.name),
            "no unit test where {} fires",
            rule.name
        );
        assert!(
            quiet.contains(&rule.name),
            "no unit test where {} stays quiet",
            rule.name
        );
    }
}

/// The anchors GitHub gives the headings of a Markdown file: lower case, spaces to hyphens,
/// punctuation dropped.
fn heading_anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| {
            heading
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn every_alert_has_a_severity_annotations_and_a_runbook_section() {
    let rules = alert_rules();
    assert!(rules.len() >= 7, "expected the seven gpumem alerts");
    let anchors = heading_anchors(&read_repo_file(RUNBOOK));
    let mut names = BTreeSet::new();
    for rule in &rules {
        assert!(names.insert(&rule.name), "{} is defined twice", rule.name);
        assert!(
            rule.name.starts_with("Gpumem"),
            "{}: alerts are named Gpumem*",
            rule.name
        );
        let severity = rule.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("warning" | "critical")),
            "{}: severity should be warning or critical, is {severity:?}",
            rule.name
        );
        for key in ["summary", "description"] {
            assert!(
                rule.annotations.get(key).is_some_and(|v| v.len() > 20),
                "{}: needs a meaningful {key} annotation",
                rule.name
            );
        }
        // Absolute: the external label `gpumem_runbook_url` when set, else the repository's
        // copy, which opens from anywhere even while the instance is down (not the instance's
        // /runbook); the section anchor is the same either way.
        let url = rule
            .annotations
            .get("runbook_url")
            .map_or("", String::as_str);
        let base = "{{ with $externalLabels.gpumem_runbook_url }}{{ . }}{{ else }}https://github.com/gpumem/gpumem/blob/main/docs/runbook.md{{ end }}#";
        let anchor = url.strip_prefix(base).unwrap_or_else(|| {
            panic!("{}: runbook_url should be {base}..., is {url:?}", rule.name)
        });
        assert!(
            anchors.contains(anchor),
            "{}: {RUNBOOK} has no section #{anchor}",
            rule.name
        );
        assert_eq!(
            anchor,
            rule.name.to_lowercase(),
            "{}: the runbook section is named after the alert",
            rule.name
        );
    }
}

/// The example inhibit rule silences High while Critical fires for the same GPU, and names
/// alerts that exist.
#[test]
fn the_inhibit_example_silences_high_under_critical() {
    let doc = load_yaml("grafana/alertmanager-example.yml");
    let rules = doc["inhibit_rules"].as_vec().expect("inhibit_rules");
    let names: BTreeSet<String> = alert_rules().into_iter().map(|r| r.name).collect();
    let rule = &rules[0];
    let matcher = |key: &str| rule[key][0].as_str().unwrap_or("").replace(' ', "");
    assert_eq!(
        matcher("source_matchers"),
        "alertname=GpumemPressureCritical"
    );
    assert_eq!(matcher("target_matchers"), "alertname=GpumemPressureHigh");
    for name in ["GpumemPressureCritical", "GpumemPressureHigh"] {
        assert!(names.contains(name), "{name} is not an alert");
    }
    let equal: Vec<&str> = rule["equal"]
        .as_vec()
        .expect("equal")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(equal, ["instance", "gpu"], "only the same GPU is silenced");
}

#[test]
fn shortening_for_keeps_everything_else() {
    let short = rules_with_short_for("1s");
    let original = read_repo_file(RULES_FILE);
    assert_eq!(short.lines().count(), original.lines().count());
    assert!(short.contains("for: 1s"));
    assert!(!short.contains("for: 5m") && !short.contains("for: 30m"));
    let exprs = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.trim_start().starts_with("expr:"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(exprs(&short), exprs(&original));
}

/// The series recorded from `gpumem demo --scenario alerts` (docs/demo.md): in that one file,
/// against the unmodified rules, every alert fires.
#[test]
fn every_alert_fires_on_the_series_recorded_from_the_alerts_scenario() {
    const RECORDED: &str = "grafana/tests/demo-scenario.yml";
    let doc = load_yaml(RECORDED);
    let rule_files = doc["rule_files"].as_vec().expect("rule_files");
    assert_eq!(rule_files.len(), 1, "{RECORDED}: only the alert rules");
    assert_eq!(rule_files[0].as_str(), Some("../alerts.yml"));
    let fired: BTreeSet<String> = doc["tests"]
        .as_vec()
        .into_iter()
        .flatten()
        .flat_map(|test| {
            test["alert_rule_test"]
                .as_vec()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|case| case["exp_alerts"].as_vec().is_some_and(|a| !a.is_empty()))
        .filter_map(|case| case["alertname"].as_str().map(str::to_string))
        .collect();
    for rule in alert_rules() {
        assert!(
            fired.contains(&rule.name),
            "{RECORDED}: {} never fires",
            rule.name
        );
    }
    if !tool_available("promtool") {
        return;
    }
    let (ok, said) = promtool(&["test", "rules", RECORDED]);
    assert!(ok, "promtool test rules {RECORDED} failed:\n{said}");
}
