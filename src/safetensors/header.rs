//! Strict validation of a safetensors header, from bytes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::json::Node;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The largest header the format allows (the `safetensors` crate's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// How every Git LFS pointer file starts.
pub const LFS_POINTER_PREFIX: &[u8] = b"version https://git-lfs.github.com/spec/";

/// One tensor of a safetensors file, as its header describes it (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (its key in the header).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape; `[]` is a scalar (one element).
    pub shape: Vec<u64>,
    /// `[begin, end)` byte offsets within the data section (not the file:
    /// add [`super::SafeTensors::data_start`]). Never assumed aligned.
    pub data_offsets: (u64, u64),
}

impl TensorInfo {
    /// Number of elements (product of the shape; 1 for a scalar).
    /// Saturates at `u64::MAX`, which a validated header never reaches.
    pub fn num_elements(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Number of bytes of the tensor's data.
    pub fn num_bytes(&self) -> u64 {
        self.data_offsets.1.saturating_sub(self.data_offsets.0)
    }

    /// Number of rows (the first dimension), or `None` for a scalar.
    pub fn rows(&self) -> Option<u64> {
        self.shape.first().copied()
    }

    /// Bytes of one row (one index of the first dimension), or `None` for a
    /// scalar or when a row of sub-byte elements does not fill whole bytes.
    pub fn row_bytes(&self) -> Option<u64> {
        let (_, rest) = self.shape.split_first()?;
        let elems = rest.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        self.dtype.bytes_for(elems)
    }
}

/// A validated header: what [`parse_bytes`] returns.
#[derive(Debug, Clone)]
pub struct Header {
    pub(crate) metadata: Option<BTreeMap<String, String>>,
    /// Sorted by data offset.
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) by_name: HashMap<String, usize>,
    pub(crate) data_start: u64,
    pub(crate) data_len: u64,
}

impl Header {
    /// The `__metadata__` map, if the header has one.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }
    /// Every tensor, sorted by data offset.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// The tensor of this name.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }
    /// File offset of the data section (8 + header length).
    pub fn data_start(&self) -> u64 {
        self.data_start
    }
    /// Length of the data section in bytes.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }
}

/// Checks the fixed-size start of a file: `prefix` is the file's first
/// bytes (at least `min(file_len, LFS_POINTER_PREFIX.len())` of them) and
/// `file_len` its length. Returns the header length `N`.
pub(crate) fn check_prefix(path: &Path, prefix: &[u8], file_len: u64) -> Result<u64> {
    if prefix.starts_with(LFS_POINTER_PREFIX) {
        return Err(Error::LfsPointer {
            path: path.to_owned(),
        });
    }
    let Some(len_bytes) = prefix.first_chunk::<8>() else {
        return Err(Error::FileTooSmall {
            path: path.to_owned(),
            len: file_len,
        });
    };
    if file_len < 8 {
        return Err(Error::FileTooSmall {
            path: path.to_owned(),
            len: file_len,
        });
    }
    let n = u64::from_le_bytes(*len_bytes);
    if n > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge {
            path: path.to_owned(),
            len: n,
            limit: MAX_HEADER_LEN,
        });
    }
    match n.checked_add(8) {
        Some(end) if end <= file_len => Ok(n),
        _ => Err(Error::HeaderOutOfBounds {
            path: path.to_owned(),
            header_len: n,
            file_len,
        }),
    }
}

/// Validates a whole safetensors file held in memory: `file` is every byte
/// of it. Used by the fuzz target and the property tests; the reader
/// itself parses the header without reading the data section.
#[doc(hidden)]
pub fn parse_bytes(path: &Path, file: &[u8]) -> Result<Header> {
    let file_len = file.len() as u64;
    let n = check_prefix(path, file, file_len)?;
    // check_prefix guarantees 8 + n <= file.len().
    let header = file
        .get(8..)
        .and_then(|rest| rest.get(..usize::try_from(n).ok()?))
        .ok_or_else(|| Error::HeaderOutOfBounds {
            path: path.to_owned(),
            header_len: n,
            file_len,
        })?;
    parse_header(path, header, file_len - 8 - n)
}

/// The header length `N` of a file, from its first bytes: `prefix` holds
/// at least `min(file_len, 40)` of them ([`LFS_POINTER_PREFIX`]'s length
/// rounded up), `file_len` is the file's length. The checks of
/// [`parse_bytes`] on the length prefix (a Git LFS pointer, a file under 8
/// bytes, `N` over [`MAX_HEADER_LEN`] or past the end of the file), for
/// readers that hold a stream, not the whole file: they read `8 + N` bytes
/// next and pass them to [`parse_head`].
pub fn header_len(path: &Path, prefix: &[u8], file_len: u64) -> Result<u64> {
    check_prefix(path, prefix, file_len)
}

/// Validates a file's header from its first `8 + N` bytes (`head`: the
/// length prefix and the JSON header; bytes after them are ignored) and
/// the file's length: every check of [`parse_bytes`], the layout of the
/// data section included, without the data section in memory. For readers
/// of a stream (a Python file object), which then read each tensor at its
/// validated offsets ([`Header::data_start`] plus
/// [`TensorInfo::data_offsets`]). A `head` shorter than `8 + N` (a stream
/// that ended early) is [`Error::HeaderOutOfBounds`].
pub fn parse_head(path: &Path, head: &[u8], file_len: u64) -> Result<Header> {
    let n = check_prefix(path, head, file_len)?;
    let header = usize::try_from(n)
        .ok()
        .and_then(|n| head.get(8..)?.get(..n))
        .ok_or_else(|| Error::HeaderOutOfBounds {
            path: path.to_owned(),
            header_len: n,
            file_len: head.len() as u64,
        })?;
    // check_prefix guarantees 8 + n <= file_len.
    parse_header(path, header, file_len - 8 - n)
}

/// Validates the JSON header (the `N` bytes after the length prefix) of a
/// file whose data section has `data_len` bytes.
pub(crate) fn parse_header(path: &Path, header: &[u8], data_len: u64) -> Result<Header> {
    let p = || path.to_owned();
    let text = std::str::from_utf8(header).map_err(|e| Error::HeaderNotUtf8 {
        path: p(),
        valid_up_to: e.valid_up_to(),
    })?;
    if !text.starts_with('{') {
        return Err(Error::HeaderNotObject {
            path: p(),
            reason: "does not start with '{'",
        });
    }
    let trimmed = text.trim_end_matches(' ');
    if !trimmed.ends_with('}') {
        return Err(Error::HeaderNotObject {
            path: p(),
            reason: "something other than spaces follows the closing '}'",
        });
    }
    let root: Node =
        serde_json::from_str(trimmed).map_err(|source| Error::HeaderJson { path: p(), source })?;
    let Node::Object(entries) = root else {
        // Unreachable for text starting with '{' that parsed, kept typed.
        return Err(Error::HeaderNotObject {
            path: p(),
            reason: "not a json object",
        });
    };
    if let Some(k) = Node::duplicate_key(&entries) {
        return Err(Error::DuplicateKey {
            path: p(),
            key: k.to_owned(),
            within: "the header".to_owned(),
        });
    }

    let mut metadata = None;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == "__metadata__" {
            // `null` is no metadata, as the safetensors package reads it
            // (some writers emit it for an empty map).
            metadata = match value {
                Node::Null => None,
                value => Some(parse_metadata(path, value)?),
            };
        } else {
            tensors.push(parse_tensor(path, name, value)?);
        }
    }

    // Tiling of the data section: sorted by (begin, end), each tensor
    // starts where the previous one ended and the last ends at data_len.
    tensors.sort_by(|a, b| {
        a.data_offsets
            .cmp(&b.data_offsets)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut cursor = 0u64;
    for t in &tensors {
        let (begin, end) = t.data_offsets;
        let problem = if end > data_len {
            Some(("tensor past the end", end))
        } else if begin > cursor {
            Some(("hole", cursor))
        } else if begin < cursor {
            Some(("overlap", begin))
        } else {
            None
        };
        if let Some((problem, offset)) = problem {
            return Err(Error::DataLayout {
                path: p(),
                tensor: Some(t.name.clone()),
                problem,
                offset,
                data_len,
            });
        }
        cursor = end;
    }
    if cursor != data_len {
        return Err(Error::DataLayout {
            path: p(),
            tensor: None,
            problem: "trailing bytes",
            offset: cursor,
            data_len,
        });
    }

    let by_name = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), i))
        .collect();
    Ok(Header {
        metadata,
        tensors,
        by_name,
        data_start: 8 + header.len() as u64,
        data_len,
    })
}

fn parse_metadata(path: &Path, value: Node) -> Result<BTreeMap<String, String>> {
    let Node::Object(entries) = value else {
        return Err(Error::InvalidMetadata {
            path: path.to_owned(),
            key: None,
            reason: "not an object",
        });
    };
    if let Some(k) = Node::duplicate_key(&entries) {
        return Err(Error::DuplicateKey {
            path: path.to_owned(),
            key: k.to_owned(),
            within: "__metadata__".to_owned(),
        });
    }
    let mut out = BTreeMap::new();
    for (k, v) in entries {
        match v {
            Node::Str(s) => {
                out.insert(k, s);
            }
            _ => {
                return Err(Error::InvalidMetadata {
                    path: path.to_owned(),
                    key: Some(k),
                    reason: "value is not a string",
                })
            }
        }
    }
    Ok(out)
}

fn parse_tensor(path: &Path, name: String, value: Node) -> Result<TensorInfo> {
    let bad = |field: &str, reason: &'static str| Error::InvalidTensorEntry {
        path: path.to_owned(),
        tensor: name.clone(),
        field: field.to_owned(),
        reason,
    };
    let Node::Object(fields) = value else {
        return Err(bad("entry", "not an object"));
    };
    if let Some(k) = Node::duplicate_key(&fields) {
        return Err(Error::DuplicateKey {
            path: path.to_owned(),
            key: k.to_owned(),
            within: format!("tensor {name:?}"),
        });
    }
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    for (k, v) in fields {
        match k.as_str() {
            "dtype" => dtype = Some(v),
            "shape" => shape = Some(v),
            "data_offsets" => offsets = Some(v),
            other => return Err(bad(other, "unknown field")),
        }
    }
    let dtype = match dtype {
        None => return Err(bad("dtype", "missing")),
        Some(Node::Str(s)) => match s.parse::<DType>() {
            Ok(d) => d,
            Err(_) => {
                return Err(Error::UnknownDType {
                    path: path.to_owned(),
                    tensor: name,
                    dtype: s,
                })
            }
        },
        Some(_) => return Err(bad("dtype", "not a string")),
    };
    let shape = match shape {
        None => return Err(bad("shape", "missing")),
        Some(v) => u64_array(v).ok_or_else(|| bad("shape", "not an array of unsigned integers"))?,
    };
    let offsets = match offsets {
        None => return Err(bad("data_offsets", "missing")),
        Some(v) => match u64_array(v).as_deref() {
            Some(&[b, e]) => (b, e),
            _ => {
                return Err(bad(
                    "data_offsets",
                    "not an array of exactly two unsigned integers",
                ))
            }
        },
    };
    let size_err = |reason| Error::InvalidTensorSize {
        path: path.to_owned(),
        tensor: name.clone(),
        dtype,
        shape: shape.clone(),
        reason,
    };
    let elements = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| size_err("element count overflows u64"))?;
    let expected = match dtype.bytes_for(elements) {
        Some(b) => b,
        None if elements.checked_mul(dtype.bits()).is_none() => {
            return Err(size_err("byte size overflows u64"))
        }
        None => {
            return Err(size_err(
                "sub-byte elements do not fill a whole number of bytes",
            ))
        }
    };
    let (begin, end) = offsets;
    if begin > end || end - begin != expected {
        return Err(Error::InvalidDataOffsets {
            path: path.to_owned(),
            tensor: name,
            begin,
            end,
            expected,
        });
    }
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        data_offsets: offsets,
    })
}

fn u64_array(v: Node) -> Option<Vec<u64>> {
    match v {
        Node::Array(items) => items
            .into_iter()
            .map(|i| match i {
                Node::U64(n) => Some(n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}
