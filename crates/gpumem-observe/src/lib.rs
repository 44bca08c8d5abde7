//! gpumem's observability over the core's managers: the [`sampler`] (one background task that
//! snapshots every interval into a [`history`] ring), the [`web`] server (`/metrics`, the status
//! page, the JSON API, `/healthz`), the [`exporter`] an engine embeds, the OOM [`flight`]
//! recorder, [`nvml`] readings (no CUDA context), [`publish`]ing snapshots for a collector and,
//! with the feature `sidecar`, [`collect`]ing them (`gpumem serve`, as a sidecar or the node
//! agent) and naming GPU processes' [`pods`] (the node agent). The renderers read what a
//! collector adds through `Snapshot::collected()`, empty in-process.

pub mod exporter;
pub mod flight;
pub mod history;
mod newest;
pub mod nvml;
pub mod publish;
pub mod sampler;
pub mod web;

#[cfg(feature = "sidecar")]
pub mod collect;
#[cfg(feature = "sidecar")]
pub mod pods;

pub use exporter::{Exporter, ExporterHandle};
