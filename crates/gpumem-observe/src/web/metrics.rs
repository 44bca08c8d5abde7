//! `/metrics`: a `prometheus` [`Collector`] that turns one snapshot into metric families, and the
//! text rendering of them. Every family is declared once in the tables below (name, help, type,
//! labels), which is also where the metrics contract is read from. Labels are bounded: `gpu`,
//! `uuid`, `pool`, `state`, `band`, the build's `version`, and `tag` for the largest few tags
//! only (`tags`) — never ids. The sidecar's series (collected processes, NVML, `source`) are
//! in `sidecar`.

mod sidecar;
mod tags;

use gpumem::manager::pressure::PressureLevel;
use gpumem::snapshot::{DeviceSnapshot, PoolSnapshot, Snapshot};
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::TextEncoder;
use std::sync::OnceLock;

/// The `Content-Type` of `/metrics` (Prometheus text format 0.0.4).
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family: what Prometheus is told about it.
pub(crate) struct Def {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
    pub labels: &'static [&'static str],
}

const GAUGE: MetricType = MetricType::GAUGE;
const COUNTER: MetricType = MetricType::COUNTER;
const DEVICE: &[&str] = &["gpu", "uuid"];
const POOL: &[&str] = &["gpu", "uuid", "pool"];

const fn def(
    name: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
    help: &'static str,
) -> Def {
    Def {
        name,
        help,
        kind,
        labels,
    }
}

type DeviceValue = fn(&DeviceSnapshot) -> Option<f64>;
type PoolValue = fn(&PoolSnapshot) -> f64;

/// Per-device families with one value each.
const DEVICE_METRICS: &[(Def, DeviceValue)] = &[
    (def("gpumem_device_memory_total_bytes", GAUGE, DEVICE, "Total memory of the device."),
        |d| Some(d.memory.map_or(d.total_bytes, |m| m.total_bytes) as f64)),
    (def("gpumem_device_memory_free_bytes", GAUGE, DEVICE, "Free memory of the device as the driver reports it (cuMemGetInfo), for all processes."),
        |d| d.memory.map(|m| m.free_bytes as f64)),
    (def("gpumem_device_memory_used_bytes", GAUGE, DEVICE, "Used memory of the device (total minus free), by every process."),
        |d| d.memory.map(|m| m.used_bytes as f64)),
    (def("gpumem_device_memory_used_by_others_bytes", GAUGE, DEVICE, "Device memory used by anything but this process's pools: other processes, CUDA contexts, libraries allocating on their own."),
        |d| d.memory.map(|m| m.used_by_others_bytes as f64)),
    (def("gpumem_pressure_level", GAUGE, DEVICE, "Memory pressure of the device: 0 low, 1 medium, 2 high, 3 critical."),
        |d| d.pressure.map(|p| f64::from(p.level.as_number()))),
    (def("gpumem_pressure_used_ratio", GAUGE, DEVICE, "Used device memory over usable memory (total minus a reserve for the driver); the pressure levels are thresholds on it."),
        |d| d.pressure.map(|p| p.used_ratio)),
    (def("gpumem_requested_bytes", GAUGE, DEVICE, "Bytes callers asked for in live allocations on the device."),
        |d| Some(d.stats.pools.requested_bytes as f64)),
    (def("gpumem_in_use_bytes", GAUGE, DEVICE, "Bytes of pool blocks handed out to live allocations (requests rounded up to blocks)."),
        |d| Some(d.stats.pools.in_use_bytes as f64)),
    (def("gpumem_reserved_bytes", GAUGE, DEVICE, "Bytes this process's pools hold from the driver on the device, in use or cached for reuse."),
        |d| Some(d.stats.pools.reserved_bytes as f64)),
    (def("gpumem_in_use_peak_bytes", GAUGE, DEVICE, "Highest in-use bytes since start or the last peak reset."),
        |d| Some(d.stats.pools.peak_in_use_bytes as f64)),
    (def("gpumem_reserved_peak_bytes", GAUGE, DEVICE, "Highest reserved bytes since start or the last peak reset."),
        |d| Some(d.stats.pools.peak_reserved_bytes as f64)),
    (def("gpumem_allocations_total", COUNTER, DEVICE, "Allocations served on the device."),
        |d| Some(d.stats.pools.allocations as f64)),
    (def("gpumem_frees_total", COUNTER, DEVICE, "Allocations freed on the device."),
        |d| Some(d.stats.pools.frees as f64)),
    (def("gpumem_driver_allocs_total", COUNTER, DEVICE, "Driver calls that took memory for the device (cuMemAlloc, or mapping pool pages)."),
        |d| Some(d.stats.pools.driver_allocs as f64)),
    (def("gpumem_driver_frees_total", COUNTER, DEVICE, "Driver calls that gave the device's memory back (cuMemFree, or unmapping pool pages)."),
        |d| Some(d.stats.pools.driver_frees as f64)),
    (def("gpumem_driver_errors_total", COUNTER, DEVICE, "Driver calls for the device's memory that failed."),
        |d| Some(d.stats.pools.driver_errors as f64)),
    (def("gpumem_ooms_total", COUNTER, DEVICE, "Allocations refused because the device, or the pool limit, was full."),
        |d| Some(d.stats.ooms as f64)),
    (def("gpumem_oom_retries_total", COUNTER, DEVICE, "Allocations that hit out-of-memory, released cached pages and tried again."),
        |d| Some(d.stats.oom_retries as f64)),
    (def("gpumem_cpu_fallbacks_total", COUNTER, DEVICE, "Allocations served from host memory because the device could not serve them."),
        |d| Some(d.stats.cpu_fallbacks as f64)),
    (def("gpumem_host_fallback_bytes", GAUGE, DEVICE, "Host memory held now by allocations that fell back from the device."),
        |d| Some(d.stats.host_fallback_bytes as f64)),
    (def("gpumem_external_bytes", GAUGE, DEVICE, "Device memory this process allocated outside gpumem and registered with track_external (NCCL, cuBLAS workspaces, its own cuMemAlloc); not in any pool figure."),
        |d| Some(d.external.bytes as f64)),
    (def("gpumem_external_buffers", GAUGE, DEVICE, "Outside buffers registered with track_external on the device."),
        |d| Some(d.external.count as f64)),
    (def("gpumem_graph_pool_bytes", GAUGE, DEVICE, "Device memory held for CUDA graphs (pools of graphs not yet released): part of gpumem_reserved_bytes, but out of reach of every other allocation."),
        |d| Some(d.graphs.reserved_bytes as f64)),
    (def("gpumem_graph_pools", GAUGE, DEVICE, "Pools holding memory for CUDA graphs on the device."),
        |d| Some(d.graphs.pools as f64)),
    (def("gpumem_live_allocations", GAUGE, DEVICE, "Live (allocated, not yet freed) allocations on the device."),
        |d| Some(d.live.count as f64)),
    (def("gpumem_live_bytes", GAUGE, DEVICE, "Requested bytes of the live allocations on the device."),
        |d| Some(d.live.bytes as f64)),
    (def("gpumem_leak_suspect_allocations", GAUGE, DEVICE, "Live allocations older than the leak age (gpumem_leak_age_seconds) whose tag is not long-lived."),
        |d| Some(d.live.leak_suspect_count as f64)),
    (def("gpumem_leak_suspect_bytes", GAUGE, DEVICE, "Requested bytes of the leak suspects (see gpumem_leak_suspect_allocations)."),
        |d| Some(d.live.leak_suspect_bytes as f64)),
    (def("gpumem_oldest_allocation_age_seconds", GAUGE, DEVICE, "Age of the oldest live allocation whose tag is not long-lived (such as weights); 0 when there is none."),
        |d| Some(d.live.oldest_age_seconds)),
];

/// Per-pool families (labels `gpu`, `uuid`, `pool`).
const POOL_METRICS: &[(Def, PoolValue)] = &[
    (def("gpumem_pool_reserved_bytes", GAUGE, POOL, "Bytes the pool holds from the driver, in use or cached."),
        |p| p.reserved_bytes as f64),
    (def("gpumem_pool_in_use_bytes", GAUGE, POOL, "Bytes of the pool's blocks handed out to live allocations."),
        |p| p.in_use_bytes as f64),
    (def("gpumem_pool_requested_bytes", GAUGE, POOL, "Bytes callers asked for in the pool's live allocations."),
        |p| p.requested_bytes as f64),
    (def("gpumem_pool_cached_free_bytes", GAUGE, POOL, "Bytes the pool holds but has not handed out (reserved minus in use)."),
        |p| p.cached_free_bytes as f64),
    (def("gpumem_pool_largest_free_block_bytes", GAUGE, POOL, "The largest request the pool can serve from its cache, without calling the driver."),
        |p| p.largest_free_block_bytes as f64),
    (def("gpumem_pool_fragmentation_ratio", GAUGE, POOL, "1 minus largest free block over cached free bytes: 0 when the cache is one block, near 1 when it is splinters."),
        |p| p.fragmentation_ratio),
    (def("gpumem_pool_idle_pages", GAUGE, POOL, "Mapped pages of the pool with nothing allocated in them, kept for reuse."),
        |p| p.idle_pages as f64),
    (def("gpumem_pool_live_allocations", GAUGE, POOL, "Live allocations served by the pool."),
        |p| p.live_allocations as f64),
    (def("gpumem_pool_requests_total", COUNTER, POOL, "Allocation requests that reached the pool."),
        |p| p.requests as f64),
    (def("gpumem_pool_hits_total", COUNTER, POOL, "Allocation requests the pool served from its cache, without a driver call."),
        |p| p.hits as f64),
    (def("gpumem_pool_driver_allocs_total", COUNTER, POOL, "Driver calls the pool made to take memory."),
        |p| p.driver_allocs as f64),
    (def("gpumem_pool_driver_frees_total", COUNTER, POOL, "Driver calls the pool made to give memory back."),
        |p| p.driver_frees as f64),
    (def("gpumem_pool_driver_errors_total", COUNTER, POOL, "Driver calls of the pool that failed."),
        |p| p.driver_errors as f64),
];

const PRESSURE_STATE: Def = def("gpumem_pressure_state", GAUGE, &["gpu", "uuid", "state"],
    "Memory pressure of the device as a state set: 1 for the current level (low, medium, high, critical), 0 for the others.");
const AGE_BAND_ALLOCATIONS: Def = def(
    "gpumem_live_age_band_allocations",
    GAUGE,
    &["gpu", "uuid", "band"],
    "Live allocations on the device by age band (0-1m, 1m-10m, 10m-1h, 1h+).",
);
const AGE_BAND_BYTES: Def = def(
    "gpumem_live_age_band_bytes",
    GAUGE,
    &["gpu", "uuid", "band"],
    "Requested bytes of live allocations on the device by age band (0-1m, 1m-10m, 10m-1h, 1h+).",
);
const BUILD_INFO: Def = def(
    "gpumem_build_info",
    GAUGE,
    &["version", "backend"],
    "Always 1; the labels say which gpumem version is running and on which backend (cuda or sim; for the sidecar, where device memory comes from: nvml, cuda, sim, published (the publishers' own readings, without NVML) or none).",
);
const UP: Def = def("gpumem_up", GAUGE, &[],
    "1 when the latest sample succeeded and is fresh (taken less than three intervals ago), else 0. The sidecar labels that one source=\"sampler\" and adds one per source (source=nvml, cuda, sim, collect): 1 while it works.");
const SAMPLE_DURATION: Def = def(
    "gpumem_sample_duration_seconds",
    GAUGE,
    &[],
    "How long the latest sample took: reading counters, walking the pools, asking the driver.",
);
const LAST_SAMPLE: Def = def(
    "gpumem_last_sample_timestamp_seconds",
    GAUGE,
    &[],
    "Unix time of the latest successful sample.",
);
const SAMPLES: Def = def(
    "gpumem_samples_total",
    COUNTER,
    &[],
    "Samples taken, successful or not.",
);
const SAMPLE_FAILURES: Def = def(
    "gpumem_sample_failures_total",
    COUNTER,
    &[],
    "Samples that failed (a device's memory could not be read, ...); the reason is on /healthz.",
);
const INTERVAL: Def = def(
    "gpumem_sample_interval_seconds",
    GAUGE,
    &[],
    "How often the sampler takes a snapshot.",
);
const LEAK_AGE: Def = def(
    "gpumem_leak_age_seconds",
    GAUGE,
    &[],
    "Age after which a live allocation whose tag is not long-lived counts as a leak suspect.",
);

const SPECIAL: &[&Def] = &[
    &BUILD_INFO,
    &UP,
    &SAMPLE_DURATION,
    &LAST_SAMPLE,
    &SAMPLES,
    &SAMPLE_FAILURES,
    &INTERVAL,
    &LEAK_AGE,
    &PRESSURE_STATE,
    &AGE_BAND_ALLOCATIONS,
    &AGE_BAND_BYTES,
];

/// Every family `/metrics` can contain.
pub(crate) fn all_defs() -> impl Iterator<Item = &'static Def> {
    SPECIAL
        .iter()
        .copied()
        .chain(DEVICE_METRICS.iter().map(|(d, _)| d))
        .chain(POOL_METRICS.iter().map(|(d, _)| d))
        .chain(sidecar::DEFS.iter().copied())
        .chain(tags::TAG_METRICS.iter().map(|(d, _, _)| d))
}

/// The metrics of one snapshot, as a `prometheus` collector.
pub(crate) struct SnapshotCollector<'a> {
    pub snapshot: &'a Snapshot,
    /// Whether the snapshot is recent enough to count as "up".
    pub fresh: bool,
}

impl Collector for SnapshotCollector<'_> {
    fn desc(&self) -> Vec<&Desc> {
        descriptors().iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        families(self.snapshot, self.fresh)
    }
}

fn descriptors() -> &'static [Desc] {
    static DESCS: OnceLock<Vec<Desc>> = OnceLock::new();
    DESCS.get_or_init(|| {
        all_defs()
            .filter_map(|d| {
                let labels = d.labels.iter().map(|l| l.to_string()).collect();
                Desc::new(
                    d.name.to_string(),
                    d.help.to_string(),
                    labels,
                    Default::default(),
                )
                .ok()
            })
            .collect()
    })
}

/// Renders the snapshot in the Prometheus text format.
pub fn render(snapshot: &Snapshot, fresh: bool) -> Result<String, prometheus::Error> {
    let collector = SnapshotCollector { snapshot, fresh };
    TextEncoder::new().encode_to_string(&collector.collect())
}

/// Collects samples family by family; families left without samples are dropped (the text
/// encoder refuses empty ones, and Prometheus has nothing to say about them either).
struct Families(Vec<MetricFamily>);

impl Families {
    fn add(&mut self, def: &Def, samples: Vec<Metric>) {
        if samples.is_empty() {
            return;
        }
        let mut family = MetricFamily::default();
        family.set_name(def.name.to_string());
        family.set_help(def.help.to_string());
        family.set_field_type(def.kind);
        family.set_metric(samples);
        self.0.push(family);
    }
}

fn sample(kind: MetricType, labels: &[(&str, &str)], value: f64) -> Metric {
    let pairs = labels
        .iter()
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name(name.to_string());
            pair.set_value(value.to_string());
            pair
        })
        .collect();
    let mut metric = Metric::from_label(pairs);
    if kind == MetricType::COUNTER {
        let mut counter = Counter::default();
        counter.set_value(value);
        metric.set_counter(counter);
    } else {
        let mut gauge = Gauge::default();
        gauge.set_value(value);
        metric.set_gauge(gauge);
    }
    metric
}

fn families(snapshot: &Snapshot, fresh: bool) -> Vec<MetricFamily> {
    let mut out = Families(Vec::with_capacity(64));
    let health = &snapshot.health;
    let single = |def: &Def, value: f64| vec![sample(def.kind, &[], value)];
    out.add(
        &BUILD_INFO,
        vec![sample(
            GAUGE,
            &[
                ("version", &snapshot.version),
                ("backend", &snapshot.backend),
            ],
            1.0,
        )],
    );
    // One label set per target: the sidecar labels its overall sample `source="sampler"` next
    // to its per-source series, instead of mixing an unlabelled series into the family.
    let sampled = f64::from(u8::from(health.latest_ok && fresh));
    let mut up = match snapshot.sidecar {
        Some(_) => vec![sample(GAUGE, &[("source", "sampler")], sampled)],
        None => single(&UP, sampled),
    };
    up.extend(sidecar::up_samples(snapshot));
    out.add(&UP, up);
    out.add(
        &SAMPLE_DURATION,
        single(&SAMPLE_DURATION, snapshot.sample_duration_seconds),
    );
    if let Some(t) = health.last_success_timestamp_seconds {
        out.add(&LAST_SAMPLE, single(&LAST_SAMPLE, t));
    }
    let samples_total = (health.samples_ok + health.samples_failed) as f64;
    out.add(&SAMPLES, single(&SAMPLES, samples_total));
    out.add(
        &SAMPLE_FAILURES,
        single(&SAMPLE_FAILURES, health.samples_failed as f64),
    );
    out.add(&INTERVAL, single(&INTERVAL, snapshot.interval_seconds));
    out.add(&LEAK_AGE, single(&LEAK_AGE, snapshot.leak_age_seconds));

    let gpus: Vec<String> = snapshot
        .devices
        .iter()
        .map(|d| d.index.to_string())
        .collect();
    let device_labels = |i: usize| {
        [
            ("gpu", gpus[i].as_str()),
            ("uuid", snapshot.devices[i].uuid.as_str()),
        ]
    };

    for (def, value) in DEVICE_METRICS {
        let own = sidecar::own_device_series(snapshot, def);
        let mut samples: Vec<Metric> = (0..snapshot.devices.len())
            .filter(|_| own)
            .filter_map(|i| {
                value(&snapshot.devices[i]).map(|v| sample(def.kind, &device_labels(i), v))
            })
            .collect();
        samples.extend(sidecar::process_device_samples(snapshot, def));
        out.add(def, samples);
    }
    let mut states = Vec::new();
    for (i, device) in snapshot.devices.iter().enumerate() {
        if let Some(pressure) = device.pressure {
            for level in PressureLevel::ALL {
                let [gpu, uuid] = device_labels(i);
                let on = f64::from(u8::from(level == pressure.level));
                states.push(sample(GAUGE, &[gpu, uuid, ("state", level.name())], on));
            }
        }
    }
    out.add(&PRESSURE_STATE, states);
    let (mut band_counts, mut band_bytes) = (Vec::new(), Vec::new());
    for (i, device) in snapshot.devices.iter().enumerate() {
        for band in &device.live.by_age {
            let [gpu, uuid] = device_labels(i);
            let labels = [gpu, uuid, ("band", band.band.as_str())];
            band_counts.push(sample(GAUGE, &labels, band.count as f64));
            band_bytes.push(sample(GAUGE, &labels, band.bytes as f64));
        }
    }
    out.add(&AGE_BAND_ALLOCATIONS, band_counts);
    out.add(&AGE_BAND_BYTES, band_bytes);

    for (def, value) in POOL_METRICS {
        let mut samples = Vec::new();
        for (i, device) in snapshot.devices.iter().enumerate() {
            for pool in &device.pools {
                let [gpu, uuid] = device_labels(i);
                samples.push(sample(
                    def.kind,
                    &[gpu, uuid, ("pool", pool.pool.as_str())],
                    value(pool),
                ));
            }
        }
        samples.extend(sidecar::process_pool_samples(snapshot, def));
        out.add(def, samples);
    }
    tags::add_families(snapshot, &mut out);
    sidecar::add_families(snapshot, &mut out);
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_well_named_and_described() {
        let defs: Vec<&Def> = all_defs().collect();
        assert_eq!(
            descriptors().len(),
            defs.len(),
            "a name or label failed validation"
        );
        for def in &defs {
            assert!(def.name.starts_with("gpumem_"), "{}", def.name);
            assert_eq!(
                def.kind == COUNTER,
                def.name.ends_with("_total"),
                "{}",
                def.name
            );
            assert!(
                def.help.len() > 20,
                "{} needs a meaningful help text",
                def.name
            );
        }
        let mut names: Vec<&str> = defs.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), defs.len(), "a family is declared twice");
    }

    #[test]
    fn an_empty_snapshot_still_renders() {
        let text = render(&Snapshot::default(), false).expect("renders");
        assert!(text.contains("gpumem_up 0"), "{text}");
        assert!(
            text.contains("# TYPE gpumem_samples_total counter"),
            "{text}"
        );
    }
}
