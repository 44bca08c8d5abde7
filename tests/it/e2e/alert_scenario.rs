//! The long test of `gpumem demo --scenario alerts`: a real Prometheus with
//! `grafana/alerts.yml` exactly as shipped (every `for:` as written) scrapes the demo and its
//! node agent every 15 s, as docker/prometheus.yml does. Each of the eight alerts must reach
//! "firing" within its `for:` plus two evaluation intervals of its condition (the rule's own
//! expression, asked of Prometheus every 2 s) first becoming true: a condition that flapped
//! would restart the window and miss that. Then every dashboard query, with the variables at
//! "All" as the compose stack's Grafana opens it, must return data, the node agent's panels
//! included. It runs for about 35 minutes, so it is ignored by default:
//! `cargo test --release --test it alert_scenario -- --ignored --nocapture`. With
//! `RECORD_ALERT_SERIES=FILE` it also writes what it scraped as a promtool test
//! (`record_series`), the source of `grafana/tests/demo-scenario.yml`.

use super::dashboard;
use super::panels::{assert_all_have_data, queries_without_data};
use super::prometheus::Prometheus;
use super::read_repo_file;
use super::record_series::{test_file, Fired};
use super::rules::{alert_rules, RULES_FILE};
use crate::support::Running;
use crate::web::tool_available;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// Scrape and evaluation interval, as docker/prometheus.yml has them.
const STEP: Duration = Duration::from_secs(15);
/// How often the test asks Prometheus.
const POLL: Duration = Duration::from_secs(2);
/// The leak alert, the last to fire, fires about 33 minutes in.
const LIMIT: Duration = Duration::from_secs(45 * 60);
/// `$__rate_interval` at a 15 s scrape interval: Grafana's four scrape intervals.
const RATE_INTERVAL: &str = "1m";
/// Instance names as the compose stack's Prometheus calls its targets.
const DEMO_INSTANCE: &str = "gpumem:9400";
const AGENT_INSTANCE: &str = "gpumem:9401";

/// A free loopback port whose next port is free too (the demo serves its node agent there).
fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = first.local_addr().expect("bound").port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two free ports in a row")
}

fn job(name: &str, target: String, instance: &str) -> Value {
    json!({
        "job_name": name,
        "static_configs": [{"targets": [target]}],
        "relabel_configs": [{"target_label": "instance", "replacement": instance}],
    })
}

/// When an alert's condition first held and when it first fired, after the start.
#[derive(Default)]
struct Timing {
    true_after: Option<Duration>,
    fired: Option<(Duration, Vec<Value>)>,
}

fn minutes(d: Duration) -> String {
    format!("{}:{:02}", d.as_secs() / 60, d.as_secs() % 60)
}

#[test]
#[ignore = "runs the alerts scenario for about 35 minutes in real time (the alerts' own for: \
            windows); run it with --ignored"]
fn every_alert_fires_from_the_alerts_scenario_in_a_real_prometheus() {
    if !tool_available("prometheus") {
        return;
    }
    let port = free_port_pair();
    let listen = format!("127.0.0.1:{port}");
    let demo = Running::start(&[
        "demo",
        "--scenario",
        "alerts",
        "--backend",
        "sim",
        "--listen",
        &listen,
    ]);
    let jobs = vec![
        job("gpumem", demo.addr.to_string(), DEMO_INSTANCE),
        job(
            "gpumem-node-agent",
            format!("127.0.0.1:{}", port + 1),
            AGENT_INSTANCE,
        ),
    ];
    // The shipped file, byte for byte.
    let prometheus = Prometheus::start_jobs(&read_repo_file(RULES_FILE), jobs, "15s");
    let started = Instant::now();
    let start_unix = gpumem::snapshot::unix_now().floor();
    let rules = alert_rules();
    assert_eq!(rules.len(), 8, "the scenario is written for eight alerts");
    let mut timings: BTreeMap<String, Timing> = BTreeMap::new();

    while started.elapsed() < LIMIT {
        let now = started.elapsed();
        for rule in &rules {
            let timing = timings.entry(rule.name.clone()).or_default();
            if timing.true_after.is_none()
                && prometheus.query(&rule.expr).is_ok_and(|r| !r.is_empty())
            {
                timing.true_after = Some(now);
                eprintln!("{} {}: condition true", minutes(now), rule.name);
            }
        }
        let alerts = prometheus.alerts().unwrap_or_default();
        for rule in &rules {
            let firing: Vec<Value> = alerts
                .iter()
                .filter(|a| {
                    a["state"] == "firing" && a["labels"]["alertname"] == rule.name.as_str()
                })
                .cloned()
                .collect();
            let timing = timings.entry(rule.name.clone()).or_default();
            if timing.fired.is_none() && !firing.is_empty() {
                eprintln!("{} {}: firing", minutes(now), rule.name);
                timing.fired = Some((now, firing));
            }
        }
        if timings.values().filter(|t| t.fired.is_some()).count() == rules.len() {
            break;
        }
        std::thread::sleep(POLL);
    }

    // The table for docs/demo.md, then the verdict on each alert.
    let mut late = Vec::new();
    eprintln!("| alert | for | condition true | firing | firing - true | limit |");
    for rule in &rules {
        let timing = &timings[&rule.name];
        let window = gpumem::units::parse_duration(&rule.for_).expect("a for: duration");
        let limit = window + 2 * STEP;
        let shown = |d: Option<Duration>| d.map_or("never".to_string(), minutes);
        let fired = timing.fired.as_ref().map(|(at, _)| *at);
        let took = match (timing.true_after, fired) {
            (Some(t), Some(f)) => Some(f.saturating_sub(t)),
            _ => None,
        };
        eprintln!(
            "| {} | {} | {} | {} | {} | {} |",
            rule.name,
            rule.for_,
            shown(timing.true_after),
            shown(fired),
            shown(took),
            minutes(limit)
        );
        // A poll's lag on either side is the test's, not the rule's.
        if took.is_none_or(|t| t > limit + POLL) {
            late.push(rule.name.clone());
        }
    }
    assert!(
        late.is_empty(),
        "not firing in time: {late:?}\n{}",
        prometheus.log()
    );

    // Every dashboard query has data with the variables at All, as the compose stack opens it.
    let values = [
        ("instance", ".*"),
        ("gpu", ".*"),
        ("namespace", ".*"),
        ("pod", ".*"),
        ("__rate_interval", RATE_INTERVAL),
    ];
    let board = dashboard::load();
    let (asked, empty) = queries_without_data(
        &prometheus,
        &board,
        &values,
        Duration::from_secs(30),
        |_| false,
    );
    assert!(asked >= 25, "only {asked} dashboard queries");
    assert_all_have_data(&prometheus, &board, &values, empty);
    // The node agent's panels show the simulated device's processes by pod, and the trainer's
    // restart as an exited GPU process.
    let pods = prometheus
        .query("count by (pod) (gpumem_process_used_bytes{pod!=\"\"})")
        .expect("pods");
    assert!(pods.len() >= 3, "processes by pod: {pods:?}");
    let exited = prometheus
        .query("gpumem_exited_gpu_processes > 0")
        .expect("exited");
    assert!(
        !exited.is_empty(),
        "the trainer's restart is not listed as exited"
    );
    eprintln!("alerts scenario test took {}", minutes(started.elapsed()));

    if let Ok(path) = std::env::var("RECORD_ALERT_SERIES") {
        let fired: Vec<Fired> = rules
            .iter()
            .filter_map(|rule| {
                let (at, alerts) = timings[&rule.name].fired.clone()?;
                Some(Fired {
                    name: rule.name.clone(),
                    after_seconds: at.as_secs(),
                    alerts,
                })
            })
            .collect();
        let last = fired.iter().map(|f| f.after_seconds).max().unwrap_or(0);
        let points = last / STEP.as_secs() + 3;
        let header = "promtool unit test of grafana/alerts.yml on series recorded from `gpumem demo \
            --scenario alerts`:\na real Prometheus scraped the demo (gpumem:9400) and its node agent \
            (gpumem:9401) every 15 s\nand each alert is expected as that Prometheus had it firing. \
            Recorded by tests/it/e2e/alert_scenario.rs\n(RECORD_ALERT_SERIES); see docs/demo.md.";
        let text = test_file(
            &prometheus,
            start_unix,
            STEP.as_secs(),
            points,
            &fired,
            header,
        );
        std::fs::write(&path, text).expect("write the recorded series");
        eprintln!("recorded series written to {path}");
    }
    drop(demo);
}
