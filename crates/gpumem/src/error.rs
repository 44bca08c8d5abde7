//! Error types a caller can act on: what the device said, and what the allocator decided.

use crate::units::Bytes;
use thiserror::Error;

/// Errors from a [`DeviceBackend`](crate::backend::DeviceBackend): the driver or the simulated device.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum BackendError {
    #[error("device {requested} does not exist: {} device(s) present{}", .count, device_list(*.count))]
    InvalidDevice { requested: usize, count: usize },

    #[error("device {device} is out of memory: requested {}, {} free", Bytes(*.requested), Bytes(*.free))]
    OutOfMemory {
        device: usize,
        requested: u64,
        free: u64,
    },

    #[error("CUDA driver unavailable: {reason}")]
    DriverUnavailable { reason: String },

    #[error("{call} failed with CUDA error {code} ({message})")]
    DriverCall {
        call: &'static str,
        code: i32,
        message: String,
    },

    #[error(
        "device {device}: address {ptr:#x} is not a live allocation (unknown or already freed)"
    )]
    InvalidAddress { device: usize, ptr: u64 },

    #[error("invalid argument to {call}: {reason}")]
    InvalidArgument { call: &'static str, reason: String },

    #[error(
        "device {device}: stream {stream:#x} is capturing a CUDA graph, so its work cannot be \
         waited for until the graph is replayed"
    )]
    StreamCapturing { device: usize, stream: u64 },

    #[error("injected fault: {0}")]
    Injected(&'static str),
}

fn device_list(count: usize) -> String {
    match count {
        0 => String::new(),
        1 => " (valid index: 0)".to_string(),
        n => format!(" (valid indices: 0..={})", n - 1),
    }
}

/// Errors from [`MemoryManager`](crate::manager::MemoryManager) allocation calls.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum AllocError {
    #[error("zero-size allocation requested")]
    ZeroSize,

    #[error("alignment {0} is not a power of two no larger than the device's page size (its allocation granularity)")]
    InvalidAlignment(u64),

    #[error(
        "allocation of {} can never fit on device {device}, which has {} in total",
        Bytes(*.requested), Bytes(*.total)
    )]
    TooLarge {
        device: usize,
        requested: u64,
        total: u64,
    },

    #[error(
        "out of memory on device {device}: requested {}; device free {} of {}; \
         held by this process's pools {} of which {} in use and {} cached but unusable for this request. \
         Try: free or shrink other buffers (largest live tags are shown on the status page), \
         call empty_cache(), lower the batch size, or set a gpu_memory_fraction that leaves room for other processes",
        Bytes(*.requested), Bytes(*.device_free), Bytes(*.device_total),
        Bytes(*.reserved), Bytes(*.in_use), Bytes(.reserved.saturating_sub(*.in_use))
    )]
    OutOfMemory {
        device: usize,
        requested: u64,
        device_free: u64,
        device_total: u64,
        reserved: u64,
        in_use: u64,
    },

    #[error(
        "pool on device {device} is capped at {} by configuration (gpu_memory_fraction / max_pool_size); \
         {} requested with {} reserved. Try: free buffers, call empty_cache(), or raise the cap",
        Bytes(*.limit), Bytes(*.requested), Bytes(*.reserved)
    )]
    PoolLimit {
        device: usize,
        requested: u64,
        /// What the device's pools hold from the driver (live blocks and cache) when refused.
        reserved: u64,
        limit: u64,
    },

    #[error(
        "device {device} is at critical memory pressure: allocating {} would leave {} free, \
         below the {} kept free (min_free_bytes); free memory, lower the batch size, or enable cpu_fallback",
        Bytes(*.requested), Bytes(.free.saturating_sub(*.requested)), Bytes(*.min_free)
    )]
    PressureCritical {
        device: usize,
        requested: u64,
        free: u64,
        min_free: u64,
    },

    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl AllocError {
    /// True for failures that might succeed later (memory freed elsewhere), false for ones that never will.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            AllocError::OutOfMemory { .. }
                | AllocError::PoolLimit { .. }
                | AllocError::PressureCritical { .. }
                | AllocError::Backend(BackendError::OutOfMemory { .. })
        )
    }
}

/// A configuration that cannot be used: names where the problem is (a key, `FILE: key`, a
/// `GPUMEM_*` variable, or the file itself), so a user can find it.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("configuration `{key}`: {message}")]
pub struct ConfigError {
    /// The key, or the file and key, or the file alone when the file itself is the problem.
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Why a `MemoryManager` could not be created.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum InitError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("could not start the upkeep thread: {0}")]
    Thread(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_device_names_the_devices_that_exist() {
        let err = BackendError::InvalidDevice {
            requested: 7,
            count: 2,
        };
        assert_eq!(
            err.to_string(),
            "device 7 does not exist: 2 device(s) present (valid indices: 0..=1)"
        );
    }

    #[test]
    fn out_of_memory_message_says_what_to_try() {
        let err = AllocError::OutOfMemory {
            device: 0,
            requested: 1 << 30,
            device_free: 1 << 20,
            device_total: 80 << 30,
            reserved: 3 << 30,
            in_use: 2 << 30,
        };
        let text = err.to_string();
        assert!(text.contains("requested 1.00 GiB"), "{text}");
        assert!(text.contains("1.00 GiB cached"), "{text}");
        assert!(text.contains("empty_cache()"), "{text}");
        assert!(err.is_out_of_memory());
    }
}
