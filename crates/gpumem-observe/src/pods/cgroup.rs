//! What a process's cgroup says about its pod: the pod's UID and the container's ID, read from
//! the text of `/proc/<pid>/cgroup`. Pure functions over that text, so every shape is a unit
//! test; `docs/node-agent.md` lists the shapes and where each came from.
//!
//! The kubelet puts every pod in a cgroup named after the pod's UID, below a `kubepods` parent,
//! and the container runtime puts each container below its pod, named after the container's ID.
//! How those names are spelled depends on the cgroup driver and the runtime:
//!
//! - systemd driver: `kubepods-burstable-pod<uid with _ for ->.slice`, then
//!   `cri-containerd-<id>.scope`, `crio-<id>.scope` or `docker-<id>.scope`;
//! - cgroupfs driver: `kubepods/burstable/pod<uid>/<id>` (CRI-O: `crio-<id>`);
//! - containerd on cgroup v1 with the systemd driver, in some hierarchies: the systemd path
//!   as containerd writes it, one component `kubepods-…-pod<uid>.slice:cri-containerd:<id>`.
//!
//! cgroup v1 lists one line per hierarchy (`4:memory:/kubepods/...`), v2 one line (`0::/...`).
//! Seen from a container with its own cgroup namespace, a path outside it starts with `/..`;
//! components are matched wherever they are, so that prefix changes nothing.

/// What the cgroup file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupIdentity {
    /// A pod's process: the pod's UID and, when the process sits in a container's cgroup, the
    /// container's ID.
    Pod {
        uid: String,
        container: Option<ContainerId>,
    },
    /// Not in a Kubernetes pod: a host process, a systemd service, a container of another
    /// manager. Named by its command; nothing to warn about.
    NotPod,
    /// Under `kubepods`, in a shape this version does not know: named by its command, and the
    /// shape is worth one warning (the text is the path that was not understood).
    Unrecognised(String),
}

/// A container's ID as its cgroup spells it, and the runtime the spelling names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerId {
    /// The ID alone (hex), as `status.containerStatuses[].containerID` ends.
    pub id: String,
    /// `containerd`, `cri-o`, `docker`, or `None` where the cgroupfs driver names only the ID.
    pub runtime: Option<&'static str>,
}

/// Reads the text of `/proc/<pid>/cgroup`: the first line whose path is a pod's decides.
pub fn parse(text: &str) -> CgroupIdentity {
    let mut unrecognised = None;
    for line in text.lines() {
        // `hierarchy-ID:controller-list:cgroup-path`; the path itself may hold ':'.
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(_), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        match parse_path(path) {
            CgroupIdentity::Pod { uid, container } => {
                return CgroupIdentity::Pod { uid, container };
            }
            CgroupIdentity::Unrecognised(path) => {
                unrecognised.get_or_insert(path);
            }
            CgroupIdentity::NotPod => {}
        }
    }
    unrecognised.map_or(CgroupIdentity::NotPod, CgroupIdentity::Unrecognised)
}

/// One cgroup path.
pub fn parse_path(path: &str) -> CgroupIdentity {
    // `slice:prefix:id` is containerd's spelling of `slice/prefix-id.scope`: read it as that.
    let components: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .flat_map(|c| match c.splitn(3, ':').collect::<Vec<_>>()[..] {
            [slice, prefix, id] => vec![slice.to_string(), format!("{prefix}-{id}.scope")],
            _ => vec![c.to_string()],
        })
        .collect();
    let Some(kubepods) = components.iter().position(|c| c.contains("kubepods")) else {
        return CgroupIdentity::NotPod;
    };
    let after = &components[kubepods..];
    let Some((at, uid)) = after
        .iter()
        .enumerate()
        .find_map(|(i, c)| Some((i, pod_uid(c)?)))
    else {
        // `kubepods`, `kubepods.slice` and the QoS classes alone are the kubelet's own
        // cgroups (no pod's process lives there): not a pod, but no surprise either.
        if after.iter().all(|c| is_kubelet_parent(c)) {
            return CgroupIdentity::NotPod;
        }
        return CgroupIdentity::Unrecognised(path.to_string());
    };
    let container = match after.get(at + 1).map(String::as_str) {
        None => None,
        Some(component) => match container_id(component) {
            Some(id) => Some(id),
            // CRI-O's conmon (the container's monitor) lives beside the container.
            None if component.starts_with("crio-conmon-") => None,
            None => return CgroupIdentity::Unrecognised(path.to_string()),
        },
    };
    CgroupIdentity::Pod { uid, container }
}

/// The pod UID a component names: `pod<uid>` (cgroupfs) or `…-pod<uid_underscored>.slice`
/// (systemd), normalised to the API's dashed form.
fn pod_uid(component: &str) -> Option<String> {
    let raw = match component.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod")?.1,
        None => component.strip_prefix("pod")?,
    };
    let uid = raw.replace('_', "-").to_ascii_lowercase();
    valid_uid(&uid).then_some(uid)
}

/// A pod UID: a UUID (`8-4-4-4-12` hex digits), or the 32 hex digits of a static pod's
/// config hash, which is what the kubelet names a static pod's cgroup after.
fn valid_uid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    let hex = groups
        .iter()
        .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()));
    hex && (lengths == [8, 4, 4, 4, 12] || lengths == [32])
}

/// The container ID a component names, and the runtime its spelling tells.
fn container_id(component: &str) -> Option<ContainerId> {
    const SCOPES: [(&str, &str); 3] = [
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
    ];
    let (id, runtime) = match component.strip_suffix(".scope") {
        Some(scope) => {
            let (prefix, runtime) = SCOPES.iter().find(|(p, _)| scope.starts_with(p))?;
            (&scope[prefix.len()..], Some(*runtime))
        }
        // cgroupfs: the bare ID (containerd, Docker), or `crio-<id>` (CRI-O).
        None => match component.strip_prefix("crio-") {
            Some(id) => (id, Some("cri-o")),
            None => (component, None),
        },
    };
    valid_container_id(id).then(|| ContainerId {
        id: id.to_ascii_lowercase(),
        runtime,
    })
}

/// Container IDs are 64 hex digits; shorter (but not absurdly short) hex is accepted too.
fn valid_container_id(id: &str) -> bool {
    (12..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The kubelet's parents of pod cgroups: `kubepods`, its QoS classes, and the systemd
/// spelling of both (also under a kubelet slice, as kind's nodes have).
fn is_kubelet_parent(component: &str) -> bool {
    let name = component.strip_suffix(".slice").unwrap_or(component);
    let name = name.strip_prefix("kubelet-").unwrap_or(name);
    matches!(
        name,
        "kubepods"
            | "burstable"
            | "besteffort"
            | "guaranteed"
            | "kubepods-burstable"
            | "kubepods-besteffort"
            | "kubepods-guaranteed"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1f9c3a52-8e7b-4d2a-9c1e-5b6f7a8d9e0f";
    const ID: &str = "4b1d4f8a9c2e3b7d6a5f0e1c2d3b4a5968778695a4b3c2d1e0f9a8b7c6d5e4f3";

    fn pod(runtime: Option<&'static str>) -> CgroupIdentity {
        CgroupIdentity::Pod {
            uid: UID.to_string(),
            container: Some(ContainerId {
                id: ID.to_string(),
                runtime,
            }),
        }
    }

    fn underscored() -> String {
        UID.replace('-', "_")
    }

    #[test]
    fn systemd_driver_shapes_on_cgroup_v2() {
        let u = underscored();
        for (scope, runtime) in [
            (format!("cri-containerd-{ID}.scope"), "containerd"),
            (format!("crio-{ID}.scope"), "cri-o"),
            (format!("docker-{ID}.scope"), "docker"),
        ] {
            let text = format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/{scope}\n"
            );
            assert_eq!(parse(&text), pod(Some(runtime)), "{text}");
        }
        // Guaranteed pods sit right under kubepods.slice.
        let text = format!("0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope");
        assert_eq!(parse(&text), pod(Some("containerd")));
        // kind's nodes nest the kubelet's cgroups under a slice of their own.
        let text = format!(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
             kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(parse(&text), pod(Some("containerd")));
    }

    #[test]
    fn cgroupfs_driver_shapes_on_cgroup_v1() {
        for (qos, container, runtime) in [
            ("burstable/", ID.to_string(), None),
            ("besteffort/", ID.to_string(), None),
            ("", ID.to_string(), None),
            ("burstable/", format!("crio-{ID}"), Some("cri-o")),
        ] {
            let text = format!(
                "12:pids:/kubepods/{qos}pod{UID}/{container}\n\
                 11:memory:/kubepods/{qos}pod{UID}/{container}\n\
                 1:name=systemd:/kubepods/{qos}pod{UID}/{container}\n"
            );
            assert_eq!(parse(&text), pod(runtime), "{text}");
        }
    }

    #[test]
    fn the_first_pod_line_of_v1_wins_over_hierarchies_without_one() {
        let u = underscored();
        let text = format!(
            "13:rdma:/\n\
             12:cpuset:/\n\
             5:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/docker-{ID}.scope\n\
             0::/\n"
        );
        assert_eq!(parse(&text), pod(Some("docker")));
    }

    #[test]
    fn containerds_colon_spelling_of_systemd_paths_on_v1() {
        let u = underscored();
        let text = format!(
            "11:blkio:/system.slice/containerd.service/kubepods-burstable-pod{u}.slice:cri-containerd:{ID}\n\
             8:cpuset:/kubepods-burstable-pod{u}.slice:cri-containerd:{ID}\n"
        );
        assert_eq!(parse(&text), pod(Some("containerd")));
    }

    #[test]
    fn a_private_cgroup_namespace_shows_paths_from_above() {
        let u = underscored();
        let text =
            format!("0::/../../kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(parse(&text), pod(Some("containerd")));
    }

    #[test]
    fn pod_level_and_conmon_cgroups_have_no_container() {
        let u = underscored();
        let no_container = CgroupIdentity::Pod {
            uid: UID.to_string(),
            container: None,
        };
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice\n"
        );
        assert_eq!(parse(&text), no_container);
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/crio-conmon-{ID}.scope\n"
        );
        assert_eq!(parse(&text), no_container);
    }

    #[test]
    fn static_pods_are_named_by_their_config_hash() {
        let hash = "6b3d0b1f0a9a8e6b8f0d5c4b3a2e1f0d";
        let text = format!("0::/kubepods/besteffort/pod{hash}/{ID}\n");
        assert_eq!(
            parse(&text),
            CgroupIdentity::Pod {
                uid: hash.to_string(),
                container: Some(ContainerId {
                    id: ID.to_string(),
                    runtime: None
                }),
            }
        );
    }

    #[test]
    fn processes_outside_pods_are_not_pods() {
        for text in [
            "0::/process_api/3f9a1c0e7b5d4e2a\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n",
            "0::/\n",
            "0::/kubepods.slice/kubepods-besteffort.slice\n",
            "",
            "garbage without colons\n",
        ] {
            assert_eq!(parse(text), CgroupIdentity::NotPod, "{text:?}");
        }
    }

    #[test]
    fn kubepods_shapes_not_understood_are_unrecognised_not_guessed() {
        let u = underscored();
        for path in [
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/runc-{ID}.scope"),
            "/kubepods/burstable/podnot-a-uid/abc".to_string(),
            format!("/kubepods/burstable/pod{UID}/not-hex-at-all"),
        ] {
            let text = format!("0::{path}\n");
            assert_eq!(parse(&text), CgroupIdentity::Unrecognised(path.clone()), "{text}");
        }
    }

    #[test]
    fn hostile_text_never_panics() {
        for text in [
            "::::\n",
            "0::/kubepods/pod/\n",
            "0::/kubepods.slice/-pod.slice\n",
            "0::/kubepods/\u{202E}pod\n",
            "0::/kubepods/burstable/pod1f9c3a52-8e7b-4d2a-9c1e-5b6f7a8d9e0f/ü\n",
        ] {
            let _ = parse(text);
        }
    }
}
