//! `/metrics`: a `prometheus` [`Collector`] that turns one snapshot into metric families, and the
//! text rendering of them. Every family is declared once in the tables below (name, help, type,
//! labels), which is also where the metrics contract is read from. Labels are bounded: `gpu`,
//! `uuid`, `pool`, `state`, `band`, the build's `version`, and `tag` for the largest few tags
//! only (`tags`) — never ids. What a collector adds (collected processes, NVML, `source`) is
//! in `collected`, asked of every snapshot: in-process it adds nothing.

mod collected;
mod families;
mod tags;

pub(crate) use families::{MANAGER_DEVICE, MANAGER_POOL};

use families::DEVICE_READINGS;
use gpumem::manager::pressure::PressureLevel;
use gpumem_wire::published::{device_record, published_pool};
use gpumem_wire::{ProcessDevice, Snapshot};
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::TextEncoder;
use std::sync::OnceLock;

/// The `Content-Type` of `/metrics` (Prometheus text format 0.0.4).
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family: what Prometheus is told about it.
#[derive(Clone, Copy)]
pub(crate) struct Def {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
    pub labels: &'static [&'static str],
}

const GAUGE: MetricType = MetricType::GAUGE;
const COUNTER: MetricType = MetricType::COUNTER;

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
        .chain(DEVICE_READINGS.iter().map(|(d, _)| d))
        .chain(MANAGER_DEVICE.iter().map(|(d, _)| d))
        .chain(MANAGER_POOL.iter().map(|(d, _)| d))
        .chain(collected::DEFS.iter().copied())
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
    let collected = snapshot.collected();
    // One label set per target: a collector labels its overall sample `source="sampler"` next
    // to its per-source series, instead of mixing an unlabelled series into the family.
    let sampled = f64::from(u8::from(health.latest_ok && fresh));
    let mut up = if snapshot.from_collector() {
        vec![sample(GAUGE, &[("source", "sampler")], sampled)]
    } else {
        single(&UP, sampled)
    };
    up.extend(collected::up_samples(collected));
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

    for (def, value) in DEVICE_READINGS {
        let samples = (0..snapshot.devices.len())
            .filter_map(|i| {
                value(&snapshot.devices[i]).map(|v| sample(def.kind, &device_labels(i), v))
            })
            .collect();
        out.add(def, samples);
    }
    // This process's devices as the record it publishes; a collector has no pools of its own
    // and exports only the collected processes' records.
    let records: Vec<ProcessDevice> = if snapshot.from_collector() {
        Vec::new()
    } else {
        snapshot.devices.iter().map(device_record).collect()
    };
    for (def, value) in &MANAGER_DEVICE {
        let mut samples: Vec<Metric> = records
            .iter()
            .enumerate()
            .filter_map(|(i, record)| value(record).map(|v| sample(def.kind, &device_labels(i), v)))
            .collect();
        samples.extend(collected::process_device_samples(collected, def, *value));
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

    for (def, value) in MANAGER_POOL {
        let mut samples = Vec::new();
        for (i, device) in snapshot.devices.iter().enumerate() {
            for pool in &device.pools {
                let [gpu, uuid] = device_labels(i);
                if let Some(v) = value(&published_pool(pool)) {
                    samples.push(sample(
                        def.kind,
                        &[gpu, uuid, ("pool", pool.pool.as_str())],
                        v,
                    ));
                }
            }
        }
        samples.extend(collected::process_pool_samples(collected, def, *value));
        out.add(def, samples);
    }
    tags::add_families(snapshot, &mut out);
    collected::add_families(collected, &mut out);
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
