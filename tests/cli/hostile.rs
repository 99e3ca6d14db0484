//! The examples against a hostile user, through the real binaries: an
//! OUTPUT that is the INPUT (or a shard, or the index), special files,
//! FIFOs (no hang), a file changed during the write, sizes beyond memory
//! or 64 bits, signals in the middle of a write, 255-byte names, and a
//! conv3d whose exact result overflows f32.

use crate::example_bin;

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rocm_safe::safetensors::{SafeTensors, SafeTensorsWriter, TensorSpec};
use rocm_safe::DType;

/// Runs example `name` with `args` (and `env`), failing the test if it
/// has not exited within 30 s (a hang).
fn run_env(name: &str, args: &[&dyn AsRef<OsStr>], env: &[(&str, &str)]) -> Output {
    let child = spawn(name, args, env);
    wait(child, Duration::from_secs(30))
}

fn run(name: &str, args: &[&dyn AsRef<OsStr>]) -> Output {
    run_env(name, args, &[])
}

fn spawn(name: &str, args: &[&dyn AsRef<OsStr>], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(example_bin::example(name));
    for a in args {
        cmd.arg(a);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

fn wait(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "hung: no exit within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

/// Exit 1, one stderr line containing `needle`, no panic, no temporary.
fn assert_refused(o: &Output, dir: &Path, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(!e.contains("panicked"), "{e}");
    assert!(e.contains(needle), "{needle:?} not in {e:?}");
    assert_eq!(temporaries(dir), Vec::<String>::new());
}

/// One BF16 tensor `x` of `n` elements (varied values).
fn write_bf16(path: &Path, n: usize) {
    let mut w =
        SafeTensorsWriter::create(path, [TensorSpec::new("x", DType::BF16, [n as u64])], None)
            .unwrap();
    let bytes: Vec<u8> = (0..n)
        .flat_map(|i| half::bf16::from_f32(i as f32 * 0.25 - 7.0).to_le_bytes())
        .collect();
    w.write_tensor("x", &bytes).unwrap();
    w.finish().unwrap();
}

/// x [1,1,1,1,1] and w [1,1,1,1,1], F32, with the given values.
fn write_conv(path: &Path, x: f32, w: f32) {
    let one = [1u64; 5];
    let mut wr = SafeTensorsWriter::create(
        path,
        [
            TensorSpec::new("x", DType::F32, one),
            TensorSpec::new("w", DType::F32, one),
        ],
        None,
    )
    .unwrap();
    wr.write_tensor("x", &x.to_le_bytes()).unwrap();
    wr.write_tensor("w", &w.to_le_bytes()).unwrap();
    wr.finish().unwrap();
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

// ----- data loss -------------------------------------------------------------

#[test]
fn convert_and_conv3d_refuse_to_write_over_their_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in.safetensors");
    write_bf16(&input, 64);
    std::fs::create_dir(d.join("sub")).unwrap();
    std::os::unix::fs::symlink(&input, d.join("link.safetensors")).unwrap();
    std::fs::hard_link(&input, d.join("hard.safetensors")).unwrap();
    let before = std::fs::read(&input).unwrap();
    for out in [
        input.clone(),
        d.join("sub/../in.safetensors"),
        d.join("link.safetensors"),
        d.join("hard.safetensors"),
    ] {
        let o = run("convert", &[&input, &out, &"--dtype", &"f32"]);
        assert_refused(&o, d, "same file as the input");
        // The input reached through the link, the output its target.
        let o = run("convert", &[&out, &input, &"--dtype", &"f32"]);
        assert_refused(&o, d, "same file as the input");
        assert_eq!(std::fs::read(&input).unwrap(), before, "{}", out.display());
    }

    let conv = d.join("conv.safetensors");
    write_conv(&conv, 1.5, 2.0);
    let before = std::fs::read(&conv).unwrap();
    let alias = d.join("sub/../conv.safetensors");
    let o = run(
        "conv3d",
        &[&conv, &alias, &"--input", &"x", &"--weight", &"w"],
    );
    assert_refused(&o, d, "same file as the input");
    assert_eq!(std::fs::read(&conv).unwrap(), before);
}

#[test]
fn convert_refuses_a_shard_or_the_index_as_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_bf16(&d.join("s1.safetensors"), 8);
    let mut w = SafeTensorsWriter::create(
        d.join("s2.safetensors"),
        [TensorSpec::new("y", DType::F32, [2u64])],
        None,
    )
    .unwrap();
    w.write_tensor("y", &[0u8; 8]).unwrap();
    w.finish().unwrap();
    let index = d.join("m.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}}"#,
    )
    .unwrap();
    for out in [
        index.clone(),
        d.join("s1.safetensors"),
        d.join("s2.safetensors"),
    ] {
        let before = std::fs::read(&out).unwrap();
        let o = run("convert", &[&index, &out, &"--dtype", &"f32"]);
        assert_refused(&o, d, "same file as the input");
        assert_eq!(std::fs::read(&out).unwrap(), before);
    }
}

#[test]
fn convert_refuses_a_special_file_as_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_bf16(&input, 8);
    let fifo = dir.path().join("out.fifo");
    mkfifo(&fifo);
    // The test's own special files, never the machine's (/dev/null): a
    // regression destroys only these.
    let socket = dir.path().join("out.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut outs = vec![(fifo.clone(), "fifo"), (socket.clone(), "socket")];
    let null = dir.path().join("null");
    if mknod_null(&null) {
        outs.push((null.clone(), "character device"));
        let link = dir.path().join("null-link");
        std::os::unix::fs::symlink(&null, &link).unwrap();
        outs.push((link, "character device"));
    }
    for (out, kind) in outs {
        let o = run("convert", &[&input, &out, &"--dtype", &"f32"]);
        assert_refused(&o, dir.path(), kind);
    }
    let meta = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()));
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
    if let Ok(meta) = std::fs::symlink_metadata(&null) {
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &meta.file_type()
        ));
    }
}

/// A character device like /dev/null (1, 3) at `path`, when this user may
/// make one (root on a file system that allows device nodes).
fn mknod_null(path: &Path) -> bool {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
    rc == 0
}

#[test]
fn convert_to_a_link_writes_through_it_as_convert_to_dev_stdout_does() {
    // `convert in.safetensors /dev/stdout > out.safetensors`, with the
    // test's own link to /proc/self/fd/1 in place of the machine's
    // /dev/stdout (a regression replaces only this link).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in.safetensors");
    write_bf16(&input, 8);
    let stdout_link = d.join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &stdout_link).unwrap();
    let out = d.join("out.safetensors");
    let o = Command::new(example_bin::example("convert"))
        .arg(&input)
        .arg(&stdout_link)
        .args(["--dtype", "f32"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&stdout_link)
        .unwrap()
        .file_type()
        .is_symlink());
    let f = SafeTensors::open(&out).unwrap();
    assert_eq!(f.read::<f32>("x").unwrap().len(), 8);
    assert_eq!(temporaries(d), Vec::<String>::new());
    // Into a pipe (stdout not redirected to a file): refused, exit != 0,
    // and the link is still a link.
    let o = run("convert", &[&input, &stdout_link, &"--dtype", &"f32"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("fifo"), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&stdout_link)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn arguments_and_environment_that_are_not_utf8_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bad = OsStr::from_bytes(b"--\xff\xfe");
    // The doctor with a variable whose name and one whose value is not UTF-8.
    let o = Command::new(example_bin::example("doctor"))
        .env(OsStr::from_bytes(b"ROCM_SAFE_TEST_\xff"), "1")
        .env("MIOPEN_DEBUG_ROCM_SAFE_TEST", OsStr::from_bytes(b"\xff"))
        .output()
        .unwrap();
    assert!(o.status.success(), "doctor: {:?} {}", o.status, stderr(&o));
    // Arguments: a usage error (exit 2), not a panic (101).
    let o = run("doctor", &[&bad]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let input = dir.path().join("in.safetensors");
    write_bf16(&input, 8);
    let o = run("load", &[&input, &bad]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A checkpoint whose file name is not UTF-8 loads.
    let odd = dir.path().join(OsStr::from_bytes(b"odd-\xff.safetensors"));
    std::fs::copy(&input, &odd).unwrap();
    let o = run("load", &[&odd, &"--backend", &"host"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn an_input_changed_during_the_write_fails_the_convert() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_bf16(&input, 4 << 20); // 8 MiB: 8 chunks
    let bytes = std::fs::read(&input).unwrap();
    std::thread::sleep(Duration::from_millis(30)); // past the timestamp tick
    let out = dir.path().join("out.safetensors");
    let child = spawn(
        "convert",
        &[&input, &out, &"--dtype", &"f32"],
        &[("ROCM_SAFE_EXAMPLE_WRITE_DELAY_MS", "150")],
    );
    wait_for_temporary(dir.path());
    // Same size, other bytes, while the process is between two chunks:
    // one byte rewritten in place (no truncation, so no moment where the
    // file looks shorter).
    {
        use std::io::{Seek, SeekFrom, Write};
        let last = bytes.len() as u64 - 1;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&input)
            .unwrap();
        f.seek(SeekFrom::Start(last)).unwrap();
        f.write_all(&[bytes[bytes.len() - 1] ^ 1]).unwrap();
    }
    let o = wait(child, Duration::from_secs(60));
    assert_refused(&o, dir.path(), "changed while being read");
    assert!(stderr(&o).contains("in.safetensors"));
    assert!(!out.exists());
}

// ----- hangs -------------------------------------------------------------------

#[test]
fn fifos_as_file_index_or_shard_do_not_hang_convert_or_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out.safetensors");
    let f = d.join("f.safetensors");
    mkfifo(&f);
    let idx = d.join("fifo.safetensors.index.json");
    mkfifo(&idx);
    std::fs::create_dir(d.join("sh")).unwrap();
    let index = d.join("sh/m.safetensors.index.json");
    std::fs::write(&index, r#"{"weight_map": {"x": "s.safetensors"}}"#).unwrap();
    mkfifo(&d.join("sh/s.safetensors"));
    for input in [&f, &idx, &index] {
        let o = run("convert", &[input, &out, &"--dtype", &"f32"]);
        assert_refused(&o, d, "fifo");
        let o = run("load", &[input]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains("fifo"), "{}", stderr(&o));
    }
    assert!(!out.exists());
}

// ----- sizes ---------------------------------------------------------------------

#[test]
fn conv3d_with_a_huge_padding_is_refused_not_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_conv(&input, 1.0, 1.0);
    let out = dir.path().join("out.safetensors");
    let o = run(
        "conv3d",
        &[
            &input,
            &out,
            &"--input",
            &"x",
            &"--weight",
            &"w",
            &"--padding",
            &"100000",
        ],
    );
    assert_refused(&o, dir.path(), "more than this machine's memory");
    assert!(!out.exists());
}

#[test]
fn conv3d_with_a_tensor_larger_than_memory_is_refused_not_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("huge.safetensors");
    // x: BF16 [1, 1, 1, 1, E] (sparse), read as f32 since w is F32.
    // SAFETY: plain old data, all-zero valid; `info` is writable.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sysinfo(&mut info) }, 0);
    let memory = (info.totalram as u64 + info.totalswap as u64) * u64::from(info.mem_unit.max(1));
    let e = memory / 4 + (1 << 20);
    let header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[1,1,1,1,1],"data_offsets":[0,4]}},"x":{{"dtype":"BF16","shape":[1,1,1,1,{e}],"data_offsets":[4,{}]}}}}"#,
        4 + 2 * e
    );
    let mut h = header.into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&h);
    std::fs::write(&input, &bytes).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .unwrap();
    f.set_len(bytes.len() as u64 + 4 + 2 * e).unwrap();
    drop(f);
    let out = dir.path().join("out.safetensors");
    let o = run(
        "conv3d",
        &[&input, &out, &"--input", &"x", &"--weight", &"w"],
    );
    assert_refused(&o, dir.path(), "cannot allocate");
    assert!(stderr(&o).contains("\"x\""), "{}", stderr(&o));
}

#[test]
fn load_budget_that_overflows_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_bf16(&input, 8);
    for v in ["17592186044416", "18446744073709551615"] {
        let o = run("load", &[&input, &"--budget-mib", &v]);
        assert_eq!(o.status.code(), Some(2), "{v}: {}", stderr(&o));
        assert!(stderr(&o).contains("--budget-mib"), "{}", stderr(&o));
    }
    // The largest value that fits still loads.
    let o = run("load", &[&input, &"--budget-mib", &"17592186044415"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

// ----- leftovers -------------------------------------------------------------------

fn wait_for_temporary(dir: &Path) {
    let start = Instant::now();
    while temporaries(dir).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no temporary file appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn signals_during_a_write_leave_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_bf16(&input, 4 << 20);
    for (sig, code) in [
        (libc::SIGINT, 130),
        (libc::SIGTERM, 143),
        (libc::SIGHUP, 129),
    ] {
        let out = dir.path().join(format!("out-{sig}.safetensors"));
        let child = spawn(
            "convert",
            &[&input, &out, &"--dtype", &"f32"],
            &[("ROCM_SAFE_EXAMPLE_WRITE_DELAY_MS", "200")],
        );
        wait_for_temporary(dir.path());
        std::thread::sleep(Duration::from_millis(100)); // inside the write
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: sends a signal to our own child, which is still running
        // (not waited for yet).
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        let o = wait(child, Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(code), "signal {sig}: {}", stderr(&o));
        assert!(stderr(&o).contains("interrupted"), "{}", stderr(&o));
        assert_eq!(
            temporaries(dir.path()),
            Vec::<String>::new(),
            "signal {sig}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn convert_writes_an_output_named_with_255_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_bf16(&input, 16);
    let out = dir
        .path()
        .join(format!("{}.safetensors", "n".repeat(255 - 12)));
    let o = run("convert", &[&input, &out, &"--dtype", &"f32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let f = SafeTensors::open(&out).unwrap();
    assert_eq!(f.read::<f32>("x").unwrap().len(), 16);
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
}

// ----- conv3d overflow ---------------------------------------------------------------

#[test]
fn conv3d_overflow_is_reported_as_such_not_as_failing_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_conv(&input, 3.0e38, 2.0); // exact result 6e38 > f32::MAX
    let out = dir.path().join("out.safetensors");
    let o = run(
        "conv3d",
        &[&input, &out, &"--input", &"x", &"--weight", &"w"],
    );
    assert_refused(&o, dir.path(), "overflows f32");
    assert!(!stderr(&o).contains("no tier served"), "{}", stderr(&o));
    assert!(!out.exists());
}

/// A file of F32 tensors `x` and `w` with these shapes (zeros).
fn write_shapes(path: &Path, x: [u64; 5], w: [u64; 5]) {
    let mut wr = SafeTensorsWriter::create(
        path,
        [
            TensorSpec::new("x", DType::F32, x),
            TensorSpec::new("w", DType::F32, w),
        ],
        None,
    )
    .unwrap();
    wr.write_tensor("x", &vec![0u8; 4 * x.iter().product::<u64>() as usize])
        .unwrap();
    wr.write_tensor("w", &vec![0u8; 4 * w.iter().product::<u64>() as usize])
        .unwrap();
    wr.finish().unwrap();
}

#[test]
fn conv3d_with_an_empty_batch_or_no_output_channels_writes_an_empty_output() {
    let dir = tempfile::tempdir().unwrap();
    for (x, w, out_shape) in [
        (
            [0u64, 1, 2, 2, 2],
            [1u64, 1, 1, 1, 1],
            vec![0u64, 1, 2, 2, 2],
        ),
        ([1, 1, 2, 2, 2], [0, 1, 1, 1, 1], vec![1, 0, 2, 2, 2]),
    ] {
        for device in ["auto", "host"] {
            let input = dir.path().join("in.safetensors");
            let out = dir.path().join("out.safetensors");
            let _ = std::fs::remove_file(&out);
            write_shapes(&input, x, w);
            let o = run(
                "conv3d",
                &[
                    &input,
                    &out,
                    &"--input",
                    &"x",
                    &"--weight",
                    &"w",
                    &"--device",
                    &device,
                ],
            );
            assert!(o.status.success(), "{x:?} {w:?} {device}: {}", stderr(&o));
            let f = SafeTensors::open(&out).unwrap();
            let info = f.info("output").unwrap();
            assert_eq!(info.shape, out_shape);
            assert!(f.read_bytes("output").unwrap().is_empty());
        }
    }
}
