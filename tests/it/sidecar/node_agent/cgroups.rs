//! The fixture `/proc` trees of `tests/fixtures/proc` (one per cgroup shape; origins in its
//! README): each one's cgroup file read as the node agent reads it, and the process named as
//! the agent names it. Every shape of the README is here, and every directory is in the table.

use gpumem_observe::nvml::PidMapper;
use gpumem_observe::pods::cgroup::{parse, CgroupIdentity, ContainerId};
use std::path::{Path, PathBuf};

/// Where the fixtures live.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc")
}

/// What each fixture's process is: (fixture, pid, pod UID and container ID and runtime, or
/// `None` for "not a pod" — or `Err` for a shape the agent must not guess, and its name).
type Expected = Option<(&'static str, &'static str, Option<&'static str>)>;
pub(crate) const TABLE: &[(&str, u32, Result<Expected, ()>, &str)] = &[
    (
        "v2-systemd-containerd",
        4121,
        Ok(Some((
            "58fec61d-0319-46fa-8724-c7f72270dd45",
            "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb",
            Some("containerd"),
        ))),
        "python3",
    ),
    (
        "v2-systemd-containerd-guaranteed",
        4122,
        Ok(Some((
            "328aeafc-c46a-4cc8-8843-93c531248c38",
            "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d",
            Some("containerd"),
        ))),
        "python3",
    ),
    (
        "v2-systemd-crio",
        4123,
        Ok(Some((
            "27094941-ee5e-471c-83f3-4c3f6125ab9f",
            "2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6",
            Some("cri-o"),
        ))),
        "tritonserver",
    ),
    (
        "v2-systemd-docker",
        4124,
        Ok(Some((
            "71e0c3e0-c950-4339-8ba6-10d4a1f7291c",
            "18ac3e7343f016890c510e93f935261169d9e3f565436429830faf0934f4f8e4",
            Some("docker"),
        ))),
        "python",
    ),
    (
        "v2-cgroupfs-containerd",
        4125,
        Ok(Some((
            "43d945b7-b784-4fcc-8e78-f31ad19a7b44",
            "3f79bb7b435b05321651daefd374cdc681dc06faa65e374e38337b88ca046dea",
            None,
        ))),
        "python3",
    ),
    (
        "v2-cgroupfs-crio",
        4134,
        Ok(Some((
            "a9e73ecf-3742-4c2f-8202-a05591ae8467",
            "1b16b1df538ba12dc3f97edbb85caa7050d46c148134290feba80f8236c83db9",
            Some("cri-o"),
        ))),
        "python3",
    ),
    (
        "v2-cgroupfs-docker",
        4135,
        Ok(Some((
            "735a9138-5423-411d-8c3c-bf1964ab910c",
            "65c74c15a686187bb6bbf9958f494fc6b80068034a659a9ad44991b08c58f2d2",
            None,
        ))),
        "python3",
    ),
    (
        "v2-private-cgroupns-containerd",
        4126,
        Ok(Some((
            "95a16349-92c7-4ce3-8902-aca34e06a75b",
            "252f10c83610ebca1a059c0bae8255eba2f95be4d1d7bcfa89d7248a82d9f111",
            Some("containerd"),
        ))),
        "python3",
    ),
    (
        "v1-systemd-crio",
        4127,
        Ok(Some((
            "53f98186-3f39-4226-8ea7-0973fa91c453",
            "cd0aa9856147b6c5b4ff2b7dfee5da20aa38253099ef1b4a64aced233c9afe29",
            Some("cri-o"),
        ))),
        "python3",
    ),
    (
        "v1-systemd-docker",
        4128,
        Ok(Some((
            "3a03b7d3-7c11-4803-8e99-7830c1d5f7cc",
            "aaa9402664f1a41f40ebbc52c9993eb66aeb366602958fdfaa283b71e64db123",
            Some("docker"),
        ))),
        "python3",
    ),
    (
        "v1-systemd-containerd-colon",
        4129,
        Ok(Some((
            "c7493a9d-a3e5-499d-83fa-7737e152548b",
            "de7d1b721a1e0632b7cf04edf5032c8ecffa9f9a08492152b926f1a5a7e765d7",
            Some("containerd"),
        ))),
        "python3",
    ),
    (
        "v1-cgroupfs-docker",
        4130,
        Ok(Some((
            "a63bf7ce-38db-4ccb-8575-1acc620ef533",
            "189f40034be7a199f1fa9891668ee3ab6049f82d38c68be70f596eab2e1857b7",
            None,
        ))),
        "python3",
    ),
    (
        "v1-cgroupfs-containerd",
        4131,
        Ok(Some((
            "5142bad9-16d2-4668-8dd4-505bd3412477",
            "8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a",
            None,
        ))),
        "python3",
    ),
    (
        "v1-cgroupfs-crio",
        4132,
        Ok(Some((
            "8ec168e8-fbdc-4c8a-89db-75c8029f234e",
            "acac86c0e609ca906f632b0e2dacccb2b77d22b0621f20ebece1a4835b93f6f0",
            Some("cri-o"),
        ))),
        "python3",
    ),
    (
        "v2-static-pod",
        4133,
        Ok(Some((
            "2053dbbf6ec7135c4e994d3464c478db",
            "62c66a7a5dd70c3146618063c344e531e6d4b59e379808443ce962b3abd63c5a",
            Some("containerd"),
        ))),
        "python3",
    ),
    ("not-a-pod-gpu-host", 4140, Ok(None), "python3"),
    ("not-a-pod-systemd-service", 4141, Ok(None), "tritonserver"),
    ("not-a-pod-cgroup-v1-host", 4142, Ok(None), "python3"),
    ("unknown-kubepods-shape", 4150, Err(()), "python3"),
];

#[test]
fn every_fixture_shape_is_read_as_its_origin_says() {
    for (fixture, pid, expected, name) in TABLE {
        let root = fixtures().join(fixture);
        let text = std::fs::read_to_string(root.join(pid.to_string()).join("cgroup"))
            .unwrap_or_else(|e| panic!("{fixture}: {e}"));
        let found = parse(&text);
        match expected {
            Ok(Some((uid, id, runtime))) => assert_eq!(
                found,
                CgroupIdentity::Pod {
                    uid: uid.to_string(),
                    container: Some(ContainerId {
                        id: id.to_string(),
                        runtime: *runtime
                    }),
                },
                "{fixture}"
            ),
            Ok(None) => assert_eq!(found, CgroupIdentity::NotPod, "{fixture}"),
            Err(()) => assert!(
                matches!(found, CgroupIdentity::Unrecognised(_)),
                "{fixture}: {found:?}"
            ),
        }
        // Named by its command, whichever of status, comm and cmdline the fixture has.
        let mapped = PidMapper::with_proc_root(&root, true)
            .map(*pid, None)
            .unwrap_or_else(|| panic!("{fixture}: no name"));
        assert_eq!(mapped.process, *name, "{fixture}");
    }
}

#[test]
fn the_table_covers_every_fixture_and_the_readme_documents_each() {
    let readme = std::fs::read_to_string(fixtures().join("README.md")).expect("README");
    let mut on_disk: Vec<String> = std::fs::read_dir(fixtures())
        .expect("fixtures")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = TABLE.iter().map(|(f, ..)| f.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    for fixture in &listed {
        assert!(
            readme.contains(&format!("`{fixture}`")),
            "{fixture} has no origin in the README"
        );
    }
    // cgroup v1 and v2, containerd, CRI-O and Docker, systemd and cgroupfs: each met.
    for (version, runtime, driver) in [
        ("v1", "containerd", "systemd"),
        ("v1", "crio", "systemd"),
        ("v1", "docker", "systemd"),
        ("v1", "containerd", "cgroupfs"),
        ("v1", "crio", "cgroupfs"),
        ("v1", "docker", "cgroupfs"),
        ("v2", "containerd", "systemd"),
        ("v2", "crio", "systemd"),
        ("v2", "docker", "systemd"),
        ("v2", "containerd", "cgroupfs"),
        ("v2", "crio", "cgroupfs"),
        ("v2", "docker", "cgroupfs"),
    ] {
        assert!(
            listed
                .iter()
                .any(|f| f.starts_with(version) && f.contains(runtime) && f.contains(driver)),
            "no {version} {runtime} {driver} fixture"
        );
    }
}
