//! The tokio runtime behind every command that serves HTTP (`serve`, `demo`, an embedded
//! exporter): two workers, and few blocking threads.
//!
//! `/metrics` renders on the blocking pool. Tokio's default of up to 512 blocking threads let a
//! sustained scrape flood start dozens of them, each growing its own glibc malloc arena: resident
//! memory rose 25 -> 35 MiB over ten minutes of 20,000 requests a second. Four are as many as
//! two cores can keep busy rendering; more requests simply queue.
//!
//! Dropping a runtime waits for its blocking threads, without limit: a sample stuck in a read
//! would keep a stopping process alive for good. [`block_on_bounded`] gives them a moment, then
//! leaves them behind.

use std::future::Future;
use std::io;
use std::time::Duration;
use tokio::runtime::{Builder, Runtime};

/// How long a stopping runtime waits for its blocking threads (a sample in progress).
pub const BLOCKING_WAIT: Duration = Duration::from_secs(2);

const WORKER_THREADS: usize = 2;
const MAX_BLOCKING_THREADS: usize = 4;

/// A multi-threaded runtime whose threads are named `name`.
pub fn build(name: &str) -> io::Result<Runtime> {
    Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_name(name)
        .enable_all()
        .build()
}

/// Runs `future` to completion on `runtime`, then shuts the runtime down waiting at most
/// [`BLOCKING_WAIT`] for blocking work still running.
pub fn block_on_bounded<F: Future>(runtime: Runtime, future: F) -> F::Output {
    let output = runtime.block_on(future);
    runtime.shutdown_timeout(BLOCKING_WAIT);
    output
}
