//! The part of the API server's `PodList` the node agent reads, and the table built from it:
//! pod UID → namespace, name and containers (ID → name). Only the fields used are declared;
//! everything else in the (large) objects is skipped by serde.

use super::cgroup::ContainerId;
use gpumem_wire::process::clean_text;
use gpumem_wire::PodRef;
use serde::Deserialize;
use std::collections::HashMap;

/// Kubernetes limits: a namespace and a container name are DNS labels (63), a pod name a DNS
/// subdomain (253). Longer values are cut, never trusted to be short.
const MAX_NAMESPACE: usize = 63;
const MAX_POD: usize = 253;
const MAX_CONTAINER: usize = 63;
/// Pods in one list, at most: a node runs 110 by default and rarely more than a few hundred;
/// a list beyond this is cut (and says so).
pub const MAX_PODS: usize = 5_000;
/// The annotation a static pod's mirror carries: the config hash its cgroup is named after.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// `GET /api/v1/pods`'s answer (`kind: PodList`).
#[derive(Debug, Deserialize)]
pub struct PodList {
    pub kind: Option<String>,
    /// At most [`MAX_PODS`]: the rest are skipped while parsing, never built (a list of a
    /// million minimal pods would otherwise cost hundreds of MiB for a few MiB of text).
    #[serde(default, deserialize_with = "at_most_max_pods")]
    pub items: Vec<Pod>,
}

/// The first [`MAX_PODS`] items of the array; the others are read past without being kept.
fn at_most_max_pods<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Pod>, D::Error> {
    struct FirstPods;
    impl<'de> serde::de::Visitor<'de> for FirstPods {
        type Value = Vec<Pod>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of pods")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Pod>, A::Error> {
            let mut pods = Vec::new();
            while pods.len() < MAX_PODS {
                match seq.next_element::<Pod>()? {
                    Some(pod) => pods.push(pod),
                    None => return Ok(pods),
                }
            }
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(pods)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<Pod>, E> {
            Ok(Vec::new())
        }
    }
    deserializer.deserialize_any(FirstPods)
}

#[derive(Debug, Deserialize)]
pub struct Pod {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

#[derive(Debug, Deserialize)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub annotations: HashMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    pub init_container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    pub ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    #[serde(default)]
    pub name: String,
    /// `containerd://<id>`, `cri-o://<id>`, `docker://<id>`; missing while it is created.
    #[serde(rename = "containerID")]
    pub container_id: Option<String>,
    /// The previous run of a restarted container: its ID is how a process of the old run
    /// is still named after the restart.
    #[serde(default)]
    pub last_state: Option<ContainerState>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ContainerState {
    pub terminated: Option<Terminated>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    #[serde(rename = "containerID")]
    pub container_id: Option<String>,
}

/// One pod as the table keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodEntry {
    namespace: String,
    name: String,
    uid: String,
    /// Container ID (hex, lower case) → container name; current runs first.
    containers: HashMap<String, String>,
    /// Container name → the ID it runs under now.
    current: HashMap<String, String>,
}

/// The pods of one node, by UID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodTable {
    pods: HashMap<String, PodEntry>,
    /// A static pod's config hash (its cgroup's UID) → the mirror pod's UID.
    mirrors: HashMap<String, String>,
}

impl PodTable {
    /// The table of `list`; pods beyond [`MAX_PODS`] are left out.
    pub fn from_list(list: PodList) -> PodTable {
        let mut table = PodTable::default();
        for pod in list.items.into_iter().take(MAX_PODS) {
            let uid = pod.metadata.uid.to_ascii_lowercase();
            if uid.is_empty() {
                continue;
            }
            if let Some(hash) = pod.metadata.annotations.get(MIRROR_ANNOTATION) {
                table.mirrors.insert(hash.to_ascii_lowercase(), uid.clone());
            }
            let mut entry = PodEntry {
                namespace: clean_text(&pod.metadata.namespace, MAX_NAMESPACE),
                name: clean_text(&pod.metadata.name, MAX_POD),
                uid: uid.clone(),
                containers: HashMap::new(),
                current: HashMap::new(),
            };
            let status = pod.status.unwrap_or_default();
            let all = status
                .container_statuses
                .iter()
                .chain(&status.init_container_statuses)
                .chain(&status.ephemeral_container_statuses);
            for container in all {
                let name = clean_text(&container.name, MAX_CONTAINER);
                let previous = container
                    .last_state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.container_id.as_deref())
                    .and_then(strip_runtime);
                if let Some(id) = previous {
                    entry.containers.insert(id, name.clone());
                }
                if let Some(id) = container.container_id.as_deref().and_then(strip_runtime) {
                    entry.current.insert(name.clone(), id.clone());
                    entry.containers.insert(id, name);
                }
            }
            table.pods.insert(uid, entry);
        }
        table
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Whether the pod with this cgroup UID is listed.
    pub fn knows(&self, uid: &str) -> bool {
        self.entry(uid).is_some()
    }

    fn entry(&self, uid: &str) -> Option<&PodEntry> {
        self.pods
            .get(uid)
            .or_else(|| self.pods.get(self.mirrors.get(uid)?))
    }

    /// The pod (and container) a cgroup names, when the pod is listed. A container ID the
    /// pod's status does not list (just created, or long gone) leaves the container unnamed.
    pub fn resolve(&self, uid: &str, container: Option<&ContainerId>) -> Option<PodRef> {
        let entry = self.entry(uid)?;
        Some(PodRef {
            namespace: entry.namespace.clone(),
            pod: entry.name.clone(),
            container: container.and_then(|c| entry.containers.get(&c.id).cloned()),
            uid: entry.uid.clone(),
            container_id: container.map(|c| c.id.clone()),
        })
    }

    /// The ID the pod's container named `container` runs under now, when listed.
    pub fn current_container_id(&self, uid: &str, container: &str) -> Option<&str> {
        self.entry(uid)?.current.get(container).map(String::as_str)
    }
}

/// `containerd://abc…` → `abc…` (lower case); `None` for an empty or odd value.
fn strip_runtime(id: &str) -> Option<String> {
    let (_, hex) = id.split_once("://")?;
    let valid = !hex.is_empty() && hex.len() <= 128 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| hex.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list shaped as the API server answers `GET /api/v1/pods` (fields from the API's
    /// reference; most of each object left out, as serde skips them anyway).
    const LIST: &str = r#"{
      "kind": "PodList", "apiVersion": "v1",
      "metadata": {"resourceVersion": "123456"},
      "items": [
        {"metadata": {"name": "vllm-0", "namespace": "serving",
                      "uid": "1F9C3A52-8E7B-4D2A-9C1E-5B6F7A8D9E0F",
                      "labels": {"app": "vllm"}},
         "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "inference"}]},
         "status": {"phase": "Running",
           "containerStatuses": [
             {"name": "inference", "ready": true, "restartCount": 1,
              "containerID": "containerd://AAAA1111bbbb2222cccc3333dddd4444eeee5555ffff6666aaaa7777bbbb8888",
              "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                "containerID": "containerd://9999888877776666555544443333222211110000aaaabbbbccccddddeeeeffff"}}},
             {"name": "metrics", "containerID": "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
           ],
           "initContainerStatuses": [
             {"name": "fetch-weights", "containerID": "cri-o://fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"}
           ]}},
        {"metadata": {"name": "kube-proxy-node-1", "namespace": "kube-system",
                      "uid": "0a1b2c3d-0000-4000-8000-000000000001",
                      "annotations": {"kubernetes.io/config.mirror": "6b3d0b1f0a9a8e6b8f0d5c4b3a2e1f0d"}},
         "status": {}},
        {"metadata": {"name": "pending", "namespace": "default", "uid": "0a1b2c3d-0000-4000-8000-000000000002"},
         "status": {"containerStatuses": [{"name": "waiting"}]}}
      ]}"#;

    fn table() -> PodTable {
        PodTable::from_list(serde_json::from_str(LIST).expect("a PodList"))
    }

    fn id(hex: &str) -> ContainerId {
        ContainerId {
            id: hex.to_string(),
            runtime: Some("containerd"),
        }
    }

    #[test]
    fn a_cgroup_resolves_to_namespace_pod_and_container() {
        let table = table();
        assert_eq!(table.len(), 3);
        let uid = "1f9c3a52-8e7b-4d2a-9c1e-5b6f7a8d9e0f";
        let current = "aaaa1111bbbb2222cccc3333dddd4444eeee5555ffff6666aaaa7777bbbb8888";
        let found = table.resolve(uid, Some(&id(current))).expect("listed");
        assert_eq!(
            (found.namespace.as_str(), found.pod.as_str()),
            ("serving", "vllm-0")
        );
        assert_eq!(found.container.as_deref(), Some("inference"));
        assert_eq!(found.short(), "vllm-0 / inference");
        // The run before the restart is still named, and the current ID is known.
        let old = "9999888877776666555544443333222211110000aaaabbbbccccddddeeeeffff";
        let before = table.resolve(uid, Some(&id(old))).expect("listed");
        assert_eq!(before.container.as_deref(), Some("inference"));
        assert_eq!(table.current_container_id(uid, "inference"), Some(current));
        // Init containers, any runtime's scheme.
        let init = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
        let found = table.resolve(uid, Some(&id(init))).expect("listed");
        assert_eq!(found.container.as_deref(), Some("fetch-weights"));
        // An ID the status does not list: the pod is named, the container is not.
        let unknown = table.resolve(uid, Some(&id(&"e".repeat(64)))).expect("pod");
        assert_eq!(unknown.container, None);
        assert!(table
            .resolve("0a1b2c3d-0000-4000-8000-00000000ffff", None)
            .is_none());
    }

    #[test]
    fn a_static_pods_cgroup_uid_finds_its_mirror() {
        let table = table();
        let found = table
            .resolve("6b3d0b1f0a9a8e6b8f0d5c4b3a2e1f0d", None)
            .expect("the mirror pod");
        assert_eq!(found.pod, "kube-proxy-node-1");
        assert!(table.knows("6b3d0b1f0a9a8e6b8f0d5c4b3a2e1f0d"));
    }

    #[test]
    fn pods_past_the_cap_are_skipped_while_parsing() {
        let items: Vec<String> = (0..MAX_PODS + 10)
            .map(|i| format!(r#"{{"metadata":{{"uid":"u{i}"}}}}"#))
            .collect();
        let list = format!(r#"{{"kind":"PodList","items":[{}]}}"#, items.join(","));
        let list: PodList = serde_json::from_str(&list).expect("parses");
        assert_eq!(list.items.len(), MAX_PODS);
        let empty: PodList = serde_json::from_str(r#"{"items":null}"#).expect("null items");
        assert!(empty.items.is_empty());
    }

    #[test]
    fn names_are_cut_to_kubernetes_limits_and_cleaned() {
        let list = format!(
            r#"{{"items":[{{"metadata":{{"name":"{}","namespace":"ns\u0007x","uid":"u"}}}}]}}"#,
            "p".repeat(400)
        );
        let table = PodTable::from_list(serde_json::from_str(&list).expect("parses"));
        let found = table.resolve("u", None).expect("listed");
        assert_eq!(found.pod.len(), MAX_POD);
        assert_eq!(found.namespace, "ns_x");
    }
}
