//! The open file behind a reader: held for the reader's whole life, or, in
//! a checkpoint with more shards than the process may keep open, reopened
//! when needed through a bounded cache of descriptors.
//!
//! A checkpoint whose shards fit in [`open_file_room`] keeps every shard
//! open (a shard removed or replaced by name after open is still read as it
//! was opened). Past that, each shard is opened once to validate its header
//! and then kept in a least-recently-used cache of `room` descriptors; a
//! shard closed by the cache is opened again by its name, relative to the
//! checkpoint folder's descriptor, with the same checks as at open (a plain
//! entry of the folder, not swapped during the open), and must be the very
//! file validated then: same identity, size and modification time, else
//! [`Error::FileChanged`]. So a shard replaced by name while closed is
//! refused, never read in place of the one validated.

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::open::{self, InFolder, Stamp};
use crate::error::{Error, Result};

/// How many shard descriptors a checkpoint may keep open: a quarter of the
/// soft limit on open files (`RLIMIT_NOFILE`), between 8 and 1024, so the
/// rest of the process (sockets, other files, the GPU runtime) keeps its
/// room.
pub(crate) fn open_file_room() -> usize {
    // SAFETY: `rlimit` is plain old data; all-zero is a valid value.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a valid, writable `rlimit`.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    };
    (soft / 4).clamp(8, 1024)
}

/// Descriptors of shards, least recently used first, at most `cap`.
#[derive(Debug)]
pub(crate) struct FdCache {
    cap: usize,
    open: Mutex<VecDeque<(usize, Arc<File>)>>,
}

impl FdCache {
    pub(crate) fn new(cap: usize) -> Arc<FdCache> {
        Arc::new(FdCache {
            cap: cap.max(1),
            open: Mutex::new(VecDeque::new()),
        })
    }

    fn get(&self, key: usize) -> Option<Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let at = open.iter().position(|(k, _)| *k == key)?;
        let entry = open.remove(at)?;
        let file = entry.1.clone();
        open.push_back(entry);
        Some(file)
    }

    /// Adds `file` as the most recently used, closing the least recently
    /// used beyond the capacity (a reader still holding one keeps it open
    /// until its read ends).
    fn put(&self, key: usize, file: Arc<File>) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|(k, _)| *k != key);
        open.push_back((key, file));
        while open.len() > self.cap {
            open.pop_front();
        }
    }

    /// Descriptors held now (for tests and the doctor).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Where a cached shard is opened again.
#[derive(Debug, Clone)]
pub(crate) struct Reopen {
    pub cache: Arc<FdCache>,
    pub key: usize,
    pub dir: Arc<File>,
    pub dir_path: PathBuf,
    pub dir_canon: PathBuf,
    pub name: String,
    pub stamp: Stamp,
}

impl Reopen {
    /// The shard's descriptor: from the cache, or opened again and checked
    /// to be the file validated at open (module docs).
    fn file(&self, path: &Path) -> Result<Arc<File>> {
        if let Some(f) = self.cache.get(self.key) {
            return Ok(f);
        }
        let changed = |what| Error::FileChanged {
            path: path.to_owned(),
            tensor: None,
            what,
        };
        let (file, stamp) =
            match open::open_in_folder(&self.dir, &self.dir_path, &self.dir_canon, &self.name)? {
                InFolder::Yes(file, stamp) => (file, stamp),
                InFolder::Outside | InFolder::Changed => {
                    return Err(changed("identity (device, inode)"))
                }
            };
        if let Some(what) = self.stamp.differs(&stamp) {
            return Err(changed(what));
        }
        let file = Arc::new(file);
        self.cache.put(self.key, file.clone());
        Ok(file)
    }
}

/// A reader's file (module docs).
#[derive(Debug)]
pub(crate) enum FileHandle {
    /// Open for the reader's life.
    Held(File),
    /// Opened when needed through a bounded cache.
    Reopened(Reopen),
}

/// A borrowed descriptor, for one read.
pub(crate) enum FileRef<'a> {
    Borrowed(&'a File),
    Shared(Arc<File>),
}

impl Deref for FileRef<'_> {
    type Target = File;
    fn deref(&self) -> &File {
        match self {
            FileRef::Borrowed(f) => f,
            FileRef::Shared(f) => f,
        }
    }
}

impl FileHandle {
    /// The descriptor (`path` names the file in errors).
    pub(crate) fn get(&self, path: &Path) -> Result<FileRef<'_>> {
        match self {
            FileHandle::Held(f) => Ok(FileRef::Borrowed(f)),
            FileHandle::Reopened(r) => r.file(path).map(FileRef::Shared),
        }
    }

    /// A second handle on the very same file: a `dup` of a held
    /// descriptor (never a new open by name), or the same cached entry.
    pub(crate) fn try_clone(&self, path: &Path) -> Result<FileHandle> {
        match self {
            FileHandle::Held(f) => f.try_clone().map(FileHandle::Held).map_err(|e| Error::Io {
                path: path.to_owned(),
                op: "duplicate descriptor",
                source: e,
            }),
            FileHandle::Reopened(r) => Ok(FileHandle::Reopened(r.clone())),
        }
    }

    /// Moves a held descriptor into `reopen`'s cache and answers through
    /// it from now on.
    pub(crate) fn into_cached(self, reopen: Reopen) -> FileHandle {
        if let FileHandle::Held(f) = self {
            reopen.cache.put(reopen.key, Arc::new(f));
        }
        FileHandle::Reopened(reopen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_the_most_recent_and_closes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FdCache::new(2);
        let files: Vec<Arc<File>> = (0..3)
            .map(|i| {
                let p = dir.path().join(format!("{i}"));
                std::fs::write(&p, [i as u8]).unwrap();
                Arc::new(File::open(&p).unwrap())
            })
            .collect();
        cache.put(0, files[0].clone());
        cache.put(1, files[1].clone());
        assert!(cache.get(0).is_some()); // 0 is now the most recent
        cache.put(2, files[2].clone()); // evicts 1
        assert_eq!(cache.held(), 2);
        assert!(cache.get(1).is_none());
        assert!(cache.get(0).is_some() && cache.get(2).is_some());
        assert!(open_file_room() >= 8);
    }
}
