//! The HIP runtime layer (`src/device/runtime/hip/`) executed over the stand-in
//! HIP runtime (`tests/hip-standin/standin.c`, built here with the C
//! compiler): the loading order and reuse of an already loaded runtime,
//! HIP 7's sticky error cleared after the failures the crate handles, and
//! unknown error codes (memory, streams, events and verification of
//! kernels that never ran: `tests/hip_standin_memory.rs`; every kernel
//! launch's argument bytes: `tests/hip_standin_launches.rs`).
//!
//! The crate chooses its HIP runtime once per process, so each scenario
//! runs in a child process (`common::hip_standin::scenario`: the test
//! binary itself, asked for exactly that test). Needs only a C compiler
//! (`cc`, or `$CC`); where build.rs found none, every test here is ignored
//! with that reason.
#![cfg(feature = "hip")]

mod common;

use std::path::PathBuf;

use common::hip_scenarios::{
    built, err, loaded_standin, on_standin, open_device, version_of, R, RUNTIME_VAR,
};
use common::hip_standin::{self as standin, scenario, Standin};
use rocm_safe::device::{raw::RawStream, BackendKind, Device, Stream};

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
