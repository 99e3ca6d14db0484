//! The CUDA kernel cache on disk, on a real GPU (`--features cuda --
//! --ignored`): a process that compiles the kernels writes them to
//! `$ROCM_SAFE_CACHE_DIR`; the next process loads them from there (no
//! NVRTC) and they convert exactly; a damaged cache file is compiled again
//! and rewritten. Each process is this test binary run again on
//! `gpu::one_process`.

#[cfg(feature = "cuda")]
mod gpu {
    use std::path::Path;
    use std::process::Command;

    use half::bf16;
    use rocm_safe::convert::scalar;
    use rocm_safe::device::{BackendKind, Device, KernelSource};

    /// Where the kernel cache lives (the README's `ROCM_SAFE_CACHE_DIR`).
    const CACHE_DIR_VAR: &str = "ROCM_SAFE_CACHE_DIR";
    /// The kernel source the child process must report.
    const EXPECT_VAR: &str = "ROCM_SAFE_TEST_EXPECT_KERNEL_SOURCE";

    /// Loads the kernels, checks where they came from (when told), and
    /// converts every bf16 pattern exactly with them.
    #[test]
    #[ignore = "needs a GPU"]
    fn one_process() {
        let dev = Device::open(BackendKind::Cuda, 0).expect("open cuda:0");
        let source = dev.kernel_source().expect("kernels load");
        if let Ok(want) = std::env::var(EXPECT_VAR) {
            assert_eq!(format!("{source:?}"), want);
            // The process's record of its loads says the same, and that
            // nothing of conv3d was compiled for a conversion.
            let loads = rocm_safe::device::kernel_loads();
            assert!(
                loads
                    .iter()
                    .any(|l| l.module == "core" && format!("{:?}", l.source) == want),
                "{loads:?}"
            );
            assert!(
                !loads.iter().any(|l| l.module.starts_with("conv3d")),
                "{loads:?}"
            );
        }
        let s = dev.stream().unwrap();
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let src = s.clone_htod(&all).unwrap();
        let mut out = s.alloc::<f32>(all.len()).unwrap();
        s.convert(&src.view(), &mut out.view_mut()).unwrap();
        let mut host = vec![0f32; all.len()];
        out.view().copy_dtoh(&s, &mut host).unwrap();
        for (b, x) in all.iter().zip(&host) {
            assert_eq!(x.to_bits(), scalar::bf16_to_f32(b.to_bits()), "{b:?}");
        }
    }

    fn child(dir: &Path, expect: KernelSource) {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &crate::common::listed(module_path!(), "one_process"),
                "--include-ignored",
            ])
            .env(CACHE_DIR_VAR, dir)
            .env(EXPECT_VAR, format!("{expect:?}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child expecting {expect:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The child really ran the test (not filtered out).
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
    }

    fn cached_files(dir: &Path) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|x| x == "cubin"))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn second_process_loads_the_kernels_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        child(dir.path(), KernelSource::Compiled);
        let files = cached_files(dir.path());
        assert_eq!(files.len(), 1, "{files:?}");
        child(dir.path(), KernelSource::DiskCache);
        // Damaged: compiled again, and the file is whole again afterwards.
        let whole = std::fs::read(&files[0]).unwrap();
        let mut damaged = whole.clone();
        let at = damaged.len() / 2;
        damaged[at] ^= 0x40;
        std::fs::write(&files[0], &damaged).unwrap();
        child(dir.path(), KernelSource::Compiled);
        assert_eq!(std::fs::read(&files[0]).unwrap(), whole);
        child(dir.path(), KernelSource::DiskCache);
        // Whole (its header checks out) but code the driver refuses, or
        // that is not an ELF image at all: compiled again too.
        let name = files[0].file_stem().unwrap().to_string_lossy().into_owned();
        let key = name.rsplit('-').next().unwrap();
        for body in [
            &b"\x7fELF but not a cubin\n"[..],
            &b"this is not a cubin\n"[..],
        ] {
            let fp = rocm_safe::convert::fingerprint::fingerprint_bytes(body);
            let mut file = format!("// rocm-safe nvrtc cache {key} {fp}\n").into_bytes();
            file.extend_from_slice(body);
            std::fs::write(&files[0], file).unwrap();
            child(dir.path(), KernelSource::Compiled);
            assert_eq!(std::fs::read(&files[0]).unwrap(), whole);
        }
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn an_empty_cache_dir_variable_turns_the_disk_cache_off() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &crate::common::listed(module_path!(), "one_process"),
                "--include-ignored",
            ])
            .env(CACHE_DIR_VAR, "")
            .env(EXPECT_VAR, format!("{:?}", KernelSource::Compiled))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
    }
}
