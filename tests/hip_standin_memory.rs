//! Memory, streams and events of the HIP runtime layer over the stand-in
//! HIP runtime (`tests/hip-standin/standin.c`, built here with the C
//! compiler), and verification catching kernels that never ran (the
//! stand-in records launches and runs none): no check passes, a load
//! arrives exact through the ladder's lower rungs (loading and errors:
//! `tests/hip_runtime_standin.rs`).
//!
//! The crate chooses its HIP runtime once per process, so each scenario
//! runs in a child process (`common::hip_standin::scenario`: the test
//! binary itself, asked for exactly that test). Needs only a C compiler
//! (`cc`, or `$CC`); where build.rs found none, every test here is ignored
//! with that reason.
#![cfg(feature = "hip")]

mod common;

use common::hip_scenarios::{err, loaded_standin, on_standin, open_device, R};
use common::hip_standin::{scenario, Live};
use half::bf16;
use rocm_safe::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::{Conv3dChain, TierKind};
use rocm_safe::device::{raw::RawStream, BackendKind, Stream};
use rocm_safe::fallback::Outcome;
use rocm_safe::verify::{convert_verified, Policy, VerifyOptions};
use rocm_safe::Error;

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
