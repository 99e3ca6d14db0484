//! Hostile paths, special files, sizes and changes, through the library:
//! an output that is an input (every way of naming the same file), special
//! output files, FIFOs as inputs (no hang), a symlink swapped while shards
//! are opened (no read escapes the folder), files changed while read,
//! tensors larger than memory (no abort), cancellation, long names.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rocm_safe::safetensors::{
    Checkpoint, SafeTensors, SafeTensorsWriter, TensorSpec, WriteOptions,
};
use rocm_safe::{DType, Error};

use crate::common;
use common::sparse_bf16;

/// A file with one F32 tensor `name` of `n` elements, all `value`.
fn write_f32(path: &Path, name: &str, n: usize, value: f32) {
    let mut w =
        SafeTensorsWriter::create(path, [TensorSpec::new(name, DType::F32, [n as u64])], None)
            .unwrap();
    let bytes: Vec<u8> = std::iter::repeat_n(value.to_le_bytes(), n)
        .flatten()
        .collect();
    w.write_tensor(name, &bytes).unwrap();
    w.finish().unwrap();
}

/// Names in `dir` that look like the writer's temporary files.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

fn try_create(path: &Path) -> rocm_safe::Result<SafeTensorsWriter> {
    SafeTensorsWriter::create(path, [TensorSpec::new("y", DType::F32, [1u64])], None)
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// Runs `f` on another thread; fails the test if it takes more than 10 s
/// (a FIFO open that blocks would hang forever).
fn within_timeout<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("blocked: no result within 10 s")
}

/// A two-shard checkpoint: `a.safetensors` (tensor a), `b.safetensors`
/// (tensor b), `m.safetensors.index.json`.
fn sharded(dir: &Path) -> PathBuf {
    write_f32(&dir.join("a.safetensors"), "a", 4, 1.0);
    write_f32(&dir.join("b.safetensors"), "b", 4, 2.0);
    let index = dir.join("m.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"weight_map": {"a": "a.safetensors", "b": "b.safetensors"}}"#,
    )
    .unwrap();
    index
}

// ----- data loss: output that is an input ----------------------------------

fn try_create_with(
    path: &Path,
    inputs: Vec<rocm_safe::safetensors::FileId>,
) -> rocm_safe::Result<SafeTensorsWriter> {
    SafeTensorsWriter::create_with(
        path,
        [TensorSpec::new("y", DType::F32, [1u64])],
        None,
        WriteOptions::default().with_inputs(inputs),
    )
}

#[test]
fn output_naming_an_input_in_any_way_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in.safetensors");
    write_f32(&input, "x", 8, 3.0);
    std::fs::create_dir(d.join("sub")).unwrap();
    std::os::unix::fs::symlink(&input, d.join("link.safetensors")).unwrap();
    std::fs::hard_link(&input, d.join("hard.safetensors")).unwrap();
    std::os::unix::fs::symlink(d, d.join("dirlink")).unwrap();
    let before = std::fs::read(&input).unwrap();

    // The input opened by name or through a symlink: the same identities.
    for opened_as in [input.clone(), d.join("link.safetensors")] {
        let ids = Checkpoint::open(&opened_as).unwrap().file_ids();
        for out in [
            input.clone(),
            d.join("sub/../in.safetensors"),
            d.join("link.safetensors"),
            d.join("hard.safetensors"),
            d.join("dirlink/in.safetensors"),
        ] {
            match try_create_with(&out, ids.clone()) {
                Err(Error::OutputIsInput { .. }) => {}
                other => panic!("{}: {other:?}", out.display()),
            }
        }
    }
    assert_eq!(temporaries(d), Vec::<String>::new());
    assert_eq!(std::fs::read(&input).unwrap(), before);
    // Another file in the same folder is fine.
    let ids = Checkpoint::open(&input).unwrap().file_ids();
    drop(try_create_with(&d.join("other.safetensors"), ids).unwrap());
    assert_eq!(temporaries(d), Vec::<String>::new());
}

#[test]
fn output_that_is_a_shard_or_the_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path());
    let ck = Checkpoint::open(&index).unwrap();
    let ids = ck.file_ids();
    assert_eq!(ids.len(), 3);
    for out in [
        index.clone(),
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    ] {
        let before = std::fs::read(&out).unwrap();
        assert!(
            matches!(
                try_create_with(&out, ids.clone()),
                Err(Error::OutputIsInput { .. })
            ),
            "{}",
            out.display()
        );
        assert_eq!(std::fs::read(&out).unwrap(), before);
    }
    // Also when the output is replaced by a link to an input after create:
    // checked again before the rename.
    let out = dir.path().join("late.safetensors");
    let a_before = std::fs::read(dir.path().join("a.safetensors")).unwrap();
    let mut w = try_create_with(&out, ids).unwrap();
    w.write_tensor("y", &1f32.to_le_bytes()).unwrap();
    std::fs::hard_link(dir.path().join("a.safetensors"), &out).unwrap();
    assert!(matches!(w.finish(), Err(Error::OutputIsInput { .. })));
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
    assert_eq!(
        std::fs::read(dir.path().join("a.safetensors")).unwrap(),
        a_before
    );
}

#[test]
fn a_file_other_readers_hold_is_replaced_atomically_and_they_keep_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write_f32(&p, "x", 16, 1.0);
    let f = SafeTensors::open(&p).unwrap();
    // No input of this write: replacing the file another reader holds is
    // what `safetensors` does too; the reader keeps the file it opened.
    write_f32(&p, "x", 16, 2.0);
    assert_eq!(f.read::<f32>("x").unwrap(), vec![1.0; 16]);
    f.check_unchanged().unwrap();
    assert_eq!(
        SafeTensors::open(&p).unwrap().read::<f32>("x").unwrap(),
        vec![2.0; 16]
    );
}

#[test]
fn saves_racing_loads_of_the_same_path_never_fail() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("race.safetensors");
    write_f32(&p, "x", 64, 0.0);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let v = SafeTensors::open(&p).unwrap().read::<f32>("x").unwrap();
                // Every read sees one whole save: 64 equal values.
                assert!(v.iter().all(|&x| x == v[0]), "a torn file: {v:?}");
                reads += 1;
            }
            reads
        })
    };
    for i in 0..300 {
        write_f32(&p, "x", 64, i as f32);
    }
    stop.store(true, Ordering::SeqCst);
    let reads = reader.join().unwrap();
    assert!(reads > 0);
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
}

// ----- where the output goes: symlinks, modes, owners -------------------------

#[test]
fn a_symlinked_output_is_written_through_and_stays_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("elsewhere")).unwrap();
    let target = d.join("elsewhere/real.safetensors");
    std::fs::write(&target, b"old").unwrap();
    let link = d.join("link.safetensors");
    std::os::unix::fs::symlink("elsewhere/real.safetensors", &link).unwrap();
    let link2 = d.join("link2.safetensors");
    std::os::unix::fs::symlink(&link, &link2).unwrap();
    let mut w = try_create(&link2).unwrap();
    assert_eq!(w.path(), std::fs::canonicalize(&target).unwrap());
    w.write_tensor("y", &5f32.to_le_bytes()).unwrap();
    let written = w.finish().unwrap();
    assert_eq!(written, std::fs::canonicalize(&target).unwrap());
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::symlink_metadata(&link2)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        SafeTensors::open(&target)
            .unwrap()
            .read::<f32>("y")
            .unwrap(),
        vec![5.0]
    );
    assert_eq!(temporaries(d), Vec::<String>::new());
    assert_eq!(temporaries(&d.join("elsewhere")), Vec::<String>::new());

    // A dangling link is refused; it stays as it was and nothing appears.
    let dangling = d.join("dangling.safetensors");
    std::os::unix::fs::symlink("missing/nothing.safetensors", &dangling).unwrap();
    match try_create(&dangling) {
        Err(Error::OutputNotRegular { kind, .. }) => assert_eq!(kind, "dangling symlink"),
        other => panic!("{other:?}"),
    }
    assert!(std::fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn an_output_through_proc_self_fd_lands_in_the_file_behind_the_descriptor() {
    // What `convert in.safetensors /dev/stdout > out.safetensors` does:
    // /dev/stdout -> /proc/self/fd/1 -> the file the shell opened.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let held = std::fs::File::create(&out).unwrap();
    let fd = std::os::unix::io::AsRawFd::as_raw_fd(&held);
    let through = PathBuf::from(format!("/proc/self/fd/{fd}"));
    let mut w = try_create(&through).unwrap();
    w.write_tensor("y", &7f32.to_le_bytes()).unwrap();
    w.finish().unwrap();
    assert_eq!(
        SafeTensors::open(&out).unwrap().read::<f32>("y").unwrap(),
        vec![7.0]
    );
    // The magic link itself was not replaced (it cannot be), and no
    // temporary file is left in the folder.
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
    // A descriptor of a pipe is not a regular file: refused.
    let (r, _wr) = std::io::pipe().unwrap();
    let pfd = std::os::unix::io::AsRawFd::as_raw_fd(&r);
    let r2 = try_create(&PathBuf::from(format!("/proc/self/fd/{pfd}")));
    assert!(
        matches!(r2, Err(Error::OutputNotRegular { kind: "fifo", .. })),
        "{r2:?}"
    );
    // A descriptor of a file removed since it was opened: refused, not
    // written to a new file named "... (deleted)".
    let gone = dir.path().join("gone.safetensors");
    let held_gone = std::fs::File::create(&gone).unwrap();
    std::fs::remove_file(&gone).unwrap();
    let gfd = std::os::unix::io::AsRawFd::as_raw_fd(&held_gone);
    let r3 = try_create(&PathBuf::from(format!("/proc/self/fd/{gfd}")));
    assert!(
        matches!(
            r3,
            Err(Error::OutputNotRegular {
                kind: "link to a deleted file",
                ..
            })
        ),
        "{r3:?}"
    );
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
}

#[test]
fn a_replaced_file_keeps_its_mode_and_owner() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("private.safetensors");
    std::fs::write(&p, b"secret").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    // As root, the file is given to another user first (CI runs as root):
    // the replacement keeps that owner.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    }
    let before = std::fs::metadata(&p).unwrap();
    write_f32(&p, "x", 4, 1.0);
    let after = std::fs::metadata(&p).unwrap();
    assert_eq!(after.mode() & 0o7777, 0o600);
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    assert_ne!(
        after.ino(),
        before.ino(),
        "replaced by rename, not rewritten"
    );
    // A wider mode is kept as it was too (no narrowing either).
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
    write_f32(&p, "x", 4, 2.0);
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
}

#[test]
fn zero_byte_tensors_need_no_write() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.safetensors");
    let specs = [
        TensorSpec::new("a", DType::F32, [0u64, 4]),
        TensorSpec::new("b", DType::F32, [2u64]),
        TensorSpec::new("c", DType::BF16, [3u64, 0]),
        TensorSpec::new("d", DType::U8, [0u64]),
    ];
    let mut w = SafeTensorsWriter::create(&p, specs.clone(), None).unwrap();
    w.write_tensor("b", &[0u8; 8]).unwrap();
    w.finish().unwrap();
    let f = SafeTensors::open(&p).unwrap();
    assert_eq!(f.read_bytes("a").unwrap(), Vec::<u8>::new());
    assert_eq!(f.read_bytes("b").unwrap(), vec![0u8; 8]);
    assert_eq!(f.info("c").unwrap().shape, vec![3, 0]);
    // Only empty tensors: finish alone; an explicit empty write is fine too.
    let q = dir.path().join("only-empty.safetensors");
    let w = SafeTensorsWriter::create(&q, [specs[0].clone(), specs[3].clone()], None).unwrap();
    w.finish().unwrap();
    let mut w = SafeTensorsWriter::create(&q, [specs[0].clone(), specs[3].clone()], None).unwrap();
    w.write_tensor("a", &[]).unwrap();
    w.finish().unwrap();
    // A non-empty tensor left unwritten is still an error, naming it.
    let mut w = SafeTensorsWriter::create(&q, specs.clone(), None).unwrap();
    w.write_tensor("a", &[]).unwrap();
    match w.finish() {
        Err(Error::Writer { tensor, .. }) => assert_eq!(tensor, "b"),
        other => panic!("{other:?}"),
    }
    // Out of order past a non-empty tensor is still refused.
    let mut w = SafeTensorsWriter::create(&q, specs, None).unwrap();
    assert!(matches!(
        w.write_tensor("d", &[]),
        Err(Error::Writer { .. })
    ));
}

// ----- a file's metadata changed while it is open -----------------------------

#[test]
fn metadata_changes_and_replacing_the_path_leave_an_open_file_readable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = d.join("m.safetensors");
    write_f32(&p, "x", 1 << 16, 4.0);
    let f = SafeTensors::open(&p).unwrap();
    let ck = Checkpoint::open(&p).unwrap();
    let check = |what: &str| {
        assert_eq!(
            f.read::<f32>("x").unwrap(),
            vec![4.0; 1 << 16],
            "after {what}"
        );
        f.check_unchanged().unwrap();
        ck.check_unchanged().unwrap();
        assert_eq!(ck.read_bytes("x").unwrap().len(), 4 << 16, "after {what}");
    };
    next_tick();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
    check("chmod");
    std::fs::hard_link(&p, d.join("hard.safetensors")).unwrap();
    check("a hard link");
    std::fs::rename(&p, d.join("moved.safetensors")).unwrap();
    check("a rename");
    write_f32(&p, "x", 1 << 16, 9.0);
    check("a new file at the old path");
    std::fs::remove_file(d.join("moved.safetensors")).unwrap();
    std::fs::remove_file(d.join("hard.safetensors")).unwrap();
    check("rm of every name");
    // Atomic replace of the path by the library's own writer.
    let g = SafeTensors::open(&p).unwrap();
    write_f32(&p, "x", 1 << 16, 5.0);
    assert_eq!(g.read::<f32>("x").unwrap(), vec![9.0; 1 << 16]);
}

// ----- data loss: special files as output ----------------------------------

#[test]
fn special_output_files_are_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    std::os::unix::fs::symlink("/dev/null", d.join("null-link")).unwrap();
    for (out, kind) in [
        (PathBuf::from("/dev/null"), "character device"),
        (d.join("null-link"), "character device"),
        (fifo.clone(), "fifo"),
        (d.to_owned(), "folder"),
    ] {
        let r = within_timeout({
            let out = out.clone();
            move || try_create(&out).map(drop)
        });
        match r {
            Err(Error::OutputNotRegular { path, kind: k }) => {
                assert_eq!(path, out);
                assert_eq!(k, kind);
            }
            other => panic!("{}: {other:?}", out.display()),
        }
    }
    let meta = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()));
    assert!(std::fs::symlink_metadata(d.join("null-link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(temporaries(d), Vec::<String>::new());
}

// ----- hangs: FIFOs as inputs ---------------------------------------------

#[test]
fn fifo_as_file_index_or_shard_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    // As the file.
    let f = d.join("f.safetensors");
    mkfifo(&f);
    let r = within_timeout(move || SafeTensors::open(&f).map(drop));
    assert!(
        matches!(r, Err(Error::NotRegularFile { kind: "fifo", .. })),
        "{r:?}"
    );
    // As the index.
    let idx = d.join("fifo.safetensors.index.json");
    mkfifo(&idx);
    let r = within_timeout(move || Checkpoint::open(&idx).map(drop));
    assert!(
        matches!(r, Err(Error::NotRegularFile { kind: "fifo", .. })),
        "{r:?}"
    );
    // As a shard.
    let index = sharded(&d);
    std::fs::remove_file(d.join("b.safetensors")).unwrap();
    mkfifo(&d.join("b.safetensors"));
    let r = within_timeout(move || Checkpoint::open(&index).map(drop));
    match r {
        Err(Error::NotRegularFile { path, kind }) => {
            assert_eq!(kind, "fifo");
            assert!(path.ends_with("b.safetensors"), "{}", path.display());
        }
        other => panic!("{other:?}"),
    }
    // A folder and a device too.
    let r = SafeTensors::open(dir.path());
    assert!(matches!(
        r,
        Err(Error::NotRegularFile { kind: "folder", .. })
    ));
    let r = SafeTensors::open("/dev/null");
    assert!(matches!(
        r,
        Err(Error::NotRegularFile {
            kind: "character device",
            ..
        })
    ));
}

// ----- path safety: a symlink swapped while shards are opened ----------------

#[test]
fn swapping_a_shard_symlink_never_lets_a_read_escape_the_folder() {
    let root = tempfile::tempdir().unwrap();
    let ckdir = root.path().join("ck");
    let outside = root.path().join("outside");
    std::fs::create_dir(&ckdir).unwrap();
    std::fs::create_dir(&outside).unwrap();
    write_f32(&ckdir.join("inside.safetensors"), "w", 16, 1.0);
    write_f32(&outside.join("secret.safetensors"), "w", 16, 666.0);
    let index = ckdir.join("m.safetensors.index.json");
    std::fs::write(&index, r#"{"weight_map": {"w": "s.safetensors"}}"#).unwrap();
    let link = ckdir.join("s.safetensors");
    std::os::unix::fs::symlink("inside.safetensors", &link).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (stop, ckdir) = (stop.clone(), ckdir.clone());
        let secret = outside.join("secret.safetensors");
        std::thread::spawn(move || {
            let tmp = ckdir.join("s.tmp-link");
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let target: &Path = if flips.is_multiple_of(2) {
                    &secret
                } else {
                    Path::new("inside.safetensors")
                };
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(target, &tmp).unwrap();
                // rename: the link is swapped atomically.
                std::fs::rename(&tmp, ckdir.join("s.safetensors")).unwrap();
                flips += 1;
            }
            flips
        })
    };
    let (mut ok, mut refused) = (0u32, 0u32);
    for _ in 0..3000 {
        match Checkpoint::open(&index) {
            Ok(ck) => {
                let w: Vec<f32> = ck.read("w").unwrap();
                assert_eq!(w, vec![1.0; 16], "a read escaped the folder");
                ok += 1;
            }
            Err(Error::InvalidShardName { .. }) | Err(Error::Io { .. }) => refused += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    assert!(flips > 100, "the symlink barely moved ({flips} flips)");
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}

// ----- a file changed while it is read ---------------------------------------

/// Sleeps past the file system's timestamp tick, so that a change made now
/// moves the change time of a file written just before.
fn next_tick() {
    std::thread::sleep(Duration::from_millis(30));
}

#[test]
fn a_file_rewritten_in_place_while_read_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    write_f32(&path, "x", 1 << 20, 1.0); // 4 MiB: several chunks
    let bytes = std::fs::read(&path).unwrap();
    let f = SafeTensors::open(&path).unwrap();
    assert_eq!(f.read::<f32>("x").unwrap().len(), 1 << 20);
    next_tick();

    // Same size, other bytes (a rewrite in place).
    let mut other = bytes.clone();
    let last = other.len() - 1;
    other[last] ^= 0x40;
    std::fs::write(&path, &other).unwrap();
    match f.read::<f32>("x") {
        Err(Error::FileChanged {
            path: p, tensor, ..
        }) => {
            assert_eq!(p, path);
            assert_eq!(tensor.as_deref(), Some("x"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        f.check_unchanged(),
        Err(Error::FileChanged { .. })
    ));
    drop(f);

    // Truncated and regrown to the same size and bytes, during a stream.
    let f = SafeTensors::open(&path).unwrap();
    next_tick();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut pieces = 0;
    let r = f.for_each_chunk("x", DType::F32, |_| {
        pieces += 1;
        if pieces == 1 {
            file.set_len(100).unwrap();
            file.set_len(other.len() as u64).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&file, &other, 0).unwrap();
        }
        Ok(())
    });
    assert!(pieces > 1);
    assert!(
        matches!(r, Err(Error::FileChanged { .. })),
        "truncate + regrow unseen: {r:?}"
    );
}

#[test]
fn a_changed_index_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path());
    let ck = Checkpoint::open(&index).unwrap();
    ck.check_unchanged().unwrap();
    next_tick();
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, text.replace("\"a\"", "\"A\"")).unwrap();
    match ck.check_unchanged() {
        Err(Error::FileChanged { path, .. }) => assert_eq!(path, index),
        other => panic!("{other:?}"),
    }
}

// ----- aborts: sizes larger than memory --------------------------------------

/// RAM plus swap, as the library's limit reads it.
fn memory() -> u64 {
    // SAFETY: plain old data, all-zero valid; `info` is writable.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sysinfo(&mut info) }, 0);
    let unit = u64::from(info.mem_unit.max(1));
    (info.totalram as u64 + info.totalswap as u64) * unit
}

#[test]
fn a_tensor_larger_than_memory_is_an_error_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.safetensors");
    // bf16 bytes alone exceed RAM + swap; as f32, twice that.
    let elems = memory() / 2 + (1 << 20);
    sparse_bf16(&path, elems);
    let f = SafeTensors::open(&path).unwrap();
    for r in [
        f.read::<f32>("x").map(drop),
        f.read_bytes("x").map(drop),
        f.read_converted_bytes("x", DType::F32).map(drop),
        f.read_rows::<half::bf16>("x", 0..elems).map(drop),
    ] {
        match r {
            Err(Error::AllocationFailed {
                path: p,
                tensor,
                bytes,
                limit,
                ..
            }) => {
                assert_eq!(p, path);
                assert_eq!(tensor, "x");
                assert!(bytes > limit, "{bytes} <= {limit}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Streaming needs two chunks whatever the size: read the first pieces.
    let mut seen = 0u64;
    let r = f.for_each_chunk("x", DType::F32, |piece| {
        assert!(piece.iter().all(|&b| b == 0));
        seen += piece.len() as u64;
        if seen >= 8 << 20 {
            return Err(Error::Cancelled {
                path: PathBuf::from("stop"),
            });
        }
        Ok(())
    });
    assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
    assert!(seen >= 8 << 20);
}

// ----- leftovers: cancellation, long names -----------------------------------

#[test]
fn a_cancelled_writer_removes_its_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let flag = Arc::new(AtomicBool::new(false));
    let opts = WriteOptions::default().with_cancel(flag.clone());
    let mut w = SafeTensorsWriter::create_with(
        &out,
        [TensorSpec::new("y", DType::U8, [1u64 << 20])],
        None,
        opts,
    )
    .unwrap();
    w.write_chunk("y", &[7u8; 4096]).unwrap();
    assert_eq!(temporaries(dir.path()).len(), 1);
    flag.store(true, Ordering::SeqCst);
    match w.write_chunk("y", &[7u8; 4096]) {
        Err(Error::Cancelled { path }) => assert_eq!(path, out),
        other => panic!("{other:?}"),
    }
    // Removed at once, not only when the writer is dropped.
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
    assert!(w.finish().is_err());
    assert!(!out.exists());
}

#[test]
fn outputs_with_names_of_255_bytes_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let ascii = format!("{}.safetensors", "a".repeat(255 - 12));
    // 'é' is two bytes: cutting must keep the temporary name valid UTF-8.
    let utf8 = format!("{}x.safetensors", "é".repeat(121));
    for name in [ascii, utf8] {
        assert_eq!(name.len(), 255);
        let out = dir.path().join(&name);
        let mut meta = BTreeMap::new();
        meta.insert("k".to_owned(), "v".to_owned());
        let mut w = SafeTensorsWriter::create(
            &out,
            [TensorSpec::new("y", DType::F32, [2u64])],
            Some(&meta),
        )
        .unwrap();
        let tmp = temporaries(dir.path());
        assert_eq!(tmp.len(), 1);
        assert!(tmp[0].len() <= 255);
        w.write_tensor("y", &[0u8; 8]).unwrap();
        w.finish().unwrap();
        assert_eq!(
            SafeTensors::open(&out).unwrap().read::<f32>("y").unwrap(),
            vec![0.0; 2]
        );
    }
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
}
