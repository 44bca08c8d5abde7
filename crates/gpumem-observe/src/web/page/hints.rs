//! The status page's hints: what needs attention (sampling, a blind collector, pressure, OOMs,
//! leak suspects, fragmentation), most urgent first, each linking its runbook section.

use super::super::format;
use gpumem::manager::PressureLevel;
use gpumem_wire::{DeviceSnapshot, Snapshot};

/// "Memory pressure is critical on GPU 0: …" and the runbook section that says what to do.
pub(crate) struct Hint {
    /// `critical` or `warn`: the colour.
    pub(crate) class: &'static str,
    pub(crate) text: String,
    pub(crate) link: String,
}

/// The runbook's section for each state (docs/runbook.md; anchors are the alerts' names).
const RUNBOOK_PRESSURE_HIGH: &str = "gpumempressurehigh";
const RUNBOOK_PRESSURE_CRITICAL: &str = "gpumempressurecritical";
const RUNBOOK_LEAKS: &str = "gpumemleaksuspectsgrowing";
const RUNBOOK_FRAGMENTED: &str = "gpumempoolfragmented";
const RUNBOOK_OOM: &str = "gpumemoutofmemory";
const RUNBOOK_SAMPLING: &str = "gpumemsamplingfailing";
const RUNBOOK_NVML: &str = "gpumemnvmlunavailable";

/// The page's hints for `snapshot`: one per state that needs attention, most urgent first.
pub(super) fn hints(snapshot: &Snapshot, fresh: bool, runbook: &str) -> Vec<Hint> {
    let link = |anchor: &str| format!("{runbook}#{anchor}");
    let mut hints = Vec::new();
    let mut hint = |class, text: String, anchor| {
        hints.push(Hint {
            class,
            text,
            link: link(anchor),
        })
    };
    if !snapshot.health.latest_ok || !fresh {
        hint(
            "warn",
            "Sampling is failing or stalled: the numbers below are old. /healthz says why."
                .to_string(),
            RUNBOOK_SAMPLING,
        );
    }
    if let Some(blind) = snapshot.collected().blind() {
        let mut text = blind;
        if let Some(first) = text.get(..1) {
            text = format!("{}{}.", first.to_uppercase(), &text[1..]);
        }
        hint("warn", text, RUNBOOK_NVML);
    }
    for device in &snapshot.devices {
        let gpu = device.index;
        if let Some(p) = device.pressure {
            let pct = format::percent(p.used_ratio);
            match p.level {
                PressureLevel::Critical => hint(
                    "critical",
                    format!("GPU {gpu} is at critical memory pressure ({pct} of usable): allocations are about to fail. Find who holds the memory and free it or lower the load."),
                    RUNBOOK_PRESSURE_CRITICAL,
                ),
                PressureLevel::High => hint(
                    "warn",
                    format!("GPU {gpu} is at high memory pressure ({pct} of usable): caches are trimmed and larger batches may not fit."),
                    RUNBOOK_PRESSURE_HIGH,
                ),
                _ => {}
            }
        }
        let ooms = device.stats.ooms + collected(snapshot, device, |d| d.ooms_total);
        if ooms > 0 {
            hint(
                "critical",
                format!("GPU {gpu}: {} allocation(s) refused with out-of-memory. The flight records below say what was asked for and who held the memory.", format::count(ooms)),
                RUNBOOK_OOM,
            );
        }
        let leaks =
            device.live.leak_suspect_bytes + collected(snapshot, device, |d| d.leak_suspect_bytes);
        if leaks > 0 {
            hint(
                "warn",
                format!("GPU {gpu}: {} held by leak suspects (allocations older than {}). If it keeps growing, something allocates and never frees.", format::bytes(leaks), format::age(snapshot.leak_age_seconds)),
                RUNBOOK_LEAKS,
            );
        }
        let fragmented = device
            .pools
            .iter()
            .map(|p| p.fragmentation_ratio)
            .fold(0.0, f64::max);
        if fragmented > gpumem::manager::FRAGMENTATION_WARNING {
            hint(
                "warn",
                format!("GPU {gpu}: a pool's cached memory is {} splinters; large requests may miss although memory is cached.", format::percent(fragmented)),
                RUNBOOK_FRAGMENTED,
            );
        }
    }
    hints.sort_by_key(|h| h.class != "critical");
    hints
}

/// A published number summed over the collected processes on `device` (0 in-process).
fn collected(
    snapshot: &Snapshot,
    device: &DeviceSnapshot,
    value: fn(&gpumem_wire::ProcessDevice) -> Option<u64>,
) -> u64 {
    snapshot
        .collected()
        .on_device(device)
        .filter_map(|(_, published)| value(published))
        .sum()
}
