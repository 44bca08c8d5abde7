//! A real Prometheus (the Debian package's `prometheus`) on a free loopback port with a temporary
//! data directory, scraping `gpumem demo` every second with `grafana/alerts.yml` loaded (its
//! `for:` cut to one second), its target labelled with a namespace and a pod as Kubernetes
//! service discovery labels a pod's exporter. Once it has scraped, every dashboard query returns
//! data for that pod (those on sidecar-only metrics must parse: a demo has no NVML processes),
//! and so do the instance, GPU, namespace and pod variables; a pressure spike forced through the
//! demo's API fires the pressure alerts and shows in the critical-pressure annotation; every rule
//! evaluates without error; stopping the demo fires GpumemExporterDown. Skipped without
//! prometheus, unless CI=true.

use super::dashboard::{self, uses_sidecar_metrics};
use super::panels::{assert_all_have_data, queries_without_data};
use super::rules::{alert_rules, rules_with_short_for};
use crate::support::Running;
use crate::web::{eventually, request, tool_available};
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How often Prometheus scrapes and evaluates rules in the test.
const STEP: &str = "1s";
/// The whole test, start to finish (it takes about 15 s).
const BUDGET: Duration = Duration::from_secs(90);
/// What the dashboard's `$__rate_interval` becomes: Grafana's floor of four scrape intervals.
const RATE_INTERVAL: &str = "4s";
const JOB: &str = "gpumem";
/// The target labels the test's scrape adds, as a PodMonitor's would for an inference pod.
const POD_LABELS: [(&str, &str); 2] = [("namespace", "serving"), ("pod", "llm-0")];

/// Percent-encodes a query parameter.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A Prometheus server for one test; killed, and its data removed, when dropped.
pub(super) struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `target` as job `gpumem`, with `rules` as its only rule file,
    /// and waits (up to 20 s) until it is ready. Retries on another port when it exits at once
    /// (the free port it was given was taken in between).
    pub(super) fn start(target: SocketAddr, rules: &str) -> Prometheus {
        Self::start_labelled(target, rules, &[])
    }

    /// As [`Prometheus::start`], with `labels` added to every series of the target.
    pub(super) fn start_labelled(
        target: SocketAddr,
        rules: &str,
        labels: &[(&str, &str)],
    ) -> Prometheus {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let job = json!({
            "job_name": JOB,
            "static_configs": [{"targets": [target.to_string()], "labels": labels}],
        });
        Self::start_job(rules, job)
    }

    /// Starts Prometheus with `rules` and `job` as its only scrape job (a `scrape_configs`
    /// entry, as JSON: YAML reads it as it is), scraping and evaluating every second.
    pub(super) fn start_job(rules: &str, job: Value) -> Prometheus {
        Self::start_jobs(rules, vec![job], STEP)
    }

    /// Starts Prometheus with `rules` and `jobs` (`scrape_configs` entries), scraping and
    /// evaluating every `step` ("15s").
    pub(super) fn start_jobs(rules: &str, jobs: Vec<Value>, step: &str) -> Prometheus {
        let dir = tempfile::Builder::new()
            .prefix("gpumem-prometheus-")
            .tempdir()
            .expect("temp dir");
        std::fs::write(dir.path().join("alerts.yml"), rules).expect("write rules");
        let config = json!({
            "global": {"scrape_interval": step, "scrape_timeout": step, "evaluation_interval": step},
            "rule_files": ["alerts.yml"],
            "scrape_configs": jobs,
        });
        std::fs::write(dir.path().join("prometheus.yml"), config.to_string())
            .expect("write config");
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::spawn(dir.path()) {
                Ok((child, addr)) => return Prometheus { child, addr, dir },
                Err(why) => failures.push(why),
            }
        }
        panic!("Prometheus did not start: {failures:#?}");
    }

    fn spawn(dir: &Path) -> Result<(Child, SocketAddr), String> {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?;
        let log = std::fs::File::create(dir.join("prometheus.log")).map_err(|e| e.to_string())?;
        let mut child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("prometheus would not run: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("exited with {status}: {}", log_tail(dir)));
            }
            if request(addr, "GET", "/-/ready").is_ok_and(|r| r.status == 200) {
                return Ok((child, addr));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("Prometheus was not ready within 20 s: {}", log_tail(dir))
    }

    /// An instant query's result vector, or why there is none.
    pub(super) fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// A range query's series (`[{metric, values: [[t, "v"], ...]}]`) from `start` to `end`
    /// (Unix seconds) every `step` seconds.
    pub(super) fn query_range(
        &self,
        promql: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Value>, String> {
        let path = format!(
            "/api/v1/query_range?query={}&start={start}&end={end}&step={step}",
            url_encode(promql)
        );
        let data = self.api(&path)?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerts pending or firing now (`/api/v1/alerts`).
    pub(super) fn alerts(&self) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// The `data` of an API answer, or why there is none.
    fn api(&self, path: &str) -> Result<Value, String> {
        let reply = request(self.addr, "GET", path).map_err(|e| e.to_string())?;
        let mut body: Value = serde_json::from_str(&reply.body)
            .map_err(|e| format!("HTTP {}: {e}: {}", reply.status, reply.body))?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        Ok(body["data"].take())
    }

    /// The values of `label` among the series `selector` matches over the last hour (Grafana's
    /// `label_values(SELECTOR, LABEL)`), sorted.
    pub(super) fn label_values(&self, selector: &str, label: &str) -> Result<Vec<String>, String> {
        let end = gpumem_wire::unix_now();
        let path = format!(
            "/api/v1/label/{label}/values?match[]={}&start={}&end={end}",
            url_encode(selector),
            end - 3600.0
        );
        let reply = request(self.addr, "GET", &path).map_err(|e| e.to_string())?;
        let body: Value = serde_json::from_str(&reply.body)
            .map_err(|e| format!("HTTP {}: {e}: {}", reply.status, reply.body))?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        let mut values: Vec<String> = body["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        values.sort();
        Ok(values)
    }

    /// Where it answers (`http://ADDR/`), for tools that ask it themselves.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The first value of a query's result, if it has one.
    pub(super) fn value(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql).ok()?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Whether `alert` is firing (for the demo's GPU 0 where `gpu` is given).
    pub(super) fn firing(&self, alert: &str, gpu: Option<&str>) -> bool {
        let gpu = gpu.map_or(String::new(), |g| format!(",gpu=\"{g}\""));
        let promql = format!("ALERTS{{alertname=\"{alert}\",alertstate=\"firing\"{gpu}}}");
        self.query(&promql).is_ok_and(|r| !r.is_empty())
    }

    /// The rules Prometheus loaded, with their health.
    pub(super) fn rules(&self) -> Vec<Value> {
        let reply = request(self.addr, "GET", "/api/v1/rules").expect("rules API");
        let body: Value = serde_json::from_str(&reply.body).expect("rules JSON");
        body["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    pub(super) fn log(&self) -> String {
        log_tail(self.dir.path())
    }
}

/// Whether an annotation's query held at any point of the last two minutes, as one instant
/// query (Grafana asks for the range; a mark shows where the query has a value).
pub(super) fn ever(promql: &str) -> String {
    format!("max_over_time(({promql})[2m:1s])")
}

fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Prometheus scrapes the demo; the dashboard's queries, variables and the alerts work on it.
#[test]
fn prometheus_scrapes_the_demo_and_the_dashboard_and_alerts_work() {
    if !tool_available("prometheus") {
        return;
    }
    let started = Instant::now();
    let left = || BUDGET.saturating_sub(started.elapsed());
    let demo = Running::sim_demo("120s");
    let target = demo.addr;
    let prometheus = Prometheus::start_labelled(target, &rules_with_short_for(STEP), &POD_LABELS);
    let instance = target.to_string();

    // Five scrapes give every rate() over $__rate_interval its two samples.
    let scraped = eventually(left(), || {
        prometheus
            .value(&format!("count_over_time(up{{job=\"{JOB}\"}}[1m])"))
            .is_some_and(|n| n >= 5.0)
    });
    assert!(
        scraped,
        "Prometheus did not scrape the demo:\n{}",
        prometheus.log()
    );
    assert_eq!(prometheus.value(&format!("up{{job=\"{JOB}\"}}")), Some(1.0));
    assert!(
        !prometheus.firing("GpumemPressureCritical", None),
        "the pressure alert fires before the spike"
    );

    // Every dashboard query, with its variables filled in as Grafana would for the pod picked
    // at the top, returns data.
    let values = [
        ("instance", instance.as_str()),
        ("gpu", "0"),
        ("namespace", POD_LABELS[0].1),
        ("pod", POD_LABELS[1].1),
        ("__rate_interval", RATE_INTERVAL),
    ];
    let board = dashboard::load();
    let (asked, empty) = queries_without_data(
        &prometheus,
        &board,
        &values,
        left().min(Duration::from_secs(20)),
        |q| {
            // Only a sidecar publishes these; here the query must at least be valid PromQL.
            uses_sidecar_metrics(&q.expr)
        },
    );
    assert!(asked >= 10, "too few dashboard queries to check");
    assert_all_have_data(&prometheus, &board, &values, empty);
    let live = prometheus.value(&format!(
        "gpumem_live_allocations{{instance=\"{instance}\",gpu=\"0\"}}"
    ));
    assert!(live.is_some_and(|n| n > 0.0), "live allocations {live:?}");
    let hits = prometheus.value("sum(gpumem_pool_hits_total) / sum(gpumem_pool_requests_total)");
    assert!(
        hits.is_some_and(|r| r > 0.0 && r <= 1.0),
        "hit ratio {hits:?}"
    );

    // A forced spike makes GPU 0 critical: both pressure alerts fire.
    let spike = request(target, "POST", "/api/v1/demo/pressure-spike?seconds=60").expect("spike");
    assert_eq!(spike.status, 202, "{}", spike.body);
    let fired = eventually(left(), || {
        prometheus.firing("GpumemPressureCritical", Some("0"))
            && prometheus.firing("GpumemPressureHigh", Some("0"))
    });
    assert!(
        fired,
        "the spike did not fire the pressure alerts; pressure level {:?}",
        prometheus.value("gpumem_pressure_level")
    );
    // The dashboard's critical-pressure annotation marks it; the out-of-memory one at least
    // parses (the demo may refuse nothing).
    for annotation in dashboard::annotation_queries(&board) {
        let promql = dashboard::substitute(&annotation.expr, &values)
            .unwrap_or_else(|e| panic!("{}: {e}", annotation.panel));
        let marked = prometheus.query(&ever(&promql));
        assert!(marked.is_ok(), "{}: {marked:?}", annotation.panel);
        if annotation.panel.contains("pressure") {
            assert!(
                marked.is_ok_and(|r| !r.is_empty()),
                "{}: no mark for the spike",
                annotation.panel
            );
        }
    }

    // Every rule of the file was loaded and evaluates against real series without error.
    let rules = prometheus.rules();
    assert_eq!(
        rules.len(),
        alert_rules().len(),
        "Prometheus loaded other rules"
    );
    for rule in &rules {
        assert_eq!(
            rule["health"], "ok",
            "{} failed: {}",
            rule["name"], rule["lastError"]
        );
    }

    // The demo goes away: the exporter-down alert fires.
    drop(demo);
    let down = eventually(left(), || prometheus.firing("GpumemExporterDown", None));
    assert!(down, "stopping the demo did not fire GpumemExporterDown");
    eprintln!(
        "prometheus end-to-end test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
