//! One GPU process's pod: its cgroup read under the proc root, resolved against the pod
//! directory's latest list. Everything here reads local files only (a few hundred bytes per
//! process); a pod the list does not know asks the directory for a refresh and leaves the
//! process named by its command until the answer comes. An unknown cgroup shape is logged once
//! for the agent's lifetime, not once per scan.

use super::cgroup::{self, CgroupIdentity};
use super::directory::{DirectoryView, PodDirectory};
use super::podlist::PodTable;
use gpumem_wire::{PodRef, PodsStatus};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Distinct pods whose processes get pod labels, at most. A node runs at most 110 pods by
/// the kubelet's default (`maxPods`), and only those with GPU processes count here; beyond the
/// cap processes keep their command names, so a runaway list cannot multiply the series.
pub const MAX_LABELLED_PODS: usize = 256;
/// `/proc/<pid>/cgroup` is a few hundred bytes; a larger one is not a cgroup file.
const MAX_CGROUP_BYTES: u64 = 64 << 10;

/// What attribution found for one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The pod, when the cgroup names one the list knows.
    pub pod: Option<PodRef>,
    /// In a pod the list does not name (yet).
    pub unnamed: bool,
    /// Under `kubepods` in a shape this version does not know.
    pub unrecognised: bool,
}

/// Attributes processes to pods; see the module documentation.
pub struct PodAttributor {
    proc_root: PathBuf,
    directory: PodDirectory,
    warned_shape: bool,
    /// This scan's reading of the directory and what was found.
    view: DirectoryView,
    pods_labelled: HashSet<String>,
    status: PodsStatus,
    asked: bool,
}

impl PodAttributor {
    pub fn new(proc_root: impl Into<PathBuf>, directory: PodDirectory) -> Self {
        PodAttributor {
            proc_root: proc_root.into(),
            directory,
            warned_shape: false,
            view: DirectoryView::default(),
            pods_labelled: HashSet::new(),
            status: PodsStatus::default(),
            asked: false,
        }
    }

    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Starts a scan: takes the directory's latest list (once, for every process of the scan).
    pub fn begin(&mut self) {
        self.view = self.directory.view();
        self.pods_labelled.clear();
        self.asked = false;
        self.status = PodsStatus {
            source: "kubernetes".to_string(),
            node: self.directory.node().to_string(),
            up: self.view.table.is_some() && self.view.error.is_none(),
            reason: self.view.error.clone().or_else(|| {
                self.view
                    .table
                    .is_none()
                    .then(|| "waiting for the first pod list".to_string())
            }),
            pods_known: self.view.table.as_ref().map(|t| t.len() as u64),
            list_age_seconds: self.view.list_age.map(|a| a.as_secs_f64()),
            requests_total: self.view.requests_total,
            errors_total: self.view.errors_total,
            ..PodsStatus::default()
        };
    }

    /// The pod of the process `pid` (a pid of the proc root's namespace: the host's).
    pub fn attribute(&mut self, pid: u32) -> Attribution {
        let text = read_small(&self.proc_root.join(pid.to_string()).join("cgroup"));
        let identity = text
            .as_deref()
            .map_or(CgroupIdentity::NotPod, cgroup::parse);
        let table = self.view.table.clone();
        let attribution = resolve(identity, table.as_deref());
        if attribution.unrecognised {
            self.status.unrecognised_cgroups += 1;
            if !self.warned_shape {
                self.warned_shape = true;
                tracing::warn!(
                    "pods: pid {pid} is under kubepods in a cgroup shape this version does not \
                     know ({}); such processes are named by their command (logged once; \
                     docs/node-agent.md says how to record a fixture of it)",
                    text.as_deref()
                        .map(|t| gpumem_wire::process::clean_text(t, 300))
                        .unwrap_or_default()
                );
            }
        }
        if attribution.unnamed {
            self.status.unnamed_processes += 1;
            if !self.asked {
                self.asked = true;
                self.directory.ask_refresh();
            }
        }
        let Some(pod) = attribution.pod else {
            return attribution;
        };
        // The cap: pods already labelled in this scan always fit; a new one only below it.
        if !self.pods_labelled.contains(&pod.uid) && self.pods_labelled.len() >= MAX_LABELLED_PODS {
            self.status.over_cap += 1;
            return Attribution {
                pod: None,
                ..attribution
            };
        }
        self.pods_labelled.insert(pod.uid.clone());
        Attribution {
            pod: Some(pod),
            ..attribution
        }
    }

    /// How this scan went (after every process was attributed).
    pub fn status(&self) -> PodsStatus {
        self.status.clone()
    }

    /// The ID the container named `container` of pod `uid` runs under now, per the list.
    pub fn current_container_id(&self, uid: &str, container: &str) -> Option<String> {
        let table = self.view.table.as_ref()?;
        table.current_container_id(uid, container).map(String::from)
    }
}

/// A cgroup identity resolved against the list (pure: the unit tests' entry point).
pub fn resolve(identity: CgroupIdentity, table: Option<&PodTable>) -> Attribution {
    match identity {
        CgroupIdentity::NotPod => Attribution::default(),
        CgroupIdentity::Unrecognised(_) => Attribution {
            unrecognised: true,
            ..Attribution::default()
        },
        CgroupIdentity::Pod { uid, container } => {
            match table.and_then(|t| t.resolve(&uid, container.as_ref())) {
                // A container ID the pod's status does not list is a container started since
                // the list (a restart, say): named by its pod now, by its container after
                // the next list, which it asks for.
                Some(pod) => Attribution {
                    unnamed: container.is_some() && pod.container.is_none(),
                    pod: Some(pod),
                    ..Attribution::default()
                },
                None => Attribution {
                    unnamed: true,
                    ..Attribution::default()
                },
            }
        }
    }
}

/// The process's PID namespace (`pid:[…]`), read under the proc root.
pub fn pid_namespace(proc_root: &Path, pid: u32) -> Option<String> {
    std::fs::read_link(proc_root.join(pid.to_string()).join("ns").join("pid"))
        .ok()
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|ns| ns.len() <= 64)
}

/// A small file of `/proc`, or `None` (gone, unreadable, too large).
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_CGROUP_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PodTable {
        let list = r#"{"kind":"PodList","items":[{"metadata":{"name":"vllm-0","namespace":"serving",
            "uid":"1f9c3a52-8e7b-4d2a-9c1e-5b6f7a8d9e0f"},"status":{"containerStatuses":[
            {"name":"inference","containerID":"containerd://4b1d4f8a9c2e3b7d6a5f0e1c2d3b4a5968778695a4b3c2d1e0f9a8b7c6d5e4f3"}]}}]}"#;
        PodTable::from_list(serde_json::from_str(list).expect("a PodList"))
    }

    #[test]
    fn pods_resolve_unknown_ones_ask_and_others_are_left_alone() {
        let table = table();
        let known = cgroup::parse(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f9c3a52_8e7b_4d2a_9c1e_5b6f7a8d9e0f.slice/cri-containerd-4b1d4f8a9c2e3b7d6a5f0e1c2d3b4a5968778695a4b3c2d1e0f9a8b7c6d5e4f3.scope",
        );
        let found = resolve(known.clone(), Some(&table));
        let pod = found.pod.expect("named");
        assert_eq!(pod.short(), "vllm-0 / inference");
        assert_eq!(pod.namespace, "serving");
        // Before the first list: in a pod, not named yet.
        assert!(resolve(known, None).unnamed);
        let other =
            cgroup::parse("0::/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000009\n");
        assert!(resolve(other, Some(&table)).unnamed);
        assert_eq!(
            resolve(cgroup::parse("0::/process_api/3f9a\n"), Some(&table)),
            Attribution::default()
        );
        assert!(resolve(cgroup::parse("0::/kubepods/x/y/z\n"), Some(&table)).unrecognised);
    }

    #[test]
    fn the_cap_leaves_further_pods_unlabelled_and_counts_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut items = Vec::new();
        for i in 0..(MAX_LABELLED_PODS + 3) {
            let uid = format!("0a1b2c3d-0000-4000-8000-{i:012}");
            items.push(format!(
                r#"{{"metadata":{{"name":"p{i}","namespace":"n","uid":"{uid}"}}}}"#
            ));
            let pid_dir = dir.path().join((1000 + i).to_string());
            std::fs::create_dir_all(&pid_dir).expect("mkdir");
            std::fs::write(pid_dir.join("cgroup"), format!("0::/kubepods/pod{uid}\n"))
                .expect("write");
        }
        let list = format!(r#"{{"items":[{}]}}"#, items.join(","));
        let table = PodTable::from_list(serde_json::from_str(&list).expect("parses"));
        let mut attributor = PodAttributor::new(dir.path(), PodDirectory::fixed(table, "node-1"));
        attributor.begin();
        let labelled = (0..(MAX_LABELLED_PODS + 3))
            .filter(|i| attributor.attribute(1000 + *i as u32).pod.is_some())
            .count();
        assert_eq!(labelled, MAX_LABELLED_PODS);
        let status = attributor.status();
        assert_eq!(status.over_cap, 3);
        assert!(status.up);
        assert_eq!(status.pods_known, Some(MAX_LABELLED_PODS as u64 + 3));
        // A pod already labelled in the scan stays labelled, whatever the count.
        assert!(attributor.attribute(1000).pod.is_some());
        // A pid that is gone is not a pod.
        assert_eq!(attributor.attribute(1), Attribution::default());
    }
}
