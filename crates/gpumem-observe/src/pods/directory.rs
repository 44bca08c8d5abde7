//! The pod directory: the latest pod list of this node, kept fresh by a thread of its own. The
//! sampler only reads what the thread last stored (a short lock, no I/O) and may *ask* for a
//! refresh when a process names a pod the list does not know; the thread decides when to ask
//! the API server — at most once every `min_gap`, and at least every `refresh` — so neither a
//! slow API server nor a stream of new pods can slow sampling or flood the server. A failed
//! request keeps the previous list and is reported, never fatal; while requests keep failing
//! the gap doubles after each (up to `refresh`), so a node's worth of agents does not hammer
//! an API server that is down.

use super::kube::{list_pods, KubeSettings};
use super::podlist::PodTable;
use parking_lot::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the list is fetched when nothing asks for it (`--pod-refresh`).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
/// The shortest time between two requests, whatever asks for them.
pub const DEFAULT_MIN_GAP: Duration = Duration::from_secs(5);

/// What the thread last learnt.
#[derive(Default)]
struct State {
    table: Option<Arc<PodTable>>,
    /// When the table was fetched, for its age.
    fetched: Option<Instant>,
    last_error: Option<String>,
    /// When the request in flight began: one that outlives [`STUCK_AFTER`] counts as failed.
    in_flight: Option<Instant>,
    requests_total: u64,
    errors_total: u64,
}

/// A request still running this long after it began is reported as failing, whatever holds
/// it up: every request is bounded by `kube::REQUEST_TIMEOUT`, so this only fires if a bound
/// was missed, and then `gpumem_pod_list_up` and `/healthz` say so rather than "ok".
const STUCK_AFTER: Duration = Duration::from_secs(super::kube::REQUEST_TIMEOUT.as_secs() + 5);

/// A reading of the directory, taken in one short lock.
#[derive(Clone, Default)]
pub struct DirectoryView {
    pub table: Option<Arc<PodTable>>,
    pub list_age: Option<Duration>,
    /// Set while the latest request failed.
    pub error: Option<String>,
    pub requests_total: u64,
    pub errors_total: u64,
}

/// See the module documentation. Dropping it stops the thread (after any request in flight).
pub struct PodDirectory {
    state: Arc<Mutex<State>>,
    nudge: SyncSender<()>,
    node: String,
}

impl PodDirectory {
    /// Starts the thread; the first request goes out at once.
    pub fn spawn(
        mut settings: KubeSettings,
        refresh: Duration,
        min_gap: Duration,
    ) -> std::io::Result<PodDirectory> {
        let state = Arc::new(Mutex::new(State::default()));
        // One pending request is all that is ever needed: more asks fold into it.
        let (nudge, nudged) = mpsc::sync_channel(1);
        let node = settings.node.clone();
        let shared = Arc::clone(&state);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("gpumem-pods".into())
            .spawn(move || {
                tracing::info!(
                    "pods: naming processes' pods from {} (node {}, refreshed every {}s)",
                    settings.url(),
                    settings.node,
                    refresh.as_secs()
                );
                let mut last_request: Option<Instant> = None;
                let mut failures: u32 = 0;
                loop {
                    if let Some(last) = last_request {
                        let gap = backoff(min_gap, refresh, failures);
                        let wait = refresh.saturating_sub(last.elapsed());
                        match nudged.recv_timeout(wait) {
                            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => return,
                        }
                        let since = last.elapsed();
                        if since < gap {
                            std::thread::sleep(gap - since);
                        }
                        // Asks that came in meanwhile are answered by this request.
                        while nudged.try_recv().is_ok() {}
                    }
                    last_request = Some(Instant::now());
                    shared.lock().in_flight = last_request;
                    // A CA that changed is read again first, by the rules of the first read.
                    let outcome = match settings.refresh_roots() {
                        Ok(()) => runtime.block_on(list_pods(&settings)),
                        Err(error) => Err(error),
                    };
                    failures = if outcome.is_ok() {
                        0
                    } else {
                        failures.saturating_add(1)
                    };
                    record(&shared, outcome);
                }
            })?;
        Ok(PodDirectory { state, nudge, node })
    }

    /// A directory that never asks anyone, holding `table` (tests, and pods given by hand).
    pub fn fixed(table: PodTable, node: &str) -> PodDirectory {
        let (nudge, _) = mpsc::sync_channel(1);
        let state = State {
            table: Some(Arc::new(table)),
            fetched: Some(Instant::now()),
            ..State::default()
        };
        PodDirectory {
            state: Arc::new(Mutex::new(state)),
            nudge,
            node: node.to_string(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// What is known now (never waits for the network).
    pub fn view(&self) -> DirectoryView {
        let state = self.state.lock();
        let stuck = state
            .in_flight
            .map(|since| since.elapsed())
            .filter(|running| *running > STUCK_AFTER)
            .map(|running| {
                format!(
                    "the request for the pod list has not ended after {}s",
                    running.as_secs()
                )
            });
        DirectoryView {
            table: state.table.clone(),
            list_age: state.fetched.map(|t| t.elapsed()),
            error: stuck.or_else(|| state.last_error.clone()),
            requests_total: state.requests_total,
            errors_total: state.errors_total,
        }
    }

    /// Asks for a fresh list soon (a pod the list does not know); never blocks.
    pub fn ask_refresh(&self) {
        match self.nudge.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

/// The shortest wait before the next request: `min_gap`, doubled for each failure in a row,
/// never beyond `refresh` (nor below `min_gap`).
fn backoff(min_gap: Duration, refresh: Duration, failures: u32) -> Duration {
    let doubled = min_gap.saturating_mul(1u32 << failures.min(16));
    doubled.min(refresh.max(min_gap))
}

fn record(state: &Mutex<State>, outcome: Result<super::podlist::PodList, String>) {
    let mut state = state.lock();
    state.in_flight = None;
    state.requests_total += 1;
    match outcome {
        Ok(list) => {
            let table = PodTable::from_list(list);
            if state.last_error.take().is_some() || state.table.is_none() {
                tracing::info!(
                    "pods: the API server lists {} pod(s) on this node",
                    table.len()
                );
            }
            state.table = Some(Arc::new(table));
            state.fetched = Some(Instant::now());
        }
        Err(error) => {
            state.errors_total += 1;
            if state.last_error.as_deref() != Some(error.as_str()) {
                let kept = if state.table.is_some() {
                    "keeping the previous pod list"
                } else {
                    "processes keep their command names until it answers"
                };
                tracing::warn!("pods: {error}; {kept}");
            }
            state.last_error = Some(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_in_a_row_double_the_gap_up_to_the_refresh() {
        let (gap, refresh) = (Duration::from_secs(5), Duration::from_secs(30));
        let waits: Vec<u64> = (0..6).map(|f| backoff(gap, refresh, f).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 30, 30, 30]);
        assert_eq!(backoff(gap, Duration::from_secs(1), 3), gap);
        assert_eq!(backoff(gap, refresh, u32::MAX), refresh);
    }
}
