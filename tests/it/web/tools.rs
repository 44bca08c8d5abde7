//! The exporter checked by an outside tool: `promtool check metrics` on `/metrics`, skipped when
//! promtool is missing, unless CI=true. (The status page in headless Chromium is `browser.rs`; a
//! real Prometheus scraping the demo is `e2e`.)

use super::http::{get, tool_available};
use super::Fixture;
use crate::support::promtool_check_metrics;

#[test]
fn promtool_accepts_the_metrics() {
    if !tool_available("promtool") {
        return;
    }
    let fixture = Fixture::start();
    let body = get(fixture.addr(), "/metrics").body;
    let (status, said) = promtool_check_metrics(&body);
    assert!(status.success(), "promtool check metrics failed: {said}");
    assert!(said.trim().is_empty(), "promtool warned: {said}");
}
