//! The node agent (`gpumem serve` as a DaemonSet): every GPU process named by its pod. The
//! cgroup shapes of real nodes as fixture `/proc` trees (`cgroups`), the API client against a
//! stand-in API server that speaks the real protocol (`apiserver`, `client`), and the whole
//! agent end to end with NVML's readings from a test fixture (`serve`, started as `agent` says,
//! which the dashboard's end-to-end test shares).

pub(crate) mod agent;
pub(crate) mod apiserver;
mod cgroups;
mod client;
mod hostile;
mod serve;
