//! The one line a flight record is logged and listed with: what happened, to whom, on which
//! device — and who held the device's memory, from what the record already holds ("29.9 GiB
//! held by pid 4121, pod vllm-0 / inference"), so the page and the log answer "who filled the
//! GPU?" without opening the file.

use super::record::{FlightRecord, OtherProcess, RecordProcess, Trigger};
use gpumem::units::{Bytes, GIB, MIB};

/// Holders named in the line, at most.
const HOLDERS_NAMED: usize = 3;

/// The one line logged for a record (and shown in lists).
pub(super) fn summary(record: &FlightRecord) -> String {
    let device = &record.device;
    let who = record
        .process
        .as_ref()
        .map(|p| format!(" ({})", process_phrase(p)))
        .unwrap_or_default();
    let memory = device
        .memory
        .map(|m| format!("{} used of {}", Bytes(m.used_bytes), Bytes(m.total_bytes)))
        .unwrap_or_else(|| "device memory unknown".to_string());
    let line = match record.trigger {
        Trigger::Oom => {
            let latest = record
                .request
                .as_ref()
                .map(|r| {
                    format!(
                        ", the latest {} for tag {} ({})",
                        Bytes(r.requested_bytes),
                        r.tag.as_deref().unwrap_or("untagged"),
                        r.kind.replace('_', " ")
                    )
                })
                .unwrap_or_default();
            let cached: u64 = record
                .pools
                .iter()
                .filter_map(|p| p.cached_free_bytes)
                .sum();
            let largest = record
                .pools
                .iter()
                .filter_map(|p| p.largest_free_block_bytes)
                .max()
                .unwrap_or(0);
            format!(
                "out of memory on GPU {}{who}: {} allocation(s) refused{latest}; device {memory}; pools cache {} free, largest block {}",
                device.gpu,
                record.ooms_since_previous,
                Bytes(cached),
                Bytes(largest)
            )
        }
        Trigger::CriticalPressure => {
            let ratio = device
                .pressure
                .map(|p| format!("{:.1} % of usable memory", p.used_ratio * 100.0))
                .unwrap_or_else(|| "usable memory".to_string());
            format!(
                "GPU {}{who} rose to critical memory pressure: {ratio} in use; device {memory}",
                device.gpu
            )
        }
        Trigger::Exited => {
            let whom = record
                .process
                .as_ref()
                .map(process_phrase)
                .unwrap_or_else(|| "a process".to_string());
            let why = match record.exit_reason.as_deref() {
                Some("restarted") => "is gone: its container restarted",
                _ => "is gone",
            };
            let held = record
                .held_bytes
                .map(|b| format!(" holding {}", short_bytes(b)))
                .unwrap_or_default();
            format!("{whom} {why}, on GPU {}{held}; device {memory}", device.gpu)
        }
    };
    match holders(&record.other_processes) {
        Some(holders) => format!("{line}; biggest holders: {holders}"),
        None => match others_held(record) {
            Some(others) => format!("{line}; {others}"),
            None => line,
        },
    }
}

/// What the rest of the device held when no other process can be named (a simulated device,
/// no NVML, NVML without per-process memory): `other processes held 35.6 GiB of 80.0 GiB`,
/// from the device's own count. Not for a vanished process: its line is about what it held.
fn others_held(record: &FlightRecord) -> Option<String> {
    if record.trigger == Trigger::Exited {
        return None;
    }
    let memory = record.device.memory?;
    (memory.used_by_others_bytes > 0).then(|| {
        format!(
            "other processes held {} of {}",
            short_bytes(memory.used_by_others_bytes),
            short_bytes(memory.total_bytes)
        )
    })
}

/// `pid 4121, pod serving/vllm-0 / inference`, or `engine pid 41` outside a pod.
fn process_phrase(process: &RecordProcess) -> String {
    match &process.pod {
        Some(pod) => format!(
            "{} pid {}, pod {}/{}",
            process.process,
            process.pid,
            pod.namespace,
            pod.short()
        ),
        None => format!("{} pid {}", process.process, process.pid),
    }
}

/// The largest holders, biggest first: `29.9 GiB held by pid 4121, pod vllm-0 / inference`.
fn holders(others: &[OtherProcess]) -> Option<String> {
    let mut known: Vec<&OtherProcess> = others
        .iter()
        .filter(|o| o.used_bytes.is_some_and(|b| b > 0))
        .collect();
    known.sort_by_key(|o| std::cmp::Reverse(o.used_bytes));
    let named: Vec<String> = known
        .iter()
        .take(HOLDERS_NAMED)
        .map(|o| {
            let bytes = short_bytes(o.used_bytes.unwrap_or(0));
            match &o.pod {
                Some(pod) => format!("{bytes} held by pid {}, pod {}", o.pid, pod.short()),
                None => format!("{bytes} held by pid {} ({})", o.pid, o.process),
            }
        })
        .collect();
    (!named.is_empty()).then(|| named.join(", "))
}

/// `29.9 GiB`, `512.0 MiB`: one decimal is what a person reads in a line.
fn short_bytes(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        Bytes(bytes).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_wire::PodRef;

    fn holder(pid: u32, gib: f64, pod: Option<(&str, &str)>) -> OtherProcess {
        OtherProcess {
            pid,
            process: "python3".into(),
            used_bytes: Some((gib * GIB as f64) as u64),
            source: "nvml".into(),
            pod: pod.map(|(pod, container)| PodRef {
                namespace: "serving".into(),
                pod: pod.into(),
                container: Some(container.into()),
                ..PodRef::default()
            }),
        }
    }

    #[test]
    fn the_line_names_the_biggest_holders_with_their_pods() {
        let others = vec![
            holder(77, 2.0, None),
            holder(4121, 29.9, Some(("vllm-0", "inference"))),
            holder(5, 0.0, None),
            holder(6, 1.0, None),
            holder(9, 0.5, None),
        ];
        let line = holders(&others).expect("holders");
        assert_eq!(
            line,
            "29.9 GiB held by pid 4121, pod vllm-0 / inference, 2.0 GiB held by pid 77 (python3), \
             1.0 GiB held by pid 6 (python3)"
        );
        assert_eq!(holders(&[holder(5, 0.0, None)]), None);
    }

    /// The demo's spike on the simulated device: no process to name, but the device knows what
    /// the rest of it held, and the line says so; named holders take its place where known.
    #[test]
    fn without_named_holders_the_line_says_what_other_processes_held() {
        let due = super::super::Due {
            trigger: Trigger::Oom,
            new_ooms: 3,
            previous_ooms: 0,
        };
        let mut record = super::super::blank(due, 0.0);
        record.device.memory = Some(gpumem_wire::DeviceMemory {
            total_bytes: 80 * GIB,
            free_bytes: GIB,
            used_bytes: 79 * GIB,
            used_by_this_process_bytes: 79 * GIB - (35.6 * GIB as f64) as u64,
            used_by_others_bytes: (35.6 * GIB as f64) as u64,
        });
        let line = summary(&record);
        assert!(
            line.ends_with("; other processes held 35.6 GiB of 80.0 GiB"),
            "{line}"
        );
        assert!(line.starts_with("out of memory on GPU 0"), "{line}");

        record.other_processes = vec![holder(4121, 29.9, Some(("vllm-0", "inference")))];
        let line = summary(&record);
        assert!(!line.contains("other processes held"), "{line}");
        assert!(
            line.contains("biggest holders: 29.9 GiB held by pid 4121"),
            "{line}"
        );

        // A vanished process's line is about what it held, not the rest of the device.
        record.other_processes.clear();
        record.trigger = Trigger::Exited;
        assert!(!summary(&record).contains("other processes held"));
        // Nobody else holding anything: nothing added.
        record.trigger = Trigger::CriticalPressure;
        if let Some(memory) = record.device.memory.as_mut() {
            memory.used_by_others_bytes = 0;
        }
        assert!(!summary(&record).contains("other processes"));
    }
}
