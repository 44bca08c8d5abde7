//! NVML on a GPU host: device memory and per-process memory as `gpumem serve` reports them,
//! against NVML itself (and `nvidia-smi` where installed), and proof that the sidecar creates no
//! CUDA context. Skipped without NVML, unless GPUMEM_REQUIRE_GPU=1, which makes a missing NVML a
//! failure.

use super::{publishing_demo, serve, TempDir};
use crate::support::gpu_required;
use crate::web::{eventually, get, value_of};
use gpumem_observe::nvml::NvmlReader;
use std::time::Duration;

fn nvml() -> Option<NvmlReader> {
    match NvmlReader::open(None) {
        Ok(reader) => Some(reader),
        Err(error) if gpu_required() => {
            panic!("GPUMEM_REQUIRE_GPU=1 but NVML is unavailable: {error}")
        }
        Err(error) => {
            eprintln!("skipped: no NVML: {error}");
            None
        }
    }
}

/// Compute processes (CUDA contexts) on every device, by NVML's own account.
fn compute_processes(reader: &NvmlReader) -> usize {
    let devices = reader.read(None).expect("NVML reads");
    devices
        .iter()
        .map(|d| d.processes.as_ref().expect("process list").len())
        .sum()
}

#[test]
fn nvml_reports_each_device_with_memory_and_a_uuid() {
    let Some(reader) = nvml() else { return };
    assert!(reader.device_count() > 0, "NVML without devices");
    for device in reader.read(None).expect("NVML reads") {
        let memory = device.memory.as_ref().expect("memory");
        assert!(
            memory.total > 0 && memory.free <= memory.total,
            "{device:?}"
        );
        assert!(device.uuid.starts_with("GPU-"), "{device:?}");
        assert!(device.processes.is_ok(), "{device:?}");
    }
}

#[test]
fn serve_reports_nvml_memory_and_the_demo_without_a_context_of_its_own() {
    let Some(reader) = nvml() else { return };
    let dir = TempDir::new("gpu-serve");
    let before = compute_processes(&reader);
    let sidecar = serve(&dir, &[]);
    std::thread::sleep(Duration::from_secs(2));
    let metrics = get(sidecar.addr, "/metrics").body;
    assert_eq!(
        value_of(&metrics, "gpumem_up", "source=\"nvml\""),
        Some(1.0),
        "{metrics}"
    );
    let device = &reader.read(Some(&[0])).expect("reads")[0];
    // Usable memory: NVML's total less what the driver reserves, as cuMemGetInfo counts it.
    let memory = device.memory.as_ref().expect("memory");
    let total = (memory.used + memory.free) as f64;
    let labels = format!("gpu=\"0\",uuid=\"{}\"", device.uuid);
    assert_eq!(
        value_of(&metrics, "gpumem_device_memory_total_bytes", &labels),
        Some(total),
        "{metrics}"
    );
    assert_eq!(
        compute_processes(&reader),
        before,
        "gpumem serve must not create a CUDA context"
    );

    // A CUDA demo on GPU 0 shows up as a process with device memory, and publishes.
    let demo = publishing_demo(&dir, &["--backend", "cuda", "--devices", "0"]);
    assert!(
        eventually(Duration::from_secs(20), || {
            let text = get(sidecar.addr, "/metrics").body;
            let used =
                value_of(&text, "gpumem_process_used_bytes", "gpu=\"0\"").is_some_and(|v| v > 0.0);
            let published = value_of(
                &text,
                "gpumem_reserved_bytes",
                &format!("pid=\"{}\"", demo.pid()),
            )
            .is_some_and(|v| v > 0.0);
            used && published
        }),
        "the demo's NVML memory and its published snapshot should both show: {}",
        get(sidecar.addr, "/metrics").body
    );
    assert_eq!(
        compute_processes(&reader),
        before + 1,
        "only the demo has a context"
    );
}
