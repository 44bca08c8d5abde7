//! One device on the status page: its overview row, memory bar, headline tiles, pools, tags,
//! leak suspects, oldest allocations, external buffers and CUDA graph pools, as printed strings.

use super::super::format;
use gpumem::manager::PressureLevel;
use gpumem_wire::DeviceSnapshot;

pub(crate) struct DeviceView {
    pub index: usize,
    pub name: String,
    pub uuid: String,
    pub simulated: bool,
    pub total_bytes: u64,
    /// Whether this process has pools on the device (false in a collector, which only reads
    /// device memory: its pool panels would be empty).
    pub own_pools: bool,
    /// CSS class and label of the pressure badge.
    pub pressure_class: &'static str,
    pub pressure_label: String,
    /// The level alone ("high"), for the overview table.
    pub pressure_short: &'static str,
    pub summary: Summary,
    pub memory_known: bool,
    pub bar: Vec<BarSegment>,
    pub tiles: Vec<Tile>,
    pub pools: Vec<PoolRow>,
    pub leaks: Vec<GroupRow>,
    pub tags: Vec<GroupRow>,
    pub oldest: Vec<AllocationRow>,
    /// Buffers allocated outside gpumem and registered with `track_external`, by tag.
    pub external: Vec<GroupRow>,
    /// "3 buffers, 1.50 GiB" (empty when none are registered).
    pub external_total: String,
    /// "2 pools, 52.00 MiB (35.00 MiB in use)" when CUDA graphs hold memory, else empty.
    pub graphs_total: String,
}

/// One device's row in the overview shown when there are several.
pub(crate) struct Summary {
    pub device_used: String,
    /// "of 80.00 GiB": hidden on a phone, where the column must stay narrow.
    pub device_total: String,
    pub in_use: String,
    pub reserved: String,
    pub leaks: String,
    pub leaks_warn: bool,
    pub ooms: String,
}

/// One part of the memory bar, and its legend entry.
pub(crate) struct BarSegment {
    pub class: &'static str,
    pub label: &'static str,
    pub value: String,
    /// Width as a CSS percentage, e.g. "12.50".
    pub width: String,
    /// The bytes behind it (a `data-bytes` attribute, for scripts and tests).
    pub bytes: u64,
}

/// A headline number.
pub(crate) struct Tile {
    pub label: &'static str,
    pub value: String,
    pub note: String,
    /// Draws the eye when something needs looking at.
    pub warn: bool,
}

pub(crate) struct PoolRow {
    pub pool: String,
    pub reserved: String,
    pub in_use: String,
    pub cached_free: String,
    pub largest_free: String,
    pub hit_ratio: String,
    pub fragmentation: String,
    pub live: String,
    pub driver_calls: String,
}

pub(crate) struct GroupRow {
    pub tag: String,
    pub count: String,
    pub bytes: String,
    pub oldest: String,
}

pub(crate) struct AllocationRow {
    pub(crate) id: String,
    pub tag: String,
    pub size: String,
    pub age: String,
    pub pool: String,
    /// Thread and backtrace of the allocation, when `capture_backtraces` recorded them.
    pub origin: Option<String>,
}

impl DeviceView {
    pub(super) fn new(device: &DeviceSnapshot, own_pools: bool) -> Self {
        let stats = &device.stats;
        let (pressure_class, pressure_label) = match device.pressure {
            Some(p) => (
                p.level.name(),
                format!(
                    "{} pressure · {} of usable",
                    p.level.name(),
                    format::percent(p.used_ratio)
                ),
            ),
            None => ("unknown", "pressure unknown".to_string()),
        };
        let leak_count = device.live.leak_suspect_count;
        let mut tiles = vec![
            Tile {
                label: "In use",
                value: format::bytes(stats.pools.in_use_bytes),
                note: format!("peak {}", format::bytes(stats.pools.peak_in_use_bytes)),
                warn: false,
            },
            Tile {
                label: "Reserved",
                value: format::bytes(stats.pools.reserved_bytes),
                note: format!("peak {}", format::bytes(stats.pools.peak_reserved_bytes)),
                warn: false,
            },
            Tile {
                label: "Pool hit ratio",
                value: format::percent(stats.hit_ratio()),
                note: format!("{} requests", format::count(stats.pools.requests)),
                warn: false,
            },
            Tile {
                label: "Live allocations",
                value: format::count(device.live.count),
                note: format::bytes(device.live.bytes),
                warn: false,
            },
            Tile {
                label: "Leak suspects",
                value: format::count(leak_count),
                note: format::bytes(device.live.leak_suspect_bytes),
                warn: leak_count > 0,
            },
            Tile {
                label: "Out of memory",
                value: format::count(stats.ooms),
                note: format!(
                    "{} retries · {} to host",
                    format::count(stats.oom_retries),
                    format::count(stats.cpu_fallbacks)
                ),
                warn: stats.ooms > 0,
            },
        ];
        if !own_pools {
            tiles.clear();
        }
        if let Some(memory) = device.memory {
            // The one percentage on the page is the pressure's: used over usable memory.
            let note = match device.pressure {
                Some(p) => format!("{} of usable", format::percent(p.used_ratio)),
                None => format!("of {}", format::bytes(memory.total_bytes)),
            };
            tiles.insert(
                tiles.len().min(2),
                Tile {
                    label: "Device used",
                    value: format::bytes(memory.used_bytes),
                    note,
                    warn: device
                        .pressure
                        .is_some_and(|p| p.level >= PressureLevel::High),
                },
            );
        }
        DeviceView {
            index: device.index,
            name: device.name.clone(),
            uuid: device.uuid.clone(),
            simulated: device.simulated,
            total_bytes: device.memory.map_or(device.total_bytes, |m| m.total_bytes),
            own_pools,
            pressure_class,
            pressure_label,
            pressure_short: device.pressure.map_or("unknown", |p| p.level.name()),
            summary: Summary {
                device_used: device
                    .memory
                    .map_or_else(|| "unknown".to_string(), |m| format::bytes(m.used_bytes)),
                device_total: format!("of {}", format::bytes(device.total_bytes)),
                in_use: format::bytes(stats.pools.in_use_bytes),
                reserved: format::bytes(stats.pools.reserved_bytes),
                leaks: format::count(leak_count),
                leaks_warn: leak_count > 0,
                ooms: format::count(stats.ooms),
            },
            memory_known: device.memory.is_some(),
            bar: memory_bar(device, own_pools),
            tiles,
            pools: device.pools.iter().map(pool_row).collect(),
            leaks: device.leak_suspects.iter().map(group_row).collect(),
            tags: device.by_tag.iter().map(group_row).collect(),
            oldest: device
                .oldest_allocations
                .iter()
                .map(|a| AllocationRow {
                    id: format!("{:#x}", a.id),
                    tag: a.tag.clone(),
                    size: format::bytes(a.requested_bytes),
                    age: format::age(a.age_seconds),
                    pool: a.pool.clone(),
                    origin: a.backtrace.as_ref().map(|trace| {
                        let thread = a.thread.as_deref().unwrap_or("unknown thread");
                        format!("thread {thread}\n{trace}")
                    }),
                })
                .collect(),
            external: device.external.by_tag.iter().map(group_row).collect(),
            graphs_total: unless_none(device.graphs.pools, || {
                format!(
                    "{} ({} in use)",
                    format::graph_pools(device.graphs.pools, device.graphs.reserved_bytes),
                    format::bytes(device.graphs.in_use_bytes)
                )
            }),
            external_total: unless_none(device.external.count, || {
                format!(
                    "{} buffers, {}",
                    format::count(device.external.count),
                    format::bytes(device.external.bytes)
                )
            }),
        }
    }
}

/// The bar: this process's memory in use, its cached memory, other users, free (without pools
/// of its own: used and free).
fn memory_bar(device: &DeviceSnapshot, own_pools: bool) -> Vec<BarSegment> {
    let stats = &device.stats;
    let in_use = stats.pools.in_use_bytes.min(stats.pools.reserved_bytes);
    let cached = stats.pools.reserved_bytes - in_use;
    let (total, others, free) = match device.memory {
        Some(m) => (
            m.total_bytes,
            Some(m.used_by_others_bytes),
            Some(m.free_bytes),
        ),
        None => (device.total_bytes, None, None),
    };
    let width = |bytes: u64| format!("{:.2}", bytes as f64 * 100.0 / total.max(1) as f64);
    let segment = |class, label, bytes: u64| BarSegment {
        class,
        label,
        value: format::bytes(bytes),
        width: width(bytes),
        bytes,
    };
    let mut bar = Vec::new();
    if own_pools {
        bar.push(segment("in-use", "In use (this process)", in_use));
        bar.push(segment("cached", "Cached by pools", cached));
    } else if stats.pools.reserved_bytes > 0 {
        // A collector: what the collected processes hold, as their own tables say.
        bar.push(segment("in-use", "In use (published processes)", in_use));
        bar.push(segment("cached", "Cached by their pools", cached));
    }
    if let (Some(others), Some(free)) = (others, free) {
        let label = if own_pools || stats.pools.reserved_bytes > 0 {
            "Used by others"
        } else {
            "Used"
        };
        bar.push(segment("others", label, others));
        bar.push(segment("free", "Free", free));
    }
    bar
}

fn pool_row(pool: &gpumem_wire::PoolSnapshot) -> PoolRow {
    PoolRow {
        pool: pool.pool.clone(),
        reserved: format::bytes(pool.reserved_bytes),
        in_use: format::bytes(pool.in_use_bytes),
        cached_free: format::bytes(pool.cached_free_bytes),
        largest_free: format::bytes(pool.largest_free_block_bytes),
        hit_ratio: if pool.requests == 0 {
            "–".to_string()
        } else {
            format::percent(pool.hit_ratio())
        },
        fragmentation: format::percent(pool.fragmentation_ratio),
        live: format::count(pool.live_allocations),
        driver_calls: format!(
            "{} / {}",
            format::count(pool.driver_allocs),
            format::count(pool.driver_frees)
        ),
    }
}

/// A panel's summary line: empty (the panel hidden) while there is nothing to sum up.
fn unless_none(count: u64, summary: impl FnOnce() -> String) -> String {
    if count == 0 {
        String::new()
    } else {
        summary()
    }
}

fn group_row(group: &gpumem_wire::TagGroup) -> GroupRow {
    GroupRow {
        tag: group.tag.clone(),
        count: format::count(group.count),
        bytes: format::bytes(group.bytes),
        oldest: format::age(group.oldest_age_seconds),
    }
}
