//! The leak tracker's questions, answered from the live allocations the pools already record
//! (id, size, device, tag, creation time): how much is live, what is old, grouped by tag, and
//! which allocations are leak suspects. Optionally, where each allocation was made (thread and
//! backtrace): slow, so off unless `capture_backtraces` is set.

use super::views::LiveAllocation;
use super::MemoryManager;
use parking_lot::Mutex;
use serde::Serialize;
use std::backtrace::Backtrace;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Where an allocation was made.
#[derive(Clone, Debug)]
pub struct AllocationOrigin {
    pub thread: String,
    pub backtrace: Arc<Backtrace>,
}

impl AllocationOrigin {
    /// The backtrace from the caller of the allocator on: frames inside the backtrace machinery
    /// and gpumem's manager are dropped, and at most `max_frames` kept — enough to find the line
    /// that allocated, small enough to ship in every snapshot.
    pub fn caller_frames(&self, max_frames: usize) -> String {
        let text = self.backtrace.to_string();
        let mut frames: Vec<String> = Vec::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            let starts_frame = trimmed
                .split_once(": ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            match frames.last_mut() {
                Some(frame) if !starts_frame => {
                    frame.push('\n');
                    frame.push_str(line);
                }
                _ => frames.push(line.to_string()),
            }
        }
        let internal = |frame: &str| {
            let symbol = frame
                .trim_start()
                .split_once(": ")
                .map_or("", |(_, symbol)| symbol);
            ["std::backtrace", "gpumem::manager::", "<gpumem::manager::"]
                .iter()
                .any(|prefix| symbol.starts_with(prefix))
        };
        let first_outside = frames.iter().position(|f| !internal(f)).unwrap_or(0);
        frames
            .into_iter()
            .skip(first_outside)
            .take(max_frames)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Origins of live allocations by id, filled only when `capture_backtraces` is on.
#[derive(Clone, Debug, Default)]
pub struct OriginTable(Arc<Mutex<HashMap<u64, AllocationOrigin>>>);

impl OriginTable {
    pub(super) fn record(&self, id: u64) {
        let thread = std::thread::current().name().map_or_else(
            || format!("{:?}", std::thread::current().id()),
            str::to_string,
        );
        let origin = AllocationOrigin {
            thread,
            backtrace: Arc::new(Backtrace::force_capture()),
        };
        self.0.lock().insert(id, origin);
    }

    pub(super) fn forget(&self, id: u64) {
        self.0.lock().remove(&id);
    }

    pub fn get(&self, id: u64) -> Option<AllocationOrigin> {
        self.0.lock().get(&id).cloned()
    }
}

/// Live allocations of one tag.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TagSummary {
    /// `None` for untagged allocations.
    pub tag: Option<String>,
    pub count: u64,
    pub bytes: u64,
    pub oldest_age: Duration,
}

/// Allocations older than the leak age, grouped by tag (largest first).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeakReport {
    pub leak_age: Duration,
    pub count: u64,
    pub bytes: u64,
    pub by_tag: Vec<TagSummary>,
}

/// Groups allocations by tag, largest byte total first.
pub fn group_by_tag<'a>(
    allocations: impl IntoIterator<Item = &'a LiveAllocation>,
) -> Vec<TagSummary> {
    let mut groups: BTreeMap<Option<String>, TagSummary> = BTreeMap::new();
    for allocation in allocations {
        let group = groups
            .entry(allocation.tag.clone())
            .or_insert_with(|| TagSummary {
                tag: allocation.tag.clone(),
                count: 0,
                bytes: 0,
                oldest_age: Duration::ZERO,
            });
        group.count += 1;
        group.bytes += allocation.requested_bytes;
        group.oldest_age = group.oldest_age.max(allocation.age);
    }
    let mut groups: Vec<TagSummary> = groups.into_values().collect();
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.tag.cmp(&b.tag)));
    groups
}

impl MemoryManager {
    /// Live allocations and their requested bytes.
    pub fn live_summary(&self) -> (u64, u64) {
        let live = self.live_allocations();
        (
            live.len() as u64,
            live.iter().map(|a| a.requested_bytes).sum(),
        )
    }

    /// Allocations older than `age`, grouped by tag.
    pub fn older_than(&self, age: Duration) -> Vec<TagSummary> {
        let live = self.live_allocations();
        group_by_tag(live.iter().filter(|a| a.age >= age))
    }

    /// The `n` oldest live allocations, oldest first.
    pub fn oldest(&self, n: usize) -> Vec<LiveAllocation> {
        let mut live = self.live_allocations();
        live.truncate(n);
        live
    }

    /// Leak suspects: live allocations older than the configured `leak_age`.
    pub fn check_leaks(&self) -> LeakReport {
        let leak_age = self.config().leak_age;
        let live = self.live_allocations();
        let suspects: Vec<&LiveAllocation> = live.iter().filter(|a| a.age >= leak_age).collect();
        LeakReport {
            leak_age,
            count: suspects.len() as u64,
            bytes: suspects.iter().map(|a| a.requested_bytes).sum(),
            by_tag: group_by_tag(suspects),
        }
    }

    /// Where allocation `id` was made, when `capture_backtraces` is on.
    pub fn origin_of(&self, id: u64) -> Option<AllocationOrigin> {
        self.shared().origins.get(id)
    }
}
