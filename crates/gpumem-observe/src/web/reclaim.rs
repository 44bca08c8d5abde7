//! Which connection gives its slot up when every slot is taken: the oldest of those that have
//! not sent a single byte yet.
//!
//! A connection that says nothing costs a slot until the header deadline, and a flood of them,
//! opened again as they close, used to hold every slot and the `/healthz` reserve for good: a
//! liveness probe then waited in the listen queue past its timeout and the agent was
//! restarted. Now the accept loop keeps accepting while any connection is silent, and each
//! connection accepted beyond the cap takes the slot of the oldest silent one. A real client
//! (a probe, Prometheus) sends its request within a round trip of connecting, so it is never
//! silent for long enough to be chosen while a flood keeps adding newer silent connections.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// A connection that has sent nothing yet.
const SILENT: u8 = 0;
/// One that has sent a byte: never chosen.
const HEARD: u8 = 1;
/// One that ended, or was chosen to give its slot up.
const GONE: u8 = 2;

/// One connection as the tracker sees it.
pub(super) struct Slot {
    /// [`SILENT`], [`HEARD`] or [`GONE`]; leaving `SILENT` (once) takes one off the count.
    state: AtomicU8,
    /// Wakes the connection's task to close it.
    reclaim: Notify,
    /// The tracker's count of silent connections.
    silent: Arc<AtomicUsize>,
}

impl Slot {
    /// The client sent its first byte: this connection is no longer a candidate.
    pub(super) fn heard(&self) {
        self.leave_silence(HEARD);
    }

    /// The connection ended by itself.
    pub(super) fn finished(&self) {
        if self.state.swap(GONE, Ordering::AcqRel) == SILENT {
            self.silent.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Moves a silent slot to `to`; whether it was silent.
    fn leave_silence(&self, to: u8) -> bool {
        let left = self
            .state
            .compare_exchange(SILENT, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if left {
            self.silent.fetch_sub(1, Ordering::AcqRel);
        }
        left
    }

    fn is_silent(&self) -> bool {
        self.state.load(Ordering::Acquire) == SILENT
    }

    /// Completes when the tracker chose this connection to give its slot up.
    pub(super) async fn reclaimed(&self) {
        self.reclaim.notified().await;
    }
}

/// The connections in the order they were accepted; see the module documentation.
#[derive(Default)]
pub(super) struct Tracker {
    order: Mutex<VecDeque<Arc<Slot>>>,
    silent: Arc<AtomicUsize>,
}

impl Tracker {
    /// A connection just accepted (silent until it sends a byte). `cap` bounds the bookkeeping:
    /// entries of connections that spoke or ended are dropped once there are twice as many.
    pub(super) fn register(&self, cap: usize) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            state: AtomicU8::new(SILENT),
            reclaim: Notify::new(),
            silent: Arc::clone(&self.silent),
        });
        self.silent.fetch_add(1, Ordering::AcqRel);
        let mut order = self.order.lock();
        if order.len() >= cap.saturating_mul(2).max(16) {
            order.retain(|slot| slot.is_silent());
        }
        order.push_back(Arc::clone(&slot));
        slot
    }

    /// How many open connections have sent nothing yet.
    pub(super) fn silent(&self) -> usize {
        self.silent.load(Ordering::Acquire)
    }

    /// Closes the oldest connection that has sent nothing; `false` when there is none.
    pub(super) fn reclaim_oldest_silent(&self) -> bool {
        let mut order = self.order.lock();
        while let Some(slot) = order.pop_front() {
            if slot.leave_silence(GONE) {
                slot.reclaim.notify_one();
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_silent_connection_goes_first_and_speakers_never() {
        let tracker = Tracker::default();
        let first = tracker.register(4);
        let second = tracker.register(4);
        let third = tracker.register(4);
        assert_eq!(tracker.silent(), 3);
        first.heard();
        assert_eq!(tracker.silent(), 2);
        assert!(tracker.reclaim_oldest_silent());
        assert_eq!(second.state.load(Ordering::Acquire), GONE);
        assert_eq!(first.state.load(Ordering::Acquire), HEARD);
        third.finished();
        assert_eq!(tracker.silent(), 0);
        assert!(
            !tracker.reclaim_oldest_silent(),
            "only a speaker and ended ones are left"
        );
        // A slot heard after it was chosen, or finished twice, counts once.
        second.heard();
        second.finished();
        assert_eq!(tracker.silent(), 0);
    }

    #[test]
    fn the_bookkeeping_stays_bounded() {
        let tracker = Tracker::default();
        for _ in 0..1_000 {
            tracker.register(8).heard();
        }
        assert!(tracker.order.lock().len() <= 16);
        assert_eq!(tracker.silent(), 0);
    }
}
