//! GGUF files (llama.cpp's format): header, metadata, tensor directory, memory-mapped data.
//!
//! The parser checks every length and offset against the file size before using it, so a
//! truncated or corrupt file gives [`ModelError::Corrupt`] naming what was wrong, never a
//! panic or an allocation sized by garbage. Tensor data stays in the memory map; the
//! [`dequant`] module turns blocks into f32 rows on request and [`convert`] maps the llama
//! architecture's names, metadata and q/k layout to Hugging Face's.

pub mod convert;
pub mod dequant;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::ModelError;

/// The magic number at the start of every GGUF file ("GGUF" little-endian).
const GGUF_MAGIC: u32 = 0x4655_4747;
/// Data alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml tensor element types siphon knows by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q6K,
}

impl GgmlType {
    /// Maps ggml's type id; unknown and unsupported ids give a message naming the type.
    pub fn from_id(id: u32) -> Result<GgmlType, String> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            14 => GgmlType::Q6K,
            30 => GgmlType::Bf16,
            other => {
                let name = match other {
                    6 => "Q5_0",
                    7 => "Q5_1",
                    9 => "Q8_1",
                    10 => "Q2_K",
                    11 => "Q3_K",
                    13 => "Q5_K",
                    15 => "Q8_K",
                    16..=23 => "an IQ type",
                    24 => "I8",
                    25 => "I16",
                    26 => "I32",
                    27 => "I64",
                    28 => "F64",
                    29 => "IQ1_M",
                    _ => "unknown",
                };
                return Err(format!(
                    "ggml type {other} ({name}); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K"
                ));
            }
        })
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => 32,
            GgmlType::Q4K | GgmlType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4K => 144,
            GgmlType::Q6K => 210,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// llama.cpp's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml dimensions, fastest-varying first (`ne[0]` is a row's length).
    pub dims: Vec<usize>,
    /// Element encoding.
    pub ggml_type: GgmlType,
    /// Byte range of the data within the file.
    pub range: std::ops::Range<usize>,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// The shape in row-major (PyTorch) order: ggml's dimensions reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// An open, validated GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile, ModelError> {
        let file = crate::file::open(path)?;
        // SAFETY: the map is read-only; siphon never writes model files while they are
        // open, and a file truncated under us by another process is outside what any
        // mmap-based loader (safetensors, llama.cpp) can defend against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        Self::parse(path.to_path_buf(), mmap)
    }

    fn parse(path: PathBuf, mmap: Mmap) -> Result<GgufFile, ModelError> {
        let corrupt = |detail: String| ModelError::Corrupt { path: path.clone(), detail };
        let mut r = Reader { buf: &mmap, pos: 0 };
        let magic = r.u32().map_err(&corrupt)?;
        if magic != GGUF_MAGIC {
            return Err(corrupt(format!("not a GGUF file (magic {:02x?}, expected \"GGUF\")", magic.to_le_bytes())));
        }
        let version = r.u32().map_err(&corrupt)?;
        if !(2..=3).contains(&version) {
            return Err(corrupt(format!("GGUF version {version} (supported: 2, 3)")));
        }
        let n_tensors = r.u64().map_err(&corrupt)?;
        let n_kv = r.u64().map_err(&corrupt)?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string().map_err(|e| corrupt(format!("metadata entry {i}: {e}")))?;
            let ty = r.u32().map_err(|e| corrupt(format!("metadata {key:?}: {e}")))?;
            let value = r.value(ty, 0).map_err(|e| corrupt(format!("metadata {key:?}: {e}")))?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::new();
        for i in 0..n_tensors {
            let what = |e: String| corrupt(format!("tensor directory entry {i}: {e}"));
            let name = r.string().map_err(what)?;
            let what = |e: String| corrupt(format!("tensor {name:?}: {e}"));
            let n_dims = r.u32().map_err(what)?;
            if n_dims == 0 || n_dims > 4 {
                return Err(what(format!("{n_dims} dimensions (ggml allows 1 to 4)")));
            }
            let mut dims = Vec::new();
            for _ in 0..n_dims {
                let d = r.u64().map_err(what)?;
                if d == 0 {
                    // An empty weight is no model's; a row of no elements has no blocks.
                    return Err(what(format!("dimension {} is 0", dims.len())));
                }
                dims.push(usize::try_from(d).map_err(|_| what(format!("dimension {d}")))?);
            }
            let ty = r.u32().map_err(what)?;
            let offset = r.u64().map_err(what)?;
            infos.push((name, dims, ty, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => return Err(corrupt(format!("general.alignment {v:?} is not a power of two"))),
            },
        };
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = mmap.len() as u64;
        let mut tensors = Vec::with_capacity(infos.len());
        let mut by_name = BTreeMap::new();
        for (name, dims, ty, offset) in infos {
            let ggml_type = GgmlType::from_id(ty);
            let n: Option<u64> = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
            let ggml_type = match ggml_type {
                Ok(t) => t,
                Err(msg) => {
                    return Err(ModelError::UnsupportedQuant(format!("tensor {name:?}: {msg}")));
                }
            };
            let block = ggml_type.block_size() as u64;
            if !(dims[0] as u64).is_multiple_of(block) {
                return Err(corrupt(format!(
                    "tensor {name:?}: row length {} is not a multiple of the {ggml_type:?} block size {block}",
                    dims[0]
                )));
            }
            let bytes = n
                .and_then(|n| (n / block).checked_mul(ggml_type.block_bytes() as u64))
                .ok_or_else(|| corrupt(format!("tensor {name:?}: dimensions {dims:?} overflow")))?;
            let start = data_start.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(bytes));
            match (start, end) {
                (Some(start), Some(end)) if end <= file_len => {
                    if by_name.insert(name.clone(), tensors.len()).is_some() {
                        return Err(corrupt(format!("tensor {name:?} appears twice")));
                    }
                    tensors.push(GgufTensorInfo { name, dims, ggml_type, range: start as usize..end as usize });
                }
                _ => {
                    return Err(corrupt(format!(
                        "tensor {name:?} needs bytes up to {} but the file has {file_len} (truncated?)",
                        data_start.saturating_add(offset).saturating_add(bytes)
                    )));
                }
            }
        }
        Ok(GgufFile { path, mmap, version, metadata, tensors, by_name })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensor directory in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// A tensor's directory entry by llama.cpp name.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's raw (still quantized) bytes, borrowed from the map.
    pub fn data(&self, info: &GgufTensorInfo) -> &[u8] {
        &self.mmap[info.range.clone()]
    }
}

/// Bounds-checked little-endian reader over the mapped header.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Nested arrays deeper than this are treated as corruption (real files use depth 1).
const MAX_ARRAY_DEPTH: usize = 4;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            format!("needs {n} bytes at offset {} but the file has {} (truncated?)", self.pos, self.buf.len())
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn len(&mut self) -> Result<usize, String> {
        let n = self.u64()?;
        // A length can never exceed what is left of the file; checking here keeps a corrupt
        // count from driving a huge allocation.
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.buf.len() - self.pos)
            .ok_or_else(|| format!("length {n} at offset {} exceeds the file (corrupt?)", self.pos - 8))
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.len()?;
        let at = self.pos;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("string at offset {at} is not UTF-8"))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(self.array::<1>()?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("bool byte {b}")),
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err("arrays nested too deeply".into());
                }
                let elem = self.u32()?;
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown value type {other}")),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
