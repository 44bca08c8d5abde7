//! Taking a snapshot: reads each manager's lock-free counters, walks its arenas for pool views
//! and live allocations, asks the driver for free memory, and folds it all into [`Snapshot`].
//! Runs on the sampler's blocking thread, never inside a request.

use super::{
    unix_now, AgeBand, AllocationSummary, DeviceCounters, DeviceMemory, DeviceSnapshot,
    ExternalSummary, LiveSummary, PoolSnapshot, Snapshot, TagGroup,
};
use crate::manager::pressure::PressureThresholds;
use crate::manager::views::{fragmentation, DeviceStats, LiveAllocation, PoolView};
use crate::manager::MemoryManager;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// What a snapshot looks for, and how much of it it keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct CaptureSettings {
    /// Recorded in the snapshot, so readers know how fresh "fresh" is.
    pub interval: Duration,
    /// Live allocations older than this are leak suspects.
    pub leak_age: Duration,
    /// Tags expected to live for the whole run: never leak suspects, not in the oldest list.
    pub long_lived_tags: Vec<String>,
    /// How many of the oldest allocations each device lists.
    pub oldest_listed: usize,
    /// How many tags each device lists by name before folding the rest into `other`.
    pub tags_listed: usize,
    pub pressure: PressureThresholds,
}

impl Default for CaptureSettings {
    fn default() -> Self {
        CaptureSettings {
            interval: Duration::from_secs(1),
            leak_age: Duration::from_secs(600),
            long_lived_tags: vec!["weights".to_string()],
            oldest_listed: 20,
            tags_listed: 10,
            pressure: PressureThresholds::default(),
        }
    }
}

/// The age bands live bytes are counted in; the labels are part of the metrics contract.
pub(super) const AGE_BANDS: [(&str, Duration); 4] = [
    ("0-1m", Duration::from_secs(60)),
    ("1m-10m", Duration::from_secs(600)),
    ("10m-1h", Duration::from_secs(3600)),
    ("1h+", Duration::MAX),
];

const UNTAGGED: &str = "untagged";
const OTHER_TAGS: &str = "other";

/// Takes a snapshot of `managers` (which should share one backend). Problems — a device whose
/// memory cannot be read — are listed in `problems`; the rest of the snapshot is still filled in.
/// The sampler fills in `health`.
pub fn capture(managers: &[MemoryManager], settings: &CaptureSettings) -> Snapshot {
    let started = Instant::now();
    let timestamp_seconds = unix_now();
    let mut problems = Vec::new();
    let mut devices: BTreeMap<usize, DeviceSnapshot> = BTreeMap::new();
    let mut accumulators: HashMap<usize, LiveAccumulator> = HashMap::new();
    // The first manager of each device answers for the device itself (properties, mem_info).
    let mut owner: HashMap<usize, &MemoryManager> = HashMap::new();

    for manager in managers {
        for index in manager.device_indices() {
            let device = match devices.entry(index) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(new) => match describe(manager, index) {
                    Ok(device) => {
                        owner.insert(index, manager);
                        new.insert(device)
                    }
                    Err(problem) => {
                        problems.push(problem);
                        continue;
                    }
                },
            };
            device.recent_ooms.extend(manager.recent_ooms(index));
            for pool in manager.graph_pools(index).unwrap_or_default() {
                if pool.pinned {
                    device.graphs.pools += 1;
                    device.graphs.reserved_bytes += pool.mapped_bytes;
                    device.graphs.in_use_bytes += pool.in_use_bytes;
                }
            }
            match manager.device_stats(index) {
                Ok(stats) => add_stats(&mut device.stats, &stats),
                Err(error) => problems.push(format!(
                    "device {index}: could not read its counters: {error}"
                )),
            }
        }
        for view in manager.pool_views() {
            if let Some(device) = devices.get_mut(&view.device) {
                merge_pool(&mut device.pools, &view);
            }
        }
        for allocation in manager.live_allocations() {
            accumulators
                .entry(allocation.device)
                .or_insert_with(|| LiveAccumulator::new(settings))
                .add(&allocation, settings, manager);
        }
        for buffer in manager.external_buffers() {
            accumulators
                .entry(buffer.device)
                .or_insert_with(|| LiveAccumulator::new(settings))
                .add_external(&buffer);
        }
    }

    for (index, device) in devices.iter_mut() {
        if let Some(manager) = owner.get(index) {
            match manager.backend().mem_info(*index) {
                Ok(info) => {
                    let used = info.used();
                    let ours = device.stats.pools.reserved_bytes.min(used);
                    device.memory = Some(DeviceMemory {
                        total_bytes: info.total,
                        free_bytes: info.free,
                        used_bytes: used,
                        used_by_this_process_bytes: ours,
                        used_by_others_bytes: used - ours,
                    });
                    device.pressure = Some(settings.pressure.measure(used, info.total));
                }
                Err(error) => problems.push(format!(
                    "device {index}: could not read free memory: {error}"
                )),
            }
        }
        // Several managers may share a device: keep the newest refusals of them all.
        let ooms = &mut device.recent_ooms;
        ooms.sort_by(|a, b| a.timestamp_seconds.total_cmp(&b.timestamp_seconds));
        let excess = ooms
            .len()
            .saturating_sub(crate::manager::ooms::KEPT_PER_DEVICE);
        ooms.drain(..excess);
        let accumulator = accumulators
            .remove(index)
            .unwrap_or_else(|| LiveAccumulator::new(settings));
        accumulator.finish(device, settings);
    }

    let backend = managers
        .first()
        .map_or_else(String::new, |m| m.backend().kind().to_string());
    Snapshot {
        devices: devices.into_values().collect(),
        problems,
        ..begun(settings, started, timestamp_seconds, backend)
    }
}

/// A snapshot stating only what every sample says about itself: version, when it was taken
/// (`timestamp_seconds`, having begun at `started`), the settings it was taken with, and the
/// backend. The in-process capture and the collector fill in the rest.
pub fn begun(
    settings: &CaptureSettings,
    started: Instant,
    timestamp_seconds: f64,
    backend: String,
) -> Snapshot {
    Snapshot {
        version: env!("CARGO_PKG_VERSION").to_string(),
        timestamp_seconds,
        sample_duration_seconds: started.elapsed().as_secs_f64(),
        interval_seconds: settings.interval.as_secs_f64(),
        leak_age_seconds: settings.leak_age.as_secs_f64(),
        long_lived_tags: settings.long_lived_tags.clone(),
        backend,
        ..Snapshot::default()
    }
}

/// A device's fixed facts; the rest is filled in as the managers are read.
fn describe(manager: &MemoryManager, index: usize) -> Result<DeviceSnapshot, String> {
    let properties = manager
        .backend()
        .properties(index)
        .map_err(|error| format!("device {index}: could not read its properties: {error}"))?;
    Ok(DeviceSnapshot {
        index,
        name: properties.name,
        uuid: properties.uuid,
        simulated: properties.simulated,
        total_bytes: properties.total_memory_bytes,
        ..DeviceSnapshot::default()
    })
}

fn add_stats(total: &mut DeviceCounters, stats: &DeviceStats) {
    total.pools.add(&stats.counters);
    total.ooms += stats.ooms;
    total.oom_retries += stats.oom_retries;
    total.cpu_fallbacks += stats.cpu_fallbacks;
    total.host_fallback_bytes += stats.host_fallback_bytes;
}

/// Adds a pool view to the device's pool of the same kind (several managers may share a device).
fn merge_pool(pools: &mut Vec<PoolSnapshot>, view: &PoolView) {
    let name = view.pool.name();
    let position = match pools.iter().position(|p| p.pool == name) {
        Some(position) => position,
        None => {
            pools.push(PoolSnapshot {
                pool: name.to_string(),
                ..PoolSnapshot::default()
            });
            pools.len() - 1
        }
    };
    let pool = &mut pools[position];
    let c = &view.counters;
    pool.requested_bytes += c.requested_bytes;
    pool.in_use_bytes += c.in_use_bytes;
    pool.reserved_bytes += c.reserved_bytes;
    pool.peak_reserved_bytes += c.peak_reserved_bytes;
    pool.cached_free_bytes += view.cached_free_bytes;
    pool.largest_free_block_bytes = pool
        .largest_free_block_bytes
        .max(view.largest_cached_free_block_bytes);
    pool.fragmentation_ratio = fragmentation(pool.largest_free_block_bytes, pool.cached_free_bytes);
    pool.idle_pages += view.idle_pages;
    pool.live_allocations += c.live_allocations;
    pool.requests += c.requests;
    pool.hits += c.hits;
    pool.driver_allocs += c.driver_allocs;
    pool.driver_frees += c.driver_frees;
    pool.driver_errors += c.driver_errors;
}

/// Folds one device's live allocations into counts, one pass, whatever their number.
struct LiveAccumulator {
    count: u64,
    bytes: u64,
    bands: Vec<AgeBand>,
    oldest_age: Duration,
    oldest: Vec<AllocationSummary>,
    leaks: HashMap<String, TagGroup>,
    tags: HashMap<String, TagGroup>,
    external: HashMap<String, TagGroup>,
}

/// Frames of an allocation's backtrace a snapshot keeps.
const BACKTRACE_FRAMES: usize = 16;

impl LiveAccumulator {
    fn new(settings: &CaptureSettings) -> Self {
        LiveAccumulator {
            count: 0,
            bytes: 0,
            bands: AGE_BANDS
                .iter()
                .map(|(band, _)| AgeBand {
                    band: band.to_string(),
                    ..AgeBand::default()
                })
                .collect(),
            oldest_age: Duration::ZERO,
            oldest: Vec::with_capacity(settings.oldest_listed),
            leaks: HashMap::new(),
            tags: HashMap::new(),
            external: HashMap::new(),
        }
    }

    fn add_external(&mut self, buffer: &crate::manager::ExternalBuffer) {
        add_to_group(&mut self.external, &buffer.tag, buffer.bytes, buffer.age);
    }

    fn add(
        &mut self,
        allocation: &LiveAllocation,
        settings: &CaptureSettings,
        manager: &MemoryManager,
    ) {
        let bytes = allocation.requested_bytes;
        let age = allocation.age;
        self.count += 1;
        self.bytes += bytes;
        let band = AGE_BANDS
            .iter()
            .position(|(_, below)| age < *below)
            .unwrap_or(AGE_BANDS.len() - 1);
        self.bands[band].count += 1;
        self.bands[band].bytes += bytes;

        let tag = allocation.tag.as_deref().unwrap_or(UNTAGGED);
        add_to_group(&mut self.tags, tag, bytes, age);
        if settings.long_lived_tags.iter().any(|t| t == tag) {
            return;
        }
        if age >= settings.leak_age {
            if let Some(group) = self.tags.get_mut(tag) {
                group.leak_suspect_count += 1;
                group.leak_suspect_bytes += bytes;
            }
            add_to_group(&mut self.leaks, tag, bytes, age);
        }
        self.oldest_age = self.oldest_age.max(age);
        // Allocations arrive oldest first from each manager; keeping the first few is enough
        // for one manager, and `finish` re-sorts in case several were merged.
        if self.oldest.len() < settings.oldest_listed {
            let origin = manager.origin_of(allocation.id);
            self.oldest.push(AllocationSummary {
                id: allocation.id,
                tag: tag.to_string(),
                requested_bytes: bytes,
                age_seconds: age.as_secs_f64(),
                pool: allocation.pool.name().to_string(),
                thread: origin.as_ref().map(|o| o.thread.clone()),
                backtrace: origin.map(|o| o.caller_frames(BACKTRACE_FRAMES)),
            });
        }
    }

    fn finish(mut self, device: &mut DeviceSnapshot, settings: &CaptureSettings) {
        self.oldest
            .sort_by(|a, b| b.age_seconds.total_cmp(&a.age_seconds));
        self.oldest.truncate(settings.oldest_listed);
        let leak_suspect_count = self.leaks.values().map(|g| g.count).sum();
        let leak_suspect_bytes = self.leaks.values().map(|g| g.bytes).sum();
        device.live = LiveSummary {
            count: self.count,
            bytes: self.bytes,
            by_age: self.bands,
            oldest_age_seconds: self.oldest_age.as_secs_f64(),
            leak_suspect_count,
            leak_suspect_bytes,
        };
        device.leak_suspects = largest_groups(self.leaks, settings.tags_listed);
        device.oldest_allocations = self.oldest;
        device.by_tag = largest_groups(self.tags, settings.tags_listed);
        device.external = ExternalSummary {
            count: self.external.values().map(|g| g.count).sum(),
            bytes: self.external.values().map(|g| g.bytes).sum(),
            by_tag: largest_groups(self.external, settings.tags_listed),
        };
    }
}

fn add_to_group(groups: &mut HashMap<String, TagGroup>, tag: &str, bytes: u64, age: Duration) {
    let group = match groups.get_mut(tag) {
        Some(group) => group,
        None => groups.entry(tag.to_string()).or_insert_with(|| TagGroup {
            tag: tag.to_string(),
            ..TagGroup::default()
        }),
    };
    group.count += 1;
    group.bytes += bytes;
    group.oldest_age_seconds = group.oldest_age_seconds.max(age.as_secs_f64());
}

/// The `keep` groups with the most bytes, then the rest folded into one `other` group, so a
/// program with thousands of distinct tags still yields a small snapshot.
fn largest_groups(groups: HashMap<String, TagGroup>, keep: usize) -> Vec<TagGroup> {
    fold_smallest(groups.into_values().collect(), keep)
}

/// `groups` sorted by bytes (most first), the groups beyond the first `keep` folded into one
/// `other` group (merged with an `other` already present). Bounds the tags a snapshot lists and
/// the `tag` label values `/metrics` exports, in-process and for collected processes alike.
pub fn fold_smallest(mut groups: Vec<TagGroup>, keep: usize) -> Vec<TagGroup> {
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.tag.cmp(&b.tag)));
    if groups.len() <= keep {
        return groups;
    }
    let mut kept = Vec::with_capacity(keep + 1);
    let mut other = TagGroup {
        tag: OTHER_TAGS.to_string(),
        ..TagGroup::default()
    };
    for group in groups {
        if kept.len() < keep && group.tag != OTHER_TAGS {
            kept.push(group);
            continue;
        }
        other.count += group.count;
        other.bytes += group.bytes;
        other.leak_suspect_count += group.leak_suspect_count;
        other.leak_suspect_bytes += group.leak_suspect_bytes;
        other.oldest_age_seconds = other.oldest_age_seconds.max(group.oldest_age_seconds);
    }
    kept.push(other);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimConfig};
    use crate::manager::{AllocOptions, ManagerConfig, Tag};
    use crate::units::MIB;
    use std::sync::Arc;

    #[test]
    fn leaks_skip_long_lived_tags_and_group_by_tag() {
        let sim = Arc::new(SimBackend::new(SimConfig::default()));
        let manager = MemoryManager::new(sim, ManagerConfig::default()).expect("manager");
        let tagged = |tag: &str| AllocOptions::tagged(Tag::new(tag));
        let _held = [
            manager
                .alloc(0, 64 * MIB, &tagged("weights"))
                .expect("alloc"),
            manager.alloc(0, MIB, &tagged("leaky")).expect("alloc"),
            manager.alloc(0, 2 * MIB, &tagged("leaky")).expect("alloc"),
            manager
                .alloc(0, 4096, &AllocOptions::default())
                .expect("alloc"),
        ];
        let settings = CaptureSettings {
            leak_age: Duration::ZERO,
            ..CaptureSettings::default()
        };
        let snapshot = capture(&[manager], &settings);
        assert!(snapshot.problems.is_empty(), "{:?}", snapshot.problems);
        let device = &snapshot.devices[0];
        assert_eq!(device.live.count, 4);
        assert_eq!(device.live.bytes, 67 * MIB + 4096);
        assert_eq!(
            device.live.by_age[0].count, 4,
            "everything is under a minute old"
        );
        let suspects: Vec<(&str, u64)> = device
            .leak_suspects
            .iter()
            .map(|g| (g.tag.as_str(), g.count))
            .collect();
        assert_eq!(
            suspects,
            [("leaky", 2), ("untagged", 1)],
            "weights are never suspects"
        );
        assert_eq!(device.live.leak_suspect_bytes, 3 * MIB + 4096);
        assert!(device.oldest_allocations.iter().all(|a| a.tag != "weights"));
        assert_eq!(device.oldest_allocations.len(), 3);
        assert_eq!(device.by_tag[0].tag, "weights");
        let memory = device.memory.expect("mem_info works");
        assert_eq!(
            memory.used_by_this_process_bytes,
            device.stats.pools.reserved_bytes
        );
        assert!(device.pressure.is_some());
    }

    fn group(tag: &str, bytes: u64) -> (String, TagGroup) {
        (
            tag.to_string(),
            TagGroup {
                tag: tag.to_string(),
                count: 1,
                bytes,
                oldest_age_seconds: bytes as f64,
                ..TagGroup::default()
            },
        )
    }

    #[test]
    fn tags_beyond_the_largest_fold_into_other() {
        let groups = HashMap::from([group("a", 5), group("b", 50), group("c", 7), group("d", 1)]);
        let kept = largest_groups(groups, 2);
        let names: Vec<&str> = kept.iter().map(|g| g.tag.as_str()).collect();
        assert_eq!(names, ["b", "c", "other"]);
        assert_eq!(kept[2].bytes, 6);
        assert_eq!(kept[2].count, 2);
        assert_eq!(kept[2].oldest_age_seconds, 5.0);
    }

    #[test]
    fn age_bands_cover_every_age() {
        let last = AGE_BANDS
            .iter()
            .position(|(_, below)| Duration::from_secs(1 << 40) < *below);
        assert_eq!(last, Some(3));
        assert_eq!(
            AGE_BANDS
                .iter()
                .position(|(_, below)| Duration::ZERO < *below),
            Some(0)
        );
    }
}
