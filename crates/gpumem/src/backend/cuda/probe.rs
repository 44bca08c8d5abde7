//! Finding a usable CUDA driver without letting cudarc panic: the library cudarc would load, every
//! symbol this backend calls, `cuInit`, the driver version and the device count.

use super::check;
use crate::error::BackendError;
use cudarc::driver::sys::{self, CUresult};

/// Every driver function the CUDA backend calls, by the exact symbol cudarc resolves for it
/// (cudarc's `sys::cuMemAlloc_v2` loads `cuMemAlloc_v2`, and so on). Keep in step with the calls in
/// this module tree: a symbol missing here would make cudarc panic instead of us returning an error.
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorString",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuMemGetAllocationGranularity",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemRelease",
    "cuMemExportToShareableHandle",
    "cuMemcpyDtoD_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuCtxSynchronize",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventDestroy_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
];

/// The library names cudarc's `culib()` tries, in its order (`cuda`, then `nvcuda`, each through
/// `get_lib_name_candidates`); it keeps the first that loads, and so do we.
const LIBRARY_STEMS: [&str; 2] = ["cuda", "nvcuda"];

/// A driver that loaded, has every symbol, initialised and reports at least one device.
pub(super) struct Driver {
    pub library: libloading::Library,
    pub library_name: String,
    pub driver_version: i32,
    pub device_count: usize,
}

pub(super) fn probe() -> Result<Driver, BackendError> {
    let (library, library_name) = load_library()?;
    check_symbols(&library, &library_name)?;
    let unavailable = |err: BackendError| BackendError::DriverUnavailable {
        reason: format!("{library_name}: {err}"),
    };

    // SAFETY: every symbol cudarc resolves from here on exists in the library it will load (the
    // same name we just loaded); `cuInit` takes plain flags, and 0 is the only valid value.
    let result = unsafe { sys::cuInit(0) };
    if result == CUresult::CUDA_ERROR_STUB_LIBRARY {
        return Err(BackendError::DriverUnavailable {
            reason: format!(
                "{library_name} is the CUDA toolkit's stub library, not the NVIDIA driver (cuInit \
                 returned CUDA_ERROR_STUB_LIBRARY); take the toolkit's stubs directory off \
                 LD_LIBRARY_PATH"
            ),
        });
    }
    check("cuInit", result).map_err(unavailable)?;

    let mut driver_version = 0;
    // SAFETY: valid out-pointer; the driver is initialised.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut driver_version)
    })
    .map_err(unavailable)?;

    let mut count = 0;
    // SAFETY: valid out-pointer; the driver is initialised.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })
    .map_err(unavailable)?;
    let device_count = usize::try_from(count).unwrap_or(0);
    if device_count == 0 {
        return Err(BackendError::DriverUnavailable {
            reason: format!(
                "the CUDA driver reports no devices ({library_name}, CUDA {}.{})",
                driver_version / 1000,
                driver_version % 1000 / 10
            ),
        });
    }
    Ok(Driver {
        library,
        library_name,
        driver_version,
        device_count,
    })
}

/// Loads the first candidate that loads, exactly as cudarc's `culib()` chooses.
fn load_library() -> Result<(libloading::Library, String), BackendError> {
    let mut candidates: Vec<String> = Vec::new();
    for candidate in LIBRARY_STEMS
        .iter()
        .flat_map(|stem| cudarc::get_lib_name_candidates(stem))
    {
        // cudarc's list repeats some names; trying one twice changes nothing, so skip repeats.
        if !candidates.contains(&candidate) {
            candidates.push(candidate);
        }
    }
    for candidate in &candidates {
        // SAFETY: loading runs the library's initialisers. These are the names cudarc loads the
        // NVIDIA driver by, so this is the code cudarc would run anyway; we call nothing through
        // this handle, we only look symbols up.
        if let Ok(library) = unsafe { libloading::Library::new(candidate.as_str()) } {
            return Ok((library, candidate.clone()));
        }
    }
    Err(BackendError::DriverUnavailable {
        reason: format!(
            "libcuda.so.1 could not be loaded (nor {} other names cudarc tries); is the NVIDIA \
             driver installed and on the loader path?",
            candidates.len().saturating_sub(1)
        ),
    })
}

/// Fails with the missing symbols' names when `library` lacks any of [`DRIVER_SYMBOLS`].
fn check_symbols(library: &libloading::Library, name: &str) -> Result<(), BackendError> {
    let missing: Vec<&str> = DRIVER_SYMBOLS
        .iter()
        .copied()
        // SAFETY: looking a symbol up only reads the library's symbol table; the pointer we get
        // back is discarded, never called or dereferenced.
        .filter(|symbol| unsafe { library.get::<*const ()>(*symbol) }.is_err())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 5;
    let mut list = missing[..missing.len().min(SHOWN)].join(", ");
    if missing.len() > SHOWN {
        list.push_str(&format!(" and {} more", missing.len() - SHOWN));
    }
    Err(BackendError::DriverUnavailable {
        reason: format!(
            "{name} is missing {} of the {} driver functions gpumem calls (missing symbols: \
             {list}); the library is a stub or the driver is too old",
            missing.len(),
            DRIVER_SYMBOLS.len()
        ),
    })
}
