//! `gpumem demo`: a real `MemoryManager` under a synthetic inference workload (see
//! `workload`), with pressure swinging up and down (see `pressure`), served by the exporter
//! like any embedding program would, and a runtime workspace per device that shrinks and grows
//! with that pressure (logged on every resize). Runs until Ctrl-C, SIGTERM or the optional
//! duration ends, then stops the workload, lets in-flight requests finish and returns. With
//! `--scenario alerts` the pressure follows that scenario's timeline instead (`scenario`,
//! `alerts`) and a node agent over a simulated node is served beside the demo (`agent`, `node`).

mod agent;
mod alerts;
mod node;
mod pressure;
mod scenario;
mod spike;
mod workload;

pub(crate) use scenario::Scenario;
pub(crate) use spike::{PressureSpike, DEFAULT_SPIKE};

use gpumem::backend::sim::SimBackend;
use gpumem::backend::DeviceBackend;
use gpumem::manager::{ManagerConfig, MemoryManager};
use gpumem_observe::exporter::{Exporter, ExporterError};
use gpumem_observe::publish::{PublishError, Publisher};
use pressure::{PressureSource, PressureSwing};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use workload::{Budget, DeviceWorkload, Rng};

/// One step of the workload.
const TICK: Duration = Duration::from_millis(50);

/// How often the workspaces re-plan (the sampler updates pressure once per interval).
const WORKSPACE_EVERY: Duration = Duration::from_secs(1);

/// The layer the demo's workspaces serve: Llama-2-7B's MLP up projection with int4 weights.
const WORKSPACE_LAYER: gpumem::planner::LinearLayer = gpumem::planner::LinearLayer {
    in_features: 4096,
    out_features: 11008,
    weight_bits: 4,
    activation_bytes: 2,
};

/// What the demo was asked to do, validated.
#[derive(Clone, Debug)]
pub(crate) struct DemoSettings {
    /// Backend device indices to use; `None` uses all.
    pub devices: Option<Vec<usize>>,
    pub listen: SocketAddr,
    pub interval: Duration,
    /// Stop after this long; `None` runs until a signal.
    pub duration: Option<Duration>,
    /// Short, so the leak view fills within a minute.
    pub leak_age: Duration,
    /// Start a pressure spike this long after the start.
    pub spike_at: Option<Duration>,
    /// Also publish snapshots into this directory, for `gpumem serve --collect-dir`.
    pub publish_dir: Option<PathBuf>,
    /// Tags per device listed by name in snapshots and `/metrics`; the rest are `other`.
    pub top_tags: usize,
    /// Where the page's hints link to (default `/runbook`).
    pub runbook_url: Option<String>,
    /// The OOM flight recorder (run by the exporter; the publisher's records would repeat it).
    pub flight: gpumem_observe::flight::FlightSettings,
    /// The manager's configuration (`--config`, `GPUMEM_*`); `devices` above overrides its own.
    pub memory: ManagerConfig,
    /// Host names allowed besides IP addresses and localhost (`--allowed-hosts`).
    pub allowed_hosts: Vec<String>,
    /// Most connections served at once (`--max-connections`); `None`: the default.
    pub max_connections: Option<usize>,
    /// The story the demo tells (`--scenario`); `alerts` needs the simulated backend.
    pub scenario: Scenario,
}

#[derive(Debug, Error)]
pub(crate) enum DemoError {
    #[error("{0}")]
    Exporter(#[from] ExporterError),
    #[error("{0}")]
    Publish(#[from] PublishError),
    #[error("could not set up the memory manager: {0}")]
    Manager(#[from] gpumem::error::InitError),
    #[error("could not start the demo: {0}")]
    Startup(#[source] std::io::Error),
    #[error("the alerts scenario needs the simulated device (--backend sim)")]
    ScenarioNeedsSim,
    #[error("could not start the alerts scenario's node agent: {0}")]
    Agent(#[source] ExporterError),
}

/// Runs the demo on `backend`. Pass the simulated backend as `sim` as well (same object) so the
/// demo can change the memory other processes hold; without it, pressure comes from ballast.
pub(crate) fn run(
    backend: Arc<dyn DeviceBackend>,
    sim: Option<Arc<SimBackend>>,
    settings: DemoSettings,
) -> Result<(), DemoError> {
    let config = ManagerConfig {
        // At most 15 s, shorter than the default, so the chart shows cached memory going back
        // to the driver.
        release_idle_after: settings
            .memory
            .release_idle_after
            .map(|after| after.min(Duration::from_secs(15))),
        devices: settings.devices.clone(),
        ..settings.memory.clone()
    };
    let manager = MemoryManager::new(backend, config)?;
    let runtime = gpumem_observe::web::runtime::build("gpumem-demo").map_err(DemoError::Startup)?;
    gpumem_observe::web::runtime::block_on_bounded(runtime, serve(manager, sim, settings))
}

async fn serve(
    manager: MemoryManager,
    sim: Option<Arc<SimBackend>>,
    settings: DemoSettings,
) -> Result<(), DemoError> {
    // Listening for signals from the start: a SIGTERM right after the first published file
    // (before the wait below began) used to kill the demo without removing that file.
    let signalled = interrupted();
    let spike = Arc::new(PressureSpike::default());
    // Ballast only exists where pressure cannot be simulated; it is meant to stay, not a leak;
    // nor are the alerts scenario's pinned buffers (they make fragmentation, not a leak).
    let long_lived: &[&str] = match sim {
        Some(_) => &["weights", alerts::PINNED_TAG],
        None => &["weights", pressure::BALLAST_TAG],
    };
    let node = match settings.scenario {
        Scenario::Calm => None,
        Scenario::Alerts if sim.is_none() => return Err(DemoError::ScenarioNeedsSim),
        Scenario::Alerts => {
            Some(node::SimNode::create(&std::env::temp_dir()).map_err(DemoError::Startup)?)
        }
    };
    // The node agent collects what the demo publishes: somewhere of the node's when not given.
    let publish_dir = settings
        .publish_dir
        .clone()
        .or_else(|| node.as_ref().map(node::SimNode::publish_dir));
    // Before the exporter: a directory that cannot be written to ends the demo before it starts.
    let publisher = match &publish_dir {
        Some(dir) => Some(
            Publisher::builder()
                .manager(manager.clone())
                .dir(dir)
                .interval(settings.interval)
                .leak_age(settings.leak_age)
                .long_lived_tags(long_lived.iter().copied())
                .process_name("gpumem-demo")
                .top_tags(settings.top_tags)
                .spawn()?,
        ),
        None => None,
    };
    let mut exporter = Exporter::builder();
    if let Some(n) = settings.max_connections {
        exporter = exporter.max_connections(n);
    }
    let exporter = exporter
        .manager(manager.clone())
        .listen(settings.listen)
        .interval(settings.interval)
        .leak_age(settings.leak_age)
        .long_lived_tags(long_lived.iter().copied())
        .top_tags(settings.top_tags)
        .runbook_url(
            settings
                .runbook_url
                .clone()
                .unwrap_or_else(|| gpumem_observe::web::DEFAULT_RUNBOOK.to_string()),
        )
        .flight(settings.flight.clone())
        .routes(spike::routes(Arc::clone(&spike)))
        .allowed_hosts(&settings.allowed_hosts)
        .spawn()?;
    // The one line a new user needs; stdout, so scripts and tests can read the address.
    println!("gpumem demo: open {}", exporter.url());
    let started = Instant::now();
    let view = Arc::new(node::NodeView::new(manager.device_indices().len()));
    let (agent_stop, agent_task) = match (node, publish_dir) {
        (Some(node), Some(collect_dir)) => {
            let agent_settings = agent::AgentSettings {
                // From the port asked for, not the one bound: asked for any free port (0), the
                // agent takes any free port too, instead of the bound one's neighbour, which
                // another server may hold.
                listen: next_port(settings.listen),
                interval: settings.interval,
                leak_age: settings.leak_age,
                top_tags: settings.top_tags,
                runbook_url: settings
                    .runbook_url
                    .clone()
                    .unwrap_or_else(|| gpumem_observe::web::DEFAULT_RUNBOOK.to_string()),
                allowed_hosts: settings.allowed_hosts.clone(),
                pressure: settings.memory.pressure,
                collect_dir,
            };
            let agent = agent::Agent::start(node, &manager, &view, agent_settings)
                .map_err(DemoError::Agent)?;
            println!(
                "gpumem demo: node agent of the alerts scenario on {}",
                agent.url()
            );
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let follow = agent.follow(manager.clone(), Arc::clone(&view), started, async {
                let _ = stopped.await;
            });
            (Some(stop), Some(tokio::spawn(follow)))
        }
        _ => (None, None),
    };
    let _ = std::io::stdout().flush();

    let stop = Arc::new(AtomicBool::new(false));
    let workload = {
        let stop = Arc::clone(&stop);
        let spike = Arc::clone(&spike);
        let spike_at = settings.spike_at;
        let scenario = settings.scenario;
        let view = Arc::clone(&view);
        std::thread::Builder::new()
            .name("gpumem-demo-workload".to_string())
            .spawn(move || {
                let driver = Driver {
                    sim,
                    scenario,
                    view,
                    started,
                };
                run_workload(manager, driver, &spike, spike_at, &stop)
            })
            .map_err(DemoError::Startup)?
    };

    wait_for_end(settings.duration, signalled).await;
    let mut node = None;
    if let (Some(stop), Some(task)) = (agent_stop, agent_task) {
        let _ = stop.send(());
        node = task.await.ok();
    }
    stop.store(true, Ordering::Relaxed);
    let joined = tokio::task::spawn_blocking(move || workload.join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        tracing::error!("the demo workload stopped with a panic");
    }
    exporter.shutdown_and_wait().await;
    if let Some(publisher) = publisher {
        // Removes the published file, so a collector drops the demo at once.
        let _ = tokio::task::spawn_blocking(move || publisher.shutdown()).await;
    }
    if let Some(node) = node {
        node.remove();
    }
    Ok(())
}

/// Returns on `signalled` (Ctrl-C, SIGTERM) or when `duration` has passed.
async fn wait_for_end(
    duration: Option<Duration>,
    signalled: impl std::future::Future<Output = ()>,
) {
    let timer = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = timer => tracing::info!("demo duration reached; stopping"),
        _ = signalled => tracing::info!("stopping on signal; finishing requests in flight"),
    }
}

/// Completes on Ctrl-C or SIGTERM (`gpumem serve` waits on it too). The handlers are installed
/// when this is called, not when the future is first polled, so a signal between the two is
/// not fatal. Call it inside the runtime.
pub(crate) fn interrupted() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, Signal, SignalKind};
        let terminate = signal(SignalKind::terminate()).ok();
        let interrupt = signal(SignalKind::interrupt()).ok();
        async fn received(stream: Option<Signal>) {
            match stream {
                Some(mut stream) => {
                    stream.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        async move {
            tokio::select! {
                _ = received(terminate) => {}
                _ = received(interrupt) => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One workspace per device, sized for the memory of now; a device without room gets none.
fn start_workspaces(manager: &MemoryManager) -> Vec<gpumem::manager::Workspace> {
    let mut workspaces = Vec::new();
    for device in manager.device_indices() {
        match manager.workspace(device, WORKSPACE_LAYER) {
            Ok(workspace) => {
                tracing::info!(
                    "workspace on GPU {device}: batch {} ({}) for a 4096x11008 int4 layer",
                    workspace.batch(),
                    gpumem::units::Bytes(workspace.bytes())
                );
                workspaces.push(workspace);
            }
            Err(error) => tracing::warn!(device, %error, "no workspace"),
        }
    }
    workspaces
}

/// Re-plans each workspace for the pressure of now; one log line per resize.
fn adapt_workspaces(workspaces: &mut [gpumem::manager::Workspace]) {
    for workspace in workspaces {
        match workspace.adapt() {
            Ok(Some(change)) => tracing::info!(
                "workspace on GPU {}: batch {} -> {} ({} -> {}) at {} pressure",
                change.device,
                change.from_batch,
                change.to_batch,
                gpumem::units::Bytes(change.from_bytes),
                gpumem::units::Bytes(change.to_bytes),
                change.pressure
            ),
            Ok(None) => {}
            Err(error) => tracing::debug!(device = workspace.device(), %error, "workspace kept"),
        }
    }
}

/// The node agent's address: the demo's port plus one (port 0 stays 0: any free port).
fn next_port(demo: SocketAddr) -> SocketAddr {
    let port = match demo.port() {
        0 => 0,
        port => port.checked_add(1).unwrap_or(0),
    };
    SocketAddr::new(demo.ip(), port)
}

/// What moves the pressure of the devices: the calm wave, or the alerts scenario's timeline.
struct Driver {
    sim: Option<Arc<SimBackend>>,
    scenario: Scenario,
    view: Arc<node::NodeView>,
    started: Instant,
}

/// One device's pressure, by the scenario.
enum DevicePressure {
    Calm(PressureSwing),
    Alerts(alerts::AlertsLoad),
}

/// The workload thread: ticks every device until `stop` is set.
fn run_workload(
    manager: MemoryManager,
    driver: Driver,
    spike: &PressureSpike,
    spike_at: Option<Duration>,
    stop: &AtomicBool,
) {
    let started = driver.started;
    let sim = driver.sim;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x9e37_79b9, |d| d.as_nanos() as u64);
    let mut rng = Rng::seeded(seed);
    let mut devices = Vec::new();
    for device in manager.device_indices() {
        let total = manager
            .backend()
            .properties(device)
            .map_or(0, |p| p.total_memory_bytes);
        let alerts = match (driver.scenario, &sim) {
            (Scenario::Alerts, Some(sim)) => Some(alerts::AlertsLoad::new(
                device,
                total,
                Arc::clone(sim),
                Arc::clone(&driver.view),
            )),
            _ => None,
        };
        // Read after the alerts scenario's neighbours took their share.
        let free = manager
            .backend()
            .mem_info(device)
            .map_or(total, |info| info.free);
        let source = match &sim {
            Some(sim) => PressureSource::Simulated(Arc::clone(sim)),
            None => PressureSource::Ballast,
        };
        let pressure = match alerts {
            Some(load) => DevicePressure::Alerts(load),
            None => DevicePressure::Calm(PressureSwing::new(source, device, total, free)),
        };
        devices.push((
            DeviceWorkload::new(device, Budget::for_free_memory(free)),
            pressure,
        ));
    }
    let mut workspaces = start_workspaces(&manager);
    let mut workspaces_adapted = Instant::now();
    let mut spiked = false;
    while !stop.load(Ordering::Relaxed) {
        let tick_started = Instant::now();
        let elapsed = started.elapsed();
        if let Some(at) = spike_at {
            if !spiked && elapsed >= at {
                spike.trigger(DEFAULT_SPIKE);
                spiked = true;
            }
        }
        let spike_on = spike.is_on();
        for (workload, pressure) in &mut devices {
            match pressure {
                DevicePressure::Calm(swing) => swing.apply(&manager, elapsed, spike_on),
                DevicePressure::Alerts(load) => load.apply(&manager, elapsed),
            }
            workload.tick(&manager, elapsed, &mut rng);
        }
        if workspaces_adapted.elapsed() >= WORKSPACE_EVERY {
            workspaces_adapted = Instant::now();
            // The level of now, not of the sampler's last look, so the log line says why.
            manager.update_pressure();
            adapt_workspaces(&mut workspaces);
        }
        std::thread::sleep(TICK.saturating_sub(tick_started.elapsed()));
    }
    let refused: u64 = devices.iter().map(|(w, _)| w.refused).sum();
    tracing::info!(refused, "demo workload stopped");
}
