//! docker/compose.yaml checked against the binary and the files it mounts: the demo's alerts
//! scenario on 9400 and its node agent on 9401, Prometheus scraping both with the alert rules
//! loaded (and promtool agreeing), Grafana with its provisioning and the dashboard where the
//! provider looks.

use super::manifests::{
    assert_flags_parse, assert_serves_probes, flag_value, read, repo, strings, text, yaml,
};
use super::TempDir;
use crate::web::tool_available;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn the_compose_file_wires_the_demo_prometheus_and_grafana() {
    let compose = &yaml("docker/compose.yaml")[0];
    let services = &compose["services"];
    let beside_compose = |path: &str| repo("docker").join(path);

    let gpumem_service = &services["gpumem"];
    let build = &gpumem_service["build"];
    let context = beside_compose(&text(&build["context"]));
    assert!(
        context.join(text(&build["dockerfile"])).is_file(),
        "the Dockerfile"
    );
    let command = strings(&gpumem_service["command"]);
    assert_eq!(command[0], "demo");
    assert_flags_parse(&command);
    let listen = flag_value(&command, "--listen").expect("--listen");
    assert_eq!(listen, "0.0.0.0:9400");
    assert!(strings(&gpumem_service["ports"]).contains(&"9400:9400".to_string()));

    // Every bind mount's source exists (the Grafana and alert files included).
    let mounts = |service: &str| -> Vec<(PathBuf, String)> {
        strings(&services[service]["volumes"])
            .iter()
            .map(|v| {
                let mut parts = v.split(':');
                let source = beside_compose(parts.next().expect("a source"));
                let target = parts.next().expect("a target").to_string();
                assert!(
                    source.exists(),
                    "{service}: {} does not exist",
                    source.display()
                );
                (source, target)
            })
            .collect()
    };
    let target_of = |mounts: &[(PathBuf, String)], file: &str| -> String {
        mounts
            .iter()
            .find(|(source, _)| source.ends_with(file))
            .map(|(_, target)| target.clone())
            .unwrap_or_else(|| panic!("{file} is not mounted"))
    };

    let prometheus_mounts = mounts("prometheus");
    let rules_target = target_of(&prometheus_mounts, "grafana/alerts.yml");
    let config_target = target_of(&prometheus_mounts, "docker/prometheus.yml");
    let command = strings(&services["prometheus"]["command"]);
    assert!(
        command.contains(&format!("--config.file={config_target}")),
        "{command:?}"
    );
    let prometheus = &yaml("docker/prometheus.yml")[0];
    assert_eq!(strings(&prometheus["rule_files"]), [rules_target]);
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(job["metrics_path"].as_str(), Some("/metrics"));
    let targets = strings(&job["static_configs"][0]["targets"]);
    assert_eq!(
        targets,
        ["gpumem:9400"],
        "the compose service on the demo's port"
    );
    // The alerts scenario (docs/demo.md), whose node agent serves on the demo's next port,
    // under a job GpumemExporterDown watches.
    let command = strings(&gpumem_service["command"]);
    assert!(
        command.windows(2).any(|w| w == ["--scenario", "alerts"]),
        "{command:?}"
    );
    assert!(strings(&gpumem_service["ports"]).contains(&"9401:9401".to_string()));
    let agent = &prometheus["scrape_configs"][1];
    assert!(
        agent["job_name"]
            .as_str()
            .is_some_and(|j| j.contains("gpumem")),
        "{agent:?}"
    );
    assert_eq!(
        strings(&agent["static_configs"][0]["targets"]),
        ["gpumem:9401"]
    );

    let grafana_mounts = mounts("grafana");
    let provisioning = target_of(&grafana_mounts, "grafana/provisioning");
    assert_eq!(provisioning, "/etc/grafana/provisioning");
    let dashboard = target_of(&grafana_mounts, "grafana/dashboard.json");
    let providers = &yaml("grafana/provisioning/dashboards/gpumem.yml")[0];
    let provider_path = text(&providers["providers"][0]["options"]["path"]);
    assert_eq!(
        Path::new(&dashboard).parent(),
        Some(Path::new(&provider_path)),
        "the dashboard must be mounted where the provider looks"
    );
    let datasource = read("grafana/provisioning/datasources/prometheus.yml");
    if datasource.contains("${PROMETHEUS_URL}") {
        let url = text(&services["grafana"]["environment"]["PROMETHEUS_URL"]);
        assert_eq!(url, "http://prometheus:9090");
        assert!(strings(&services["prometheus"]["ports"]).contains(&"9090:9090".to_string()));
    }

    let dir = TempDir::new("compose-cmd");
    drop(assert_serves_probes(
        &strings(&gpumem_service["command"]),
        &dir,
    ));
}

#[test]
fn promtool_accepts_the_prometheus_config_with_the_alert_rules() {
    if !tool_available("promtool") {
        return;
    }
    // Where compose mounts the rules, the repository has them: point the config there.
    let dir = TempDir::new("promtool-config");
    let rules = repo("grafana/alerts.yml");
    let config = read("docker/prometheus.yml")
        .replace("/etc/prometheus/alerts.yml", rules.to_str().expect("utf-8"));
    std::fs::write(dir.join("prometheus.yml"), config).expect("write");
    let output = Command::new("promtool")
        .args([
            "check",
            "config",
            dir.join("prometheus.yml").to_str().expect("utf-8"),
        ])
        .output()
        .expect("promtool runs");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
