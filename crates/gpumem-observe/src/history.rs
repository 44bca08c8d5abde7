//! The history ring: the last hour of compact points (per device: in use, reserved, device
//! used), one per step, for the status page's chart and `/api/v1/history`. Bounded: it never
//! holds more than `window / step` points, however long the process runs.

use gpumem_wire::Snapshot;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;
use std::time::Instant;

/// A published snapshot and when it was taken, by the monotonic clock (for staleness).
#[derive(Debug)]
pub struct Sample {
    pub snapshot: Snapshot,
    pub taken_at: Instant,
}

impl Sample {
    /// Stale when no new sample arrived for three intervals: the sampler is stuck or gone.
    pub fn is_stale(&self, interval: Duration) -> bool {
        self.taken_at.elapsed() > interval * 3
    }
}

/// One instant of the chart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryPoint {
    /// Seconds since the Unix epoch.
    pub t: f64,
    pub devices: Vec<DevicePoint>,
}

/// One device at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePoint {
    pub gpu: usize,
    pub in_use_bytes: u64,
    pub reserved_bytes: u64,
    /// `None` when the driver could not be asked in that sample.
    pub device_used_bytes: Option<u64>,
}

/// What `/api/v1/history` returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryReply {
    pub step_seconds: f64,
    pub window_seconds: f64,
    pub points: Vec<HistoryPoint>,
}

/// A ring of points shared between the sampler (writer) and the web layer (readers).
#[derive(Debug)]
pub struct History {
    step: Duration,
    window: Duration,
    capacity: usize,
    points: RwLock<VecDeque<HistoryPoint>>,
}

impl History {
    /// A ring covering `window` with one point per `step` (a step under a second is raised to
    /// one second, so a fast sampler does not multiply the memory an hour takes).
    pub fn new(step: Duration, window: Duration) -> Self {
        let step = step.max(Duration::from_secs(1));
        let capacity = (window.as_secs_f64() / step.as_secs_f64()).ceil().max(1.0) as usize;
        History {
            step,
            window,
            capacity,
            points: RwLock::new(VecDeque::with_capacity(capacity)),
        }
    }

    pub fn step(&self) -> Duration {
        self.step
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.points.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.read().is_empty()
    }

    /// The time of the oldest point kept, if any.
    pub fn oldest_timestamp(&self) -> Option<f64> {
        self.points.read().front().map(|p| p.t)
    }

    /// Adds the point of `sample`, dropping the oldest once full.
    pub fn record(&self, sample: &Sample) {
        let snapshot = &sample.snapshot;
        let point = HistoryPoint {
            t: snapshot.timestamp_seconds,
            devices: snapshot
                .devices
                .iter()
                .map(|d| DevicePoint {
                    gpu: d.index,
                    in_use_bytes: d.stats.pools.in_use_bytes,
                    reserved_bytes: d.stats.pools.reserved_bytes,
                    device_used_bytes: d.memory.map(|m| m.used_bytes),
                })
                .collect(),
        };
        let mut points = self.points.write();
        while points.len() >= self.capacity {
            points.pop_front();
        }
        points.push_back(point);
    }

    /// The points taken after `since` (Unix seconds; `None` for all), oldest first.
    pub fn reply_since(&self, since: Option<f64>) -> HistoryReply {
        let points = self.points.read();
        let start = match since {
            Some(t) => points.partition_point(|p| p.t <= t),
            None => 0,
        };
        HistoryReply {
            step_seconds: self.step.as_secs_f64(),
            window_seconds: self.window.as_secs_f64(),
            points: points.range(start..).cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_wire::Snapshot;
    use std::time::Instant;

    fn sample_at(t: f64) -> Sample {
        Sample {
            snapshot: Snapshot {
                timestamp_seconds: t,
                ..Snapshot::default()
            },
            taken_at: Instant::now(),
        }
    }

    #[test]
    fn the_ring_is_bounded_and_keeps_the_newest() {
        let history = History::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(history.capacity(), 5);
        for t in 0..12 {
            history.record(&sample_at(t as f64));
        }
        assert_eq!(history.len(), 5);
        let all = history.reply_since(None);
        let times: Vec<f64> = all.points.iter().map(|p| p.t).collect();
        assert_eq!(times, [7.0, 8.0, 9.0, 10.0, 11.0]);
        let newer = history.reply_since(Some(9.0));
        assert_eq!(newer.points.len(), 2);
    }

    #[test]
    fn sub_second_steps_are_raised_to_a_second() {
        let history = History::new(Duration::from_millis(100), Duration::from_secs(3600));
        assert_eq!(history.step(), Duration::from_secs(1));
        assert_eq!(history.capacity(), 3600);
    }
}
