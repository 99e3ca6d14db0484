//! The HIP runtime layer (`src/device/hip/`) executed over the stand-in
//! HIP runtime (`tests/hip-standin/standin.c`, built here with the C
//! compiler): the loading order and reuse of an already loaded runtime,
//! HIP 7's sticky error cleared after the failures the crate handles,
//! unknown error codes, memory, streams and events, every kernel launch's
//! argument bytes against the argument metadata of the code object the
//! crate loaded, and verification catching kernels that never ran.
//!
//! The crate chooses its HIP runtime once per process, so each scenario
//! runs in a child process (`common::hip_standin::scenario`: the test
//! binary itself, asked for exactly that test). Needs only a C compiler
//! (`cc`, or `$CC`); where build.rs found none, every test here is ignored
//! with that reason.
#![cfg(feature = "hip")]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::hip_standin::{self as standin, scenario, Launch, Live, PointerArg, Standin};
use half::{bf16, f16};
use rocm_safe::conv3d::{Conv3dData, Conv3dGeometry, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::{Conv3dChain, TierKind};
use rocm_safe::device::{BackendKind, Conv3dKernel, Device, RawStream, Stream};
use rocm_safe::diagnostics::{read_code_object, CodeObjectInfo, KernelResources};
use rocm_safe::fallback::Outcome;
use rocm_safe::verify::{convert_verified, Policy, VerifyOptions};
use rocm_safe::Error;

/// The variable naming the HIP runtime to load (a file or a folder).
const RUNTIME_VAR: &str = "ROCM_SAFE_HIP_RUNTIME";
/// The versions the stand-ins report (`hipRuntimeGetVersion`).
const VERSIONS: [(u32, i32); 3] = [(7, 70125424), (6, 60443482), (5, 50731921)];

type R = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn built() -> standin::Built {
    match standin::library() {
        Ok(b) => b,
        Err(e) => panic!("building the stand-in HIP runtime: {e}"),
    }
}

fn version_of(major: u32) -> i32 {
    VERSIONS
        .iter()
        .find(|(m, _)| *m == major)
        .map_or(0, |(_, v)| *v)
}

/// `HSA_OVERRIDE_GFX_VERSION` for a gfx arch: `gfx1151` -> `11.5.1`,
/// `gfx90a` -> `9.0.10` (minor and stepping are hex digits in the name).
fn hsa_override(arch: &str) -> String {
    let d = arch.trim_start_matches("gfx");
    let (major, rest) = d.split_at(d.len() - 2);
    let hex = |c: char| c.to_digit(16).expect("a hex digit");
    let mut r = rest.chars();
    let (minor, step) = (
        hex(r.next().expect("minor")),
        hex(r.next().expect("stepping")),
    );
    format!("{major}.{minor}.{step}")
}

/// The stand-in the crate loaded in this process: the `libamdhip64`
/// mapped, opened again without loading anything.
fn loaded_standin() -> Result<Standin, String> {
    let mapped = standin::mapped_hip_runtimes();
    mapped
        .iter()
        .filter_map(|p| Standin::loaded_from(p))
        .find(|s| s.exports("standin_major"))
        .ok_or_else(|| format!("no stand-in HIP runtime is loaded; mapped: {mapped:?}"))
}

fn open_device() -> Result<Device, String> {
    Device::open(BackendKind::Hip, 0).map_err(|e| format!("opening hip:0 on the stand-in: {e}"))
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

// ----- loading: which runtime, from where, one per process -----------------

/// The runtime of `major` was loaded, found as `found_by` says, is the
/// only `libamdhip64` mapped, and serves the crate's calls.
fn assert_runtime(major: u32, found_by: &str) -> R {
    let file = rocm_safe::device::hip::runtime_file().map_err(err("runtime_file"))?;
    ensure!(
        file.found_by == found_by,
        "found by {:?}, expected {found_by:?}",
        file.found_by
    );
    let want_name = standin::soname(major);
    ensure!(
        file.path.as_ref().is_some_and(|p| p.ends_with(&want_name)),
        "runtime file {:?}, expected a {want_name}",
        file.path
    );
    ensure!(
        file.version
            .as_ref()
            .is_ok_and(|(v, _)| *v == version_of(major)),
        "runtime file version {:?}",
        file.version
    );
    let (raw, text) = rocm_safe::device::hip::runtime_version().map_err(err("runtime_version"))?;
    ensure!(
        raw == version_of(major),
        "runtime version {raw} ({text}), expected the stand-in HIP {major}'s {}",
        version_of(major)
    );
    let list = Device::list(BackendKind::Hip).map_err(err("Device::list"))?;
    ensure!(
        list.len() == 1 && list[0].name.contains(&format!("stand-in HIP {major} ")),
        "devices {list:?}"
    );
    let st = loaded_standin()?;
    ensure!(
        st.major() == major as i32,
        "loaded stand-in is HIP {}",
        st.major()
    );
    ensure!(
        st.calls("hipRuntimeGetVersion") >= 1 && st.calls("hipGetDeviceCount") >= 1,
        "the crate's calls did not reach {}",
        st.path.display()
    );
    let mapped = standin::mapped_hip_runtimes();
    ensure!(mapped.len() == 1, "HIP runtimes mapped: {mapped:?}");
    Ok(())
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn loads_the_runtime_named_by_the_variable_as_a_file() {
    for major in standin::MAJORS {
        scenario(
            "loads_the_runtime_named_by_the_variable_as_a_file",
            &format!("HIP {major}"),
            |c| {
                c.env(RUNTIME_VAR, built().file(major));
            },
            || assert_runtime(major, "$ROCM_SAFE_HIP_RUNTIME"),
        );
    }
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn loads_the_runtime_named_by_the_variable_as_a_folder_newest_first() {
    for major in standin::MAJORS {
        scenario(
            "loads_the_runtime_named_by_the_variable_as_a_folder_newest_first",
            &format!("HIP {major}"),
            |c| {
                c.env(RUNTIME_VAR, built().folder(major));
            },
            || assert_runtime(major, "$ROCM_SAFE_HIP_RUNTIME"),
        );
    }
    // .so.7, .so.6 and .so.5 side by side: the newest.
    scenario(
        "loads_the_runtime_named_by_the_variable_as_a_folder_newest_first",
        "all three",
        |c| {
            c.env(RUNTIME_VAR, built().all());
        },
        || assert_runtime(7, "$ROCM_SAFE_HIP_RUNTIME"),
    );
}

/// A ROCm prefix `<root>/prefix{major}` whose `lib` holds only that
/// major's stand-in.
fn prefix(major: u32) -> PathBuf {
    let b = built();
    let p = b.root.join(format!("prefix{major}"));
    let lib = p.join("lib");
    if !lib.join(standin::soname(major)).exists() {
        std::fs::create_dir_all(&lib).expect("a prefix folder");
        std::fs::copy(b.file(major), lib.join(standin::soname(major))).expect("a copy");
    }
    p
}

/// The places after the variable, in order: `$ROCM_PATH/lib`, then
/// `$HIP_PATH/lib`, then the loader path; the variable before them all.
#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn the_places_are_tried_in_the_documented_order() {
    let name = "the_places_are_tried_in_the_documented_order";
    scenario(
        name,
        "variable before $ROCM_PATH",
        |c| {
            c.env(RUNTIME_VAR, built().file(5))
                .env("ROCM_PATH", prefix(7))
                .env("HIP_PATH", prefix(6));
        },
        || assert_runtime(5, "$ROCM_SAFE_HIP_RUNTIME"),
    );
    scenario(
        name,
        "$ROCM_PATH before $HIP_PATH",
        |c| {
            c.env("ROCM_PATH", prefix(5))
                .env("HIP_PATH", prefix(7))
                .env("LD_LIBRARY_PATH", built().folder(6));
        },
        || assert_runtime(5, "$ROCM_PATH/lib"),
    );
    scenario(
        name,
        "$HIP_PATH before the loader path",
        |c| {
            c.env("HIP_PATH", prefix(6))
                .env("LD_LIBRARY_PATH", built().folder(7));
        },
        || assert_runtime(6, "$HIP_PATH/lib"),
    );
    scenario(
        name,
        "the loader path",
        |c| {
            c.env("LD_LIBRARY_PATH", built().folder(6));
        },
        || assert_runtime(6, "the loader path (libamdhip64.so.6)"),
    );
    scenario(
        name,
        "an unset $ROCM_PATH is skipped",
        |c| {
            c.env("ROCM_PATH", "").env("HIP_PATH", prefix(7));
        },
        || assert_runtime(7, "$HIP_PATH/lib"),
    );
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn a_runtime_already_in_the_process_is_the_one_used() {
    let b = built();
    // A framework's private copy, in a folder nothing else names, loaded
    // (RTLD_GLOBAL, as Python extensions are) before the crate's first HIP
    // call; the variable names another major, which must not be loaded
    // beside it.
    let private = b.root.join("framework-private");
    std::fs::create_dir_all(&private).expect("a folder");
    let copy = private.join(standin::soname(6));
    if !copy.exists() {
        std::fs::copy(b.file(6), &copy).expect("a copy of the stand-in");
    }
    scenario(
        "a_runtime_already_in_the_process_is_the_one_used",
        "HIP 6 loaded first",
        |c| {
            c.env(RUNTIME_VAR, b.file(7))
                .env("ROCM_SAFE_STANDIN_PRELOAD", &copy);
        },
        || {
            let path =
                PathBuf::from(std::env::var_os("ROCM_SAFE_STANDIN_PRELOAD").unwrap_or_default());
            let framework = Standin::load_global(&path)?;
            let before = framework.calls("hipGetDeviceCount");
            let dev = open_device()?;
            let s = dev.stream().map_err(err("stream"))?;
            let buf = s.clone_htod(&[1u32, 2, 3]).map_err(err("upload"))?;
            ensure!(
                buf.to_vec().map_err(err("download"))? == [1, 2, 3],
                "round trip"
            );
            let (raw, _) = rocm_safe::device::hip::runtime_version().map_err(err("version"))?;
            ensure!(
                raw == version_of(6),
                "the crate uses version {raw}, not the framework's HIP 6"
            );
            ensure!(
                framework.calls("hipGetDeviceCount") > before && framework.calls("hipMalloc") >= 1,
                "the crate's calls did not reach the framework's runtime"
            );
            let mapped = standin::mapped_hip_runtimes();
            ensure!(mapped == [path.clone()], "mapped HIP runtimes: {mapped:?}");
            let file = rocm_safe::device::hip::runtime_file().map_err(err("runtime_file"))?;
            ensure!(
                file.already_loaded
                    && file.found_by.contains("already loaded in this process")
                    && file.found_by.contains("libamdhip64.so.6"),
                "{file:?}"
            );
            // A stream the framework made is a stream of the crate's runtime.
            let (rc, raw_stream) = framework.hip_stream_create();
            ensure!(rc == 0, "the framework makes a stream: {rc}");
            // SAFETY: a live stream of the runtime the device uses; the
            // borrowed `Stream` never destroys it.
            let borrowed = unsafe { Stream::from_raw(&dev, RawStream(raw_stream)) };
            let b2 = borrowed
                .clone_htod(&[7u8; 64])
                .map_err(err("upload on the framework's stream"))?;
            ensure!(
                b2.to_vec().map_err(err("download"))? == [7u8; 64],
                "borrowed stream round trip"
            );
            drop(b2);
            drop(borrowed);
            dev.synchronize().map_err(err("synchronize"))?;
            Ok(())
        },
    );
}

/// A runtime loaded by a path whose name and soname are none the crate
/// asks for (`libamdhip64.so.7.1.25424`) is found by its mapped file.
#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn a_runtime_mapped_under_another_name_is_the_one_used() {
    scenario(
        "a_runtime_mapped_under_another_name_is_the_one_used",
        "libamdhip64.so.7.1.25424 loaded first",
        |c| {
            c.env(RUNTIME_VAR, built().file(6));
        },
        || {
            let path = built().full_version_name();
            let framework = Standin::load_global(&path)?;
            let dev = open_device()?;
            let s = dev.stream().map_err(err("stream"))?;
            let b = s.clone_htod(&[9u64; 4]).map_err(err("upload"))?;
            ensure!(
                b.to_vec().map_err(err("download"))? == [9u64; 4],
                "round trip"
            );
            ensure!(
                framework.calls("hipMalloc") >= 1,
                "the crate's calls went elsewhere"
            );
            let file = rocm_safe::device::hip::runtime_file().map_err(err("runtime_file"))?;
            ensure!(
                file.already_loaded
                    && file.found_by == "already mapped in this process"
                    && file
                        .version
                        .as_ref()
                        .is_ok_and(|(v, _)| *v == version_of(7)),
                "{file:?}"
            );
            let mapped = standin::mapped_hip_runtimes();
            ensure!(mapped == [path.clone()], "mapped HIP runtimes: {mapped:?}");
            Ok(())
        },
    );
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn no_runtime_found_lists_every_place_tried() {
    let b = built();
    let empty = b.root.join("empty");
    std::fs::create_dir_all(&empty).expect("a folder");
    // The loader path: files named as the sonames that are not libraries,
    // so that dlopen by soname stops there with the loader's message and
    // the machine's own runtime (Debian's .so.5 in CI) is never reached.
    let shadow = b.root.join("shadow");
    std::fs::create_dir_all(&shadow).expect("a folder");
    for m in standin::MAJORS {
        std::fs::write(shadow.join(standin::soname(m)), b"not a library").expect("a file");
    }
    std::fs::write(shadow.join("libamdhip64.so"), b"not a library").expect("a file");
    scenario(
        "no_runtime_found_lists_every_place_tried",
        "nothing anywhere",
        |c| {
            c.env(RUNTIME_VAR, b.root.join("no-such-file"))
                .env("ROCM_PATH", &empty)
                .env("HIP_PATH", &empty)
                .env("LD_LIBRARY_PATH", &shadow);
        },
        || {
            let e = match Device::list(BackendKind::Hip) {
                Ok(l) => return Err(format!("found devices {l:?} with no runtime")),
                Err(e) => e.to_string(),
            };
            let empty = built().root.join("empty");
            for part in [
                RUNTIME_VAR.to_owned(),
                "no-such-file".to_owned(),
                empty.display().to_string(),
                "libamdhip64.so.7".to_owned(),
                "libamdhip64.so.6".to_owned(),
                "libamdhip64.so.5".to_owned(),
                "/opt/rocm/lib".to_owned(),
            ] {
                ensure!(e.contains(&part), "{part:?} missing from: {e}");
            }
            let v = rocm_safe::device::hip::runtime_version();
            ensure!(v.is_err(), "a runtime version with no runtime: {v:?}");
            ensure!(
                standin::mapped_hip_runtimes().is_empty(),
                "mapped: {:?}",
                standin::mapped_hip_runtimes()
            );
            // The process goes on without a GPU.
            ensure!(
                Device::first_available().kind() == BackendKind::Host,
                "first_available without a runtime"
            );
            Ok(())
        },
    );
}

// ----- errors: HIP 7's sticky last error, unknown codes ---------------------

/// The stand-ins keep the last error as the HIP of their major does, so
/// that the clearing checks below can fail.
#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn the_standins_keep_the_last_error_as_their_major_does() {
    for major in standin::MAJORS {
        let st = Standin::load_global(&built().file(major)).expect("loading a stand-in");
        assert_eq!(st.major(), major as i32);
        // Each copy has its own state: a fresh thread per major.
        std::thread::scope(|s| {
            s.spawn(|| {
                let h = Standin::loaded_from(&built().file(major)).expect("loaded");
                h.fail_next("hipMalloc", 2);
                assert_eq!(h.hip_malloc(64).0, 2, "the injected out-of-memory");
                assert_eq!(h.hip_set_device(0), 0);
                let want = if major >= 7 { 2 } else { 0 };
                assert_eq!(h.thread_last_error(), want, "HIP {major} after a success");
                assert_eq!(h.pending_errors().0, want);
                assert_eq!(h.hip_get_last_error(), want);
                assert_eq!(h.hip_get_last_error(), 0, "read once, then cleared");
            });
        });
    }
}

fn on_standin(major: u32) -> impl FnOnce(&mut Command) {
    move |c| {
        c.env(RUNTIME_VAR, built().file(major))
            .env("HSA_OVERRIDE_GFX_VERSION", "11.5.1");
    }
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn handled_failures_leave_no_sticky_error() {
    scenario(
        "handled_failures_leave_no_sticky_error",
        "HIP 7",
        on_standin(7),
        || {
            let dev = open_device()?;
            let st = loaded_standin()?;
            let s = dev.stream().map_err(err("stream"))?;
            // An out-of-memory the crate retries: a freed buffer is pending,
            // the next hipMalloc fails, the crate frees and retries.
            drop(s.alloc::<u8>(1 << 20).map_err(err("alloc"))?);
            ensure!(dev.pending_free_bytes() > 0, "the drop is deferred");
            let mallocs = st.calls("hipMalloc");
            st.fail_next("hipMalloc", 2);
            let b = s.alloc::<u8>(4096).map_err(err("alloc after the retry"))?;
            ensure!(
                st.calls("hipMalloc") == mallocs + 2,
                "hipMalloc called {} times, expected the failure and the retry",
                st.calls("hipMalloc") - mallocs
            );
            ensure!(
                st.thread_last_error() == 0,
                "the handled out-of-memory is still pending: {}",
                st.thread_last_error()
            );
            drop(b);
            // A refused hipHostRegister: the runtime's allocator serves.
            let (registers, host_mallocs) =
                (st.calls("hipHostRegister"), st.calls("hipHostMalloc"));
            st.fail_next("hipHostRegister", 1);
            let mut pinned = dev.alloc_pinned::<u8>(4 << 20).map_err(err("pinned"))?;
            ensure!(
                st.calls("hipHostRegister") == registers + 1
                    && st.calls("hipHostMalloc") == host_mallocs + 1,
                "the refused registration was not replaced by hipHostMalloc"
            );
            ensure!(
                st.thread_last_error() == 0,
                "the refused registration is still pending: {}",
                st.thread_last_error()
            );
            pinned.as_mut_slice().map_err(err("pinned slice"))?.fill(3);
            drop(pinned);
            // What PyTorch's next check would see, on any thread.
            ensure!(
                st.pending_errors() == (0, 0),
                "pending: {:?}",
                st.pending_errors()
            );
            ensure!(
                st.hip_get_last_error() == 0,
                "hipGetLastError after the handled failures"
            );
            Ok(())
        },
    );
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn unknown_error_codes_print_their_number() {
    scenario(
        "unknown_error_codes_print_their_number",
        "HIP 7",
        on_standin(7),
        || {
            let dev = open_device()?;
            let st = loaded_standin()?;
            let s = dev.stream().map_err(err("stream"))?;
            for (code, func) in [
                (916, "hipMalloc"),
                (999, "hipMalloc"),
                (4242, "hipStreamCreateWithFlags"),
                (914, "hipMemcpyAsync"),
            ] {
                st.fail_next(func, code);
                let e = match func {
                    "hipMalloc" => s.alloc::<u8>(256).map(drop),
                    "hipStreamCreateWithFlags" => dev.stream().map(drop),
                    _ => s.clone_htod(&[1u8; 16]).map(drop),
                };
                let text = match e {
                    Ok(()) => return Err(format!("{func} with code {code} succeeded")),
                    Err(e) => e.to_string(),
                };
                ensure!(text.contains(&code.to_string()), "{func} {code}: {text}");
                ensure!(
                    text.contains(func),
                    "{func} {code} does not name the call: {text}"
                );
            }
            // The device still works after them.
            let b = s.clone_htod(&[5u16; 8]).map_err(err("upload"))?;
            ensure!(
                b.to_vec().map_err(err("download"))? == [5u16; 8],
                "round trip"
            );
            Ok(())
        },
    );
}

// ----- memory, streams, events ------------------------------------------------

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn memory_streams_and_events_over_the_standin() {
    scenario(
        "memory_streams_and_events_over_the_standin",
        "HIP 7",
        on_standin(7),
        || {
            let st;
            {
                let dev = open_device()?;
                st = loaded_standin()?;
                let info = dev.info();
                ensure!(
                    info.kind == BackendKind::Hip && info.total_memory == 4096 << 20,
                    "{info:?}"
                );
                let pci = rocm_safe::device::hip::pci_bus_id(0).map_err(err("pci bus id"))?;
                ensure!(pci == "0000:c3:00.0", "pci bus id {pci}");
                let (free0, total) = dev.mem_info().map_err(err("mem_info"))?;
                ensure!(
                    total == 4096 << 20 && free0 <= total,
                    "mem_info {free0} / {total}"
                );

                let s = dev.stream().map_err(err("stream"))?;
                let s2 = dev.stream().map_err(err("second stream"))?;
                ensure!(
                    st.live(Live::Streams) >= 2,
                    "streams {}",
                    st.live(Live::Streams)
                );
                let data: Vec<u32> = (0..100_000u32)
                    .map(|i| i.wrapping_mul(2_654_435_761))
                    .collect();
                let h2d = st.copied_bytes(1);
                let mut a = s.clone_htod(&data).map_err(err("upload"))?;
                ensure!(st.copied_bytes(1) - h2d == 400_000, "host-to-device bytes");
                let (free1, _) = dev.mem_info().map_err(err("mem_info"))?;
                ensure!(free0 - free1 >= 400_000, "free memory {free0} -> {free1}");
                let back = a.to_vec().map_err(err("download"))?;
                ensure!(back == data, "download differs from upload");
                // Device to device, then zeroing.
                let mut b = s.alloc::<u32>(data.len()).map_err(err("alloc"))?;
                b.copy_dtod(&a.view()).map_err(err("dtod"))?;
                ensure!(b.to_vec().map_err(err("download b"))? == data, "dtod copy");
                ensure!(st.copied_bytes(3) >= 400_000, "device-to-device bytes");
                a.memset_zero().map_err(err("memset"))?;
                ensure!(
                    a.to_vec()
                        .map_err(err("download a"))?
                        .iter()
                        .all(|&v| v == 0),
                    "memset"
                );
                // Pinned buffers, async copies, events across streams.
                let mut pinned = dev.alloc_pinned::<u32>(1024).map_err(err("pinned"))?;
                pinned
                    .as_mut_slice()
                    .map_err(err("pinned slice"))?
                    .copy_from_slice(&data[..1024]);
                let mut c = s.alloc::<u32>(1024).map_err(err("alloc c"))?;
                c.view_mut()
                    .copy_htod_async(&s, &mut pinned)
                    .map_err(err("async upload"))?;
                let e0 = dev.event().map_err(err("event"))?;
                let e1 = dev.event().map_err(err("event"))?;
                ensure!(
                    st.live(Live::Events) >= 2,
                    "events {}",
                    st.live(Live::Events)
                );
                s.record(&e0).map_err(err("record"))?;
                std::thread::sleep(std::time::Duration::from_millis(30));
                s.record(&e1).map_err(err("record"))?;
                s2.wait(&e1).map_err(err("wait"))?;
                e1.synchronize().map_err(err("event sync"))?;
                let ms = e0.elapsed_ms(&e1).map_err(err("elapsed"))?;
                ensure!(
                    (25.0..10_000.0).contains(&ms),
                    "elapsed {ms} ms for a 30 ms sleep"
                );
                let back = c.to_vec().map_err(err("download c"))?;
                ensure!(back == data[..1024], "async upload from pinned memory");
                // A stream handle the runtime does not know is its error,
                // with the runtime's code.
                // SAFETY: the borrowed stream is only synchronised (the
                // runtime validates the handle) and never destroyed.
                let bogus = unsafe { Stream::from_raw(&dev, RawStream(0x5eed_0000)) };
                let e = bogus
                    .synchronize()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                ensure!(
                    e.contains("400") && e.contains("hipStreamSynchronize"),
                    "bogus stream: {e:?}"
                );
                drop((a, b, c, pinned, e0, e1, s2));
                dev.synchronize().map_err(err("synchronize"))?;
                ensure!(
                    st.live(Live::Events) == 0,
                    "events left: {}",
                    st.live(Live::Events)
                );
                ensure!(
                    dev.take_errors().is_empty(),
                    "errors recorded on the device"
                );
            }
            // The device is closed: everything it made is released.
            for (what, n) in [
                ("allocations", st.live(Live::Allocations)),
                ("device bytes", st.live(Live::DeviceBytes)),
                ("pinned allocations", st.live(Live::HostAllocations)),
                ("registered ranges", st.live(Live::Registered)),
                ("streams", st.live(Live::Streams)),
                ("events", st.live(Live::Events)),
                ("modules", st.live(Live::Modules)),
            ] {
                ensure!(n == 0, "{n} {what} left after the device closed");
            }
            ensure!(
                st.pending_errors() == (0, 0),
                "pending: {:?}",
                st.pending_errors()
            );
            Ok(())
        },
    );
}

// ----- kernel launches against the code objects' argument metadata ----------

/// One expected argument of a launch.
#[derive(Debug)]
enum Want {
    /// A device address the test knows (0: null).
    Ptr(u64),
    /// A device address the crate made (a scratch buffer).
    AnyPtr,
    /// An 8-byte value.
    U64(u64),
    /// A 4-byte value.
    U32(u32),
    /// A by-value struct, byte for byte.
    Bytes(Vec<u8>),
}

/// Checks one recorded launch against the kernel's metadata and what the
/// crate meant to pass.
fn check_launch(l: &Launch, k: &KernelResources, want: &[Want]) -> R {
    let name = &k.name;
    ensure!(
        l.name == *name,
        "launched {} where {name} was expected",
        l.name
    );
    ensure!(
        l.packed == 1,
        "{name}: arguments not packed by the registered layout"
    );
    let args: Vec<_> = k.explicit_args().collect();
    ensure!(
        args.len() == want.len(),
        "{name}: the code object has {} explicit arguments, the crate's call {}",
        args.len(),
        want.len()
    );
    for (i, (a, w)) in args.iter().zip(want).enumerate() {
        let (off, size) = (a.offset as usize, a.size as usize);
        let at = |len: usize| {
            l.arg_u64(off, len)
                .ok_or(format!("{name} arg {i}: outside the record"))
        };
        match w {
            Want::Ptr(_) | Want::AnyPtr => {
                ensure!(
                    a.value_kind == "global_buffer" && size == 8,
                    "{name} arg {i}: the kernel takes {} of {size} bytes, the crate an address",
                    a.value_kind
                );
                let status = l.pointers.get(i).copied().flatten();
                match w {
                    Want::Ptr(0) => {
                        ensure!(
                            at(8)? == 0 && status == Some(PointerArg::Null),
                            "{name} arg {i}: not null"
                        )
                    }
                    Want::Ptr(p) => {
                        let got = at(8)?;
                        ensure!(
                            got == *p,
                            "{name} arg {i}: address {got:#x}, expected {p:#x}"
                        );
                        ensure!(
                            status == Some(PointerArg::Device),
                            "{name} arg {i}: {status:?}"
                        );
                    }
                    _ => ensure!(
                        status == Some(PointerArg::Device),
                        "{name} arg {i}: scratch address {:#x} is {status:?}",
                        at(8)?
                    ),
                }
            }
            Want::U64(v) => {
                ensure!(
                    a.value_kind == "by_value" && size == 8,
                    "{name} arg {i}: {a:?} for a u64"
                );
                ensure!(at(8)? == *v, "{name} arg {i}: {} expected {v}", at(8)?);
            }
            Want::U32(v) => {
                ensure!(
                    a.value_kind == "by_value" && size == 4,
                    "{name} arg {i}: {a:?} for a u32"
                );
                ensure!(
                    at(4)? == u64::from(*v),
                    "{name} arg {i}: {} expected {v}",
                    at(4)?
                );
            }
            Want::Bytes(b) => {
                ensure!(
                    a.value_kind == "by_value" && size == b.len(),
                    "{name} arg {i}: {a:?} for a struct of {} bytes",
                    b.len()
                );
                let got = l
                    .args
                    .get(off..off + size)
                    .ok_or("struct outside the record")?;
                ensure!(got == &b[..], "{name} arg {i}: struct bytes differ");
            }
        }
    }
    ensure!(l.block == [256, 1, 1], "{name}: block {:?}", l.block);
    ensure!(
        u64::from(l.block[0]) <= k.max_flat_workgroup_size,
        "{name}: {} threads per block, the kernel was built for at most {}",
        l.block[0],
        k.max_flat_workgroup_size
    );
    ensure!(
        u64::from(l.shared) + k.group_segment_fixed_size <= 64 * 1024,
        "{name}: {} + {} bytes of LDS",
        l.shared,
        k.group_segment_fixed_size
    );
    ensure!(l.grid.iter().all(|&g| g >= 1), "{name}: grid {:?}", l.grid);
    Ok(())
}

/// The launches made by `f`, which must be exactly the kernels `names`.
fn launches_of(st: &Standin, names: &[&str], f: impl FnOnce() -> R) -> Result<Vec<Launch>, String> {
    let before = st.launches().len();
    f()?;
    let new: Vec<Launch> = st.launches().split_off(before);
    let got: Vec<&str> = new.iter().map(|l| l.name.as_str()).collect();
    ensure!(got == names, "launched {got:?}, expected {names:?}");
    Ok(new)
}

fn conv3d_struct(g: &Conv3dGeometry, bias: bool) -> Vec<u8> {
    let p = &g.params;
    let fields = [
        g.batch,
        g.in_channels,
        g.input[0],
        g.input[1],
        g.input[2],
        g.out_channels,
        g.kernel[0],
        g.kernel[1],
        g.kernel[2],
        g.output[0],
        g.output[1],
        g.output[2],
        p.stride[0],
        p.stride[1],
        p.stride[2],
        p.padding[0],
        p.padding[1],
        p.padding[2],
        p.dilation[0],
        p.dilation[1],
        p.dilation[2],
        p.groups,
        usize::from(bias),
    ];
    fields
        .iter()
        .flat_map(|&v| (v as u64).to_le_bytes())
        .collect()
}

/// Every kernel the crate launches, for the arch the environment names:
/// the code object the crate loaded is the arch's, and each launch's
/// argument bytes, packed by that code object's metadata, are the values
/// the crate meant.
fn check_every_launch(arch: &str) -> R {
    let dev = open_device()?;
    let st = loaded_standin()?;
    ensure!(
        st.arch() == arch,
        "the stand-in runs {}, expected {arch}",
        st.arch()
    );
    ensure!(
        dev.info().arch == arch,
        "the crate chose {} for {arch}",
        dev.info().arch
    );
    dev.kernel_source().map_err(err("loading the kernels"))?;
    let (image, elf) = st.module_image(0).ok_or("no module loaded")?;
    let info: CodeObjectInfo =
        read_code_object(elf, arch).map_err(err("the loaded code object"))?;
    ensure!(
        info.target.ends_with(arch),
        "loaded the code object of {}",
        info.target
    );
    ensure!(
        read_code_object(image, arch).map_err(err("the loaded bundle"))? == info,
        "the bundle's {arch} entry differs from the code object the stand-in chose"
    );
    for k in &info.kernels {
        let layout: Vec<(u64, u64, bool)> = k
            .explicit_args()
            .map(|a| (a.size, a.offset, a.value_kind == "global_buffer"))
            .collect();
        ensure!(
            !layout.is_empty(),
            "{}: no explicit arguments in the metadata",
            k.name
        );
        st.set_kernel_layout(&k.name, &layout);
    }
    let kernel = |name: &str| {
        info.kernels
            .iter()
            .find(|k| k.name == name)
            .ok_or(format!("{name} missing from the {arch} code object"))
    };
    let s = dev.stream().map_err(err("stream"))?;
    let ptr = |p: rocm_safe::device::DevicePtr| p.0;
    let n = 1000usize;
    let mut launched: Vec<String> = Vec::new();

    // Conversions: (src, dst, n), 8 elements per item.
    let bf = s
        .clone_htod(&vec![bf16::from_f32(1.5); n])
        .map_err(err("upload"))?;
    let hf = s
        .clone_htod(&vec![f16::from_f32(-2.0); n])
        .map_err(err("upload"))?;
    let mut f = s.alloc::<f32>(n).map_err(err("alloc"))?;
    let mut bf_out = s.alloc::<bf16>(n).map_err(err("alloc"))?;
    let mut hf_out = s.alloc::<f16>(n).map_err(err("alloc"))?;
    let one_d = |l: &Launch, items: usize| -> R {
        ensure!(
            l.grid == [items.div_ceil(256) as u32, 1, 1],
            "{}: grid {:?} for {items} items",
            l.name,
            l.grid
        );
        Ok(())
    };
    let convert_items = n.div_ceil(8);
    let l = launches_of(&st, &["convert_bf16_f32"], || {
        s.convert(&bf.view(), &mut f.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_bf16_f32")?,
        &[
            Want::Ptr(ptr(bf.device_ptr())),
            Want::Ptr(ptr(f.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    one_d(&l[0], convert_items)?;
    ensure!(
        l[0].stream_id == st.stream_id(s.raw().0) && l[0].stream_id != 0,
        "launched on stream {}",
        l[0].stream_id
    );
    let l = launches_of(&st, &["convert_f16_f32"], || {
        s.convert(&hf.view(), &mut f.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_f16_f32")?,
        &[
            Want::Ptr(ptr(hf.device_ptr())),
            Want::Ptr(ptr(f.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    let l = launches_of(&st, &["convert_f32_bf16"], || {
        s.convert(&f.view(), &mut bf_out.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_f32_bf16")?,
        &[
            Want::Ptr(ptr(f.device_ptr())),
            Want::Ptr(ptr(bf_out.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    let l = launches_of(&st, &["convert_f32_f16"], || {
        s.convert(&f.view(), &mut hf_out.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_f32_f16")?,
        &[
            Want::Ptr(ptr(f.device_ptr())),
            Want::Ptr(ptr(hf_out.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    one_d(&l[0], convert_items)?;
    launched.extend(
        [
            "convert_bf16_f32",
            "convert_f16_f32",
            "convert_f32_bf16",
            "convert_f32_f16",
        ]
        .map(String::from),
    );
    // fp8 -> f32 with runtime dtypes: (src, dst, n), 16 elements per item.
    let f8 = s.clone_htod(&vec![0x38u8; n]).map_err(err("upload"))?;
    for (name, dtype) in [
        ("convert_f8_e4m3_f32", rocm_safe::DType::F8_E4M3),
        ("convert_f8_e5m2_f32", rocm_safe::DType::F8_E5M2),
    ] {
        let mut fv = f.view_mut();
        let mut out = fv.cast_mut::<u8>().map_err(err("cast"))?;
        let l = launches_of(&st, &[name], || {
            s.convert_raw(&f8.view(), dtype, &mut out, rocm_safe::DType::F32)
                .map_err(err("convert_raw"))
        })?;
        check_launch(
            &l[0],
            kernel(name)?,
            &[
                Want::Ptr(ptr(f8.device_ptr())),
                Want::Ptr(ptr(f.device_ptr())),
                Want::U64(n as u64),
            ],
        )?;
        one_d(&l[0], n.div_ceil(16))?;
        launched.push(name.into());
    }

    // Fingerprint: (src, nbytes, first_word, acc), 16 bytes per item.
    let mut acc = s.alloc_zeros::<u64>(1).map_err(err("alloc acc"))?;
    let l = launches_of(&st, &["fingerprint_sum_u8"], || {
        s.fingerprint_sum_into(&f.view(), &mut acc.view_mut())
            .map_err(err("fingerprint"))
    })?;
    check_launch(
        &l[0],
        kernel("fingerprint_sum_u8")?,
        &[
            Want::Ptr(ptr(f.device_ptr())),
            Want::U64(4 * n as u64),
            Want::U64(0),
            Want::Ptr(ptr(acc.device_ptr())),
        ],
    )?;
    one_d(&l[0], (4 * n).div_ceil(16))?;
    // Fused: (src, dst, n, acc).
    for (name, src) in [
        ("convert_fingerprint_bf16_f32", ptr(bf.device_ptr())),
        ("convert_fingerprint_f16_f32", ptr(hf.device_ptr())),
    ] {
        let l = launches_of(&st, &[name], || {
            if name.contains("bf16") {
                s.convert_fingerprint_into(&bf.view(), &mut f.view_mut(), &mut acc.view_mut())
            } else {
                s.convert_fingerprint_into(&hf.view(), &mut f.view_mut(), &mut acc.view_mut())
            }
            .map_err(err("convert_fingerprint"))
        })?;
        check_launch(
            &l[0],
            kernel(name)?,
            &[
                Want::Ptr(src),
                Want::Ptr(ptr(f.device_ptr())),
                Want::U64(n as u64),
                Want::Ptr(ptr(acc.device_ptr())),
            ],
        )?;
        launched.push(name.into());
    }
    launched.push("fingerprint_sum_u8".into());

    // Non-finite scans: (ptr, n, clamp, counts).
    for (name, p) in [
        ("nonfinite_f32", ptr(f.device_ptr())),
        ("nonfinite_bf16", ptr(bf_out.device_ptr())),
        ("nonfinite_f16", ptr(hf_out.device_ptr())),
    ] {
        for clamp in [false, true] {
            let l = launches_of(&st, &[name], || {
                let r = match (name, clamp) {
                    ("nonfinite_f32", false) => s.count_nonfinite(&f.view()),
                    ("nonfinite_f32", true) => s.clamp_nonfinite(&mut f.view_mut()),
                    ("nonfinite_bf16", false) => s.count_nonfinite(&bf_out.view()),
                    ("nonfinite_bf16", true) => s.clamp_nonfinite(&mut bf_out.view_mut()),
                    (_, false) => s.count_nonfinite(&hf_out.view()),
                    (_, true) => s.clamp_nonfinite(&mut hf_out.view_mut()),
                };
                r.map(drop).map_err(err("nonfinite"))
            })?;
            check_launch(
                &l[0],
                kernel(name)?,
                &[
                    Want::Ptr(p),
                    Want::U64(n as u64),
                    Want::U32(u32::from(clamp)),
                    Want::AnyPtr,
                ],
            )?;
        }
        launched.push(name.into());
    }

    // conv3d: (x, w, bias, y, rs_conv3d_args by value), with and without a bias.
    let g = Conv3dProblem::new(
        Conv3dParams {
            stride: [1, 2, 1],
            padding: [1, 0, 1],
            dilation: [1, 1, 2],
            groups: 2,
        },
        Conv3dData::F32(&[0.0; 2 * 4 * 5 * 6 * 7]),
        &[2usize, 4, 5, 6, 7],
        Conv3dData::F32(&[0.0; 16 * 2 * 3 * 2 * 2]),
        &[16usize, 2, 3, 2, 2],
        None,
    )
    .map_err(err("conv3d problem"))?
    .geometry;
    let input_len: usize = g.input_shape().iter().product();
    let weight_len: usize = g.weight_shape().iter().product();
    let bias = s
        .clone_htod(&vec![0.5f32; g.out_channels])
        .map_err(err("bias"))?;
    let mut y = s.alloc::<f32>(g.output_len()).map_err(err("y"))?;
    for (dtype, kind) in [
        ("f32", Conv3dKernel::Naive),
        ("f32", Conv3dKernel::Tiled),
        ("bf16", Conv3dKernel::Naive),
        ("bf16", Conv3dKernel::Tiled),
    ] {
        let name = format!(
            "conv3d_{}_{dtype}",
            if kind == Conv3dKernel::Naive {
                "naive"
            } else {
                "tiled"
            }
        );
        for with_bias in [false, true] {
            let b = with_bias.then(|| bias.view());
            let (x_ptr, w_ptr);
            let l = if dtype == "f32" {
                let x = s.clone_htod(&vec![1f32; input_len]).map_err(err("x"))?;
                let w = s.alloc_zeros::<f32>(weight_len).map_err(err("w"))?;
                (x_ptr, w_ptr) = (ptr(x.device_ptr()), ptr(w.device_ptr()));
                launches_of(&st, &[&name], || {
                    s.conv3d(kind, &g, &x.view(), &w.view(), b, &mut y.view_mut())
                        .map_err(err("conv3d"))
                })?
            } else {
                let x = s
                    .clone_htod(&vec![bf16::ONE; input_len])
                    .map_err(err("x"))?;
                let w = s.alloc_zeros::<bf16>(weight_len).map_err(err("w"))?;
                (x_ptr, w_ptr) = (ptr(x.device_ptr()), ptr(w.device_ptr()));
                launches_of(&st, &[&name], || {
                    s.conv3d(kind, &g, &x.view(), &w.view(), b, &mut y.view_mut())
                        .map_err(err("conv3d"))
                })?
            };
            let bias_ptr = if with_bias { ptr(bias.device_ptr()) } else { 0 };
            check_launch(
                &l[0],
                kernel(&name)?,
                &[
                    Want::Ptr(x_ptr),
                    Want::Ptr(w_ptr),
                    Want::Ptr(bias_ptr),
                    Want::Ptr(ptr(y.device_ptr())),
                    Want::Bytes(conv3d_struct(&g, with_bias)),
                ],
            )?;
        }
        launched.push(name);
    }
    s.synchronize().map_err(err("synchronize"))?;

    // Every recorded launch was packed by its kernel's layout, and the
    // kernels launched are those the test expected.
    for l in st.launches() {
        ensure!(
            l.packed == 1,
            "{}: launched without a layout (an unknown kernel?)",
            l.name
        );
    }
    let names: std::collections::BTreeSet<String> =
        st.launches().into_iter().map(|l| l.name).collect();
    let want: std::collections::BTreeSet<String> = launched.into_iter().collect();
    ensure!(
        names == want,
        "kernels launched {names:?}, checked {want:?}"
    );
    // The conv3d chain's own launches (its tiers and the checks of their
    // output on the device): values the test cannot predict, but each is
    // packed by its kernel's layout, in the block the kernel was built
    // for, with every address inside device memory (or null).
    let before = st.launches().len();
    let x: Vec<f32> = (0..2 * 4 * 5 * 6 * 7)
        .map(|i| (i % 5) as f32 - 2.0)
        .collect();
    let w: Vec<f32> = (0..16 * 2 * 3 * 2 * 2)
        .map(|i| (i % 3) as f32 - 1.0)
        .collect();
    let p = Conv3dProblem::new(
        g.params,
        Conv3dData::F32(&x),
        &[2usize, 4, 5, 6, 7],
        Conv3dData::F32(&w),
        &[16usize, 2, 3, 2, 2],
        None,
    )
    .map_err(err("conv3d problem"))?;
    Conv3dChain::for_device(&dev)
        .run(&p)
        .map_err(err("conv3d chain"))?;
    let chain = st.launches().split_off(before);
    ensure!(!chain.is_empty(), "the chain launched nothing");
    for l in &chain {
        let k = kernel(&l.name)?;
        ensure!(l.packed == 1, "{}: not packed by its layout", l.name);
        ensure!(
            l.block.iter().product::<u32>() as u64 <= k.max_flat_workgroup_size,
            "{}: block {:?} over the kernel's {}",
            l.name,
            l.block,
            k.max_flat_workgroup_size
        );
        for (i, ptr) in l.pointers.iter().enumerate() {
            ensure!(
                !matches!(ptr, Some(PointerArg::Elsewhere)),
                "{} arg {i}: an address outside device memory",
                l.name
            );
        }
    }
    println!(
        "{arch}: checked {} kernels by value, {} chain launches of {:?}",
        want.len(),
        chain.len(),
        chain
            .iter()
            .map(|l| l.name.as_str())
            .collect::<std::collections::BTreeSet<_>>()
    );
    ensure!(
        st.pending_errors() == (0, 0),
        "pending: {:?}",
        st.pending_errors()
    );
    Ok(())
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn every_launch_matches_the_argument_metadata_of_every_built_arch() {
    let archs = rocm_safe::device::hip::built_archs();
    assert!(!archs.is_empty(), "a hip build embeds code objects");
    for arch in archs {
        scenario(
            "every_launch_matches_the_argument_metadata_of_every_built_arch",
            arch,
            |c| {
                c.env(RUNTIME_VAR, built().file(7))
                    .env("HSA_OVERRIDE_GFX_VERSION", hsa_override(arch));
            },
            || check_every_launch(arch),
        );
    }
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn an_arch_with_no_code_object_is_refused_with_the_reason() {
    scenario(
        "an_arch_with_no_code_object_is_refused_with_the_reason",
        "HIP 7",
        |c| {
            c.env(RUNTIME_VAR, built().file(7))
                .env("HSA_OVERRIDE_GFX_VERSION", "10.3.0");
        },
        || {
            let dev = open_device()?;
            ensure!(dev.info().arch == "gfx1030", "arch {}", dev.info().arch);
            let st = loaded_standin()?;
            let e = match dev.kernel_source() {
                Ok(k) => return Err(format!("kernels for gfx1030 from {k:?}")),
                Err(e) => e,
            };
            ensure!(
                matches!(e, Error::KernelUnavailable { .. }) && e.to_string().contains("gfx1030"),
                "{e}"
            );
            ensure!(
                st.calls("hipModuleLoadData") == 0,
                "a code object of another arch was loaded"
            );
            Ok(())
        },
    );
}

// ----- verification: kernels that never ran -----------------------------------

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn kernels_that_never_ran_are_never_reported_correct() {
    scenario(
        "kernels_that_never_ran_are_never_reported_correct",
        "HIP 7",
        on_standin(7),
        || {
            let dev = open_device()?;
            let st = loaded_standin()?;
            let s = dev.stream().map_err(err("stream"))?;
            let host: Vec<bf16> = (0..4096u32)
                .map(|i| bf16::from_bits((i * 7919) as u16 & 0x7f7f))
                .collect();
            let want: Vec<f32> = host.iter().map(|v| v.to_f32()).collect();
            let src = s.clone_htod(&host).map_err(err("upload"))?;
            for opts in [
                VerifyOptions::default(),
                VerifyOptions::default().with_self_test(false),
                VerifyOptions::default()
                    .with_self_test(false)
                    .with_policy(Policy::ReadBack),
                VerifyOptions::default()
                    .with_self_test(false)
                    .with_policy(Policy::FusedFingerprint),
            ] {
                let mut dst = s.alloc::<f32>(host.len()).map_err(err("alloc"))?;
                let launches = st.launches().len();
                let r = convert_verified(&s, &host, &src.view(), &mut dst.view_mut(), &opts)
                    .map_err(err("convert_verified with the CPU fallback"))?;
                ensure!(
                    !matches!(r.outcome, Outcome::Served),
                    "{opts:?}: the device was trusted: {r}"
                );
                ensure!(
                    st.launches().len() > launches || opts.self_test,
                    "{opts:?}: no kernel was launched"
                );
                let out = dst.to_vec().map_err(err("download"))?;
                ensure!(out == want, "{opts:?}: the CPU fallback's output is wrong");
                let strict = opts.with_cpu_fallback(false);
                let mut dst = s.alloc::<f32>(host.len()).map_err(err("alloc"))?;
                match convert_verified(&s, &host, &src.view(), &mut dst.view_mut(), &strict) {
                    Ok(r) => return Err(format!("{strict:?}: returned as correct: {r}")),
                    Err(e) => ensure!(
                        matches!(
                            e,
                            Error::VerificationFailed { .. } | Error::KernelUntrusted { .. }
                        ),
                        "{strict:?}: {e}"
                    ),
                }
            }
            // The conv3d chain: the GPU tiers' output fails the checks, the
            // CPU serves.
            let x: Vec<f32> = (0..2 * 3 * 4 * 5 * 6)
                .map(|i| (i % 13) as f32 * 0.25 - 1.0)
                .collect();
            let w: Vec<f32> = (0..16 * 3 * 3 * 3 * 3)
                .map(|i| (i % 7) as f32 * 0.125 - 0.375)
                .collect();
            let p = Conv3dProblem::new(
                Conv3dParams::default(),
                Conv3dData::F32(&x),
                &[2usize, 3, 4, 5, 6],
                Conv3dData::F32(&w),
                &[16usize, 3, 3, 3, 3],
                None,
            )
            .map_err(err("conv3d problem"))?;
            let chain = Conv3dChain::for_device(&dev);
            let launches = st.launches().len();
            let (out, report) = chain.run(&p).map_err(err("conv3d chain"))?;
            ensure!(
                report.served_by() == Some(TierKind::Cpu),
                "served by {:?}: {report}",
                report.served_by()
            );
            let failed: Vec<TierKind> = report
                .attempts
                .iter()
                .filter(|a| matches!(a.outcome, Outcome::Failed(_)))
                .map(|a| a.kind)
                .collect();
            ensure!(
                failed.contains(&TierKind::Tiled) && failed.contains(&TierKind::Naive),
                "{report}"
            );
            ensure!(
                st.launches().len() > launches,
                "the GPU tiers launched nothing"
            );
            let (cpu, _) = Conv3dChain::first_gpu().run(&p).map_err(err("CPU chain"))?;
            ensure!(out == cpu, "the chain's output is not the CPU's");
            Ok(())
        },
    );
}

/// A checkpoint loaded onto the stand-in device: kernels never run, so no
/// device check passes, yet every tensor arrives exact (the ladder's lower
/// rungs) and none is reported as served by a rung whose device check
/// could not have passed.
#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn a_load_through_kernels_that_never_ran_is_exact() {
    for (case, policy) in [
        ("fingerprint", Policy::Fingerprint),
        ("read-back", Policy::ReadBack),
    ] {
        scenario(
            "a_load_through_kernels_that_never_ran_is_exact",
            case,
            on_standin(7),
            || load_through_the_standin(policy),
        );
    }
}

fn load_through_the_standin(policy: Policy) -> R {
    use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
    use rocm_safe::transfer::{LoadOptions, Loader, Rung};
    use rocm_safe::DType;
    let dir = tempfile::tempdir().map_err(err("tempdir"))?;
    let path = dir.path().join("ckpt.safetensors");
    let specs: [(&str, DType, Vec<u64>); 3] = [
        ("a.bf16", DType::BF16, vec![300, 333]),
        ("b.f32", DType::F32, vec![70, 101]),
        ("c.f16", DType::F16, vec![1000]),
    ];
    let mut w = SafeTensorsWriter::create(
        &path,
        specs
            .iter()
            .map(|(n, d, sh)| TensorSpec::new(*n, *d, sh.clone())),
        None,
    )
    .map_err(err("writer"))?;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for (n, d, sh) in &specs {
        let len = d.bytes_for(sh.iter().product()).ok_or("size")? as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Finite values only: no exponent of all ones.
                (seed as u8) & 0x7e
            })
            .collect();
        w.write_tensor(n, &bytes).map_err(err("write"))?;
    }
    w.finish().map_err(err("finish"))?;
    let ckpt = Checkpoint::open(&path).map_err(err("open"))?;
    let dev = open_device()?;
    let st = loaded_standin()?;
    let opts = LoadOptions::default()
        .with_dtype(Some(DType::F32))
        .with_policy(policy)
        .with_self_test(false)
        .with_ring_buffers(2)
        .with_buffer_bytes(64 * 1024)
        .with_small_chunk_bytes(16 * 1024);
    let launches = st.launches().len();
    let loaded = Loader::new(&dev, opts)
        .map_err(err("loader"))?
        .load_all(&ckpt)
        .map_err(err("load"))?;
    ensure!(
        st.launches().len() > launches,
        "the load launched no kernel"
    );
    for t in &loaded.tensors {
        let want = ckpt
            .read_converted_bytes(&t.name, t.dtype)
            .map_err(err("reader"))?;
        let got = t.data.to_host().map_err(err("to_host"))?;
        ensure!(
            got == want,
            "{}: the loaded bytes differ from the reader's",
            t.name
        );
        let rep = loaded.report.tensor(&t.name).ok_or("no report")?;
        let rungs: Vec<Rung> = rep.attempts.iter().map(|a| a.step).collect();
        // A device rung serves only what needs no kernel: a tensor loaded
        // as stored, checked by reading it back (copies are real here);
        // with fingerprints, not even the CPU conversion's upload is
        // confirmed (the device fingerprint never runs): kept on the host.
        let stored = ckpt.info(&t.name).map_err(err("info"))?.dtype;
        let want_rung = match (policy, t.dtype == stored) {
            (Policy::ReadBack, true) => Rung::PinnedRing,
            (Policy::ReadBack, false) => Rung::CpuConvert,
            _ => Rung::KeepOnHost,
        };
        ensure!(
            rep.rung == want_rung,
            "{}: served by {:?} after {rungs:?}, expected {want_rung:?}",
            t.name,
            rep.rung
        );
    }
    ensure!(
        st.pending_errors() == (0, 0),
        "pending: {:?}",
        st.pending_errors()
    );
    Ok(())
}

#[test]
fn hsa_override_strings() {
    assert_eq!(hsa_override("gfx1151"), "11.5.1");
    assert_eq!(hsa_override("gfx1100"), "11.0.0");
    assert_eq!(hsa_override("gfx1201"), "12.0.1");
    assert_eq!(hsa_override("gfx942"), "9.4.2");
    assert_eq!(hsa_override("gfx90a"), "9.0.10");
}
