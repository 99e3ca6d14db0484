//! Opening input files: regular files only, never blocking, and for shards
//! never outside the checkpoint's folder, whatever a symlink does meanwhile.
//!
//! * [`open_regular`] opens with `O_NONBLOCK` (a FIFO's `open` returns at
//!   once instead of waiting for a writer), `fstat`s what it opened,
//!   refuses anything but a regular file ([`Error::NotRegularFile`]), then
//!   clears `O_NONBLOCK`.
//! * [`open_in_folder`] opens a shard relative to the folder's descriptor
//!   (`openat`), then checks **what was opened**: its identity (device,
//!   inode) must be the one of a plain (non-symlink) entry of the folder,
//!   looked up after the open. A symlink swapped between any two steps can
//!   make the open fail, never make it read a file outside the folder.
//! * [`Stamp`] is what the reader compares after its reads to notice a file
//!   changed in place while it was read ([`Error::FileChanged`]).

use std::ffi::CString;
use std::fs::{File, FileType, Metadata};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};

/// The identity of a file: device and inode, as `stat(2)` reports them.
/// Two paths (through symlinks, hard links, `..`) name the same file
/// exactly when their identities are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// `st_dev`: the device holding the file.
    pub dev: u64,
    /// `st_ino`: the inode number on that device.
    pub ino: u64,
}

impl FileId {
    /// The identity in `meta` (from `stat`, `fstat` or `lstat`).
    pub fn of(meta: &Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    /// The identity of the file `path` names, following symlinks.
    pub fn of_path(path: impl AsRef<Path>) -> std::io::Result<FileId> {
        std::fs::metadata(path).map(|m| FileId::of(&m))
    }
}

/// What must not change while a file is read: the open file's identity,
/// size and modification time (with nanoseconds), all taken from the open
/// file (`fstat`), so they describe its *content*. Every write or truncate
/// moves `mtime`. The change time is not compared: `chmod`, a new hard
/// link, a rename, `rm` of the path, or an atomic replace of the path (a
/// new file renamed over it) all move or leave it without touching a byte
/// of the open file, which stays valid to read. Only a rewrite that sets
/// `mtime` back on purpose (`utimes`) with the same size goes unseen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub id: FileId,
    pub len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    pub fn of(meta: &Metadata) -> Stamp {
        Stamp {
            id: FileId::of(meta),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }

    /// What differs from `now`, if anything.
    pub fn differs(&self, now: &Stamp) -> Option<&'static str> {
        if self.id != now.id {
            Some("identity (device, inode)")
        } else if self.len != now.len {
            Some("size")
        } else if self.mtime != now.mtime {
            Some("modification time")
        } else {
            None
        }
    }
}

/// A file type's name, for errors.
pub(crate) fn kind_of(ft: FileType) -> &'static str {
    if ft.is_file() {
        "regular file"
    } else if ft.is_dir() {
        "folder"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// Opens `path` read-only without blocking, refuses a non-regular file,
/// and returns it (blocking again) with its stamp.
///
/// Errors: [`Error::Io`] (`op` as given) when the open or `fstat` fails,
/// [`Error::NotRegularFile`].
pub(crate) fn open_regular(path: &Path, op: &'static str) -> Result<(File, Stamp)> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::Io {
            path: path.to_owned(),
            op,
            source: e,
        })?;
    checked_regular(path, file)
}

/// `fstat`s `file` (opened non-blocking from `path`), refuses a
/// non-regular file, clears `O_NONBLOCK`.
fn checked_regular(path: &Path, file: File) -> Result<(File, Stamp)> {
    let io = |op, source| Error::Io {
        path: path.to_owned(),
        op,
        source,
    };
    let meta = file.metadata().map_err(|e| io("stat", e))?;
    if !meta.is_file() {
        return Err(Error::NotRegularFile {
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor `file` owns and keeps open; no
    // memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io("fcntl", std::io::Error::last_os_error()));
    }
    // SAFETY: F_SETFL with an integer flag set, on the same descriptor.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io("fcntl", std::io::Error::last_os_error()));
    }
    Ok((file, Stamp::of(&meta)))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never
/// what a symlink points to. `None` when it cannot be read.
fn entry_stat(dir: &File, name: &CString) -> Option<(FileId, bool)> {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open descriptor, `name` a NUL-terminated string
    // that outlives the call, `st` a valid, writable `stat`.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return None;
    }
    let id = FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    };
    Some((id, st.st_mode & libc::S_IFMT == libc::S_IFREG))
}

/// Where an opened shard was found to live.
pub(crate) enum InFolder {
    /// A plain file of the folder (maybe reached through symlinks that
    /// stay inside it).
    Yes(File, Stamp),
    /// Its name resolves outside the folder.
    Outside,
    /// What was opened is no longer what the name leads to (a symlink or
    /// file swapped during the open): refused, nothing of it read.
    Changed,
}

/// Opens shard `name` (a plain file name, checked by the caller) of the
/// folder `dir` (opened as a descriptor; `dir_path` its path as given,
/// `dir_canon` its canonical path), then checks that the file opened is a
/// plain entry of that folder (module docs).
///
/// Errors: [`Error::Io`] naming the shard when it cannot be opened,
/// [`Error::NotRegularFile`].
pub(crate) fn open_in_folder(
    dir: &File,
    dir_path: &Path,
    dir_canon: &Path,
    name: &str,
) -> Result<InFolder> {
    let shard_path = dir_path.join(name);
    let io = |source| Error::Io {
        path: shard_path.clone(),
        op: "open shard",
        source,
    };
    let c_name = CString::new(name)
        .map_err(|_| io(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: `dir` is an open descriptor and `c_name` a NUL-terminated
    // string that outlives the call; the flags ask for a read-only,
    // non-blocking, close-on-exec descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c_name.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by `openat`, is open, and is owned by
    // nothing else: the `File` takes ownership and closes it.
    let file = unsafe { File::from_raw_fd(fd) };
    let (file, stamp) = checked_regular(&shard_path, file)?;

    // Where does what we opened live? First the name itself, not followed.
    match entry_stat(dir, &c_name) {
        Some((id, true)) if id == stamp.id => return Ok(InFolder::Yes(file, stamp)),
        Some((_, true)) | None => return Ok(InFolder::Changed),
        Some((_, false)) => {} // a symlink (or other): resolve it below
    }
    let Ok(canon) = shard_path.canonicalize() else {
        return Ok(InFolder::Changed);
    };
    if canon.parent() != Some(dir_canon) {
        return Ok(InFolder::Outside);
    }
    let Some(Ok(target)) = canon
        .file_name()
        .map(|n| CString::new(n.as_bytes().to_vec()))
    else {
        return Ok(InFolder::Changed);
    };
    match entry_stat(dir, &target) {
        Some((id, true)) if id == stamp.id => Ok(InFolder::Yes(file, stamp)),
        _ => Ok(InFolder::Changed),
    }
}
