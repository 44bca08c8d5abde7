//! The status page in a real browser: headless Chromium (Debian's `chromium`), driven over the
//! DevTools protocol, opens the page of a running `gpumem demo`, sees the chart update at least
//! twice (`window.gpumemChartUpdates`, counted by static/chart.js), finds no JavaScript error,
//! console error or failed load, and saves screenshots to target/status-page.png (what the
//! window shows) and target/status-page-full.png (the whole page). Skipped without chromium,
//! unless CI=true.

use crate::support::{target_dir, Chromium, Running};
use crate::web::{eventually, get, tool_available, value_of};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[test]
fn the_status_page_updates_its_chart_without_errors_in_chromium() {
    if !tool_available("chromium") {
        return;
    }
    let started = Instant::now();
    let demo = Running::sim_demo("90s");
    // A page worth looking at: the model is loaded and a few history points exist.
    let loaded = eventually(Duration::from_secs(15), || {
        value_of(
            &get(demo.addr, "/metrics").body,
            "gpumem_live_allocations",
            "gpu=\"0\"",
        )
        .is_some_and(|n| n > 0.0)
    });
    assert!(loaded, "the demo never allocated");
    std::thread::sleep(Duration::from_secs(3));

    let mut browser = Chromium::start();
    let mut page = browser.page();
    for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
        page.call(domain, json!({}));
    }
    let url = format!("http://{}/", demo.addr);
    let navigated = page.call("Page.navigate", json!({ "url": url }));
    assert!(
        navigated.get("errorText").is_none(),
        "could not open {url}: {}",
        navigated["errorText"]
    );

    // The page updates itself in place (static/live.js); should it ever reload, a screenshot
    // counts only if the document is still the one whose chart updated twice.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (updates, window_shot, full_shot) = loop {
        let updates = page
            .evaluate("window.gpumemChartUpdates || 0")
            .as_u64()
            .unwrap_or(0);
        if updates >= 2 {
            let document = page.evaluate("performance.timeOrigin");
            let window_shot = page.screenshot(false);
            let full_shot = page.screenshot(true);
            if page.evaluate("performance.timeOrigin") == document {
                break (updates, window_shot, full_shot);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the chart updated {updates} times in 30 s (expected at least 2); errors: {:?}",
            page.errors()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let title = page.evaluate("document.title");
    let errors = page.errors();

    let dir = target_dir();
    std::fs::create_dir_all(&dir).expect("target dir");
    for (name, png) in [
        ("status-page.png", &window_shot),
        ("status-page-full.png", &full_shot),
    ] {
        assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
        assert!(
            png.len() > 20_000,
            "{name} looks empty ({} bytes)",
            png.len()
        );
        std::fs::write(dir.join(name), png).expect("write screenshot");
    }
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    // The check above can see an error: throw one and look for it.
    page.evaluate("setTimeout(function () { throw new Error('gpumem-probe'); }, 0); 1");
    let seen = eventually(Duration::from_secs(5), || {
        page.evaluate("1");
        page.errors().iter().any(|e| e.contains("gpumem-probe"))
    });
    assert!(
        seen,
        "a thrown error did not show up in {:?}",
        page.errors()
    );
    assert!(
        title.as_str().is_some_and(|t| t.starts_with("gpumem")),
        "title {title}"
    );
    eprintln!(
        "chart updated {updates} times; screenshots in {} ({:.1} s)",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
}

/// The sidecar's page in Chromium, in a pressure state (a demo publishing into its directory,
/// pushed to critical pressure so it refuses allocations): the device bar counts what the
/// process table says the collected process holds (no "used 0 B" next to a process holding
/// GiBs), hints say what to do and link runbook sections that exist, the OOM records are
/// listed, and the page updates itself by polling, with the refresh only inside <noscript>.
#[test]
fn the_sidecar_page_agrees_with_itself_and_says_what_to_do_in_chromium() {
    if !tool_available("chromium") {
        return;
    }
    let dir = crate::sidecar::TempDir::new("browser-sidecar");
    let sim = ["--backend", "sim", "--sim-memory", "8GiB"];
    let mut args = vec!["--spike-at", "2s"];
    args.extend(sim);
    let _demo = crate::sidecar::publishing_demo(&dir, &args);
    // The sidecar's own (simulated) reading of the device is smaller than what the demo holds
    // under its spike, so the device it shows is under pressure because of the collected
    // process: the pressure hint must be there too.
    let sidecar = crate::sidecar::serve(&dir, &["--backend", "sim", "--sim-memory", "4GiB"]);
    let ready = eventually(Duration::from_secs(30), || {
        let snapshot: Value = serde_json::from_str(&get(sidecar.addr, "/api/v1/snapshot").body)
            .unwrap_or(Value::Null);
        let ooms = snapshot["sidecar"]["processes"][0]["devices"][0]["ooms_total"].as_u64();
        ooms.is_some_and(|n| n > 0)
    });
    assert!(
        ready,
        "the demo never refused an allocation under the spike"
    );

    let mut browser = Chromium::start();
    let mut page = browser.page();
    for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
        page.call(domain, json!({}));
    }
    let url = format!("http://{}/", sidecar.addr);
    page.call("Page.navigate", json!({ "url": url }));
    let updated = eventually(Duration::from_secs(20), || {
        page.evaluate("window.gpumemPageUpdates || 0").as_u64() >= Some(2)
    });
    assert!(
        updated,
        "the page did not update itself: {:?}",
        page.errors()
    );
    let refresh = page.evaluate(
        "Array.from(document.querySelectorAll('meta[http-equiv=refresh]')).filter(m => !m.closest('noscript')).length",
    );
    assert_eq!(refresh, json!(0), "a meta refresh outside <noscript>");

    // Each device's bar counts what the process table says its processes hold.
    let agreement = page.evaluate(
        r#"Array.from(document.querySelectorAll('section.device')).map(function (d) {
            var bytes = function (cls) {
              var s = d.querySelector('.bar .seg.' + cls);
              return s ? Number(s.getAttribute('data-bytes')) : 0;
            };
            var table = Array.from(document.querySelectorAll('tr.process'))
              .filter(function (r) { return r.getAttribute('data-uuid') === d.getAttribute('data-uuid'); })
              .reduce(function (sum, r) { return sum + Number(r.getAttribute('data-reserved-bytes')); }, 0);
            var used = bytes('in-use') + bytes('cached') + bytes('others');
            return { table: table, bar: bytes('in-use') + bytes('cached'), used: used,
                     badge: d.querySelector('.device-head .badge').textContent };
          })"#,
    );
    let devices = agreement.as_array().expect("device sections");
    assert!(!devices.is_empty(), "no device section");
    for device in devices {
        let table = device["table"].as_f64().unwrap_or(0.0);
        assert!(table > 0.0, "the process table holds nothing: {device}");
        assert_eq!(
            device["bar"], device["table"],
            "bar and table disagree: {device}"
        );
        assert!(device["used"].as_f64() >= Some(table), "{device}");
        let badge = device["badge"].as_str().unwrap_or("");
        assert!(
            badge.contains("of usable"),
            "one percentage, of usable: {badge}"
        );
    }

    // Hints: at least the OOM one, each linking a runbook section that exists.
    let hints = page.evaluate(
        "Array.from(document.querySelectorAll('.hint')).map(h => [h.textContent, h.querySelector('a').getAttribute('href')])",
    );
    let hints = hints.as_array().expect("hints").clone();
    assert!(
        hints
            .iter()
            .any(|h| h[0].as_str().is_some_and(|t| t.contains("out-of-memory"))),
        "no OOM hint: {hints:?}"
    );
    assert!(
        hints
            .iter()
            .any(|h| h[0].as_str().is_some_and(|t| t.contains("pressure"))),
        "no pressure hint although the collected process fills the device: {hints:?}"
    );
    let runbook = get(sidecar.addr, "/runbook").body;
    for hint in &hints {
        let href = hint[1].as_str().unwrap_or("");
        let anchor = href.split_once("/runbook#").map(|(_, a)| a).unwrap_or("");
        assert!(
            !anchor.is_empty() && runbook.contains(&format!("id=\"{anchor}\"")),
            "hint links nowhere: {hint}"
        );
    }
    let records = page.evaluate("document.querySelectorAll('#oom-records tbody tr').length");
    assert!(records.as_u64() >= Some(1), "no OOM record on the page");
    let shot = page.screenshot(true);
    std::fs::write(target_dir().join("sidecar-page-full.png"), &shot).expect("screenshot");
    let errors = page.errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
}
