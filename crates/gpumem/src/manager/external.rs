//! Buffers the manager did not allocate but should account for: memory an engine takes from the
//! driver itself (its own `cuMemAlloc`, NCCL buffers, cuBLAS workspaces) and registers with
//! [`MemoryManager::track_external`], so the page, `/metrics` and snapshots show it next to the
//! pools — counted apart from them, since the pools neither own nor free it.

use super::MemoryManager;
use crate::backend::DevicePtr;
use crate::error::BackendError;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Duration;
use thiserror::Error;

/// One registered outside buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExternalBuffer {
    pub device: usize,
    pub ptr: DevicePtr,
    pub bytes: u64,
    /// What it is, e.g. "nccl" or "cublas_workspace".
    pub tag: String,
    /// How long ago it was registered.
    pub age: Duration,
}

/// Why registering or unregistering an outside buffer failed.
#[derive(Debug, Error)]
pub enum ExternalError {
    #[error(transparent)]
    Device(#[from] BackendError),
    #[error("an outside buffer of 0 bytes cannot be tracked")]
    ZeroSize,
    #[error("device {device} already tracks an outside buffer at {ptr:#x}")]
    AlreadyTracked { device: usize, ptr: DevicePtr },
    #[error("device {device} tracks no outside buffer at {ptr:#x}")]
    NotTracked { device: usize, ptr: DevicePtr },
}

struct Entry {
    bytes: u64,
    tag: String,
    since_ticks: u64,
}

/// The registered buffers, by (device, pointer). Registering is rare (set-up, a new
/// communicator), so one lock is enough and the allocation path never touches it.
#[derive(Default)]
pub(crate) struct ExternalTable(Mutex<HashMap<(usize, DevicePtr), Entry>>);

impl MemoryManager {
    /// Counts `bytes` at `ptr` on `device`, allocated by someone else, under `tag` until
    /// [`untrack_external`](Self::untrack_external). The manager never frees it and its pools
    /// do not count it; it is shown apart (snapshot `external`, `gpumem_external_bytes`).
    pub fn track_external(
        &self,
        device: usize,
        ptr: DevicePtr,
        bytes: u64,
        tag: &str,
    ) -> Result<(), ExternalError> {
        self.device(device)?;
        if bytes == 0 {
            return Err(ExternalError::ZeroSize);
        }
        let mut table = self.shared().external.0.lock();
        if table.contains_key(&(device, ptr)) {
            return Err(ExternalError::AlreadyTracked { device, ptr });
        }
        // The tag rule of every tag (`tag::clean_tag`): it becomes a label and a page's text.
        let tag = match super::tag::clean_tag(tag) {
            cleaned if cleaned.is_empty() => super::tag::OTHER_TAG.to_string(),
            cleaned => cleaned,
        };
        let entry = Entry {
            bytes,
            tag,
            since_ticks: crate::clock::now(),
        };
        table.insert((device, ptr), entry);
        Ok(())
    }

    /// Stops counting the outside buffer at `ptr` on `device`; returns its size.
    pub fn untrack_external(&self, device: usize, ptr: DevicePtr) -> Result<u64, ExternalError> {
        self.device(device)?;
        let removed = self.shared().external.0.lock().remove(&(device, ptr));
        removed
            .map(|entry| entry.bytes)
            .ok_or(ExternalError::NotTracked { device, ptr })
    }

    /// Every registered outside buffer, largest first.
    pub fn external_buffers(&self) -> Vec<ExternalBuffer> {
        let now = crate::clock::now();
        let mut buffers: Vec<ExternalBuffer> = self
            .shared()
            .external
            .0
            .lock()
            .iter()
            .map(|(&(device, ptr), entry)| ExternalBuffer {
                device,
                ptr,
                bytes: entry.bytes,
                tag: entry.tag.clone(),
                age: crate::clock::between(entry.since_ticks, now),
            })
            .collect();
        buffers.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ptr.cmp(&b.ptr)));
        buffers
    }

    /// Bytes of the outside buffers registered on `device`.
    pub fn external_bytes(&self, device: usize) -> u64 {
        let table = self.shared().external.0.lock();
        table
            .iter()
            .filter(|((d, _), _)| *d == device)
            .map(|(_, entry)| entry.bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimConfig};
    use crate::manager::MemoryConfig;
    use crate::units::MIB;
    use std::sync::Arc;

    #[test]
    fn outside_buffers_are_counted_apart_and_checked() {
        let sim = Arc::new(SimBackend::new(SimConfig::default()));
        let m = MemoryManager::new(sim, MemoryConfig::default()).unwrap();
        m.track_external(0, 0x7000_0000, 512 * MIB, "nccl").unwrap();
        m.track_external(0, 0x9000_0000, 32 * MIB, "cublas_workspace")
            .unwrap();
        assert_eq!(m.external_bytes(0), 544 * MIB);
        assert_eq!(m.reserved_bytes(), 0, "the pools do not count them");
        let listed = m.external_buffers();
        assert_eq!(listed[0].tag, "nccl");
        assert_eq!(listed[1].bytes, 32 * MIB);
        assert!(matches!(
            m.track_external(0, 0x7000_0000, MIB, "again"),
            Err(ExternalError::AlreadyTracked { .. })
        ));
        assert!(matches!(
            m.track_external(0, 1, 0, "empty"),
            Err(ExternalError::ZeroSize)
        ));
        assert!(matches!(
            m.track_external(3, 1, MIB, "nowhere"),
            Err(ExternalError::Device(_))
        ));
        assert_eq!(m.untrack_external(0, 0x7000_0000).unwrap(), 512 * MIB);
        assert_eq!(m.external_bytes(0), 32 * MIB);
        let error = m.untrack_external(0, 0x7000_0000).unwrap_err();
        assert_eq!(
            error.to_string(),
            "device 0 tracks no outside buffer at 0x70000000"
        );
    }
}
