//! The driver's own stream-ordered pool (`cuMemAllocAsync` / `cuMemFreeAsync` on the device's
//! default memory pool): not used by gpumem's pools, but the baseline they are benchmarked and
//! replayed against, so it lives beside the other driver calls.

use super::{check, to_usize, CudaBackend};
use crate::backend::{DevicePtr, DriverPool, StreamOrder};
use crate::error::BackendError;
use cudarc::driver::sys;

/// Symbols the stream-ordered baseline needs; older drivers may lack them, so they are checked
/// when first used instead of at `open`.
const STREAM_ORDERED_SYMBOLS: [&str; 6] = [
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuDeviceGetDefaultMemPool",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
];

impl DriverPool for CudaBackend {
    /// Prepares the device's default pool as the baselines use it: nothing is returned to the
    /// OS on synchronisation (release threshold = max), so it caches like a pool.
    fn prepare_stream_ordered_pool(&self, device: usize) -> Result<(), BackendError> {
        for symbol in STREAM_ORDERED_SYMBOLS {
            // SAFETY: looking a symbol up only reads the library's symbol table; the pointer is
            // discarded, never called.
            if unsafe { self.library().get::<*const ()>(symbol) }.is_err() {
                return Err(BackendError::DriverUnavailable {
                    reason: format!("the driver lacks {symbol} (stream-ordered allocation)"),
                });
            }
        }
        let pool = self.default_pool(device)?;
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the release threshold attribute takes a pointer to a cuuint64_t, which
        // `threshold` is, alive for the duration of the call.
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        })
    }

    /// `cuMemAllocAsync` on the legacy default stream. Call
    /// [`prepare_stream_ordered_pool`](Self::prepare_stream_ordered_pool) once first.
    fn alloc_stream_ordered(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        self.make_current(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the null stream is the legacy default stream of the current
        // context; `prepare_stream_ordered_pool` checked the symbol exists.
        check("cuMemAllocAsync", unsafe {
            sys::cuMemAllocAsync(
                &mut ptr,
                to_usize("alloc_stream_ordered", size)?,
                std::ptr::null_mut(),
            )
        })?;
        Ok(ptr)
    }

    /// `cuMemFreeAsync` on the legacy default stream.
    fn free_stream_ordered(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError> {
        self.make_current(device)?;
        // SAFETY: `ptr` came from `alloc_stream_ordered`; the driver validates it.
        check("cuMemFreeAsync", unsafe {
            sys::cuMemFreeAsync(ptr, std::ptr::null_mut())
        })
    }

    /// Bytes the device's default pool holds from the driver now, and its high-water mark
    /// since the last [`reset_stream_ordered_peak`](Self::reset_stream_ordered_peak).
    fn stream_ordered_reserved(&self, device: usize) -> Result<(u64, u64), BackendError> {
        let pool = self.default_pool(device)?;
        let read = |attr: sys::CUmemPool_attribute| -> Result<u64, BackendError> {
            let mut value: u64 = 0;
            // SAFETY: the reserved-memory attributes write one cuuint64_t, which `value` is.
            check("cuMemPoolGetAttribute", unsafe {
                sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast())
            })?;
            Ok(value)
        };
        Ok((
            read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        ))
    }

    /// Restarts the default pool's high-water mark of reserved bytes.
    fn reset_stream_ordered_peak(&self, device: usize) -> Result<(), BackendError> {
        let pool = self.default_pool(device)?;
        let mut zero: u64 = 0;
        // SAFETY: the high-water attribute takes a pointer to a cuuint64_t (which must be 0).
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        })
    }

    /// Returns everything the default pool caches to the driver (after the stream is idle).
    fn trim_stream_ordered_pool(&self, device: usize) -> Result<(), BackendError> {
        self.synchronize_stream(device, crate::backend::StreamId::DEFAULT)?;
        let pool = self.default_pool(device)?;
        // SAFETY: `pool` is the device's default pool; trimming to 0 keeps what is in use.
        check("cuMemPoolTrimTo", unsafe { sys::cuMemPoolTrimTo(pool, 0) })
    }
}

impl CudaBackend {
    fn default_pool(&self, device: usize) -> Result<sys::CUmemoryPool, BackendError> {
        let dev = self.make_current(device)?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device handle came from cuDeviceGet.
        check("cuDeviceGetDefaultMemPool", unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, dev.handle)
        })?;
        Ok(pool)
    }
}
