//! One safetensors file: [`SafeTensors`].

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::handle::{FileHandle, Reopen};
use super::header::{self, Header, TensorInfo, LFS_POINTER_PREFIX};
use super::open::{self, FileId, Stamp};
use crate::alloc;
use crate::convert::{self, Element};
use crate::dtype::DType;
use crate::error::{Error, Result, TensorRef};

/// Bytes of source data converted per step of a converting read. The
/// source chunk lives in a reused per-thread buffer, so a converting read
/// needs the output plus this much.
pub const CHUNK_BYTES: usize = 1 << 20;

thread_local! {
    /// Per-thread staging buffer of converting reads (at most CHUNK_BYTES).
    static STAGING: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a staging buffer of `len` bytes (`len <= CHUNK_BYTES`),
/// reused between calls on one thread.
fn with_staging<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    // Take the buffer out so that no RefCell borrow is held while `f` runs
    // (a nested call then simply allocates its own).
    let mut buf = STAGING.with(|s| s.take());
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let cut = len.min(buf.len());
    let (chunk, _) = buf.split_at_mut(cut);
    let r = f(chunk);
    STAGING.with(|s| {
        if let Ok(mut slot) = s.try_borrow_mut() {
            *slot = buf;
        }
    });
    r
}

/// One safetensors file, opened and validated; tensor data is read lazily
/// with positioned reads (`pread`), only when asked for.
///
/// `SafeTensors` is `Send + Sync`: several threads may read different
/// tensors (or row ranges) of one file at the same time.
///
/// While it lives, the file's identity is registered as being read: a
/// [`SafeTensorsWriter`](super::SafeTensorsWriter) of this process refuses
/// to write over it ([`Error::OutputIsInput`]).
#[derive(Debug)]
pub struct SafeTensors {
    path: PathBuf,
    file: FileHandle,
    file_len: u64,
    header: Header,
    /// Identity, size and times at open; compared after every read.
    stamp: Stamp,
}

impl SafeTensors {
    /// Opens `path` and validates its whole header (see the module docs for
    /// every check) without reading any tensor data.
    ///
    /// The file is opened without blocking and must be a regular file
    /// ([`Error::NotRegularFile`] for a FIFO, device, socket or folder:
    /// refused at once, never waited on).
    ///
    /// Errors: [`Error::Io`] when the file cannot be opened or read, and
    /// the header errors ([`Error::LfsPointer`], [`Error::FileTooSmall`],
    /// [`Error::HeaderTooLarge`], [`Error::HeaderOutOfBounds`],
    /// [`Error::HeaderNotUtf8`], [`Error::HeaderNotObject`],
    /// [`Error::HeaderJson`], [`Error::DuplicateKey`],
    /// [`Error::InvalidMetadata`], [`Error::InvalidTensorEntry`],
    /// [`Error::UnknownDType`], [`Error::InvalidTensorSize`],
    /// [`Error::InvalidDataOffsets`], [`Error::DataLayout`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let (file, stamp) = open::open_regular(&path, "open")?;
        Self::from_file(path, file, stamp)
    }

    /// Validates the header of `file`, opened (regular, blocking) from
    /// `path` with `stamp`.
    pub(crate) fn from_file(path: PathBuf, file: File, stamp: Stamp) -> Result<Self> {
        let io = |op, source| Error::Io {
            path: path.clone(),
            op,
            source,
        };
        let file_len = stamp.len;

        let mut prefix = [0u8; LFS_POINTER_PREFIX.len()];
        let plen = usize::try_from(file_len).map_or(prefix.len(), |l| l.min(prefix.len()));
        let (head, _) = prefix.split_at_mut(plen);
        read_exact_at(&file, head, 0).map_err(|e| io("read header", e))?;
        let n = header::check_prefix(&path, head, file_len)?;

        // n <= MAX_HEADER_LEN (100 MB): fits in usize on 32 and 64 bits.
        let n_usize = usize::try_from(n).map_err(|_| Error::HeaderTooLarge {
            path: path.clone(),
            len: n,
            limit: header::MAX_HEADER_LEN,
        })?;
        let mut json = vec![0u8; n_usize];
        read_exact_at(&file, &mut json, 8).map_err(|e| io("read header", e))?;
        let header = header::parse_header(&path, &json, file_len - 8 - n)?;
        let st = SafeTensors {
            path,
            file: FileHandle::Held(file),
            file_len,
            header,
            stamp,
        };
        st.verify(None)?;
        Ok(st)
    }

    /// A second descriptor of the very file this reader validated (`dup`,
    /// never a new open by name, which a swapped symlink or a FIFO put in
    /// its place could redirect or block). For the transfer pipeline's
    /// positioned reads.
    pub(crate) fn try_clone_file(&self) -> Result<FileHandle> {
        self.file.try_clone(&self.path)
    }

    /// From now on, reads go through `reopen`'s bounded cache of
    /// descriptors (a checkpoint with more shards than may stay open:
    /// [`handle`](super::handle)).
    pub(crate) fn into_cached(mut self, reopen: Reopen) -> Self {
        let held = std::mem::replace(&mut self.file, FileHandle::Reopened(reopen.clone()));
        self.file = held.into_cached(reopen);
        self
    }

    /// The file's identity (device, inode), taken from the open descriptor.
    pub fn file_id(&self) -> FileId {
        self.stamp.id
    }

    /// Checks that the file is unchanged since [`open`](Self::open): same
    /// identity, size and modification time (nanoseconds) of the open
    /// file. Every
    /// read already checks this after its last `pread`; call it to check
    /// once more, e.g. after a sequence of reads and before committing
    /// their result.
    ///
    /// Detected: any write, truncation or regrowth of the open file after
    /// open (its size or modification time moves). Not detected: a change
    /// that keeps the size and falls in the same timestamp tick as the
    /// file's previous change (the kernel's coarse clock, a few
    /// milliseconds: the time does not move), e.g. a file still being
    /// written when it was opened; a rewrite that keeps the size and sets
    /// the modification time back on purpose (`utimes`); writes through a
    /// shared memory map not yet written back; a change after the last
    /// check (reads already returned stay as they were). Not a change:
    /// what leaves the open file's bytes alone, `chmod`, a new hard link,
    /// a rename, `rm` of its path, or an atomic replace of its path (a new
    /// file renamed over it, as [`SafeTensorsWriter`](super::SafeTensorsWriter)
    /// does): the handle keeps reading the file it opened, as
    /// `safetensors`' memory map does.
    ///
    /// Errors: [`Error::FileChanged`], [`Error::Io`] when `fstat` fails.
    pub fn check_unchanged(&self) -> Result<()> {
        self.verify(None)
    }

    /// [`check_unchanged`](Self::check_unchanged), naming `tensor`.
    fn verify(&self, tensor: Option<&str>) -> Result<()> {
        let meta = self
            .file
            .get(&self.path)?
            .metadata()
            .map_err(|e| Error::Io {
                path: self.path.clone(),
                op: "stat",
                source: e,
            })?;
        match self.stamp.differs(&Stamp::of(&meta)) {
            None => Ok(()),
            Some(what) => Err(Error::FileChanged {
                path: self.path.clone(),
                tensor: tensor.map(str::to_owned),
                what,
            }),
        }
    }

    /// The file's path, as given to [`open`](Self::open).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `__metadata__` string map, if the header has one.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.header.metadata()
    }

    /// Every tensor, sorted by data offset.
    pub fn tensors(&self) -> &[TensorInfo] {
        self.header.tensors()
    }

    /// The tensor of this name, if any.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.header.get(name)
    }

    /// The tensor of this name, or [`Error::TensorNotFound`].
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.get(name).ok_or_else(|| Error::TensorNotFound {
            path: self.path.clone(),
            tensor: name.to_owned(),
        })
    }

    /// File offset of the data section (8 + header length).
    pub fn data_start(&self) -> u64 {
        self.header.data_start()
    }

    /// The file's length when it was opened.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    // ----- raw bytes ------------------------------------------------------

    /// Reads a tensor's raw bytes, as stored (little-endian, never converted:
    /// [`read_converted_bytes_into`](Self::read_converted_bytes_into)
    /// converts), into `dst`, which
    /// must have exactly [`TensorInfo::num_bytes`] bytes
    /// ([`Error::LengthMismatch`] otherwise). Any dtype.
    pub fn read_bytes_into(&self, name: &str, dst: &mut [u8]) -> Result<()> {
        let info = self.info(name)?;
        self.read_span(info, (0, info.num_bytes()), info.dtype, dst)
    }

    /// Reads a tensor's bytes, as stored, into a new buffer. Any dtype.
    pub fn read_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let info = self.info(name)?;
        let mut out: Vec<u8> = self.alloc(info, self.to_usize(info, info.num_bytes())?)?;
        self.read_span(info, (0, info.num_bytes()), info.dtype, &mut out)?;
        Ok(out)
    }

    // ----- typed, converting ---------------------------------------------

    /// Reads a tensor into `dst` as `T`, converting on the way when the
    /// stored dtype differs: F64, F32, F16 and BF16 tensors read as `f32`,
    /// `half::bf16` or `half::f16` (exact conversions of
    /// [`crate::convert`]); a tensor whose dtype is `T`'s is copied as is.
    /// `dst` must have [`TensorInfo::num_elements`] elements.
    ///
    /// Errors: [`Error::TensorNotFound`], [`Error::UnsupportedConversion`]
    /// (integer, bool, fp8 tensors; targets other than f32/f16/bf16),
    /// [`Error::LengthMismatch`], [`Error::FileShrunk`], [`Error::Io`].
    pub fn read_into<T: Element>(&self, name: &str, dst: &mut [T]) -> Result<()> {
        let info = self.info(name)?;
        self.check_len(info, info.num_elements(), dst.len())?;
        self.read_span(
            info,
            (0, info.num_bytes()),
            T::DTYPE,
            bytemuck::cast_slice_mut(dst),
        )
    }

    /// Reads a tensor into a new `Vec<T>`, converting as [`read_into`](Self::read_into).
    pub fn read<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        let info = self.info(name)?;
        self.check_convertible(info, T::DTYPE)?;
        let mut out: Vec<T> = self.alloc(info, self.to_usize(info, info.num_elements())?)?;
        self.read_span(
            info,
            (0, info.num_bytes()),
            T::DTYPE,
            bytemuck::cast_slice_mut(&mut out),
        )?;
        Ok(out)
    }

    /// Reads a tensor as little-endian bytes of dtype `to` into `dst`
    /// (`num_elements * to.size()` bytes, any alignment). `to` equal to the
    /// stored dtype copies the raw bytes (any dtype); otherwise the
    /// conversion rules of [`read_into`](Self::read_into) apply.
    pub fn read_converted_bytes_into(&self, name: &str, to: DType, dst: &mut [u8]) -> Result<()> {
        let info = self.info(name)?;
        self.read_span(info, (0, info.num_bytes()), to, dst)
    }

    /// Reads a tensor as little-endian bytes of dtype `to` into a new buffer
    /// (the raw, stored bytes are [`read_bytes`](Self::read_bytes)).
    pub fn read_converted_bytes(&self, name: &str, to: DType) -> Result<Vec<u8>> {
        let info = self.info(name)?;
        self.check_convertible(info, to)?;
        let len = self.out_bytes(info, info.num_elements(), to)?;
        let mut out: Vec<u8> = self.alloc(info, len)?;
        self.read_span(info, (0, info.num_bytes()), to, &mut out)?;
        Ok(out)
    }

    /// Streams a tensor as little-endian bytes of dtype `to` (the stored
    /// dtype: raw bytes, any dtype; otherwise the conversions of
    /// [`read_into`](Self::read_into)), calling `f` on consecutive pieces of
    /// the output, each from at most [`CHUNK_BYTES`] of the file: memory is
    /// two chunks whatever the tensor's size. This is how a whole file is
    /// converted or copied (e.g. into
    /// [`SafeTensorsWriter::write_chunk`](super::SafeTensorsWriter::write_chunk))
    /// without holding a tensor. `f` is called at least once (with an
    /// empty piece for a tensor of zero bytes), so a writer fed by it sees
    /// every tensor. An error from `f` stops the stream and is returned. After the last piece the file is checked unchanged
    /// ([`Error::FileChanged`]): a caller committing the output only after
    /// this returns `Ok` never commits a mix of old and new data (see
    /// [`check_unchanged`](Self::check_unchanged) for the limits).
    pub fn for_each_chunk(
        &self,
        name: &str,
        to: DType,
        mut f: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let info = self.info(name)?;
        self.check_convertible(info, to)?;
        let (ss, ds) = if to == info.dtype {
            (1u64, 1u64)
        } else {
            (
                info.dtype.size().unwrap_or(1) as u64,
                to.size().unwrap_or(1) as u64,
            )
        };
        let total = info.num_bytes();
        let chunk_src = (CHUNK_BYTES as u64 / ss).max(1) * ss;
        let out_cap = self.to_usize(info, chunk_src.min(total) / ss * ds)?;
        let mut out: Vec<u8> = self.alloc(info, out_cap)?;
        if total == 0 {
            f(&[])?;
        }
        let mut off = 0u64;
        while off < total {
            let n = chunk_src.min(total - off);
            let len = ((n / ss * ds) as usize).min(out.len());
            let (piece, _) = out.split_at_mut(len);
            self.read_span_unverified(info, (off, off + n), to, piece)?;
            f(piece)?;
            off += n;
        }
        self.verify(Some(&info.name))
    }

    // ----- rows -----------------------------------------------------------

    /// Byte span (within the tensor) and element count of rows `rows`.
    fn row_span(&self, info: &TensorInfo, rows: &Range<u64>) -> Result<((u64, u64), u64)> {
        let (Some(nrows), Some(rb)) = (info.rows(), info.row_bytes()) else {
            return Err(Error::NoRows {
                path: self.path.clone(),
                tensor: info.name.clone(),
                shape: info.shape.clone(),
            });
        };
        if rows.start > rows.end || rows.end > nrows {
            return Err(Error::RowRange {
                path: self.path.clone(),
                tensor: info.name.clone(),
                start: rows.start,
                end: rows.end,
                rows: nrows,
            });
        }
        // rows.end <= nrows, and nrows * rb == num_bytes for a validated
        // header, so these cannot overflow; checked all the same.
        let per_row: u64 = info
            .shape
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d));
        let span = (rows.start.saturating_mul(rb), rows.end.saturating_mul(rb));
        let elems = (rows.end - rows.start).saturating_mul(per_row);
        Ok((span, elems))
    }

    /// Reads rows `rows` (of the first dimension) of a tensor into `dst`,
    /// converting as [`read_into`](Self::read_into); only those rows' bytes
    /// are read. `dst` has `(rows.end - rows.start) * row elements` elements.
    ///
    /// Errors: as `read_into`, plus [`Error::NoRows`] for a scalar and
    /// [`Error::RowRange`] for `start > end` or `end` past the rows.
    pub fn read_rows_into<T: Element>(
        &self,
        name: &str,
        rows: Range<u64>,
        dst: &mut [T],
    ) -> Result<()> {
        let info = self.info(name)?;
        let (span, elems) = self.row_span(info, &rows)?;
        self.check_len(info, elems, dst.len())?;
        self.read_span(info, span, T::DTYPE, bytemuck::cast_slice_mut(dst))
    }

    /// Reads rows `rows` of a tensor into a new `Vec<T>` (see
    /// [`read_rows_into`](Self::read_rows_into)).
    pub fn read_rows<T: Element>(&self, name: &str, rows: Range<u64>) -> Result<Vec<T>> {
        let info = self.info(name)?;
        let (span, elems) = self.row_span(info, &rows)?;
        self.check_convertible(info, T::DTYPE)?;
        let mut out: Vec<T> = self.alloc(info, self.to_usize(info, elems)?)?;
        self.read_span(info, span, T::DTYPE, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Reads the raw bytes of rows `rows` of a tensor (any dtype) into `dst`.
    pub fn read_rows_bytes_into(&self, name: &str, rows: Range<u64>, dst: &mut [u8]) -> Result<()> {
        let info = self.info(name)?;
        let (span, _) = self.row_span(info, &rows)?;
        self.read_span(info, span, info.dtype, dst)
    }

    /// Reads the raw bytes of rows `rows` of a tensor (any dtype).
    pub fn read_rows_bytes(&self, name: &str, rows: Range<u64>) -> Result<Vec<u8>> {
        let info = self.info(name)?;
        let (span, _) = self.row_span(info, &rows)?;
        let mut out: Vec<u8> = self.alloc(info, self.to_usize(info, span.1 - span.0)?)?;
        self.read_span(info, span, info.dtype, &mut out)?;
        Ok(out)
    }

    // ----- internals ------------------------------------------------------

    /// `n` zeroed elements for `info`'s data, allocated fallibly after a
    /// check against the machine's memory ([`Error::AllocationFailed`]).
    fn alloc<T: bytemuck::Zeroable>(&self, info: &TensorInfo, n: usize) -> Result<Vec<T>> {
        alloc::tensor_vec(&self.path, &info.name, n as u64)
    }

    fn to_usize(&self, info: &TensorInfo, n: u64) -> Result<usize> {
        usize::try_from(n).map_err(|_| Error::TooLargeForPlatform {
            path: self.path.clone(),
            tensor: info.name.clone(),
            bytes: n,
        })
    }

    fn check_len(&self, info: &TensorInfo, expected: u64, actual: usize) -> Result<()> {
        if expected != actual as u64 {
            return Err(Error::LengthMismatch {
                op: "read",
                expected: usize::try_from(expected).unwrap_or(usize::MAX),
                actual,
                tensor: Some(TensorRef::new(&self.path, &info.name)),
            });
        }
        Ok(())
    }

    fn check_convertible(&self, info: &TensorInfo, to: DType) -> Result<()> {
        if to != info.dtype && !convert::supported(info.dtype, to) {
            return Err(Error::UnsupportedConversion {
                op: "read",
                from: info.dtype,
                to,
                tensor: Some(TensorRef::new(&self.path, &info.name)),
            });
        }
        Ok(())
    }

    /// Bytes of `elems` elements of `to`, as usize.
    fn out_bytes(&self, info: &TensorInfo, elems: u64, to: DType) -> Result<usize> {
        let bytes = to
            .bytes_for(elems)
            .ok_or_else(|| Error::TooLargeForPlatform {
                path: self.path.clone(),
                tensor: info.name.clone(),
                bytes: u64::MAX,
            })?;
        self.to_usize(info, bytes)
    }

    /// Reads bytes `span` (relative to the tensor's start) of `info`,
    /// converted to `to`, into `dst`, then checks that the file did not
    /// change since it was opened ([`Error::FileChanged`]).
    fn read_span(
        &self,
        info: &TensorInfo,
        span: (u64, u64),
        to: DType,
        dst: &mut [u8],
    ) -> Result<()> {
        self.read_span_unverified(info, span, to, dst)?;
        self.verify(Some(&info.name))
    }

    /// [`read_span`](Self::read_span) without the final check. The one
    /// place that touches the file.
    fn read_span_unverified(
        &self,
        info: &TensorInfo,
        span: (u64, u64),
        to: DType,
        dst: &mut [u8],
    ) -> Result<()> {
        self.check_convertible(info, to)?;
        let base = self
            .data_start()
            .checked_add(info.data_offsets.0)
            .and_then(|b| b.checked_add(span.0))
            .ok_or_else(|| Error::TooLargeForPlatform {
                path: self.path.clone(),
                tensor: info.name.clone(),
                bytes: u64::MAX,
            })?;
        let src_len = span.1.saturating_sub(span.0);
        if to == info.dtype {
            self.check_len(info, src_len, dst.len())?;
            return self.pread(info, dst, base);
        }
        // Convertible floats are whole-byte types (2, 4 or 8 bytes).
        let (ss, ds) = (
            info.dtype.size().unwrap_or(1) as u64,
            to.size().unwrap_or(1) as u64,
        );
        let elems = src_len / ss;
        let expected = elems.saturating_mul(ds);
        if expected != dst.len() as u64 {
            return Err(Error::LengthMismatch {
                op: "read",
                expected: usize::try_from(expected / ds).unwrap_or(usize::MAX),
                actual: dst.len() / ds as usize,
                tensor: Some(TensorRef::new(&self.path, &info.name)),
            });
        }
        if elems == 0 {
            return Ok(());
        }
        let chunk_elems = (CHUNK_BYTES as u64 / ss).max(1);
        let staging_len = self.to_usize(info, chunk_elems.min(elems) * ss)?;
        with_staging(staging_len, |staging| {
            let mut done = 0u64;
            for out in dst.chunks_mut((chunk_elems * ds) as usize) {
                let k = out.len() as u64 / ds;
                let (src, _) = staging.split_at_mut(((k * ss) as usize).min(staging.len()));
                self.pread(info, src, base + done * ss)?;
                convert::convert_bytes(info.dtype, src, to, out)?;
                done += k;
            }
            Ok(())
        })
    }

    /// `pread` of exactly `dst.len()` bytes at file offset `off`; a short
    /// read (the file shrank since it was opened) is [`Error::FileShrunk`].
    fn pread(&self, info: &TensorInfo, dst: &mut [u8], off: u64) -> Result<()> {
        let file = self.file.get(&self.path)?;
        pread_tensor(&file, &self.path, self.file_len, &info.name, dst, off)
    }
}

/// `pread` of exactly `dst.len()` bytes at offset `off` of `file` (the file
/// at `path`, `opened_len` bytes long when it was opened) for `tensor`. A
/// short read means the file shrank since: [`Error::FileShrunk`]; any other
/// failure is [`Error::Io`]. Zero-length reads issue no system call. Shared
/// by the reader and the transfer pipeline's positioned reads.
pub(crate) fn pread_tensor(
    file: &File,
    path: &Path,
    opened_len: u64,
    tensor: &str,
    dst: &mut [u8],
    off: u64,
) -> Result<()> {
    read_exact_at(file, dst, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::FileShrunk {
                path: path.to_owned(),
                tensor: tensor.to_owned(),
                expected: opened_len,
                actual: file.metadata().map_or(0, |m| m.len()),
            }
        } else {
            Error::Io {
                path: path.to_owned(),
                op: "read tensor data",
                source: e,
            }
        }
    })
}

/// `read_exact_at` that never issues a zero-length read.
fn read_exact_at(file: &File, dst: &mut [u8], off: u64) -> std::io::Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    file.read_exact_at(dst, off)
}
