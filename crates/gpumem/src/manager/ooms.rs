//! The last out-of-memory refusals of each device, kept so that whoever explains an OOM later
//! (the flight recorder, the status page) knows what was asked for, with which tag and why it
//! failed. Written only on the failure path, under a small lock: the hot path never sees it.

use parking_lot::Mutex;
use std::collections::VecDeque;

/// How many refusals each device remembers; older ones are counted, not kept.
pub const KEPT_PER_DEVICE: usize = 16;

pub use gpumem_wire::OomEvent;

/// A device's recent refusals, newest last.
#[derive(Debug, Default)]
pub(crate) struct OomLog(Mutex<VecDeque<OomEvent>>);

impl OomLog {
    pub(crate) fn record(&self, event: OomEvent) {
        let mut events = self.0.lock();
        if events.len() >= KEPT_PER_DEVICE {
            events.pop_front();
        }
        events.push_back(event);
    }

    pub(crate) fn recent(&self) -> Vec<OomEvent> {
        self.0.lock().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_the_newest() {
        let log = OomLog::default();
        for seq in 1..=(KEPT_PER_DEVICE as u64 + 3) {
            log.record(OomEvent {
                seq,
                ..OomEvent::default()
            });
        }
        let recent = log.recent();
        assert_eq!(recent.len(), KEPT_PER_DEVICE);
        assert_eq!(recent[0].seq, 4);
        assert_eq!(
            recent.last().map(|e| e.seq),
            Some(KEPT_PER_DEVICE as u64 + 3)
        );
    }
}
