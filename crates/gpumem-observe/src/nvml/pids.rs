//! Mapping NVML's pids to processes this collector can see. NVML reports pids in the host's PID
//! namespace. In the host namespace (`hostPID: true`, or no container) `/proc/<pid>` is that
//! process, and its `NStgid` line gives the pid its own container sees (what it publishes). In a
//! container's namespace a host pid means nothing: a `/proc/<pid>` of the same number is
//! believed only when its name agrees with the name NVML gives, else the process is not mapped.

use std::path::{Path, PathBuf};

/// `PROC_PID_INIT_INO`: the inode of the initial PID namespace, the same on every Linux.
const ROOT_PID_NAMESPACE: &str = "pid:[4026531836]";
/// `comm` is cut to 15 bytes by the kernel.
const COMM_LEN: usize = 15;

/// A process NVML reported, as this collector sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The pid in the process's own (innermost) namespace: what it publishes as its pid.
    pub pid: u32,
    /// Its name (`/proc/<pid>/status` `Name:`).
    pub process: String,
}

/// Maps NVML pids; see the module documentation.
#[derive(Clone, Debug)]
pub struct PidMapper {
    proc_root: PathBuf,
    host_namespace: bool,
}

impl Default for PidMapper {
    fn default() -> Self {
        Self::new()
    }
}

impl PidMapper {
    pub fn new() -> Self {
        let namespace = std::fs::read_link("/proc/self/ns/pid")
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default();
        PidMapper {
            proc_root: PathBuf::from("/proc"),
            host_namespace: namespace == ROOT_PID_NAMESPACE,
        }
    }

    /// A mapper over another `/proc` (for tests).
    pub fn with_proc_root(proc_root: impl Into<PathBuf>, host_namespace: bool) -> Self {
        PidMapper {
            proc_root: proc_root.into(),
            host_namespace,
        }
    }

    /// The process behind an NVML pid, when it can be told; `nvml_name` is NVML's own name.
    pub fn map(&self, nvml_pid: u32, nvml_name: Option<&str>) -> Option<Mapping> {
        let status = read_status(&self.proc_root, nvml_pid)?;
        if self.host_namespace {
            return Some(status);
        }
        let nvml_name = nvml_name?;
        let base = Path::new(nvml_name.trim())
            .file_name()?
            .to_string_lossy()
            .into_owned();
        let same = |a: &str, b: &str| a.bytes().take(COMM_LEN).eq(b.bytes().take(COMM_LEN));
        same(&base, &status.process).then_some(status)
    }
}

/// `Name:` and the innermost `NStgid:` of `/proc/<pid>/status`; without a readable status,
/// the name from `comm`, else from the first word of `cmdline`, and the pid as it is.
fn read_status(proc_root: &Path, pid: u32) -> Option<Mapping> {
    let dir = proc_root.join(pid.to_string());
    let Ok(text) = std::fs::read_to_string(dir.join("status")) else {
        return Some(Mapping {
            pid,
            process: command_name(&dir)?,
        });
    };
    let mut process = None;
    let mut innermost = pid;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("Name:") {
            process = Some(name.trim().to_string());
        } else if let Some(ids) = line.strip_prefix("NStgid:") {
            if let Some(last) = ids.split_whitespace().last().and_then(|p| p.parse().ok()) {
                innermost = last;
            }
        }
    }
    Some(Mapping {
        pid: innermost,
        process: process.filter(|n| !n.is_empty())?,
    })
}

/// The command's name: `comm`, else the file name of `cmdline`'s first word.
fn command_name(dir: &Path) -> Option<String> {
    if let Ok(comm) = std::fs::read_to_string(dir.join("comm")) {
        let comm = comm.trim();
        if !comm.is_empty() {
            return Some(comm.to_string());
        }
    }
    let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
    let first = cmdline.split(|b| *b == 0).next()?;
    let first = String::from_utf8_lossy(first);
    let name = Path::new(first.trim())
        .file_name()?
        .to_string_lossy()
        .into_owned();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(entries: &[(u32, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "gpumem-proc-{}-{}",
            std::process::id(),
            entries.len()
        ));
        for (pid, status) in entries {
            let dir = root.join(pid.to_string());
            std::fs::create_dir_all(&dir).expect("temp dir");
            std::fs::write(dir.join("status"), status).expect("write");
        }
        root
    }

    #[test]
    fn host_pids_map_to_the_containers_own_pid() {
        let root = fake_proc(&[(4242, "Name:\tpython3\nNStgid:\t4242\t7\n")]);
        let host = PidMapper::with_proc_root(&root, true);
        let expected = Mapping {
            pid: 7,
            process: "python3".into(),
        };
        assert_eq!(host.map(4242, None), Some(expected.clone()));
        assert_eq!(host.map(1, None), None, "no such process");

        // Outside the host namespace only an agreeing name is believed.
        let pod = PidMapper::with_proc_root(&root, false);
        assert_eq!(pod.map(4242, None), None);
        assert_eq!(pod.map(4242, Some("/usr/bin/bash")), None);
        assert_eq!(pod.map(4242, Some("/usr/bin/python3")), Some(expected));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn without_status_the_command_names_the_process() {
        let root = tempfile::tempdir().expect("temp dir");
        let comm = root.path().join("10");
        let cmdline = root.path().join("11");
        std::fs::create_dir_all(&comm).expect("mkdir");
        std::fs::create_dir_all(&cmdline).expect("mkdir");
        std::fs::write(comm.join("comm"), "python3\n").expect("write");
        std::fs::write(cmdline.join("cmdline"), b"/opt/venv/bin/vllm\0serve\0").expect("write");
        let host = PidMapper::with_proc_root(root.path(), true);
        assert_eq!(
            host.map(10, None).map(|m| m.process),
            Some("python3".into())
        );
        assert_eq!(
            host.map(11, None).map(|m| (m.pid, m.process)),
            Some((11, "vllm".into()))
        );
        assert_eq!(host.map(12, None), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_maps_to_itself_in_the_host_namespace() {
        let mapper = PidMapper::with_proc_root("/proc", true);
        let me = mapper.map(std::process::id(), None).expect("own status");
        assert!(!me.process.is_empty());
        assert_eq!(
            me.pid,
            std::process::id(),
            "our own namespace is the innermost"
        );
    }
}
