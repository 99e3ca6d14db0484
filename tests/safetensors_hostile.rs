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

#[test]
fn output_naming_the_input_in_any_way_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in.safetensors");
    write_f32(&input, "x", 8, 3.0);
    std::fs::create_dir(d.join("sub")).unwrap();
    std::os::unix::fs::symlink(&input, d.join("link.safetensors")).unwrap();
    std::fs::hard_link(&input, d.join("hard.safetensors")).unwrap();
    std::os::unix::fs::symlink(d, d.join("dirlink")).unwrap();
    let before = std::fs::read(&input).unwrap();

    let ck = Checkpoint::open(&input).unwrap();
    for out in [
        input.clone(),
        d.join("sub/../in.safetensors"),
        d.join("link.safetensors"),
        d.join("hard.safetensors"),
        d.join("dirlink/in.safetensors"),
    ] {
        match try_create(&out) {
            Err(Error::OutputIsInput { path, input: i }) => {
                assert_eq!(path, out);
                assert_eq!(i, input);
            }
            other => panic!("{}: {other:?}", out.display()),
        }
    }
    assert_eq!(temporaries(d), Vec::<String>::new());
    assert_eq!(std::fs::read(&input).unwrap(), before);
    drop(ck);

    // The input opened through a symlink, the output its target.
    let ck = Checkpoint::open(d.join("link.safetensors")).unwrap();
    assert!(matches!(
        try_create(&input),
        Err(Error::OutputIsInput { .. })
    ));
    drop(ck);

    // No reader left: the identities passed explicitly are refused too.
    let ids = Checkpoint::open(&input).unwrap().file_ids();
    let opts = WriteOptions::default().with_inputs(ids);
    let r = SafeTensorsWriter::create_with(
        d.join("hard.safetensors"),
        [TensorSpec::new("y", DType::F32, [1u64])],
        None,
        opts,
    );
    assert!(matches!(r, Err(Error::OutputIsInput { .. })), "{r:?}");
    assert_eq!(std::fs::read(&input).unwrap(), before);
    // Another file in the same folder is fine.
    let w = try_create(&d.join("other.safetensors")).unwrap();
    drop(w);
    assert_eq!(temporaries(d), Vec::<String>::new());
}

#[test]
fn output_that_is_a_shard_or_the_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path());
    let ck = Checkpoint::open(&index).unwrap();
    assert_eq!(ck.file_ids().len(), 3);
    for out in [
        index.clone(),
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    ] {
        let before = std::fs::read(&out).unwrap();
        assert!(
            matches!(try_create(&out), Err(Error::OutputIsInput { .. })),
            "{}",
            out.display()
        );
        assert_eq!(std::fs::read(&out).unwrap(), before);
    }
    // Also when the output is replaced by a link to an input after create:
    // checked again before the rename.
    let out = dir.path().join("late.safetensors");
    let a_before = std::fs::read(dir.path().join("a.safetensors")).unwrap();
    let mut w = try_create(&out).unwrap();
    w.write_tensor("y", &1f32.to_le_bytes()).unwrap();
    std::fs::hard_link(dir.path().join("a.safetensors"), &out).unwrap();
    assert!(matches!(w.finish(), Err(Error::OutputIsInput { .. })));
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
    assert_eq!(
        std::fs::read(dir.path().join("a.safetensors")).unwrap(),
        a_before
    );
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

/// A sparse file (no data blocks) declaring one BF16 tensor `x` of
/// `elems` elements.
pub fn sparse_bf16(path: &Path, elems: u64) {
    let header = format!(
        r#"{{"x":{{"dtype":"BF16","shape":[{elems}],"data_offsets":[0,{}]}}}}"#,
        elems * 2
    );
    let mut h = header.into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&h);
    std::fs::write(path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(bytes.len() as u64 + elems * 2).unwrap();
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
        f.read_as_bytes("x", DType::F32).map(drop),
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
