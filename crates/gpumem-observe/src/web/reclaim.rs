//! Which connection gives its slot up when every slot is taken: the oldest of those with no
//! request in flight — connected and silent, halfway through a request's headers, or kept
//! alive and idle after a response.
//!
//! Such a connection costs a slot until the header deadline (10 s), and a flood of them, opened
//! again as they close, used to hold every slot and the `/healthz` reserve for good: a liveness
//! probe then waited in the listen queue past its timeout and the agent was restarted. Now the
//! accept loop keeps accepting while any connection is idle, and each connection accepted
//! beyond the cap takes the slot of the oldest idle one. A real client (a probe, Prometheus)
//! sends its request within a round trip of connecting, so it is busy long before a flood of
//! newer idle connections could make it the oldest; a request being answered is never cut.

use hyper::body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// No request in flight: a candidate.
const IDLE: u8 = 0;
/// A request's headers arrived and its response is not sent yet: never chosen.
const BUSY: u8 = 1;
/// Ended, or chosen to give its slot up.
const GONE: u8 = 2;

/// A connection that has just sent a response is left alone this long: hyper drops a body
/// once its last bytes are in its own buffer, before they reach the socket, and closing the
/// connection then would cut the response short. Short, or a flood of connections that each
/// send one request would leave nothing to reclaim.
const ANSWERED_GRACE: Duration = Duration::from_millis(100);

/// One connection as the tracker sees it.
pub(super) struct Slot {
    /// [`IDLE`], [`BUSY`] or [`GONE`]; the tracker's count follows every move in or out of
    /// `IDLE`.
    state: AtomicU8,
    /// When its latest response was sent (milliseconds on [`clock`]); 0 before any.
    answered_ms: AtomicU64,
    /// Wakes the connection's task to close it.
    reclaim: Notify,
    /// The tracker's count of idle connections.
    idle: Arc<AtomicUsize>,
}

impl Slot {
    /// A request's headers are complete: this connection is not a candidate until its
    /// response is sent.
    fn busy(&self) {
        if self.moved(IDLE, BUSY) {
            self.idle.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The response is sent (or dropped): the connection waits for its next request.
    fn idle(&self) {
        self.answered_ms.store(clock().max(1), Ordering::Release);
        if self.moved(BUSY, IDLE) {
            self.idle.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether it answered a request within [`ANSWERED_GRACE`].
    fn just_answered(&self) -> bool {
        let at = self.answered_ms.load(Ordering::Acquire);
        at != 0 && clock().saturating_sub(at) < ANSWERED_GRACE.as_millis() as u64
    }

    /// The connection ended by itself.
    pub(super) fn finished(&self) {
        if self.state.swap(GONE, Ordering::AcqRel) == IDLE {
            self.idle.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Completes when the tracker chose this connection to give its slot up.
    pub(super) async fn reclaimed(&self) {
        self.reclaim.notified().await;
    }

    fn moved(&self, from: u8, to: u8) -> bool {
        self.state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }
}

/// The open connections, oldest first; see the module documentation.
#[derive(Default)]
pub(super) struct Tracker {
    order: Mutex<VecDeque<Arc<Slot>>>,
    idle: Arc<AtomicUsize>,
}

impl Tracker {
    /// A connection just accepted (idle until its first request's headers are complete).
    /// `cap` bounds the bookkeeping: entries of ended connections are dropped once there are
    /// twice as many entries as connections allowed.
    pub(super) fn register(&self, cap: usize) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            state: AtomicU8::new(IDLE),
            answered_ms: AtomicU64::new(0),
            reclaim: Notify::new(),
            idle: Arc::clone(&self.idle),
        });
        self.idle.fetch_add(1, Ordering::AcqRel);
        let mut order = self.order.lock();
        if order.len() >= cap.saturating_mul(2).max(16) {
            order.retain(|slot| slot.state() != GONE);
        }
        order.push_back(Arc::clone(&slot));
        slot
    }

    /// How many open connections have no request in flight.
    pub(super) fn idle(&self) -> usize {
        self.idle.load(Ordering::Acquire)
    }

    /// Closes the oldest connection with no request in flight; `false` when there is none.
    /// Busy connections met on the way keep their place in the order.
    pub(super) fn reclaim_oldest_idle(&self) -> bool {
        let mut order = self.order.lock();
        let mut busy = Vec::new();
        let mut found = false;
        while let Some(slot) = order.pop_front() {
            match slot.state() {
                GONE => {}
                BUSY => busy.push(slot),
                _ if slot.just_answered() => busy.push(slot),
                _ if slot.moved(IDLE, GONE) => {
                    self.idle.fetch_sub(1, Ordering::AcqRel);
                    slot.reclaim.notify_one();
                    found = true;
                    break;
                }
                // Became busy or ended just now.
                _ => busy.push(slot),
            }
        }
        for slot in busy.into_iter().rev() {
            order.push_front(slot);
        }
        found
    }
}

/// Milliseconds since the first call, for the grace after a response.
fn clock() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A connection's service, telling its slot when a request is in flight: busy from the
/// request's headers until its response body is sent or dropped.
pub(super) struct Tracked<S> {
    inner: S,
    slot: Arc<Slot>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, slot: Arc<Slot>) -> Self {
        Tracked { inner, slot }
    }
}

impl<S, R, B> hyper::service::Service<R> for Tracked<S>
where
    S: hyper::service::Service<R, Response = hyper::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = hyper::Response<SentThenIdle<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, request: R) -> Self::Future {
        self.slot.busy();
        let slot = Arc::clone(&self.slot);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            match response {
                Ok(response) => Ok(response.map(|body| SentThenIdle {
                    body,
                    slot: Some(slot),
                })),
                Err(error) => {
                    slot.idle();
                    Err(error)
                }
            }
        })
    }
}

/// A response body that marks its connection idle once it is dropped (hyper drops it when
/// the last byte is written, or when the connection goes).
pub(super) struct SentThenIdle<B> {
    body: B,
    slot: Option<Arc<Slot>>,
}

impl<B> Drop for SentThenIdle<B> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.idle();
        }
    }
}

impl<B: Body + Unpin> Body for SentThenIdle<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_idle_connection_goes_first_and_busy_ones_never() {
        let tracker = Tracker::default();
        let first = tracker.register(4);
        let second = tracker.register(4);
        let third = tracker.register(4);
        assert_eq!(tracker.idle(), 3);
        first.busy();
        assert_eq!(tracker.idle(), 2);
        assert!(tracker.reclaim_oldest_idle());
        assert_eq!(second.state(), GONE);
        assert_eq!(first.state(), BUSY);
        third.finished();
        assert_eq!(tracker.idle(), 0);
        assert!(
            !tracker.reclaim_oldest_idle(),
            "only a busy and ended ones are left"
        );
        // The busy one answered: idle again, left alone while its answer may still be in
        // hyper's buffer, then the one to go.
        first.idle();
        assert_eq!(tracker.idle(), 1);
        assert!(!tracker.reclaim_oldest_idle(), "it has just answered");
        std::thread::sleep(ANSWERED_GRACE + Duration::from_millis(50));
        assert!(tracker.reclaim_oldest_idle());
        assert_eq!(first.state(), GONE);
        // Moves after the end count nothing.
        second.busy();
        second.idle();
        second.finished();
        assert_eq!(tracker.idle(), 0);
    }

    #[test]
    fn the_bookkeeping_stays_bounded() {
        let tracker = Tracker::default();
        for _ in 0..1_000 {
            tracker.register(8).finished();
        }
        assert!(tracker.order.lock().len() <= 16);
        assert_eq!(tracker.idle(), 0);
    }
}
