//! The exported functions by name: the one list behind per-call faults (`not_supported`,
//! `no_permission`, `errors` in a scenario) and the symbol check in the tests.

/// Where a function's per-call faults are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Init, shutdown, `nvmlErrorString` and the control symbols: no per-call faults
    /// (init faults live in `[init]`).
    None,
    /// Top-level `not_supported` / `no_permission` / `errors`.
    System,
    /// A GPU's `not_supported` / `no_permission` / `errors`; they also apply to its MIG
    /// devices and to the handle lookups that name the GPU.
    Device,
}

macro_rules! functions {
    ($($variant:ident => $scope:ident,)*) => {
        /// One exported symbol.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[allow(non_camel_case_types, reason = "variants spell the C symbol names")]
        pub enum Func {
            $($variant,)*
        }

        impl Func {
            /// Every exported symbol, in a fixed order.
            pub const ALL: &'static [Func] = &[$(Func::$variant,)*];
            /// The number of exported symbols (sizes the per-GPU fault table).
            pub const COUNT: usize = Func::ALL.len();

            /// The C symbol name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Func::$variant => stringify!($variant),)*
                }
            }

            /// Where faults for this function are configured.
            pub const fn scope(self) -> Scope {
                match self {
                    $(Func::$variant => Scope::$scope,)*
                }
            }
        }
    };
}

functions! {
    nvmlInit_v2 => None,
    nvmlInitWithFlags => None,
    nvmlShutdown => None,
    nvmlErrorString => None,
    nvmlSystemGetDriverVersion => System,
    nvmlSystemGetNVMLVersion => System,
    nvmlSystemGetCudaDriverVersion => System,
    nvmlSystemGetCudaDriverVersion_v2 => System,
    nvmlSystemGetProcessName => System,
    nvmlDeviceGetCount_v2 => System,
    nvmlDeviceGetHandleByIndex_v2 => Device,
    nvmlDeviceGetHandleByUUID => Device,
    nvmlDeviceGetName => Device,
    nvmlDeviceGetUUID => Device,
    nvmlDeviceGetSerial => Device,
    nvmlDeviceGetVbiosVersion => Device,
    nvmlDeviceGetBoardPartNumber => Device,
    nvmlDeviceGetPciInfo_v3 => Device,
    nvmlDeviceGetBrand => Device,
    nvmlDeviceGetArchitecture => Device,
    nvmlDeviceGetCudaComputeCapability => Device,
    nvmlDeviceGetIndex => Device,
    nvmlDeviceGetMinorNumber => Device,
    nvmlDeviceGetMemoryBusWidth => Device,
    nvmlDeviceGetMaxClockInfo => Device,
    nvmlDeviceGetClockInfo => Device,
    nvmlDeviceGetMaxPcieLinkGeneration => Device,
    nvmlDeviceGetMaxPcieLinkWidth => Device,
    nvmlDeviceGetCurrPcieLinkGeneration => Device,
    nvmlDeviceGetCurrPcieLinkWidth => Device,
    nvmlDeviceGetPcieLinkMaxSpeed => Device,
    nvmlDeviceGetBAR1MemoryInfo => Device,
    nvmlDeviceGetEccMode => Device,
    nvmlDeviceGetTotalEccErrors => Device,
    nvmlDeviceGetRetiredPages => Device,
    nvmlDeviceGetRetiredPages_v2 => Device,
    nvmlDeviceGetRetiredPagesPendingStatus => Device,
    nvmlDeviceGetRemappedRows => Device,
    nvmlDeviceGetCurrentClocksEventReasons => Device,
    nvmlDeviceGetCurrentClocksThrottleReasons => Device,
    nvmlDeviceGetSupportedClocksEventReasons => Device,
    nvmlDeviceGetSupportedClocksThrottleReasons => Device,
    nvmlDeviceGetFieldValues => Device,
    nvmlDeviceGetPersistenceMode => Device,
    nvmlDeviceGetComputeMode => Device,
    nvmlDeviceGetPowerManagementLimit => Device,
    nvmlDeviceGetEnforcedPowerLimit => Device,
    nvmlDeviceGetPowerManagementDefaultLimit => Device,
    nvmlDeviceGetTemperatureThreshold => Device,
    nvmlDeviceGetPerformanceState => Device,
    nvmlDeviceGetMigMode => Device,
    nvmlDeviceGetMaxMigDeviceCount => Device,
    nvmlDeviceGetMigDeviceHandleByIndex => Device,
    nvmlDeviceGetDeviceHandleFromMigDeviceHandle => Device,
    nvmlDeviceIsMigDeviceHandle => Device,
    nvmlDeviceGetGpuInstanceId => Device,
    nvmlDeviceGetComputeInstanceId => Device,
    nvmlDeviceGetMemoryInfo_v2 => Device,
    nvmlDeviceGetMemoryInfo => Device,
    nvmlDeviceGetUtilizationRates => Device,
    nvmlDeviceGetTemperature => Device,
    nvmlDeviceGetPowerUsage => Device,
    nvmlDeviceGetComputeRunningProcesses_v3 => Device,
    nvmlDeviceGetGraphicsRunningProcesses_v3 => Device,
    nvmlDeviceGetMPSComputeRunningProcesses_v3 => Device,
    nvmlDeviceGetProcessUtilization => Device,
    nvmlDeviceGetNvLinkState => Device,
    nvmlDeviceGetNvLinkVersion => Device,
    nvmlDeviceGetNvLinkRemotePciInfo_v2 => Device,
    nvmlDeviceGetNvLinkRemoteDeviceType => Device,
    nvmlDeviceGetTopologyCommonAncestor => Device,
    nvmlDeviceGetP2PStatus => Device,
    fakeNvmlSetTime => None,
    fakeNvmlAdvanceTime => None,
    fakeNvmlGetCallCount => None,
    fakeNvmlResetCallCounts => None,
}

impl Func {
    /// The function with this C name.
    pub fn by_name(name: &str) -> Option<Func> {
        Func::ALL.iter().copied().find(|f| f.name() == name)
    }

    /// Index into per-function tables.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The names of every symbol the library exports, NVML's and the control ones.
pub fn exported_symbols() -> impl Iterator<Item = &'static str> {
    Func::ALL.iter().map(|f| f.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Func::ALL {
            assert_eq!(Func::by_name(f.name()), Some(*f));
            assert_eq!(Func::ALL[f.index()], *f);
        }
        assert_eq!(Func::by_name("nvmlDeviceGetFanSpeed"), None);
        assert_eq!(
            Func::nvmlDeviceGetPowerUsage.name(),
            "nvmlDeviceGetPowerUsage"
        );
    }

    #[test]
    fn scopes() {
        assert_eq!(Func::nvmlInit_v2.scope(), Scope::None);
        assert_eq!(Func::nvmlDeviceGetCount_v2.scope(), Scope::System);
        assert_eq!(Func::nvmlDeviceGetHandleByIndex_v2.scope(), Scope::Device);
        assert_eq!(Func::fakeNvmlSetTime.scope(), Scope::None);
    }
}
