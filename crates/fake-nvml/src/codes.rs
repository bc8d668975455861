//! NVML return codes: the numbers come from nvml-wrapper-sys (so they cannot drift from the
//! header), the names are what scenario files use, the messages are `nvmlErrorString`'s.

use std::ffi::CStr;

pub use nvml_wrapper_sys::bindings::nvmlReturn_t as Ret;
use nvml_wrapper_sys::bindings::*;

pub const SUCCESS: Ret = nvmlReturn_enum_NVML_SUCCESS;
pub const UNINITIALIZED: Ret = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: Ret = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: Ret = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NO_PERMISSION: Ret = nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
pub const NOT_FOUND: Ret = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: Ret = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const DRIVER_NOT_LOADED: Ret = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub const GPU_IS_LOST: Ret = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub const ARGUMENT_VERSION_MISMATCH: Ret = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const UNKNOWN: Ret = nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// `(scenario name, code, nvmlErrorString text)`. The texts follow NVIDIA's own wording
/// (the strings DCGM carries for NVML); codes NVIDIA's list lacks get a plain description.
const CODES: &[(&str, Ret, &CStr)] = &[
    ("success", nvmlReturn_enum_NVML_SUCCESS, c"Success"),
    (
        "uninitialized",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        c"Uninitialized",
    ),
    (
        "invalid_argument",
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        c"Invalid Argument",
    ),
    (
        "not_supported",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        c"Not Supported",
    ),
    (
        "no_permission",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        c"Insufficient Permissions",
    ),
    (
        "already_initialized",
        nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED,
        c"Already Initialized",
    ),
    (
        "not_found",
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        c"Not Found",
    ),
    (
        "insufficient_size",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        c"Insufficient Size",
    ),
    (
        "insufficient_power",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
        c"Insufficient External Power",
    ),
    (
        "driver_not_loaded",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        c"Driver Not Loaded",
    ),
    ("timeout", nvmlReturn_enum_NVML_ERROR_TIMEOUT, c"Timeout"),
    (
        "irq_issue",
        nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE,
        c"Interrupt Request Issue",
    ),
    (
        "library_not_found",
        nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND,
        c"NVML Shared Library Not Found",
    ),
    (
        "function_not_found",
        nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
        c"Function Not Found",
    ),
    (
        "corrupted_inforom",
        nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM,
        c"Corrupted infoROM",
    ),
    (
        "gpu_is_lost",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        c"GPU is lost",
    ),
    (
        "reset_required",
        nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
        c"GPU requires reset",
    ),
    (
        "operating_system",
        nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM,
        c"GPU access blocked by the operating system",
    ),
    (
        "lib_rm_version_mismatch",
        nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        c"Driver/library version mismatch",
    ),
    (
        "in_use",
        nvmlReturn_enum_NVML_ERROR_IN_USE,
        c"In use by another client",
    ),
    (
        "memory",
        nvmlReturn_enum_NVML_ERROR_MEMORY,
        c"Insufficient Memory",
    ),
    ("no_data", nvmlReturn_enum_NVML_ERROR_NO_DATA, c"No data"),
    (
        "vgpu_ecc_not_supported",
        nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
        c"vGPU operation not available because ECC is enabled",
    ),
    (
        "insufficient_resources",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        c"Insufficient Resources",
    ),
    (
        "freq_not_supported",
        nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED,
        c"Frequency not supported",
    ),
    (
        "argument_version_mismatch",
        nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        c"Argument version mismatch",
    ),
    (
        "deprecated",
        nvmlReturn_enum_NVML_ERROR_DEPRECATED,
        c"Deprecated",
    ),
    (
        "not_ready",
        nvmlReturn_enum_NVML_ERROR_NOT_READY,
        c"Not ready",
    ),
    (
        "gpu_not_found",
        nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND,
        c"GPU not found",
    ),
    (
        "invalid_state",
        nvmlReturn_enum_NVML_ERROR_INVALID_STATE,
        c"Invalid state",
    ),
    (
        "reset_type_not_supported",
        nvmlReturn_enum_NVML_ERROR_RESET_TYPE_NOT_SUPPORTED,
        c"Reset type not supported",
    ),
    (
        "unknown",
        nvmlReturn_enum_NVML_ERROR_UNKNOWN,
        c"Unknown Error",
    ),
];

/// The code for a scenario error name such as `"gpu_is_lost"`.
pub fn code_by_name(name: &str) -> Option<Ret> {
    CODES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, c, _)| *c)
}

/// All error names, for messages that list the choices.
pub fn error_names() -> impl Iterator<Item = &'static str> {
    CODES.iter().map(|(n, _, _)| *n).filter(|n| *n != "success")
}

/// `nvmlErrorString`: a static string for every code; codes NVML does not define read as
/// "Unknown Error", as the real library does.
pub fn error_string(code: Ret) -> &'static CStr {
    CODES
        .iter()
        .find(|(_, c, _)| *c == code)
        .map_or(c"Unknown Error", |(_, _, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's numbers, typed in independently of the bindings, so a wrong constant
    /// (Datadog's fake had INVALID_ARGUMENT = 1) fails here.
    #[test]
    fn codes_equal_the_header_numbers() {
        let expected: &[(&str, u32)] = &[
            ("success", 0),
            ("uninitialized", 1),
            ("invalid_argument", 2),
            ("not_supported", 3),
            ("no_permission", 4),
            ("already_initialized", 5),
            ("not_found", 6),
            ("insufficient_size", 7),
            ("insufficient_power", 8),
            ("driver_not_loaded", 9),
            ("timeout", 10),
            ("irq_issue", 11),
            ("library_not_found", 12),
            ("function_not_found", 13),
            ("corrupted_inforom", 14),
            ("gpu_is_lost", 15),
            ("reset_required", 16),
            ("operating_system", 17),
            ("lib_rm_version_mismatch", 18),
            ("in_use", 19),
            ("memory", 20),
            ("no_data", 21),
            ("vgpu_ecc_not_supported", 22),
            ("insufficient_resources", 23),
            ("freq_not_supported", 24),
            ("argument_version_mismatch", 25),
            ("deprecated", 26),
            ("not_ready", 27),
            ("gpu_not_found", 28),
            ("invalid_state", 29),
            ("reset_type_not_supported", 30),
            ("unknown", 999),
        ];
        assert_eq!(CODES.len(), expected.len());
        for (name, number) in expected {
            assert_eq!(code_by_name(name), Some(*number), "{name}");
        }
        assert_eq!(SUCCESS, 0);
        assert_eq!(UNINITIALIZED, 1);
        assert_eq!(INVALID_ARGUMENT, 2);
        assert_eq!(NOT_SUPPORTED, 3);
        assert_eq!(NO_PERMISSION, 4);
        assert_eq!(NOT_FOUND, 6);
        assert_eq!(INSUFFICIENT_SIZE, 7);
        assert_eq!(GPU_IS_LOST, 15);
        assert_eq!(ARGUMENT_VERSION_MISMATCH, 25);
        assert_eq!(UNKNOWN, 999);
    }

    #[test]
    fn strings() {
        assert_eq!(error_string(18), c"Driver/library version mismatch");
        assert_eq!(error_string(15), c"GPU is lost");
        assert_eq!(error_string(12345), c"Unknown Error");
        assert_eq!(code_by_name("nope"), None);
        assert!(error_names().all(|n| n != "success"));
    }
}
