//! GpumemPressureCritical for a collected process with no NVML, through a real Prometheus:
//! `gpumem demo` publishes (its device's memory and pressure among its numbers), a sidecar
//! whose NVML cannot load collects it, and Prometheus scrapes the sidecar with
//! `grafana/alerts.yml` loaded (`for:` cut to a second). The demo's pressure spike takes its
//! device to critical; the sidecar, blind to the device, reports the publisher's pressure, and
//! the alert fires for that GPU. Skipped without prometheus, unless CI=true.

use super::prometheus::Prometheus;
use super::rules::rules_with_short_for;
use crate::sidecar::{serve, TempDir};
use crate::support::Running;
use crate::web::{eventually, tool_available};
use std::time::Duration;

#[test]
fn the_critical_pressure_alert_fires_for_a_publisher_without_nvml() {
    if !tool_available("prometheus") {
        return;
    }
    let dir = TempDir::new("blind-e2e");
    let sim = ["--backend", "sim", "--sim-memory", "16GiB"];
    let mut args = vec!["demo", "--listen", "127.0.0.1:0", "--interval", "200ms"];
    args.extend(sim);
    args.extend(["--publish-dir", dir.str(), "--spike-at", "2s"]);
    let _demo = Running::start(&args);
    // No NVML (libm is not one) and no backend: blind to the device.
    let sidecar = serve(&dir, &["--nvml-library", "libm.so.6"]);
    let prometheus = Prometheus::start(sidecar.addr, &rules_with_short_for("1s"));
    let instance = sidecar.addr.to_string();
    let blind = eventually(Duration::from_secs(30), || {
        prometheus.value(&format!(
            "gpumem_up{{instance=\"{instance}\",source=\"nvml\"}}"
        )) == Some(0.0)
    });
    assert!(blind, "the sidecar should be scraped with NVML down");
    let firing = eventually(Duration::from_secs(60), || {
        prometheus
            .query(&format!(
                "ALERTS{{alertname=\"GpumemPressureCritical\",alertstate=\"firing\",instance=\"{instance}\",gpu=\"0\"}}"
            ))
            .is_ok_and(|r| !r.is_empty())
    });
    assert!(
        firing,
        "GpumemPressureCritical never fired; pressure seen: {:?}",
        prometheus.query(&format!("gpumem_pressure_level{{instance=\"{instance}\"}}"))
    );
}
