//! A checkpoint: one `.safetensors` file or a sharded `*.safetensors.index.json`.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::file::SafeTensors;
use super::handle;
use super::header::{TensorInfo, MAX_HEADER_LEN};
use super::json::Node;
use super::open::{self, FileId, InFolder, Stamp};
use crate::convert::Element;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One view over a checkpoint: a single `.safetensors` file, or every shard
/// named by a `*.safetensors.index.json`. Tensor names are unique across
/// shards; reads are delegated to the shard holding the tensor.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    shards: Vec<SafeTensors>,
    /// name -> (shard index, tensor index within the shard)
    by_name: HashMap<String, (usize, usize)>,
    metadata: Option<BTreeMap<String, String>>,
    index_metadata: Option<serde_json::Value>,
    /// The index file (sharded checkpoints): kept open so that its
    /// identity stays registered as being read and its stamp can be checked.
    index: Option<IndexFile>,
}

/// A sharded checkpoint's index, read at open.
#[derive(Debug)]
struct IndexFile {
    file: File,
    stamp: Stamp,
}

impl Checkpoint {
    /// Opens a checkpoint. A path whose name ends in `.json` is read as a
    /// sharded index (`{"metadata": {..}, "weight_map": {"tensor": "shard"}}`);
    /// anything else is opened as one safetensors file.
    ///
    /// Index rules (each broken rule is a typed error naming the index
    /// and the tensor): `weight_map` is an object of strings without
    /// duplicate keys ([`Error::InvalidIndex`], [`Error::DuplicateKey`]);
    /// each shard name is a plain file name in the index's folder, and
    /// after resolving symlinks still is ([`Error::InvalidShardName`]);
    /// every listed tensor is in its shard ([`Error::TensorNotFound`]
    /// naming the shard); a tensor is never in two shards
    /// ([`Error::TensorInTwoShards`]); every tensor of a shard is listed
    /// ([`Error::TensorNotInIndex`]: a shard tensor that the index does not
    /// mention is refused rather than guessed at); the shards'
    /// `__metadata__` maps agree ([`Error::MetadataConflict`]). Other
    /// top-level keys of the index are ignored. Shards open in sorted
    /// file-name order.
    ///
    /// The file, the index and every shard must be regular files
    /// ([`Error::NotRegularFile`], without blocking on a FIFO). Each shard
    /// is opened relative to the folder's descriptor and the file opened
    /// is checked to be a plain entry of the folder (a symlink inside the
    /// folder to a file inside it is followed); a symlink pointing out, or
    /// swapped while the shard is opened, is [`Error::InvalidShardName`]
    /// and nothing of the file it led to is read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let is_index = path.extension().is_some_and(|e| e == "json");
        if is_index {
            Self::open_index(path)
        } else {
            let file = SafeTensors::open(path)?;
            let by_name = file
                .tensors()
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), (0, i)))
                .collect();
            Ok(Checkpoint {
                path: path.to_owned(),
                metadata: file.metadata().cloned(),
                shards: vec![file],
                by_name,
                index_metadata: None,
                index: None,
            })
        }
    }

    fn open_index(path: &Path) -> Result<Self> {
        let p = || path.to_owned();
        let invalid = |tensor: Option<&str>, reason| Error::InvalidIndex {
            path: p(),
            tensor: tensor.map(str::to_owned),
            reason,
        };
        let io = |op, source| Error::Io {
            path: p(),
            op,
            source,
        };
        let (file, stamp) = open::open_regular(path, "open index")?;
        if stamp.len > MAX_HEADER_LEN {
            return Err(invalid(None, "index file larger than 100 MB"));
        }
        let mut bytes = Vec::new();
        (&file)
            .take(MAX_HEADER_LEN + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io("read index", e))?;
        if bytes.len() as u64 > MAX_HEADER_LEN {
            return Err(invalid(None, "index file larger than 100 MB"));
        }
        let index = IndexFile { file, stamp };
        check_stamp(path, &index.file, &index.stamp)?;
        let root: Node = serde_json::from_slice(&bytes)
            .map_err(|source| Error::HeaderJson { path: p(), source })?;
        let Node::Object(top) = root else {
            return Err(invalid(None, "not a json object"));
        };
        if let Some(k) = Node::duplicate_key(&top) {
            return Err(Error::DuplicateKey {
                path: p(),
                key: k.to_owned(),
                within: "the index".to_owned(),
            });
        }
        let mut weight_map = None;
        let mut index_metadata = None;
        for (k, v) in top {
            match k.as_str() {
                "weight_map" => weight_map = Some(v),
                "metadata" => index_metadata = Some(v.into_value()),
                _ => {}
            }
        }
        let Some(Node::Object(entries)) = weight_map else {
            return Err(invalid(None, "weight_map missing or not an object"));
        };
        if let Some(k) = Node::duplicate_key(&entries) {
            return Err(Error::DuplicateKey {
                path: p(),
                key: k.to_owned(),
                within: "weight_map".to_owned(),
            });
        }
        let mut map: Vec<(String, String)> = Vec::with_capacity(entries.len());
        for (tensor, shard) in entries {
            match shard {
                Node::Str(s) => map.push((tensor, s)),
                _ => return Err(invalid(Some(&tensor), "shard name is not a string")),
            }
        }

        // The folder the shards must live in, resolved.
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let dir_canon = dir
            .canonicalize()
            .map_err(|e| io("resolve index folder", e))?;
        let dir_file = File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&dir)
            .map_err(|e| Error::Io {
                path: dir.clone(),
                op: "open index folder",
                source: e,
            })?;

        // Validate shard names, open each distinct shard once, sorted.
        let mut names: Vec<&str> = Vec::new();
        for (tensor, shard) in &map {
            check_shard_name(path, tensor, shard)?;
            names.push(shard);
        }
        names.sort_unstable();
        names.dedup();
        // More shards than may stay open: each is kept in a bounded cache
        // of descriptors once validated (`handle` module docs).
        let room = handle::open_file_room();
        let cache = (names.len() > room).then(|| handle::FdCache::new(room));
        let dir_file = Arc::new(dir_file);
        let mut shards = Vec::with_capacity(names.len());
        for (key, name) in names.iter().enumerate() {
            let refused = |reason| {
                let tensor = map
                    .iter()
                    .find(|(_, s)| s == name)
                    .map(|(t, _)| t.clone())
                    .unwrap_or_default();
                Error::InvalidShardName {
                    path: p(),
                    tensor,
                    shard: (*name).to_owned(),
                    reason,
                }
            };
            match open::open_in_folder(&dir_file, &dir, &dir_canon, name)? {
                InFolder::Yes(file, stamp) => {
                    let shard = SafeTensors::from_file(dir.join(name), file, stamp)?;
                    shards.push(match &cache {
                        None => shard,
                        Some(cache) => shard.into_cached(handle::Reopen {
                            cache: cache.clone(),
                            key,
                            dir: dir_file.clone(),
                            dir_path: dir.clone(),
                            dir_canon: dir_canon.clone(),
                            name: (*name).to_owned(),
                            stamp,
                        }),
                    })
                }
                InFolder::Outside => {
                    return Err(refused(
                        "resolves (through a symlink) outside the checkpoint's folder",
                    ))
                }
                InFolder::Changed => {
                    return Err(refused(
                        "changed while being opened (a symlink or file was swapped): refused, nothing read",
                    ))
                }
            }
        }
        let shard_of: HashMap<&str, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let listed: HashMap<&str, usize> = map
            .iter()
            .filter_map(|(t, s)| Some((t.as_str(), *shard_of.get(s.as_str())?)))
            .collect();

        // Every shard tensor is listed, for this shard.
        let mut by_name = HashMap::with_capacity(map.len());
        for (si, shard) in shards.iter().enumerate() {
            for (ti, t) in shard.tensors().iter().enumerate() {
                match listed.get(t.name.as_str()) {
                    None => {
                        return Err(Error::TensorNotInIndex {
                            path: p(),
                            tensor: t.name.clone(),
                            shard: shard.path().to_owned(),
                        })
                    }
                    Some(&want) if want != si => {
                        let Some(other) = shards.get(want) else {
                            continue;
                        };
                        if other.get(&t.name).is_none() {
                            // Listed for `other`, stored here only.
                            return Err(Error::TensorNotFound {
                                path: other.path().to_owned(),
                                tensor: t.name.clone(),
                            });
                        }
                        return Err(Error::TensorInTwoShards {
                            path: p(),
                            tensor: t.name.clone(),
                            first: other.path().to_owned(),
                            second: shard.path().to_owned(),
                        });
                    }
                    Some(_) => {
                        by_name.insert(t.name.clone(), (si, ti));
                    }
                }
            }
        }
        // Every listed tensor is in its shard.
        for (tensor, shard) in &map {
            if !by_name.contains_key(tensor) {
                return Err(Error::TensorNotFound {
                    path: dir.join(shard),
                    tensor: tensor.clone(),
                });
            }
        }

        // Merge the shards' __metadata__.
        let mut metadata: Option<BTreeMap<String, String>> = None;
        for shard in &shards {
            let Some(m) = shard.metadata() else { continue };
            let merged = metadata.get_or_insert_with(BTreeMap::new);
            for (k, v) in m {
                match merged.get(k) {
                    Some(old) if old != v => {
                        return Err(Error::MetadataConflict {
                            path: p(),
                            key: k.clone(),
                            first: old.clone(),
                            second: v.clone(),
                            shard: shard.path().to_owned(),
                        })
                    }
                    Some(_) => {}
                    None => {
                        merged.insert(k.clone(), v.clone());
                    }
                }
            }
        }

        Ok(Checkpoint {
            path: p(),
            shards,
            by_name,
            metadata,
            index_metadata,
            index: Some(index),
        })
    }

    /// The identities (device, inode) of every file this checkpoint read:
    /// the index (sharded checkpoints) and each shard. While the
    /// checkpoint lives a [`SafeTensorsWriter`](super::SafeTensorsWriter)
    /// of this process refuses all of them as output; pass them in
    /// [`WriteOptions::inputs`](super::WriteOptions::inputs) to say so
    /// explicitly.
    pub fn file_ids(&self) -> Vec<FileId> {
        self.index
            .as_ref()
            .map(|i| i.stamp.id)
            .into_iter()
            .chain(self.shards.iter().map(SafeTensors::file_id))
            .collect()
    }

    /// Checks that no file of the checkpoint (index and shards) changed
    /// since it was opened ([`SafeTensors::check_unchanged`] for what this
    /// sees). Call it after a sequence of reads, before committing their
    /// result.
    ///
    /// Errors: [`Error::FileChanged`] naming the file, [`Error::Io`].
    pub fn check_unchanged(&self) -> Result<()> {
        if let Some(i) = &self.index {
            check_stamp(&self.path, &i.file, &i.stamp)?;
        }
        self.shards
            .iter()
            .try_for_each(SafeTensors::check_unchanged)
    }

    /// The path given to [`open`](Self::open) (the file or the index).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The shard files (one for a single-file checkpoint), in sorted order.
    pub fn shards(&self) -> &[SafeTensors] {
        &self.shards
    }

    /// Every tensor with the shard holding it: shard order, then data
    /// offset order within a shard (deterministic).
    pub fn tensors(&self) -> impl Iterator<Item = (&SafeTensors, &TensorInfo)> + '_ {
        self.shards
            .iter()
            .flat_map(|s| s.tensors().iter().map(move |t| (s, t)))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether the checkpoint has no tensors.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The tensor of this name and its shard.
    pub fn get(&self, name: &str) -> Option<(&SafeTensors, &TensorInfo)> {
        let &(s, t) = self.by_name.get(name)?;
        let shard = self.shards.get(s)?;
        Some((shard, shard.tensors().get(t)?))
    }

    /// The tensor of this name, or [`Error::TensorNotFound`] naming the checkpoint.
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        Ok(self.locate(name)?.1)
    }

    /// The merged `__metadata__` of the shards (they must agree, checked at open).
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }

    /// The index file's free-form `"metadata"` value (sharded checkpoints only).
    pub fn index_metadata(&self) -> Option<&serde_json::Value> {
        self.index_metadata.as_ref()
    }

    fn locate(&self, name: &str) -> Result<(&SafeTensors, &TensorInfo)> {
        self.get(name).ok_or_else(|| Error::TensorNotFound {
            path: self.path.clone(),
            tensor: name.to_owned(),
        })
    }

    /// [`SafeTensors::read_bytes_into`] on the shard holding `name`.
    pub fn read_bytes_into(&self, name: &str, dst: &mut [u8]) -> Result<()> {
        self.locate(name)?.0.read_bytes_into(name, dst)
    }
    /// [`SafeTensors::read_bytes`] on the shard holding `name`.
    pub fn read_bytes(&self, name: &str) -> Result<Vec<u8>> {
        self.locate(name)?.0.read_bytes(name)
    }
    /// [`SafeTensors::read_into`] on the shard holding `name`.
    pub fn read_into<T: Element>(&self, name: &str, dst: &mut [T]) -> Result<()> {
        self.locate(name)?.0.read_into(name, dst)
    }
    /// [`SafeTensors::read`] on the shard holding `name`.
    pub fn read<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        self.locate(name)?.0.read(name)
    }
    /// [`SafeTensors::read_converted_bytes_into`] on the shard holding `name`.
    pub fn read_converted_bytes_into(&self, name: &str, to: DType, dst: &mut [u8]) -> Result<()> {
        self.locate(name)?
            .0
            .read_converted_bytes_into(name, to, dst)
    }
    /// [`SafeTensors::read_converted_bytes`] on the shard holding `name`.
    pub fn read_converted_bytes(&self, name: &str, to: DType) -> Result<Vec<u8>> {
        self.locate(name)?.0.read_converted_bytes(name, to)
    }
    /// [`SafeTensors::read_rows_into`] on the shard holding `name`.
    pub fn read_rows_into<T: Element>(
        &self,
        name: &str,
        rows: Range<u64>,
        dst: &mut [T],
    ) -> Result<()> {
        self.locate(name)?.0.read_rows_into(name, rows, dst)
    }
    /// [`SafeTensors::read_rows`] on the shard holding `name`.
    pub fn read_rows<T: Element>(&self, name: &str, rows: Range<u64>) -> Result<Vec<T>> {
        self.locate(name)?.0.read_rows(name, rows)
    }
    /// [`SafeTensors::read_rows_bytes_into`] on the shard holding `name`.
    pub fn read_rows_bytes_into(&self, name: &str, rows: Range<u64>, dst: &mut [u8]) -> Result<()> {
        self.locate(name)?.0.read_rows_bytes_into(name, rows, dst)
    }
    /// [`SafeTensors::read_rows_bytes`] on the shard holding `name`.
    pub fn read_rows_bytes(&self, name: &str, rows: Range<u64>) -> Result<Vec<u8>> {
        self.locate(name)?.0.read_rows_bytes(name, rows)
    }
    /// [`SafeTensors::for_each_chunk`] on the shard holding `name`.
    pub fn for_each_chunk(
        &self,
        name: &str,
        to: DType,
        f: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.locate(name)?.0.for_each_chunk(name, to, f)
    }
}

/// [`Error::FileChanged`] when `file` (opened from `path`) differs from `stamp`.
fn check_stamp(path: &Path, file: &File, stamp: &Stamp) -> Result<()> {
    let meta = file.metadata().map_err(|e| Error::Io {
        path: path.to_owned(),
        op: "stat",
        source: e,
    })?;
    match stamp.differs(&Stamp::of(&meta)) {
        None => Ok(()),
        Some(what) => Err(Error::FileChanged {
            path: path.to_owned(),
            tensor: None,
            what,
        }),
    }
}

/// A shard name must be one plain path component: not empty, not `.` or
/// `..`, no separator, not absolute, no NUL.
fn check_shard_name(index: &Path, tensor: &str, shard: &str) -> Result<()> {
    let reason = if shard.is_empty() {
        Some("empty file name")
    } else if shard.contains('\0') {
        Some("contains a NUL byte")
    } else if shard.contains('/') || shard.contains('\\') {
        Some("contains a path separator: must be a plain file name in the index's folder")
    } else {
        let mut comps = Path::new(shard).components();
        match (comps.next(), comps.next()) {
            (Some(Component::Normal(_)), None) => None,
            _ => Some("not a plain file name (`.`, `..` or absolute)"),
        }
    };
    match reason {
        Some(reason) => Err(Error::InvalidShardName {
            path: index.to_owned(),
            tensor: tensor.to_owned(),
            shard: shard.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}
