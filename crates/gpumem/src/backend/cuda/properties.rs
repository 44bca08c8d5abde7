//! Device properties straight from the driver (`gpumem devices`): attribute queries that need no
//! context, so listing devices never creates one (each costs about 500 MiB of device memory).

use super::check;
use crate::backend::DeviceProperties;
use crate::error::BackendError;
use crate::units::MIB;
use cudarc::driver::sys::{self, CUdevice, CUdevice_attribute};
use std::ffi::{c_char, CStr};
use std::fmt::Write;

/// Page size assumed when a device cannot tell us (no virtual memory management support).
const FALLBACK_GRANULARITY: u64 = 2 * MIB;

pub(super) fn query(index: usize, device: CUdevice) -> Result<DeviceProperties, BackendError> {
    let attribute = |attribute| attribute_u32(device, attribute);
    let compute_capability = (
        attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let virtual_memory_supported =
        attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?
            != 0;
    Ok(DeviceProperties {
        index,
        name: name(device)?,
        uuid: uuid(device)?,
        simulated: false,
        total_memory_bytes: total_memory(device)?,
        compute_capability,
        multiprocessor_count: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?,
        max_threads_per_block: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        )?,
        max_threads_per_multiprocessor: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
        )?,
        shared_memory_per_block_bytes: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
        )?
        .into(),
        memory_clock_khz: attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?,
        memory_bus_width_bits: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
        )?,
        total_constant_memory_bytes: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY,
        )?
        .into(),
        unified_addressing: attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?
            != 0,
        supports_fp16: compute_capability >= (5, 3),
        supports_bf16: compute_capability >= (8, 0),
        memory_pools_supported: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )? != 0,
        virtual_memory_supported,
        allocation_granularity_bytes: if virtual_memory_supported {
            granularity(device)?
        } else {
            FALLBACK_GRANULARITY
        },
    })
}

/// The allocation property every page of the VMM path uses: pinned device memory on `device`;
/// `shareable` asks for pages another process can import through a file descriptor
/// (`export.rs`), which is how PyTorch's CUDA IPC shares memory mapped this way.
pub(super) fn page_allocation_prop(device: CUdevice, shareable: bool) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: if shareable {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        },
        location: device_location(device),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

pub(super) fn device_location(device: CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

fn attribute_u32(device: CUdevice, attribute: CUdevice_attribute) -> Result<u32, BackendError> {
    let mut value = 0;
    // SAFETY: valid out-pointer, a device handle from `cuDeviceGet` and an attribute from the enum.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut value, attribute, device)
    })?;
    // Attributes are counts, sizes and flags; a negative one would be a driver bug, read as 0.
    Ok(u32::try_from(value).unwrap_or(0))
}

fn name(device: CUdevice) -> Result<String, BackendError> {
    let mut buffer = [0 as c_char; 256];
    // SAFETY: the driver writes at most `len` bytes, NUL included, into `buffer`.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buffer.as_mut_ptr(), buffer.len() as i32, device)
    })?;
    let bytes: Vec<u8> = buffer.iter().map(|&c| c as u8).collect();
    Ok(CStr::from_bytes_until_nul(&bytes)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned()))
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase, as nvidia-smi and dcgm-exporter print it.
fn uuid(device: CUdevice) -> Result<String, BackendError> {
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: valid out-pointer to a 16-byte CUuuid.
    check("cuDeviceGetUuid_v2", unsafe {
        sys::cuDeviceGetUuid_v2(&mut uuid, device)
    })?;
    Ok(format_uuid(&uuid.bytes.map(|b| b as u8)))
}

fn format_uuid(bytes: &[u8; 16]) -> String {
    let mut text = String::from("GPU-");
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        let _ = write!(text, "{byte:02x}");
    }
    text
}

fn total_memory(device: CUdevice) -> Result<u64, BackendError> {
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer and device handle.
    check("cuDeviceTotalMem_v2", unsafe {
        sys::cuDeviceTotalMem_v2(&mut bytes, device)
    })?;
    Ok(bytes as u64)
}

/// Minimum granularity of pinned device memory on `device` (2 MiB on H100/H200).
fn granularity(device: CUdevice) -> Result<u64, BackendError> {
    let prop = page_allocation_prop(device, false);
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer and a fully initialised allocation property that outlives the call.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut bytes,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    let bytes = bytes as u64;
    if !bytes.is_power_of_two() {
        // Page arithmetic divides by this; never let a broken answer reach it.
        tracing::warn!(
            device,
            bytes,
            "driver reported an unusable allocation granularity; using 2 MiB"
        );
        return Ok(FALLBACK_GRANULARITY);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::format_uuid;

    #[test]
    fn uuid_has_the_nvidia_smi_form() {
        let bytes: [u8; 16] = [
            0x5f, 0x1d, 0xa3, 0x10, 0x0b, 0x2c, 0x4e, 0x7f, 0x9a, 0x01, 0xde, 0xad, 0xbe, 0xef,
            0x00, 0x42,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-5f1da310-0b2c-4e7f-9a01-deadbeef0042"
        );
    }
}
