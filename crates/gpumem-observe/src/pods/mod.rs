//! The node agent's pod attribution (feature `sidecar`): which pod and container each GPU
//! process runs in. The cgroup of `/proc/<pid>/cgroup` gives the pod's UID and the container's
//! ID ([`cgroup`]); the API server's list of this node's pods gives their names ([`kube`],
//! [`podlist`]), fetched off the sampling path by [`directory`]; [`attribute`] puts the two
//! together for one process. The rules and the shapes supported: `docs/node-agent.md`.

pub mod attribute;
mod body;
pub mod cgroup;
mod credentials;
pub mod directory;
pub mod kube;
pub mod podlist;

pub use attribute::{Attribution, PodAttributor, MAX_LABELLED_PODS};
pub use directory::{PodDirectory, DEFAULT_MIN_GAP, DEFAULT_REFRESH};
pub use kube::{KubeConfig, KubeSettings};
pub use podlist::PodTable;
