//! The HIP runtime functions rocm-safe calls, declared here (no HIP headers,
//! no link-time `libamdhip64`) and bound once from the library
//! [`super::loader`] opened, in [`Api`], a struct of function pointers.
//!
//! Each function's C declaration (the same in `hip_runtime_api.h` of HIP
//! 5.4, 6.4, 7.1, 7.2 and 7.14) is quoted on its field. C enums
//! (`hipError_t`, `hipMemcpyKind`) are taken as `unsigned int`, so a code a
//! newer runtime adds is just a number ([`super::HipError`] names the ones
//! known), never undefined behaviour; handles (`hipStream_t`, ...) are
//! pointers to opaque structs, taken as `*mut c_void`.
//!
//! One macro, `hip_api!`, writes the struct, its binding and
//! [`SIGNATURES`], the table the tests compare with the facts extracted
//! from each release's header (`api_facts.txt`, written by
//! `scripts/hip-api-facts.py`), so the declarations checked are the ones
//! called.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::device::dynlib::Lib;

/// `hipError_t`: a C enum, 4 bytes, taken as its number.
pub(crate) type Status = c_uint;
/// `hipStream_t` (`struct ihipStream_t*`).
pub(crate) type Stream = *mut c_void;
/// `hipEvent_t` (`struct ihipEvent_t*`).
pub(crate) type Event = *mut c_void;
/// `hipModule_t` (`struct ihipModule_t*`).
pub(crate) type Module = *mut c_void;
/// `hipFunction_t` (`struct ihipModuleSymbol_t*`).
pub(crate) type Function = *mut c_void;
/// `hipMemcpyKind`: a C enum, taken as its number.
pub(crate) type MemcpyKind = c_uint;
/// `hipDevice_t` (`typedef int`).
pub(crate) type DeviceId = c_int;

/// `hipMemcpyHostToDevice`.
pub(crate) const MEMCPY_HOST_TO_DEVICE: MemcpyKind = 1;
/// `hipMemcpyDeviceToHost`.
pub(crate) const MEMCPY_DEVICE_TO_HOST: MemcpyKind = 2;
/// `hipMemcpyDeviceToDevice`.
pub(crate) const MEMCPY_DEVICE_TO_DEVICE: MemcpyKind = 3;
/// `hipStreamNonBlocking`.
pub(crate) const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipEventDefault`.
pub(crate) const EVENT_DEFAULT: c_uint = 0;

/// One declared function as written in Rust: its C name, parameter types
/// and return type (the tokens of the declaration).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Signature {
    /// The C function name.
    pub(crate) name: &'static str,
    /// Each parameter's Rust type, as written.
    pub(crate) params: &'static [&'static str],
    /// The return type, as written.
    pub(crate) ret: &'static str,
}

macro_rules! hip_api {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
    )*) => {
        /// The HIP runtime functions, bound from one loaded library.
        #[allow(non_snake_case)]
        pub(crate) struct Api {
            $(
                $(#[doc = $doc])*
                pub(crate) $name: unsafe extern "C" fn($($arg: $ty),*) -> $ret,
            )*
        }

        impl Api {
            /// Binds every function from `lib`; the name of the first
            /// symbol it does not export otherwise.
            ///
            /// # Safety
            /// `lib` is a HIP runtime (`libamdhip64`): each symbol of these
            /// names is the C function declared on its field.
            pub(crate) unsafe fn bind(lib: &Lib) -> Result<Api, &'static str> {
                Ok(Api {
                    $(
                        $name: {
                            let name = concat!(stringify!($name), "\0");
                            let Ok(c) = CStr::from_bytes_with_nul(name.as_bytes()) else {
                                return Err(stringify!($name));
                            };
                            let Some(p) = lib.symbol(c) else {
                                return Err(stringify!($name));
                            };
                            // SAFETY: the symbol is the runtime's exported C
                            // function of this name (caller), whose
                            // declaration (quoted on the field, checked
                            // against the headers by the tests) is this
                            // function pointer type; data and function
                            // pointers have the same size on the targets
                            // supported (x86-64 and aarch64 Linux).
                            unsafe {
                                std::mem::transmute::<
                                    *mut c_void,
                                    unsafe extern "C" fn($($ty),*) -> $ret,
                                >(p.as_ptr())
                            }
                        },
                    )*
                })
            }
        }

        /// Every declared function, as written (for the tests against the
        /// headers' facts).
        pub(crate) const SIGNATURES: &[Signature] = &[
            $(
                Signature {
                    name: stringify!($name),
                    params: &[$(stringify!($ty)),*],
                    ret: stringify!($ret),
                },
            )*
        ];
    };
}

hip_api! {
    /// `hipError_t hipMalloc(void** ptr, size_t size);`
    fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Status;
    /// `hipError_t hipFree(void* ptr);`
    fn hipFree(ptr: *mut c_void) -> Status;
    /// `hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags);`
    fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Status;
    /// `hipError_t hipHostFree(void* ptr);`
    fn hipHostFree(ptr: *mut c_void) -> Status;
    /// `hipError_t hipHostRegister(void* hostPtr, size_t sizeBytes, unsigned int flags);`
    fn hipHostRegister(host_ptr: *mut c_void, size: usize, flags: c_uint) -> Status;
    /// `hipError_t hipHostUnregister(void* hostPtr);`
    fn hipHostUnregister(host_ptr: *mut c_void) -> Status;
    /// `hipError_t hipMemcpyAsync(void* dst, const void* src, size_t sizeBytes,
    /// hipMemcpyKind kind, hipStream_t stream);`
    fn hipMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
        kind: MemcpyKind,
        stream: Stream,
    ) -> Status;
    /// `hipError_t hipMemsetAsync(void* dst, int value, size_t sizeBytes, hipStream_t stream);`
    fn hipMemsetAsync(dst: *mut c_void, value: c_int, size: usize, stream: Stream) -> Status;
    /// `hipError_t hipMemGetInfo(size_t* free, size_t* total);`
    fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> Status;
    /// `hipError_t hipDeviceTotalMem(size_t* bytes, hipDevice_t device);`
    fn hipDeviceTotalMem(bytes: *mut usize, device: DeviceId) -> Status;
    /// `hipError_t hipDeviceGetName(char* name, int len, hipDevice_t device);`
    fn hipDeviceGetName(name: *mut c_char, len: c_int, device: DeviceId) -> Status;
    /// `hipError_t hipDeviceGetPCIBusId(char* pciBusId, int len, int device);`
    fn hipDeviceGetPCIBusId(pci_bus_id: *mut c_char, len: c_int, device: c_int) -> Status;
    /// `hipError_t hipGetDeviceCount(int* count);`
    fn hipGetDeviceCount(count: *mut c_int) -> Status;
    /// `hipError_t hipSetDevice(int deviceId);`
    fn hipSetDevice(device: c_int) -> Status;
    /// `hipError_t hipDeviceSynchronize(void);`
    fn hipDeviceSynchronize() -> Status;
    /// `hipError_t hipDriverGetVersion(int* driverVersion);`
    fn hipDriverGetVersion(version: *mut c_int) -> Status;
    /// `hipError_t hipRuntimeGetVersion(int* runtimeVersion);`
    fn hipRuntimeGetVersion(version: *mut c_int) -> Status;
    /// `const char* hipGetErrorString(hipError_t hipError);`
    fn hipGetErrorString(error: Status) -> *const c_char;
    /// `hipError_t hipGetLastError(void);` (returns the thread's last error
    /// and resets it to `hipSuccess`; HIP 7 keeps an error until it is read).
    fn hipGetLastError() -> Status;
    /// `hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags);`
    fn hipStreamCreateWithFlags(stream: *mut Stream, flags: c_uint) -> Status;
    /// `hipError_t hipStreamDestroy(hipStream_t stream);`
    fn hipStreamDestroy(stream: Stream) -> Status;
    /// `hipError_t hipStreamSynchronize(hipStream_t stream);`
    fn hipStreamSynchronize(stream: Stream) -> Status;
    /// `hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags);`
    fn hipStreamWaitEvent(stream: Stream, event: Event, flags: c_uint) -> Status;
    /// `hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags);`
    fn hipEventCreateWithFlags(event: *mut Event, flags: c_uint) -> Status;
    /// `hipError_t hipEventDestroy(hipEvent_t event);`
    fn hipEventDestroy(event: Event) -> Status;
    /// `hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream);`
    fn hipEventRecord(event: Event, stream: Stream) -> Status;
    /// `hipError_t hipEventSynchronize(hipEvent_t event);`
    fn hipEventSynchronize(event: Event) -> Status;
    /// `hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop);`
    fn hipEventElapsedTime(ms: *mut f32, start: Event, stop: Event) -> Status;
    /// `hipError_t hipModuleLoadData(hipModule_t* module, const void* image);`
    fn hipModuleLoadData(module: *mut Module, image: *const c_void) -> Status;
    /// `hipError_t hipModuleUnload(hipModule_t module);`
    fn hipModuleUnload(module: Module) -> Status;
    /// `hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module,
    /// const char* kname);`
    fn hipModuleGetFunction(function: *mut Function, module: Module, name: *const c_char)
        -> Status;
    /// `hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX,
    /// unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
    /// unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes,
    /// hipStream_t stream, void** kernelParams, void** extra);`
    fn hipModuleLaunchKernel(
        f: Function,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: Stream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Status;
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Api({} HIP functions)", SIGNATURES.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::runtime::hip::HipError;
    use std::collections::BTreeMap;

    /// One release's facts from `api_facts.txt`.
    #[derive(Debug, Default)]
    struct Release {
        version: String,
        source: String,
        types: BTreeMap<String, String>,
        functions: BTreeMap<String, (Vec<String>, String)>,
        missing: Vec<String>,
        codes: Vec<(u32, String)>,
    }

    fn releases() -> Vec<Release> {
        let mut out: Vec<Release> = Vec::new();
        for line in include_str!("api_facts.txt").lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
            if key == "version" {
                out.push(Release {
                    version: rest.to_owned(),
                    ..Release::default()
                });
                continue;
            }
            let r = out.last_mut().expect("a `version` line first");
            match key {
                "source" => r.source = rest.to_owned(),
                "type" => {
                    let (name, ty) = rest.split_once(' ').expect("type NAME C-TYPE");
                    r.types.insert(name.to_owned(), ty.to_owned());
                }
                "missing" => r.missing.push(rest.to_owned()),
                "code" => {
                    let (value, name) = rest.split_once(' ').expect("code VALUE NAME");
                    r.codes
                        .push((value.parse().expect("a number"), name.to_owned()));
                }
                "fn" => {
                    let (name, rest) = rest.split_once('(').expect("fn NAME(");
                    let (params, ret) = rest.split_once(") -> ").expect(") -> RET");
                    let params = params
                        .split(", ")
                        .filter(|p| !p.is_empty())
                        .map(str::to_owned)
                        .collect();
                    r.functions
                        .insert(name.to_owned(), (params, ret.to_owned()));
                }
                other => panic!("unknown line kind {other:?}"),
            }
        }
        out
    }

    /// The Rust type this crate must declare for a C type of the headers.
    fn rust_for(c: &str) -> &'static str {
        match c {
            "void*" => "*mut c_void",
            "const void*" => "*const c_void",
            "void**" => "*mut *mut c_void",
            "size_t" => "usize",
            "size_t*" => "*mut usize",
            "int" => "c_int",
            "int*" => "*mut c_int",
            "unsigned int" => "c_uint",
            "char*" => "*mut c_char",
            "const char*" => "*const c_char",
            "float*" => "*mut f32",
            "hipError_t" => "Status",
            "hipDevice_t" => "DeviceId",
            "hipMemcpyKind" => "MemcpyKind",
            "hipStream_t" => "Stream",
            "hipStream_t*" => "*mut Stream",
            "hipEvent_t" => "Event",
            "hipEvent_t*" => "*mut Event",
            "hipModule_t" => "Module",
            "hipModule_t*" => "*mut Module",
            "hipFunction_t" => "Function",
            "hipFunction_t*" => "*mut Function",
            other => panic!("no Rust type known for the C type {other:?}"),
        }
    }

    fn squash(s: &str) -> String {
        s.split_whitespace().collect()
    }

    #[test]
    fn the_facts_cover_the_releases_asked_for() {
        let versions: Vec<String> = releases().into_iter().map(|r| r.version).collect();
        for v in ["5.4.", "6.4.", "7.1.", "7.14."] {
            assert!(
                versions.iter().any(|x| x.starts_with(v)),
                "{v} missing from {versions:?}"
            );
        }
    }

    #[test]
    fn every_declaration_matches_every_header() {
        assert_eq!(SIGNATURES.len(), 32);
        for r in releases() {
            assert!(
                r.missing.is_empty(),
                "{}: {:?} not declared",
                r.version,
                r.missing
            );
            assert_eq!(r.functions.len(), SIGNATURES.len(), "{}", r.version);
            for sig in SIGNATURES {
                let Some((params, ret)) = r.functions.get(sig.name) else {
                    panic!("{} ({}) has no {}", r.version, r.source, sig.name);
                };
                let want: Vec<String> = params.iter().map(|c| squash(rust_for(c))).collect();
                let have: Vec<String> = sig.params.iter().map(|p| squash(p)).collect();
                assert_eq!(
                    have, want,
                    "{} parameters vs {} ({})",
                    sig.name, r.version, r.source
                );
                assert_eq!(
                    squash(sig.ret),
                    squash(rust_for(ret)),
                    "{} return type vs {}",
                    sig.name,
                    r.version
                );
            }
        }
    }

    #[test]
    fn handle_and_enum_types_have_the_declared_representation() {
        use std::mem::size_of;
        for r in releases() {
            for handle in ["hipStream_t", "hipEvent_t", "hipModule_t", "hipFunction_t"] {
                let c = &r.types[handle];
                assert!(
                    c.ends_with('*') && !c.ends_with("**"),
                    "{}: {handle} = {c}",
                    r.version
                );
            }
            for e in ["hipError_t", "hipMemcpyKind"] {
                let c = r.types[e].as_str();
                assert!(
                    matches!(c, "unsigned int" | "enum u32"),
                    "{}: {e} = {c}",
                    r.version
                );
            }
            assert_eq!(r.types["hipDevice_t"], "int", "{}", r.version);
        }
        assert_eq!(size_of::<Status>(), 4);
        assert_eq!(size_of::<MemcpyKind>(), 4);
        assert_eq!(size_of::<DeviceId>(), 4);
        assert_eq!(size_of::<Stream>(), size_of::<*mut u8>());
    }

    #[test]
    fn every_error_code_of_every_header_is_named() {
        // hipErrorTbd is the enum's end marker (never returned): 1054 up to
        // HIP 7.2, then 1054 became hipErrorInvalidClusterSize and the
        // marker 1055.
        let renamed = [(1054u32, "hipErrorTbd")];
        for r in releases() {
            assert!(
                r.codes.len() >= 78,
                "{}: {} codes",
                r.version,
                r.codes.len()
            );
            for (value, name) in &r.codes {
                let ours = HipError::CODES.iter().find(|(_, n)| n == name);
                match ours {
                    Some((v, _)) if *v == *value => {}
                    _ if renamed.contains(&(*value, name.as_str())) => {
                        assert!(HipError(*value).name().is_some());
                    }
                    _ => panic!("{}: {name} = {value} vs ours {ours:?}", r.version),
                }
            }
        }
        // The codes added after HIP 5.4, by number.
        for (v, name) in [
            (911, "hipErrorInvalidChannelDescriptor"),
            (912, "hipErrorInvalidTexture"),
            (914, "hipErrorInvalidResourceType"),
            (915, "hipErrorInvalidResourceConfiguration"),
            (916, "hipErrorStreamDetached"),
            (1054, "hipErrorInvalidClusterSize"),
        ] {
            assert_eq!(HipError(v).name(), Some(name));
        }
    }
}
