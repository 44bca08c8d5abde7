//! The embedding API: one call for an inference engine to serve `/metrics`, the status page and
//! the JSON API for its own managers —
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let manager: gpumem::MemoryManager = unimplemented!();
//! let exporter = gpumem_observe::Exporter::builder()
//!     .manager(manager)
//!     .listen(([127, 0, 0, 1], 9400))
//!     .spawn()?;
//! println!("status page: {}", exporter.url());
//! // ... serve inference ...
//! exporter.shutdown();
//! # Ok(()) }
//! ```
//!
//! Inside a tokio runtime the exporter runs as tasks on it; outside one it starts its own small
//! runtime on a thread named `gpumem-exporter`. Signals stay the host's business: call
//! [`ExporterHandle::shutdown`] from the host's own handler.

mod address;

pub use address::{
    parse_interval, parse_listen, reachable_addr, DEFAULT_LISTEN, DEFAULT_LISTEN_ADDR,
};

use crate::history::Sample;
use crate::sampler::{
    self, sampling_setters, Sampler, SamplingOptions, SnapshotSource, MIN_INTERVAL,
};
use crate::web::{self, WebState};
use axum::Router;
use gpumem::units::format_duration;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;

/// How long shutdown waits for in-flight requests before closing their connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum ExporterError {
    #[error("the exporter needs at least one memory manager (call .manager(m)) or a source (.source(s))")]
    NoManagers,
    #[error("the interval {} is too short; the shortest is {}", format_duration(*.0), format_duration(MIN_INTERVAL))]
    IntervalTooShort(Duration),
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("could not start the exporter's runtime thread: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Entry point of the embedding API.
pub struct Exporter;

impl Exporter {
    pub fn builder() -> ExporterBuilder {
        ExporterBuilder::default()
    }
}

/// Settings of an exporter; see the module documentation.
pub struct ExporterBuilder {
    sampling: SamplingOptions,
    listen: SocketAddr,
    routes: Option<Router>,
    source: Option<Box<dyn SnapshotSource>>,
    allowed_hosts: web::host::AllowedHosts,
    runbook_url: Option<String>,
    limits: web::ServerLimits,
}

impl Default for ExporterBuilder {
    fn default() -> Self {
        ExporterBuilder {
            sampling: SamplingOptions::default(),
            listen: DEFAULT_LISTEN_ADDR,
            routes: None,
            source: None,
            allowed_hosts: web::host::AllowedHosts::default(),
            runbook_url: None,
            limits: web::ServerLimits::default(),
        }
    }
}

impl ExporterBuilder {
    sampling_setters!();

    /// Where to listen (default `127.0.0.1:9400`; port 0 picks a free port).
    pub fn listen(mut self, addr: impl Into<SocketAddr>) -> Self {
        self.listen = addr.into();
        self
    }

    /// Where the status page's hints link to (docs/runbook.md hosted somewhere); default: the
    /// copy every gpumem serves at `/runbook`.
    pub fn runbook_url(mut self, url: impl Into<String>) -> Self {
        self.runbook_url = Some(url.into());
        self
    }

    /// Extra routes served next to the exporter's own (they must not reuse its paths).
    pub fn routes(mut self, routes: Router) -> Self {
        self.routes = Some(routes);
        self
    }

    /// Host names requests may use besides IP addresses and `localhost` (`*`: any); see
    /// `web::host`.
    pub fn allowed_hosts<S: AsRef<str>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.allowed_hosts = web::host::AllowedHosts::new(names);
        self
    }

    /// Serves at most `n` connections at once (a few of them kept for `/healthz`); the default
    /// follows the process's descriptor limit (`web::server`). Raised to
    /// [`web::MIN_CONNECTIONS`] if lower.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.limits.max_connections = n.max(web::MIN_CONNECTIONS);
        self
    }

    /// Samples `source` instead of managers (a collector); managers given as well are ignored.
    pub fn source(mut self, source: Box<dyn SnapshotSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// Binds the address, takes the first sample (so every endpoint has data at once) and
    /// starts the sampler and the server. Errors are returned here, never panicked on.
    pub fn spawn(self) -> Result<ExporterHandle, ExporterError> {
        if self.sampling.managers.is_empty() && self.source.is_none() {
            return Err(ExporterError::NoManagers);
        }
        let capture = self
            .sampling
            .capture_settings()
            .map_err(ExporterError::IntervalTooShort)?;
        let interval = capture.interval;
        let bind_error = |source| ExporterError::Bind {
            addr: self.listen,
            source,
        };
        let listener = web::listen(self.listen).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;

        let flight = self.sampling.flight.unwrap_or_default();
        let sampler = match self.source {
            Some(source) => Sampler::with_source(source, capture),
            None => Sampler::new(self.sampling.managers, capture),
        };
        let mut sampler = sampler.with_flight(flight);
        let first = sampler.sample();
        let (publish, latest) = watch::channel(first);
        let mut state =
            WebState::new(latest, sampler.history(), interval).with_flight(sampler.flight_log());
        if let Some(url) = &self.runbook_url {
            state = state.with_runbook(url);
        }
        let app = web::router(state, self.routes, self.allowed_hosts);
        let (stop, stopped) = watch::channel(false);
        let work = run(listener, app, self.limits, sampler, publish, stopped);

        let task = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => Task::Tokio(runtime.spawn(work)),
            Err(_) => {
                let runtime = crate::web::runtime::build("gpumem-exporter-worker")
                    .map_err(ExporterError::Runtime)?;
                let thread = std::thread::Builder::new()
                    .name("gpumem-exporter".to_string())
                    .spawn(move || crate::web::runtime::block_on_bounded(runtime, work))
                    .map_err(ExporterError::Runtime)?;
                Task::Thread(thread)
            }
        };
        tracing::info!("serving metrics and the status page on http://{local_addr}/");
        Ok(ExporterHandle {
            local_addr,
            stop,
            task: Some(task),
        })
    }
}

enum Task {
    Tokio(tokio::task::JoinHandle<()>),
    Thread(std::thread::JoinHandle<()>),
}

/// A running exporter. Dropping it stops the exporter (without waiting): keep it alive as long
/// as the endpoints should be served.
#[must_use = "dropping the handle stops the exporter"]
pub struct ExporterHandle {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<Task>,
}

impl ExporterHandle {
    /// The address actually bound (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The status page's URL; an unspecified address (0.0.0.0) is shown as loopback.
    pub fn url(&self) -> String {
        format!("http://{}/", reachable_addr(self.local_addr))
    }

    /// Stops the sampler and the server: no new connections, in-flight requests finish. On the
    /// exporter's own thread this waits until everything has stopped; on the host's runtime it
    /// returns at once (use [`shutdown_and_wait`](Self::shutdown_and_wait) from async code).
    pub fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(Task::Thread(thread)) = self.task.take() {
            if thread.join().is_err() {
                tracing::error!("the exporter thread panicked while stopping");
            }
        }
    }

    /// Stops the exporter and waits until the server and the sampler have finished.
    pub async fn shutdown_and_wait(mut self) {
        let _ = self.stop.send(true);
        match self.task.take() {
            Some(Task::Tokio(task)) => {
                if let Err(error) = task.await {
                    tracing::error!("the exporter task failed: {error}");
                }
            }
            Some(Task::Thread(thread)) => {
                let joined = tokio::task::spawn_blocking(move || thread.join()).await;
                if !matches!(joined, Ok(Ok(()))) {
                    tracing::error!("the exporter thread panicked while stopping");
                }
            }
            None => {}
        }
    }
}

impl Drop for ExporterHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The exporter's life: sampler and server until `stopped` turns true, then a bounded wait for
/// in-flight requests and the sampler's last tick.
async fn run(
    listener: std::net::TcpListener,
    app: Router,
    limits: web::ServerLimits,
    sampler: Sampler,
    publish: watch::Sender<Arc<Sample>>,
    stopped: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!("could not serve on the bound socket: {error}");
            return;
        }
    };
    let sampler_task = sampler::spawn(sampler, publish, stopped.clone());
    let mut stop_signal = stopped.clone();
    let shutdown = async move {
        // An error means the handle is gone, which also means stop.
        let _ = stop_signal.wait_for(|stop| *stop).await;
    };
    let mut grace = stopped;
    let grace_over = async move {
        let _ = grace.wait_for(|stop| *stop).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        served = web::serve_with(listener, app, shutdown, limits) => {
            if let Err(error) = served {
                tracing::error!("the HTTP server failed: {error}");
            }
        }
        _ = grace_over => {
            tracing::warn!("requests still running {} after shutdown; closing them", format_duration(SHUTDOWN_GRACE));
        }
    }
    // A sample stuck in a read (a driver call, a file) must not keep a stopping process alive.
    match tokio::time::timeout(SHUTDOWN_GRACE, sampler_task).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!("the sampler failed: {error}"),
        Err(_) => tracing::warn!(
            "the sampler is still busy {} after shutdown; not waiting for it",
            format_duration(SHUTDOWN_GRACE)
        ),
    }
}
