//! The `alerts` scenario's node agent: a real `collect::Collector` (what `gpumem serve` runs as a
//! DaemonSet) over the simulated node of `node`, served on its own address beside the demo's.
//! Once a second it brings the node's files up to the timeline and stops or starts the agent
//! when the timeline says it goes away or comes back — on the same address, so a scraper finds
//! it again as it would a restarted pod.

use super::node::{NodeView, SimNode, NODE_NAME};
use super::scenario;
use gpumem::manager::MemoryManager;
use gpumem_observe::collect::{CollectSettings, Collector, DeviceSource};
use gpumem_observe::exporter::{Exporter, ExporterError, ExporterHandle};
use gpumem_observe::pods::PodDirectory;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the agent is started with, every time.
#[derive(Clone, Debug)]
pub(super) struct AgentSettings {
    pub listen: SocketAddr,
    pub interval: Duration,
    pub leak_age: Duration,
    pub top_tags: usize,
    pub runbook_url: String,
    pub allowed_hosts: Vec<String>,
    pub pressure: gpumem::manager::PressureThresholds,
    /// Where the demo publishes its snapshots: the agent collects them.
    pub collect_dir: PathBuf,
}

/// The agent, running or not, and the node it watches.
pub(super) struct Agent {
    node: SimNode,
    settings: AgentSettings,
    running: Option<ExporterHandle>,
}

impl Agent {
    /// Starts the agent on `settings.listen` (a port of 0 is chosen once and kept).
    pub(super) fn start(
        node: SimNode,
        manager: &MemoryManager,
        view: &NodeView,
        mut settings: AgentSettings,
    ) -> Result<Agent, ExporterError> {
        let mut node = node;
        if let Err(error) = node.update(manager, view, scenario::moment(Duration::ZERO)) {
            tracing::warn!(%error, "alerts scenario: could not write the simulated node's files");
        }
        let running = spawn(&node, &settings)?;
        settings.listen = running.local_addr();
        Ok(Agent {
            node,
            settings,
            running: Some(running),
        })
    }

    pub(super) fn url(&self) -> String {
        format!("http://{}/", self.settings.listen)
    }

    /// Runs until `stop` completes: the node follows the timeline, once a second. Returns the
    /// node, for its files to be removed once nothing writes to them.
    pub(super) async fn follow(
        mut self,
        manager: MemoryManager,
        view: Arc<NodeView>,
        started: Instant,
        stop: impl std::future::Future<Output = ()>,
    ) -> SimNode {
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tick.tick() => {}
            }
            let moment = scenario::moment(started.elapsed());
            if let Err(error) = self.node.update(&manager, &view, moment) {
                tracing::warn!(%error, "alerts scenario: could not write the simulated node's files");
            }
            match (moment.agent_down, self.running.take()) {
                (true, Some(running)) => {
                    tracing::info!("alerts scenario: the node agent goes away");
                    running.shutdown_and_wait().await;
                }
                (false, None) => match spawn(&self.node, &self.settings) {
                    Ok(running) => {
                        tracing::info!("alerts scenario: the node agent is back");
                        self.running = Some(running);
                    }
                    // Taken meanwhile, say: try again next second.
                    Err(error) => {
                        tracing::warn!(%error, "alerts scenario: the node agent could not start")
                    }
                },
                (_, running) => self.running = running,
            }
        }
        if let Some(running) = self.running.take() {
            running.shutdown_and_wait().await;
        }
        self.node
    }
}

/// A node agent over `node`, as `gpumem serve` builds it on a GPU node.
fn spawn(node: &SimNode, settings: &AgentSettings) -> Result<ExporterHandle, ExporterError> {
    let collect = CollectSettings::new(&settings.collect_dir, settings.interval);
    let mut agent = Collector::open(DeviceSource::NvmlFixture(node.nvml_file()), Some(collect));
    agent.use_proc_root(node.proc_root());
    agent.attribute_pods(PodDirectory::fixed(SimNode::pods(), NODE_NAME));
    Exporter::builder()
        .source(Box::new(agent))
        .listen(settings.listen)
        .interval(settings.interval)
        .leak_age(settings.leak_age)
        .top_tags(settings.top_tags)
        .runbook_url(settings.runbook_url.clone())
        .allowed_hosts(&settings.allowed_hosts)
        .pressure_thresholds(settings.pressure)
        .spawn()
}
