//! Streaming safetensors writer: [`SafeTensorsWriter`].

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::header::{TensorInfo, MAX_HEADER_LEN};
use super::open::{kind_of, FileId};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Name, dtype and shape of one tensor to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name (not `__metadata__`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape (`[]` for a scalar).
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// A spec from its parts.
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.into(),
        }
    }
}

impl From<&TensorInfo> for TensorSpec {
    fn from(t: &TensorInfo) -> Self {
        TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone())
    }
}

/// Longest file name the writer creates (`NAME_MAX` of Linux file systems).
const NAME_MAX: usize = 255;

/// What a [`SafeTensorsWriter`] must know beyond its output: the files it
/// must never write over, and a flag that cancels it.
///
/// ```
/// use std::sync::{atomic::AtomicBool, Arc};
/// use rocm_safe::safetensors::WriteOptions;
/// let cancel = Arc::new(AtomicBool::new(false));
/// let opts = WriteOptions::default().with_cancel(cancel.clone());
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WriteOptions {
    /// Identities of files the output must not be: this write's own
    /// inputs, e.g. [`Checkpoint::file_ids`](super::Checkpoint::file_ids)
    /// of the source. Only these are refused: a file some other reader of
    /// the process holds open may be replaced, since the replacement is a
    /// rename and that reader keeps reading the file it opened.
    pub inputs: Vec<FileId>,
    /// Checked before every write and before the final rename: once it is
    /// `true`, the writer closes and removes its temporary file and
    /// returns [`Error::Cancelled`]. A signal handler may set it (storing
    /// to an `AtomicBool` is async-signal-safe); a program that wants
    /// SIGINT/SIGTERM/SIGHUP to leave no temporary file behind installs
    /// such a handler, because the default action of those signals ends
    /// the process without running any destructor.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl WriteOptions {
    /// These options, also refusing `inputs` as output.
    pub fn with_inputs(mut self, inputs: impl IntoIterator<Item = FileId>) -> Self {
        self.inputs.extend(inputs);
        self
    }
    /// These options with a cancellation flag.
    pub fn with_cancel(mut self, flag: Arc<AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }
}

/// Writes a safetensors file tensor by tensor, holding none of them.
///
/// [`create`](Self::create) writes the header (8-byte little-endian length,
/// JSON padded with spaces to a multiple of 8, `__metadata__` first, then
/// the tensors in the given order with consecutive `data_offsets`: the
/// layout of the `safetensors` crate) to a temporary file `.{name}.tmp-{pid}-{n}`
/// in the destination's folder (`{name}` shortened so that the temporary
/// name fits in 255 bytes). [`write_tensor`](Self::write_tensor) takes
/// each tensor's bytes in the declared order;
/// [`finish`](Self::finish) flushes, fsyncs, and renames the temporary file
/// to the final name (then fsyncs the folder). Dropping the writer without
/// `finish` (or after a failed `finish`) removes the temporary file, so a
/// partial file never appears under the final name.
///
/// # Where the file goes
///
/// * An output that is a **symlink** is written *through*: the link is
///   resolved (every level, `/dev/stdout` -> `/proc/self/fd/1` -> the file
///   the shell opened included), the temporary file is made in the
///   target's folder and renamed over the target, so the link stays a
///   link and the data lands where it points. [`path`](Self::path) and
///   [`finish`](Self::finish) give that target. A symlink whose target
///   does not exist (dangling, or a deleted file behind `/proc/self/fd`)
///   is refused: [`Error::OutputNotRegular`] with kind `"dangling
///   symlink"`.
/// * A **replaced file keeps its permission bits** (`rwx` for user, group
///   and others; set-id bits are dropped) and, where the writer is
///   permitted (root, or the same owner), its owner and group; otherwise
///   its group where permitted. The temporary file gets these before any
///   data is written to it, so the data is never readable more widely than
///   the file it replaces. A new file gets `0666` less the umask, as
///   `safetensors` (Python's `open`) does.
///
/// # What is refused, before anything is written
///
/// * An output that is the same file (device and inode, so through `..`,
///   symlinks and hard links, and a name whose folder resolves through a
///   symlink) as one named in [`WriteOptions::inputs`] (the call's own
///   inputs): [`Error::OutputIsInput`]. Checked at `create` and again just
///   before the rename in `finish`. Files other readers of the process
///   hold are not refused: the rename leaves them reading the file they
///   opened.
/// * An output that exists and is not a regular file (a device node such
///   as `/dev/null`, a FIFO, a socket, a folder; also through a symlink):
///   [`Error::OutputNotRegular`]. Such a file is never replaced nor written
///   through.
///
/// # Tensors of zero bytes
///
/// A declared tensor with no bytes (a zero in its shape) needs no write:
/// writing the tensor after it, or [`finish`](Self::finish), passes over
/// it (an explicit empty [`write_tensor`](Self::write_tensor) is accepted
/// too).
///
/// # Cancellation and signals
///
/// With [`WriteOptions::cancel`], a set flag makes the next write (or
/// `finish`) remove the temporary file and return [`Error::Cancelled`].
/// Without a handler, SIGINT/SIGTERM/SIGHUP end the process at once and
/// the hidden temporary file stays behind; the `convert` and `conv3d`
/// examples show the handler that prevents it.
#[derive(Debug)]
pub struct SafeTensorsWriter {
    path: PathBuf,
    tmp: PathBuf,
    inputs: Vec<FileId>,
    cancel: Option<Arc<AtomicBool>>,
    out: Option<BufWriter<File>>,
    /// Declared tensors and their byte sizes, in order.
    specs: Vec<(TensorSpec, u64)>,
    /// Index of the tensor being written.
    next: usize,
    /// Bytes of it written so far.
    partial: u64,
}

impl SafeTensorsWriter {
    /// Creates the temporary file and writes the header, with the default
    /// [`WriteOptions`] (no extra inputs, no cancellation flag; files this
    /// process is reading are refused all the same).
    ///
    /// Errors: [`Error::Writer`] for a duplicate or reserved
    /// (`__metadata__`) tensor name, [`Error::InvalidTensorSize`] when a
    /// shape's byte size overflows or sub-byte elements do not fill whole
    /// bytes, [`Error::HeaderTooLarge`], [`Error::OutputIsInput`],
    /// [`Error::OutputNotRegular`], [`Error::Io`].
    pub fn create(
        path: impl AsRef<Path>,
        tensors: impl IntoIterator<Item = TensorSpec>,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<Self> {
        Self::create_with(path, tensors, metadata, WriteOptions::default())
    }

    /// [`create`](Self::create) with options: files to refuse as output
    /// besides those being read, and a cancellation flag.
    ///
    /// Errors: as [`create`](Self::create), [`Error::Cancelled`].
    pub fn create_with(
        path: impl AsRef<Path>,
        tensors: impl IntoIterator<Item = TensorSpec>,
        metadata: Option<&BTreeMap<String, String>>,
        options: WriteOptions,
    ) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let mut specs = Vec::new();
        let mut seen = HashSet::new();
        for spec in tensors {
            let wrong = |reason| Error::Writer {
                path: path.clone(),
                tensor: spec.name.clone(),
                reason,
            };
            if spec.name == "__metadata__" {
                return Err(wrong("reserved name"));
            }
            if !seen.insert(spec.name.clone()) {
                return Err(wrong("declared twice"));
            }
            let size = spec
                .shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .and_then(|n| spec.dtype.bytes_for(n))
                .ok_or_else(|| Error::InvalidTensorSize {
                    path: path.clone(),
                    tensor: spec.name.clone(),
                    dtype: spec.dtype,
                    shape: spec.shape.clone(),
                    reason: "byte size overflows u64 or sub-byte elements do not fill whole bytes",
                })?;
            specs.push((spec, size));
        }
        let header = header_json(&path, &specs, metadata)?;
        let file_name = path.file_name().ok_or_else(|| Error::Io {
            path: path.clone(),
            op: "create",
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"),
        })?;
        let (target, replaced) = resolve_output(&path)?;
        check_output(&target, &path, &options.inputs)?;
        let path = target;
        if options
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::SeqCst))
        {
            return Err(Error::Cancelled { path });
        }
        // pid plus a per-process counter: two writers never share a name.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let seq = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_file_name(temp_name(
            file_name,
            &format!(".tmp-{}-{seq}", std::process::id()),
        ));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::Io {
                path: tmp.clone(),
                op: "create temporary file",
                source: e,
            })?;
        let mut w = SafeTensorsWriter {
            path,
            tmp,
            inputs: options.inputs,
            cancel: options.cancel,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            specs,
            next: 0,
            partial: 0,
        };
        if let Some(meta) = replaced {
            let file = w.out.as_ref().map(BufWriter::get_ref);
            if let Some(file) = file {
                keep_mode_and_owner(file, &meta).map_err(|e| Error::Io {
                    path: w.tmp.clone(),
                    op: "set the replaced file's mode",
                    source: e,
                })?;
            }
        }
        w.write_raw(&(header.len() as u64).to_le_bytes())?;
        w.write_raw(&header)?;
        Ok(w)
    }

    /// The final path (where [`finish`](Self::finish) puts the file).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name of the next tensor to write, or `None` when all are written.
    pub fn next_tensor(&self) -> Option<&TensorSpec> {
        self.specs.get(self.next).map(|(s, _)| s)
    }

    /// Appends the bytes of tensor `name`, which must be the next declared
    /// tensor; `bytes` completes it (its whole data, or the rest after
    /// [`write_chunk`](Self::write_chunk)).
    ///
    /// Errors: [`Error::Writer`] (not declared, already written, or not the
    /// next one), [`Error::WriterSize`] (nothing is written then, and the
    /// writer stays usable), [`Error::Io`] (the writer is then closed:
    /// drop it, which removes the temporary file).
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let remaining = self.remaining(name)?;
        if remaining != bytes.len() as u64 {
            return Err(Error::WriterSize {
                path: self.path.clone(),
                tensor: name.to_owned(),
                expected: remaining,
                actual: bytes.len() as u64,
            });
        }
        self.append(bytes)
    }

    /// Appends part of tensor `name`'s bytes (the next declared tensor):
    /// a tensor may be written in any number of chunks, so a converted copy
    /// of a checkpoint needs only one chunk in memory (e.g. with
    /// [`SafeTensors::read_rows`](super::SafeTensors::read_rows)). The
    /// tensor is complete when its byte size is reached.
    ///
    /// Errors: as [`write_tensor`](Self::write_tensor); [`Error::WriterSize`]
    /// when the chunk would go past the tensor's end.
    pub fn write_chunk(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let remaining = self.remaining(name)?;
        if bytes.len() as u64 > remaining {
            return Err(Error::WriterSize {
                path: self.path.clone(),
                tensor: name.to_owned(),
                expected: remaining,
                actual: bytes.len() as u64,
            });
        }
        self.append(bytes)
    }

    /// Passes over declared tensors of zero bytes up to the one named
    /// `name` (or every one, for `None`), when no byte of the current
    /// tensor is written yet.
    fn skip_empty(&mut self, name: Option<&str>) {
        while self.partial == 0 {
            match self.specs.get(self.next) {
                Some((spec, 0)) if name != Some(spec.name.as_str()) => self.next += 1,
                _ => break,
            }
        }
    }

    /// Bytes still to write of `name`, which must be the next tensor
    /// (zero-byte tensors before it are passed over).
    fn remaining(&mut self, name: &str) -> Result<u64> {
        let at = (self.next, self.partial);
        if self
            .specs
            .iter()
            .skip(self.next)
            .any(|(s, _)| s.name == name)
        {
            self.skip_empty(Some(name));
        }
        let wrong = |reason| Error::Writer {
            path: self.path.clone(),
            tensor: name.to_owned(),
            reason,
        };
        match self.specs.get(self.next) {
            Some((spec, size)) if spec.name == name => Ok(size - self.partial),
            _ => {
                (self.next, self.partial) = at;
                let pos = self.specs.iter().position(|(s, _)| s.name == name);
                Err(wrong(match pos {
                    None => "not declared",
                    Some(i) if i < self.next => "already written",
                    Some(_) => "written out of the declared order",
                }))
            }
        }
    }

    /// Writes bytes of the current tensor; advances when it is complete.
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.write_raw(bytes)?;
        self.partial += bytes.len() as u64;
        if self
            .specs
            .get(self.next)
            .is_some_and(|(_, size)| self.partial == *size)
        {
            self.next += 1;
            self.partial = 0;
        }
        Ok(())
    }

    /// Flushes, fsyncs and renames the finished file to its final name.
    /// Returns the final path.
    ///
    /// Errors: [`Error::Writer`] naming the first tensor not written yet,
    /// [`Error::Io`]. On error the temporary file is removed.
    pub fn finish(mut self) -> Result<PathBuf> {
        self.skip_empty(None);
        if let Some((spec, _)) = self.specs.get(self.next) {
            return Err(Error::Writer {
                path: self.path.clone(),
                tensor: spec.name.clone(),
                reason: "finish before every declared tensor was written",
            });
        }
        let tmp = self.tmp.clone();
        let io = |op, source| Error::Io {
            path: tmp.clone(),
            op,
            source,
        };
        let Some(out) = self.out.take() else {
            return Err(io("finish", std::io::Error::other("writer already closed")));
        };
        let file = out.into_inner().map_err(|e| io("flush", e.into_error()))?;
        file.sync_all().map_err(|e| io("fsync", e))?;
        drop(file);
        // Once more, just before the rename: the output may have been
        // replaced (by a link to an input, a device node) since `create`.
        self.check_cancel()?;
        check_output(&self.path, &self.path, &self.inputs)?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| io("rename to final name", e))?;
        // The temporary name is gone: nothing for Drop to remove.
        self.tmp = PathBuf::new();
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                d.sync_all().map_err(|e| Error::Io {
                    path: dir.to_owned(),
                    op: "fsync folder",
                    source: e,
                })?;
            }
        }
        Ok(self.path.clone())
    }

    /// [`Error::Cancelled`] (after removing the temporary file) when the
    /// cancellation flag is set.
    fn check_cancel(&mut self) -> Result<()> {
        if self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::SeqCst))
        {
            self.out = None;
            if !self.tmp.as_os_str().is_empty() {
                let _ = std::fs::remove_file(&self.tmp);
                self.tmp = PathBuf::new();
            }
            return Err(Error::Cancelled {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.check_cancel()?;
        let Some(out) = self.out.as_mut() else {
            return Err(Error::Io {
                path: self.tmp.clone(),
                op: "write",
                source: std::io::Error::other("writer already closed"),
            });
        };
        out.write_all(bytes).map_err(|e| {
            // Part of `bytes` may be written: the file is no longer
            // consistent with the writer's state, so close it for good.
            self.out = None;
            Error::Io {
                path: self.tmp.clone(),
                op: "write",
                source: e,
            }
        })
    }
}

impl Drop for SafeTensorsWriter {
    fn drop(&mut self) {
        // Unfinished: close and remove the temporary file. A failure to
        // remove it cannot be reported from Drop; the file keeps its
        // hidden temporary name and never appears under the final one.
        drop(self.out.take());
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `.{name}{suffix}`, with `name` cut (at a character boundary when it is
/// UTF-8) so that the whole fits in [`NAME_MAX`] bytes.
fn temp_name(name: &std::ffi::OsStr, suffix: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = name.as_bytes();
    let room = NAME_MAX.saturating_sub(1 + suffix.len());
    let mut cut = bytes.len().min(room);
    if let Ok(s) = std::str::from_utf8(bytes) {
        while cut > 0 && !s.is_char_boundary(cut) {
            cut -= 1;
        }
    }
    let mut out = Vec::with_capacity(1 + cut + suffix.len());
    out.push(b'.');
    out.extend_from_slice(bytes.get(..cut).unwrap_or_default());
    out.extend_from_slice(suffix.as_bytes());
    std::ffi::OsString::from_vec(out)
}

/// Where the data goes for the output `path` (see [`SafeTensorsWriter`],
/// "Where the file goes"): `path` itself, or the file a symlink at `path`
/// resolves to; with the metadata of the file it replaces, if one exists.
fn resolve_output(path: &Path) -> Result<(PathBuf, Option<std::fs::Metadata>)> {
    let stat_err = |e| Error::Io {
        path: path.to_owned(),
        op: "stat output",
        source: e,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(path) {
            Ok(target) => {
                let meta = std::fs::metadata(&target).map_err(stat_err)?;
                Ok((target, Some(meta)))
            }
            // The link has no target by name. Through /proc/self/fd it may
            // still reach an object (a pipe, a socket, a deleted file),
            // which is named when refused.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::OutputNotRegular {
                path: path.to_owned(),
                kind: match std::fs::metadata(path) {
                    Ok(m) if m.is_file() => "link to a deleted file",
                    Ok(m) => kind_of(m.file_type()),
                    Err(_) => "dangling symlink",
                },
            }),
            Err(e) => Err(stat_err(e)),
        },
        Ok(m) => Ok((path.to_owned(), Some(m))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((path.to_owned(), None)),
        Err(e) => Err(stat_err(e)),
    }
}

/// Gives the temporary `file` the permission bits of the file it replaces
/// (`meta`), then its owner and group where permitted, else its group
/// where permitted (see [`SafeTensorsWriter`]).
fn keep_mode_and_owner(file: &File, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !meta.is_file() {
        return Ok(()); // refused by check_output
    }
    file.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o777))?;
    let (uid, gid) = (meta.uid(), meta.gid());
    if std::os::unix::fs::fchown(file, Some(uid), Some(gid)).is_err() {
        // Not permitted to give the file away: keep the group if this user
        // may (a member of it), else it stays the writer's.
        let _ = std::os::unix::fs::fchown(file, None, Some(gid));
    }
    Ok(())
}

/// Refuses an output that is one of this write's inputs or an existing
/// non-regular file (see [`SafeTensorsWriter`]). A missing output is fine:
/// there is nothing to destroy. `shown` is the path errors name (the one
/// the caller gave, when `path` is what its symlink resolved to).
fn check_output(path: &Path, shown: &Path, inputs: &[FileId]) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => match std::fs::metadata(path) {
            Ok(target) => target,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(Error::Io {
                    path: path.to_owned(),
                    op: "stat output",
                    source: e,
                })
            }
        },
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Error::Io {
                path: path.to_owned(),
                op: "stat output",
                source: e,
            })
        }
    };
    let id = FileId::of(&meta);
    if inputs.contains(&id) {
        return Err(Error::OutputIsInput {
            path: shown.to_owned(),
            input: shown.to_owned(),
        });
    }
    if !meta.is_file() {
        return Err(Error::OutputNotRegular {
            path: shown.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    Ok(())
}

/// The JSON header, padded with spaces to a multiple of 8 bytes.
fn header_json(
    path: &Path,
    specs: &[(TensorSpec, u64)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<u8>> {
    // JSON string literal of `s` (serialising a plain string cannot fail).
    let lit = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let mut entries: Vec<String> = Vec::with_capacity(specs.len() + 1);
    if let Some(m) = metadata {
        let fields: Vec<String> = m
            .iter()
            .map(|(k, v)| format!("{}:{}", lit(k), lit(v)))
            .collect();
        entries.push(format!("\"__metadata__\":{{{}}}", fields.join(",")));
    }
    let mut offset = 0u64;
    for (spec, size) in specs {
        let end = offset
            .checked_add(*size)
            .ok_or_else(|| Error::InvalidTensorSize {
                path: path.to_owned(),
                tensor: spec.name.clone(),
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                reason: "data section size overflows u64",
            })?;
        let shape: Vec<String> = spec.shape.iter().map(u64::to_string).collect();
        // Field order of the safetensors crate: dtype, shape, data_offsets.
        entries.push(format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            lit(&spec.name),
            spec.dtype.name(),
            shape.join(","),
            offset,
            end
        ));
        offset = end;
    }
    let mut bytes = format!("{{{}}}", entries.join(",")).into_bytes();
    let padded = bytes.len().next_multiple_of(8);
    bytes.resize(padded, b' ');
    if bytes.len() as u64 > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge {
            path: path.to_owned(),
            len: bytes.len() as u64,
            limit: MAX_HEADER_LEN,
        });
    }
    Ok(bytes)
}
