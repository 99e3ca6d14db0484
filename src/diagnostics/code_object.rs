//! Reads an AMDGPU code object's kernel metadata: the registers, scratch,
//! LDS and wavefront size the compiler gave each kernel, and each kernel's
//! arguments (size, offset and kind in the kernel argument segment, which is
//! how the runtime packs a launch's `kernelParams`). Parses the bytes
//! `build.rs` embeds (a clang offload bundle, or a bare ELF) down to the
//! `NT_AMDGPU_METADATA` note (MessagePack), with bounds-checked reads only:
//! a malformed object is an error, never a panic.

use std::fmt;

/// Why a code object could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodeObjectError {
    /// The bytes end before a field that must be there.
    Truncated {
        /// The structure being read (`"bundle entry"`, `"ELF header"`).
        what: &'static str,
    },
    /// The bytes are not of the expected format.
    Malformed {
        /// What is wrong.
        what: &'static str,
    },
    /// The bundle holds no code object for the arch.
    NoEntry {
        /// The arch looked for (`gfx1151`).
        arch: String,
        /// The bundle's entry ids.
        entries: Vec<String>,
    },
}

impl fmt::Display for CodeObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodeObjectError::Truncated { what } => write!(f, "code object truncated in the {what}"),
            CodeObjectError::Malformed { what } => write!(f, "malformed code object: {what}"),
            CodeObjectError::NoEntry { arch, entries } => write!(
                f,
                "the offload bundle has no code object for {arch} (entries: {})",
                entries.join(", ")
            ),
        }
    }
}

impl std::error::Error for CodeObjectError {}

type Result<T> = std::result::Result<T, CodeObjectError>;

/// One kernel's resources, as the compiler recorded them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct KernelResources {
    /// The kernel's symbol (`conv3d_tiled_f32`).
    pub name: String,
    /// Vector registers per lane (arch VGPRs plus AGPRs on gfx90a/gfx942).
    pub vgpr_count: u64,
    /// Scalar registers per wave.
    pub sgpr_count: u64,
    /// Vector registers spilled (to scratch memory).
    pub vgpr_spill_count: u64,
    /// Scalar registers spilled (to VGPR lanes; to scratch only when
    /// `private_segment_fixed_size` is not 0).
    pub sgpr_spill_count: u64,
    /// Scratch memory per lane, in bytes (0: nothing spills to memory).
    pub private_segment_fixed_size: u64,
    /// Static LDS (shared memory) per block, in bytes.
    pub group_segment_fixed_size: u64,
    /// The most threads per block the kernel was compiled for.
    pub max_flat_workgroup_size: u64,
    /// Lanes per wavefront (32 or 64).
    pub wavefront_size: u64,
    /// Whether the stack size is unknown at compile time (recursion,
    /// indirect calls): scratch is then sized at run time.
    pub uses_dynamic_stack: bool,
    /// The size of the kernel argument segment, in bytes (explicit and
    /// hidden arguments).
    #[serde(default)]
    pub kernarg_segment_size: u64,
    /// Every argument, in the metadata's order: the explicit ones (the
    /// kernel's parameters, what a launch passes) first, then the hidden
    /// ones the runtime fills.
    #[serde(default)]
    pub args: Vec<KernelArgInfo>,
}

/// One argument of a kernel (`.args` in the AMDGPU metadata).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct KernelArgInfo {
    /// The parameter's name in the source, when recorded.
    pub name: Option<String>,
    /// Bytes in the argument segment.
    pub size: u64,
    /// Byte offset in the argument segment.
    pub offset: u64,
    /// `.value_kind`: `global_buffer` (a pointer), `by_value` (a scalar or
    /// a struct), or a `hidden_*` kind the runtime fills.
    pub value_kind: String,
}

impl KernelArgInfo {
    /// Whether the runtime fills it (a `hidden_*` kind), rather than the
    /// launch's `kernelParams`.
    pub fn is_hidden(&self) -> bool {
        self.value_kind.starts_with("hidden_")
    }
}

impl KernelResources {
    /// The explicit arguments: the kernel's parameters, in order, as a
    /// launch's `kernelParams` must give them.
    pub fn explicit_args(&self) -> impl Iterator<Item = &KernelArgInfo> {
        self.args.iter().filter(|a| !a.is_hidden())
    }
}

impl KernelResources {
    /// Whether the kernel uses scratch memory (spilled registers, a
    /// private array or a dynamic stack).
    pub fn uses_scratch(&self) -> bool {
        self.private_segment_fixed_size != 0
            || self.vgpr_spill_count != 0
            || self.uses_dynamic_stack
    }
}

/// What one arch's code object says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct CodeObjectInfo {
    /// The ELF's target id (`amdgcn-amd-amdhsa--gfx1151`).
    pub target: String,
    /// The code object version (4, 5, 6), from the ELF header's ABI version.
    pub code_object_version: u32,
    /// Every kernel, in the order of the metadata.
    pub kernels: Vec<KernelResources>,
}

#[cfg(test)] // used by the unit tests only
/// The lanes per wavefront an arch runs HIP kernels with: 64 on gfx9
/// (GCN/CDNA), 32 on gfx10, gfx11 and gfx12 (RDNA; HIP builds them wave32).
/// `None` for a name that is not a gfx arch.
pub fn wavefront_size(arch: &str) -> Option<u64> {
    let digits = arch.strip_prefix("gfx")?;
    let family = digits.get(..digits.len().checked_sub(2)?)?;
    match family.parse::<u32>().ok()? {
        6..=9 => Some(64),
        10..=12 => Some(32),
        _ => None,
    }
}

/// The code object for `arch` in `bytes`: an offload bundle (as `hipcc
/// --genco` and clang's HIP device-only mode write) or a bare ELF.
pub fn read_code_object(bytes: &[u8], arch: &str) -> Result<CodeObjectInfo> {
    let elf = if bytes.starts_with(BUNDLE_MAGIC) {
        bundle_entry(bytes, arch)?
    } else if bytes.starts_with(b"CCOB") {
        return Err(CodeObjectError::Malformed {
            what: "compressed offload bundle (not read here)",
        });
    } else {
        bytes
    };
    read_elf(elf)
}

const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";

fn get<'a>(b: &'a [u8], at: u64, len: u64, what: &'static str) -> Result<&'a [u8]> {
    let start = usize::try_from(at).map_err(|_| CodeObjectError::Truncated { what })?;
    let len = usize::try_from(len).map_err(|_| CodeObjectError::Truncated { what })?;
    let end = start
        .checked_add(len)
        .ok_or(CodeObjectError::Truncated { what })?;
    b.get(start..end).ok_or(CodeObjectError::Truncated { what })
}

fn le_u64(b: &[u8], at: u64, what: &'static str) -> Result<u64> {
    let s = get(b, at, 8, what)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

fn le_u32(b: &[u8], at: u64, what: &'static str) -> Result<u32> {
    let s = get(b, at, 4, what)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Ok(u32::from_le_bytes(a))
}

fn le_u16(b: &[u8], at: u64, what: &'static str) -> Result<u16> {
    let s = get(b, at, 2, what)?;
    Ok(u16::from_le_bytes([s[0], s[1]]))
}

/// The ELF of the bundle entry whose id ends in `--{arch}` (or
/// `--{arch}:features`), e.g. `hipv4-amdgcn-amd-amdhsa--gfx1151`.
fn bundle_entry<'a>(b: &'a [u8], arch: &str) -> Result<&'a [u8]> {
    let what = "bundle entry";
    let n = le_u64(b, 24, what)?;
    let mut at = 32u64;
    let mut ids = Vec::new();
    for _ in 0..n {
        let off = le_u64(b, at, what)?;
        let size = le_u64(b, at + 8, what)?;
        let id_len = le_u64(b, at + 16, what)?;
        let id = get(b, at + 24, id_len, what)?;
        let id = String::from_utf8_lossy(id).into_owned();
        at = at
            .checked_add(24 + id_len)
            .ok_or(CodeObjectError::Truncated { what })?;
        let target = id.rsplit("--").next().unwrap_or("");
        if id.contains("amdgcn") && target.split(':').next() == Some(arch) {
            return get(b, off, size, "bundled code object");
        }
        ids.push(id);
    }
    Err(CodeObjectError::NoEntry {
        arch: arch.to_owned(),
        entries: ids,
    })
}

const EM_AMDGPU: u16 = 224;
const SHT_NOTE: u32 = 7;
const NT_AMDGPU_METADATA: u32 = 32;

fn read_elf(e: &[u8]) -> Result<CodeObjectInfo> {
    let h = "ELF header";
    let ident = get(e, 0, 16, h)?;
    if &ident[..4] != b"\x7fELF" || ident[4] != 2 || ident[5] != 1 {
        return Err(CodeObjectError::Malformed {
            what: "not a 64-bit little-endian ELF",
        });
    }
    if le_u16(e, 18, h)? != EM_AMDGPU {
        return Err(CodeObjectError::Malformed {
            what: "ELF machine is not AMDGPU",
        });
    }
    // ABI version 2, 3, 4 = code object v4, v5, v6.
    let code_object_version = u32::from(ident[8]) + 2;
    let shoff = le_u64(e, 0x28, h)?;
    let shentsize = u64::from(le_u16(e, 0x3a, h)?);
    let shnum = u64::from(le_u16(e, 0x3c, h)?);
    if shentsize < 64 {
        return Err(CodeObjectError::Malformed {
            what: "ELF section header size below 64",
        });
    }
    for i in 0..shnum {
        let sh = get(e, shoff + i * shentsize, 64, "section header")?;
        if le_u32(sh, 4, "section header")? != SHT_NOTE {
            continue;
        }
        let notes = get(
            e,
            le_u64(sh, 0x18, "section header")?,
            le_u64(sh, 0x20, "section header")?,
            "note section",
        )?;
        if let Some(meta) = find_metadata_note(notes)? {
            return parse_metadata(meta, code_object_version);
        }
    }
    Err(CodeObjectError::Malformed {
        what: "no NT_AMDGPU_METADATA note",
    })
}

fn align4(n: u64) -> u64 {
    n.div_ceil(4) * 4
}

fn find_metadata_note(notes: &[u8]) -> Result<Option<&[u8]>> {
    let what = "note";
    let mut at = 0u64;
    while at < notes.len() as u64 {
        let namesz = u64::from(le_u32(notes, at, what)?);
        let descsz = u64::from(le_u32(notes, at + 4, what)?);
        let ty = le_u32(notes, at + 8, what)?;
        let name = get(notes, at + 12, namesz, what)?;
        let desc_at = at + 12 + align4(namesz);
        let desc = get(notes, desc_at, descsz, what)?;
        if ty == NT_AMDGPU_METADATA && name.strip_suffix(b"\0").unwrap_or(name) == b"AMDGPU" {
            return Ok(Some(desc));
        }
        at = desc_at + align4(descsz);
    }
    Ok(None)
}

/// A MessagePack value (the subset AMDGPU metadata uses, plus what is
/// needed to skip the rest).
#[derive(Debug, Clone, PartialEq)]
enum Msg {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bytes,
    Array(Vec<Msg>),
    Map(Vec<(Msg, Msg)>),
}

impl Msg {
    fn get(&self, key: &str) -> Option<&Msg> {
        match self {
            Msg::Map(kv) => kv
                .iter()
                .find(|(k, _)| matches!(k, Msg::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
    fn uint(&self, key: &str) -> u64 {
        match self.get(key) {
            Some(Msg::Int(i)) => u64::try_from(*i).unwrap_or(0),
            _ => 0,
        }
    }
}

struct MsgReader<'a> {
    b: &'a [u8],
    at: u64,
}

impl MsgReader<'_> {
    fn take(&mut self, n: u64) -> Result<&[u8]> {
        let s = get(self.b, self.at, n, "metadata")?;
        self.at += n;
        Ok(s)
    }
    fn be(&mut self, n: u64) -> Result<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |a, &x| (a << 8) | u64::from(x)))
    }
    fn signed(&mut self, n: u64) -> Result<i128> {
        let v = self.be(n)?;
        let shift = 64 - 8 * n as u32;
        Ok(i128::from(((v << shift) as i64) >> shift))
    }
    fn str(&mut self, n: u64) -> Result<Msg> {
        Ok(Msg::Str(
            String::from_utf8_lossy(self.take(n)?).into_owned(),
        ))
    }
    fn array(&mut self, n: u64, depth: u32) -> Result<Msg> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(self.value(depth + 1)?);
        }
        Ok(Msg::Array(v))
    }
    fn map(&mut self, n: u64, depth: u32) -> Result<Msg> {
        let mut v = Vec::new();
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            v.push((k, self.value(depth + 1)?));
        }
        Ok(Msg::Map(v))
    }
    fn value(&mut self, depth: u32) -> Result<Msg> {
        if depth > 32 {
            return Err(CodeObjectError::Malformed {
                what: "metadata nested too deep",
            });
        }
        let t = self.take(1)?[0];
        Ok(match t {
            0x00..=0x7f => Msg::Int(i128::from(t)),
            0x80..=0x8f => self.map(u64::from(t & 0x0f), depth)?,
            0x90..=0x9f => self.array(u64::from(t & 0x0f), depth)?,
            0xa0..=0xbf => self.str(u64::from(t & 0x1f))?,
            0xc0 => Msg::Nil,
            0xc2 => Msg::Bool(false),
            0xc3 => Msg::Bool(true),
            0xc4..=0xc6 => {
                let n = self.be(1 << (t - 0xc4))?;
                self.take(n)?;
                Msg::Bytes
            }
            0xc7..=0xc9 => {
                let n = self.be(1 << (t - 0xc7))?;
                self.take(n + 1)?;
                Msg::Bytes
            }
            0xca => Msg::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Msg::Float(f64::from_bits(self.be(8)?)),
            0xcc..=0xcf => Msg::Int(i128::from(self.be(1 << (t - 0xcc))?)),
            0xd0..=0xd3 => Msg::Int(self.signed(1 << (t - 0xd0))?),
            0xd4..=0xd8 => {
                self.take((1 << (t - 0xd4)) + 1)?;
                Msg::Bytes
            }
            0xd9..=0xdb => {
                let n = self.be(1 << (t - 0xd9))?;
                self.str(n)?
            }
            0xdc | 0xdd => {
                let n = self.be(2 << (t - 0xdc))?;
                self.array(n, depth)?
            }
            0xde | 0xdf => {
                let n = self.be(2 << (t - 0xde))?;
                self.map(n, depth)?
            }
            0xe0..=0xff => Msg::Int(i128::from(t as i8)),
            0xc1 => {
                return Err(CodeObjectError::Malformed {
                    what: "metadata uses the reserved MessagePack byte 0xc1",
                })
            }
        })
    }
}

fn parse_metadata(meta: &[u8], code_object_version: u32) -> Result<CodeObjectInfo> {
    let root = MsgReader { b: meta, at: 0 }.value(0)?;
    let target = match root.get("amdhsa.target") {
        Some(Msg::Str(s)) => s.clone(),
        _ => String::new(),
    };
    let Some(Msg::Array(list)) = root.get("amdhsa.kernels") else {
        return Err(CodeObjectError::Malformed {
            what: "metadata has no amdhsa.kernels list",
        });
    };
    let mut kernels = Vec::new();
    for k in list {
        let Some(Msg::Str(name)) = k.get(".name") else {
            return Err(CodeObjectError::Malformed {
                what: "a kernel's metadata has no .name",
            });
        };
        let mut args = Vec::new();
        if let Some(Msg::Array(list)) = k.get(".args") {
            for a in list {
                let Some(Msg::Str(kind)) = a.get(".value_kind") else {
                    return Err(CodeObjectError::Malformed {
                        what: "a kernel argument's metadata has no .value_kind",
                    });
                };
                args.push(KernelArgInfo {
                    name: match a.get(".name") {
                        Some(Msg::Str(s)) => Some(s.clone()),
                        _ => None,
                    },
                    size: a.uint(".size"),
                    offset: a.uint(".offset"),
                    value_kind: kind.clone(),
                });
            }
        }
        kernels.push(KernelResources {
            name: name.clone(),
            vgpr_count: k.uint(".vgpr_count"),
            sgpr_count: k.uint(".sgpr_count"),
            vgpr_spill_count: k.uint(".vgpr_spill_count"),
            sgpr_spill_count: k.uint(".sgpr_spill_count"),
            private_segment_fixed_size: k.uint(".private_segment_fixed_size"),
            group_segment_fixed_size: k.uint(".group_segment_fixed_size"),
            max_flat_workgroup_size: k.uint(".max_flat_workgroup_size"),
            wavefront_size: k.uint(".wavefront_size"),
            uses_dynamic_stack: matches!(k.get(".uses_dynamic_stack"), Some(Msg::Bool(true))),
            kernarg_segment_size: k.uint(".kernarg_segment_size"),
            args,
        });
    }
    Ok(CodeObjectInfo {
        target,
        code_object_version,
        kernels,
    })
}

#[cfg(test)] // used by the unit tests only
/// Every problem with one arch's kernels: a kernel of `expected` missing,
/// a kernel using scratch memory, or a wavefront size other than the one
/// `arch` runs. Empty when all is well.
pub fn check_kernels(arch: &str, info: &CodeObjectInfo, expected: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    for name in expected {
        if !info.kernels.iter().any(|k| k.name == *name) {
            problems.push(format!(
                "{arch}: kernel {name} is missing from the code object"
            ));
        }
    }
    let wave = wavefront_size(arch);
    for k in &info.kernels {
        if k.uses_scratch() {
            problems.push(format!(
                "{arch}: {} uses scratch memory ({} VGPRs spilled, {} bytes of scratch per lane{})",
                k.name,
                k.vgpr_spill_count,
                k.private_segment_fixed_size,
                if k.uses_dynamic_stack {
                    ", dynamic stack"
                } else {
                    ""
                }
            ));
        }
        if Some(k.wavefront_size) != wave {
            problems.push(format!(
                "{arch}: {} is built for wavefront size {}, the arch runs {}",
                k.name,
                k.wavefront_size,
                wave.map_or_else(|| "an unknown size".to_owned(), |w| w.to_string())
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MessagePack for a map of string keys.
    fn mp_str(s: &str, out: &mut Vec<u8>) {
        assert!(s.len() < 32);
        out.push(0xa0 | s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }

    fn kernel_map(name: &str, vgprs: u8, scratch: u16, wave: u8) -> Vec<u8> {
        let mut m = vec![0x85];
        mp_str(".name", &mut m);
        mp_str(name, &mut m);
        mp_str(".vgpr_count", &mut m);
        m.extend_from_slice(&[0xcc, vgprs]);
        mp_str(".private_segment_fixed_size", &mut m);
        m.push(0xcd);
        m.extend_from_slice(&scratch.to_be_bytes());
        mp_str(".wavefront_size", &mut m);
        m.push(wave);
        mp_str(".uses_dynamic_stack", &mut m);
        m.push(0xc2);
        m
    }

    fn metadata(kernels: &[Vec<u8>]) -> Vec<u8> {
        let mut m = vec![0x82];
        mp_str("amdhsa.target", &mut m);
        mp_str("amdgcn-amd-amdhsa--gfx1151", &mut m);
        mp_str("amdhsa.kernels", &mut m);
        m.push(0x90 | kernels.len() as u8);
        for k in kernels {
            m.extend_from_slice(k);
        }
        m
    }

    /// A minimal AMDGPU ELF: header, one SHT_NOTE section with the
    /// metadata note, section headers (a null one first).
    fn elf(meta: &[u8], abi: u8) -> Vec<u8> {
        let mut note = Vec::new();
        note.extend_from_slice(&7u32.to_le_bytes());
        note.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        note.extend_from_slice(&NT_AMDGPU_METADATA.to_le_bytes());
        note.extend_from_slice(b"AMDGPU\0\0");
        note.extend_from_slice(meta);
        while note.len() % 4 != 0 {
            note.push(0);
        }
        let mut e = vec![0u8; 64];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = 1;
        e[7] = 64;
        e[8] = abi;
        e[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
        let note_at = e.len() as u64;
        e.extend_from_slice(&note);
        let shoff = e.len() as u64;
        e[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        e[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        e[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        e.extend_from_slice(&[0u8; 64]);
        let mut sh = [0u8; 64];
        sh[4..8].copy_from_slice(&SHT_NOTE.to_le_bytes());
        sh[0x18..0x20].copy_from_slice(&note_at.to_le_bytes());
        sh[0x20..0x28].copy_from_slice(&(note.len() as u64).to_le_bytes());
        e.extend_from_slice(&sh);
        e
    }

    fn bundle(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut head = BUNDLE_MAGIC.to_vec();
        head.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        let table: usize = entries.iter().map(|(id, _)| 24 + id.len()).sum();
        let mut off = (head.len() + table) as u64;
        let mut body = Vec::new();
        for (id, data) in entries {
            head.extend_from_slice(&off.to_le_bytes());
            head.extend_from_slice(&(data.len() as u64).to_le_bytes());
            head.extend_from_slice(&(id.len() as u64).to_le_bytes());
            head.extend_from_slice(id.as_bytes());
            off += data.len() as u64;
            body.extend_from_slice(data);
        }
        head.extend_from_slice(&body);
        head
    }

    #[test]
    fn reads_kernels_from_a_bundle_and_checks_them() {
        let e = elf(
            &metadata(&[
                kernel_map("good", 40, 0, 32),
                kernel_map("spills", 200, 224, 32),
                kernel_map("wave64", 20, 0, 64),
            ]),
            3,
        );
        let b = bundle(&[
            ("host-x86_64-unknown-linux--", b""),
            ("hipv4-amdgcn-amd-amdhsa--gfx1151", &e),
        ]);
        let info = read_code_object(&b, "gfx1151").unwrap();
        assert_eq!(info.target, "amdgcn-amd-amdhsa--gfx1151");
        assert_eq!(info.code_object_version, 5);
        assert_eq!(info.kernels.len(), 3);
        assert_eq!(info.kernels[1].vgpr_count, 200);
        assert_eq!(info.kernels[1].private_segment_fixed_size, 224);
        let p = check_kernels("gfx1151", &info, &["good", "absent"]);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("absent is missing"), "{p:?}");
        assert!(p[1].contains("spills uses scratch"), "{p:?}");
        assert!(
            p[2].contains("wave64 is built for wavefront size 64"),
            "{p:?}"
        );
        assert!(check_kernels("gfx1151", &info, &["good"])
            .iter()
            .all(|m| !m.contains("good")));
        match read_code_object(&b, "gfx90a") {
            Err(CodeObjectError::NoEntry { entries, .. }) => assert_eq!(entries.len(), 2),
            other => panic!("{other:?}"),
        }
        // A bare ELF reads the same.
        assert_eq!(read_code_object(&e, "gfx1151").unwrap(), info);
    }

    #[test]
    fn reads_each_kernels_arguments() {
        // convert(const u16* src, float* dst, u64 n) + one hidden argument.
        let arg = |name: Option<&str>, size: u8, offset: u8, kind: &str| {
            let mut m = vec![if name.is_some() { 0x84 } else { 0x83 }];
            if let Some(n) = name {
                mp_str(".name", &mut m);
                mp_str(n, &mut m);
            }
            mp_str(".size", &mut m);
            m.push(size);
            mp_str(".offset", &mut m);
            m.push(offset);
            mp_str(".value_kind", &mut m);
            mp_str(kind, &mut m);
            m
        };
        let mut k = vec![0x84];
        mp_str(".name", &mut k);
        mp_str("convert", &mut k);
        mp_str(".wavefront_size", &mut k);
        k.push(32);
        mp_str(".kernarg_segment_size", &mut k);
        k.extend_from_slice(&[0xcc, 0x98]);
        mp_str(".args", &mut k);
        k.push(0x94);
        k.extend(arg(Some("src"), 8, 0, "global_buffer"));
        k.extend(arg(Some("dst"), 8, 8, "global_buffer"));
        k.extend(arg(Some("n"), 8, 16, "by_value"));
        k.extend(arg(None, 4, 24, "hidden_block_count_x"));
        let info = read_code_object(&elf(&metadata(&[k]), 3), "gfx1151").unwrap();
        let c = &info.kernels[0];
        assert_eq!(c.kernarg_segment_size, 0x98);
        assert_eq!(c.args.len(), 4);
        let explicit: Vec<(u64, u64, &str)> = c
            .explicit_args()
            .map(|a| (a.size, a.offset, a.value_kind.as_str()))
            .collect();
        assert_eq!(
            explicit,
            [
                (8, 0, "global_buffer"),
                (8, 8, "global_buffer"),
                (8, 16, "by_value")
            ]
        );
        assert_eq!(c.args[2].name.as_deref(), Some("n"));
        assert!(c.args[3].is_hidden() && c.args[3].name.is_none());
        // A kernel without `.args` has none.
        let bare = read_code_object(&elf(&metadata(&[kernel_map("k", 1, 0, 32)]), 3), "gfx1151");
        assert!(bare.unwrap().kernels[0].args.is_empty());
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let e = elf(&metadata(&[kernel_map("k", 1, 0, 64)]), 2);
        let b = bundle(&[("hipv4-amdgcn-amd-amdhsa--gfx90a", &e)]);
        assert_eq!(
            read_code_object(&b, "gfx90a").unwrap().code_object_version,
            4
        );
        for n in 0..b.len() {
            assert!(read_code_object(&b[..n], "gfx90a").is_err(), "{n}");
        }
        // An absurd entry count runs into the end of the bytes.
        let mut bad = b.clone();
        bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_code_object(&bad, "gfx1151").is_err());
        // An absurd section header offset too.
        let mut bad = e.clone();
        bad[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_code_object(&bad, "gfx90a").is_err());
    }

    #[test]
    fn wavefront_sizes_by_family() {
        for (arch, w) in [
            ("gfx90a", Some(64)),
            ("gfx942", Some(64)),
            ("gfx906", Some(64)),
            ("gfx1030", Some(32)),
            ("gfx1100", Some(32)),
            ("gfx1151", Some(32)),
            ("gfx1201", Some(32)),
            ("sm_90", None),
            ("gfx", None),
        ] {
            assert_eq!(wavefront_size(arch), w, "{arch}");
        }
    }

    /// The check that CI relies on: every code object this build embeds
    /// holds every kernel the HIP backend loads, none uses scratch memory,
    /// and each is built for its arch's wavefront size. Prints the
    /// per-arch figures (BENCHMARKS.md, "HIP kernel resources") with
    /// `--nocapture`.
    #[cfg(feature = "hip")]
    #[test]
    fn embedded_code_objects_have_every_kernel_no_scratch_and_the_right_wavefront() {
        use crate::device::kernels::{Kernel, HIP_CODE_OBJECTS};
        let expected: Vec<&str> = Kernel::all().iter().map(|k| k.symbol()).collect();
        let mut problems = Vec::new();
        println!("| arch | kernel | VGPRs | SGPRs | SGPR spills (to VGPR lanes) | scratch B | LDS B | max block | wave |");
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for (arch, bytes) in HIP_CODE_OBJECTS {
            let info = match read_code_object(bytes, arch) {
                Ok(i) => i,
                Err(e) => {
                    problems.push(format!("{arch}: {e}"));
                    continue;
                }
            };
            if Some(info.code_object_version) != super::super::build_info::code_object_version() {
                problems.push(format!(
                    "{arch}: code object v{}, build.rs pinned {:?}",
                    info.code_object_version,
                    super::super::build_info::code_object_version()
                ));
            }
            for k in &info.kernels {
                println!(
                    "| {arch} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    k.name,
                    k.vgpr_count,
                    k.sgpr_count,
                    k.sgpr_spill_count,
                    k.private_segment_fixed_size,
                    k.group_segment_fixed_size,
                    k.max_flat_workgroup_size,
                    k.wavefront_size
                );
            }
            problems.extend(check_kernels(arch, &info, &expected));
        }
        assert!(
            !HIP_CODE_OBJECTS.is_empty(),
            "a hip build embeds code objects"
        );
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
