//! The Kubernetes path end to end, as a platform engineer runs it: `gpumem demo` publishing with
//! tags into a directory, `gpumem serve --collect-dir` on it, a real Prometheus scraping the
//! sidecar. The dashboard's per-tag and per-process panels return data; a pressure spike makes
//! the demo refuse allocations, which leaves a flight record file, a log line naming it and an
//! entry at `/api/v1/oom` (the demo's and the sidecar's); `kill -9` of the demo leaves it on the
//! sidecar as "exited" with its last numbers, and its file removed. Skipped without prometheus,
//! unless CI=true.

use super::dashboard;
use super::prometheus::{ever, Prometheus};
use super::rules::rules_with_short_for;
use crate::sidecar::{serve, TempDir};
use crate::support::Running;
use crate::web::{eventually, get, tool_available};
use serde_json::Value;
use std::time::{Duration, Instant};

const BUDGET: Duration = Duration::from_secs(120);

fn json(addr: std::net::SocketAddr, path: &str) -> Value {
    serde_json::from_str(&get(addr, path).body).unwrap_or(Value::Null)
}

#[test]
fn tags_ooms_and_exits_reach_the_sidecar_prometheus_and_the_dashboard() {
    if !tool_available("prometheus") {
        return;
    }
    let started = Instant::now();
    let left = || BUDGET.saturating_sub(started.elapsed());
    let dir = TempDir::new("oom-e2e");
    let log_path = dir.path().with_extension("demo.log");
    let log = std::fs::File::create(&log_path).expect("a log file");
    let sim = ["--backend", "sim", "--sim-memory", "16GiB"];
    let mut args = vec!["demo", "--listen", "127.0.0.1:0", "--interval", "200ms"];
    args.extend(sim);
    args.extend([
        "--publish-dir",
        dir.str(),
        "--spike-at",
        "3s",
        "--leak-age",
        "2s",
    ]);
    let mut demo = Running::start_with_stderr(&args, log);
    let sidecar = serve(&dir, &sim);
    let prometheus = Prometheus::start(sidecar.addr, &rules_with_short_for("1s"));
    let instance = sidecar.addr.to_string();

    // The dashboard's per-tag and per-process panels return data for the collected process,
    // with namespace and pod at "All" (the sidecar here is scraped without pod labels).
    let values = [
        ("instance", instance.as_str()),
        ("gpu", "0"),
        ("namespace", ".*"),
        ("pod", ".*"),
        ("__rate_interval", "4s"),
    ];
    let board = dashboard::load();
    let wanted = ["Live memory by tag", "Reserved per process (published)"];
    let mut waiting: Vec<(String, String)> = dashboard::queries(&board)
        .into_iter()
        .filter(|q| wanted.contains(&q.panel.as_str()))
        .map(|q| {
            let promql = dashboard::substitute(&q.expr, &values).expect("variables");
            (q.panel, promql)
        })
        .collect();
    assert!(
        waiting.len() >= 3,
        "the per-tag and per-process panels exist"
    );
    eventually(left(), || {
        waiting.retain(|(_, promql)| !prometheus.query(promql).is_ok_and(|r| !r.is_empty()));
        waiting.is_empty()
    });
    assert!(waiting.is_empty(), "panels without data: {waiting:?}");
    let kv = prometheus.query(&format!(
        "gpumem_tag_live_bytes{{instance=\"{instance}\",process=\"gpumem-demo\",tag=\"kv_cache\"}}"
    ));
    assert!(
        kv.is_ok_and(|r| !r.is_empty()),
        "kv_cache is exported by tag"
    );

    // The spike makes the demo refuse allocations: a record file, a log line, /api/v1/oom.
    let records = dir.join("oom");
    let mut file = None;
    eventually(left(), || {
        file = std::fs::read_dir(&records).ok().and_then(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .find(|name| name.contains("-oom-"))
        });
        file.is_some()
    });
    let file = file.unwrap_or_else(|| panic!("no OOM record in {}", records.display()));
    let record: Value = serde_json::from_slice(&std::fs::read(records.join(&file)).expect("read"))
        .expect("the record is JSON");
    assert_eq!(record["format"], "gpumem.flight");
    assert!(
        record["request"]["requested_bytes"].as_u64() > Some(0),
        "{record}"
    );
    assert!(record["request"]["tag"].is_string(), "{record}");
    // The simulated device names no other process, but its line says what the others held.
    assert!(
        record["summary"]
            .as_str()
            .is_some_and(|s| s.contains("; other processes held ")),
        "{record}"
    );
    assert!(!record["pools"].as_array().expect("pools").is_empty());
    assert!(!record["top_tags"].as_array().expect("tags").is_empty());
    assert!(!record["history"].as_array().expect("history").is_empty());
    let logged = eventually(left(), || {
        std::fs::read_to_string(&log_path).is_ok_and(|text| {
            text.lines()
                .any(|l| l.contains("out of memory on GPU 0") && l.contains(&file))
        })
    });
    assert!(logged, "no log line names {file}");
    let listed = |addr| {
        json(addr, "/api/v1/oom")["records"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["file"] == file.as_str()))
    };
    assert!(listed(demo.addr), "the demo's /api/v1/oom lacks {file}");
    assert!(
        eventually(left(), || listed(sidecar.addr)),
        "the sidecar's /api/v1/oom lacks {file}"
    );
    // The dashboard's out-of-memory annotation marks the refusals.
    let oom = dashboard::annotation_queries(&board)
        .into_iter()
        .find(|a| a.expr.contains("gpumem_ooms_total"))
        .expect("an out-of-memory annotation");
    let promql = ever(&dashboard::substitute(&oom.expr, &values).expect("variables"));
    let marked = eventually(left(), || {
        prometheus.query(&promql).is_ok_and(|r| !r.is_empty())
    });
    assert!(marked, "{}: no mark for the refusals: {promql}", oom.panel);

    // kill -9: no clean-up by the demo; the sidecar keeps it as exited, with its numbers.
    let pid = demo.pid();
    demo.kill_hard();
    let mut exited = Value::Null;
    let seen = eventually(left(), || {
        let snapshot = json(sidecar.addr, "/api/v1/snapshot");
        exited = snapshot["sidecar"]["exited"]
            .as_array()
            .and_then(|list| list.iter().find(|e| e["last"]["pid"] == pid).cloned())
            .unwrap_or(Value::Null);
        !exited.is_null()
    });
    assert!(seen, "the killed demo is not listed as exited");
    assert_eq!(exited["reason"], "exited", "{exited}");
    let last = &exited["last"]["devices"][0];
    assert!(last["reserved_peak_bytes"].as_u64() > Some(0), "{exited}");
    assert!(last["ooms_total"].as_u64() > Some(0), "{exited}");
    assert!(
        !dir.join(&format!("gpumem-{pid}.json")).exists(),
        "the dead process's file was not removed"
    );
    let page = get(sidecar.addr, "/").body;
    assert!(page.contains("Exited processes"), "the page lists it");
    let _ = std::fs::remove_file(&log_path);
}
