//! A checkpoint with more shards than the process may keep open
//! (`ulimit -n`): opened, read and loaded through a bounded cache of
//! descriptors, with a shard replaced by name while closed refused.
//! One test in its own binary: it lowers the process's open-file limit.

use rocm_safe::device::Device;
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{LoadOptions, Loader};
use rocm_safe::{DType, Error};

const SHARDS: usize = 1100;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn write_shard(path: &std::path::Path, name: &str, value: f32) {
    let mut w =
        SafeTensorsWriter::create(path, [TensorSpec::new(name, DType::F32, [2u64])], None).unwrap();
    let bytes: Vec<u8> = [value, value + 0.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    w.write_tensor(name, &bytes).unwrap();
    w.finish().unwrap();
}

#[test]
fn more_shards_than_open_files_are_read_and_loaded_through_a_bounded_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = Vec::new();
    for i in 0..SHARDS {
        let shard = format!("s{i:04}.safetensors");
        write_shard(&dir.path().join(&shard), &format!("t{i}"), i as f32);
        map.push(format!("\"t{i}\": \"{shard}\""));
    }
    let index = dir.path().join("m.safetensors.index.json");
    std::fs::write(
        &index,
        format!("{{\"weight_map\": {{{}}}}}", map.join(", ")),
    )
    .unwrap();

    // As under `ulimit -n 256`.
    // SAFETY: `rlimit` is plain old data; getrlimit/setrlimit get valid
    // pointers to it.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = 256;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    let ck = Checkpoint::open(&index).unwrap();
    assert_eq!(ck.len(), SHARDS);
    assert!(open_fds() < 200, "{} descriptors open", open_fds());
    for i in (0..SHARDS).rev() {
        assert_eq!(
            ck.read::<f32>(&format!("t{i}")).unwrap(),
            vec![i as f32, i as f32 + 0.5]
        );
    }
    ck.check_unchanged().unwrap();
    assert!(open_fds() < 200, "{} descriptors open", open_fds());

    // Loaded (host backend) with the same bound.
    let dev = Device::host();
    let loaded = Loader::new(&dev, LoadOptions::default())
        .unwrap()
        .load_all(&ck)
        .unwrap();
    assert_eq!(loaded.tensors.len(), SHARDS);
    for t in &loaded.tensors {
        let i: usize = t.name[1..].parse().unwrap();
        let want: Vec<u8> = [i as f32, i as f32 + 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(t.data.to_host().unwrap(), want, "{}", t.name);
    }
    assert!(open_fds() < 200, "{} descriptors open", open_fds());

    // Touch every shard but the first, so the cache has closed s0000; then
    // replace s0000 by name: reopened, it is another file: refused.
    for i in 1..SHARDS {
        ck.read::<f32>(&format!("t{i}")).unwrap();
    }
    let first = dir.path().join("s0000.safetensors");
    write_shard(&first, "t0", 99.0);
    match ck.read::<f32>("t0") {
        Err(Error::FileChanged { path, .. }) => assert_eq!(path, first),
        other => panic!("{other:?}"),
    }
}
