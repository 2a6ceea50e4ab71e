//! GGUF reader: header, metadata of every value type, tensor infos, alignment, and
//! memory-mapped tensor data with dequantization to f32.
//!
//! Every bound is checked while parsing: a truncated file, a bad magic, an unsupported
//! version or tensor type, or a tensor that points past the end is an `Error::Gguf` that
//! names the problem (and the tensor or key involved), never a panic.

use std::collections::BTreeMap;
use std::path::Path;

use memmap2::Mmap;

use super::quant::{self, GgmlType};
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: usize = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8: UTF-8 text.
    String(String),
    /// Type 9: values of one type.
    Array(Vec<MetaValue>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl MetaValue {
    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer value that fits a u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits a u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_u64().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer value that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float value, or any integer that fits an i64, as f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The elements of an array value.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// Where a tensor lies in the file and what it holds. `dims` is in ggml order: `dims[0]`
/// is the innermost (contiguous) dimension, so a `[rows, cols]` matrix has dims `[cols, rows]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`, ...).
    pub name: String,
    /// Its dimensions, innermost first.
    pub dims: Vec<usize>,
    /// Its element (or block) type.
    pub ty: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: usize,
    /// Bytes of its data.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Values in the tensor: the product of `dims`.
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// The shape in row-major order (outermost first), as HF and PyTorch write it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed header and metadata, tensors read on demand.
pub struct GgufFile {
    storage: Storage,
    /// The format version (2 or 3).
    pub version: u32,
    /// Every metadata entry, by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Every tensor, in file order; each lies within the file.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of tensor data in bytes (`general.alignment`, else 32); a power of two.
    pub alignment: usize,
    data_start: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the mapping is read-only; a model file being rewritten underneath a
        // running server is outside what we promise, as for every mmap-based loader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::parse(Storage::Mapped(mmap))
            .map_err(|e| Error::Gguf(format!("{}: {}", path.display(), strip(e))))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self> {
        let bytes = storage.bytes();
        let mut r = Reader { bytes, pos: 0 };
        let magic = r.take(4, "magic")?;
        if magic != MAGIC {
            return Err(Error::Gguf(format!(
                "bad magic {magic:02x?}: not a GGUF file (expected \"GGUF\")"
            )));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::Gguf(format!(
                "GGUF version {version} is not supported (2 and 3 are)"
            )));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let ty = r.u32(&format!("type of metadata {key:?}"))?;
            let value = r.value(ty, &key, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => {
                    return Err(Error::Gguf(format!(
                        "general.alignment {v:?} is not a power of two"
                    )))
                }
            },
        };
        let mut tensors = Vec::new();
        for i in 0..n_tensors {
            tensors.push(r.tensor_info(i)?);
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let file_len = bytes.len();
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(Error::Gguf(format!(
                    "tensor {:?} offset {} is not aligned to {alignment}",
                    t.name, t.offset
                )));
            }
            let end = data_start
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.n_bytes));
            if end.is_none_or(|e| e > file_len) {
                return Err(Error::Gguf(format!(
                    "tensor {:?} ({} bytes at data offset {}) points past the end of the file ({file_len} bytes)",
                    t.name, t.n_bytes, t.offset
                )));
            }
        }
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            alignment,
            data_start,
            storage,
        })
    }

    /// Metadata value `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// A required metadata value, or an error naming the missing key.
    pub fn require(&self, key: &str) -> Result<&MetaValue> {
        self.get(key)
            .ok_or_else(|| Error::Gguf(format!("missing metadata key {key:?}")))
    }

    /// The tensor named `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor, as stored.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = self.data_start + info.offset;
        &self.storage.bytes()[start..start + info.n_bytes]
    }

    /// A tensor dequantized to f32, with its row-major shape.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| Error::Gguf(format!("missing tensor {name:?}")))?;
        let data = quant::dequantize(info.ty, self.tensor_bytes(info), info.n_elements())
            .map_err(|e| Error::Gguf(format!("tensor {name:?}: {}", strip(e))))?;
        Ok((info.shape(), data))
    }
}

fn strip(e: Error) -> String {
    match e {
        Error::Gguf(m) => m,
        other => other.to_string(),
    }
}

/// A bounds-checked little-endian cursor over the file.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

const MAX_DEPTH: usize = 4;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(Error::Gguf(format!(
                "truncated file: {what} needs {n} bytes at offset {} but the file has {}",
                self.pos,
                self.bytes.len()
            ))),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("length checked"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must be satisfiable by the bytes left (each item takes >= `min_size`).
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_size as u64) > left {
            return Err(Error::Gguf(format!(
                "truncated file: {what} is {n} but only {left} bytes remain"
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(&format!("length of {what}"), 1)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::Gguf(format!("{what} is not valid UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue> {
        let what = format!("value of {key:?}");
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(&what)?[0]),
            1 => MetaValue::I8(self.array::<1>(&what)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => match self.array::<1>(&what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(Error::Gguf(format!(
                        "{what}: bool byte {b} is neither 0 nor 1"
                    )))
                }
            },
            8 => MetaValue::String(self.string(&what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(Error::Gguf(format!("{what}: arrays nested too deeply")));
                }
                let elem_ty = self.u32(&format!("element type of {key:?}"))?;
                let n = self.count(&format!("length of array {key:?}"), 1)?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(&what)?)),
            other => {
                return Err(Error::Gguf(format!(
                    "metadata {key:?} has unknown value type {other}"
                )))
            }
        })
    }

    fn tensor_info(&mut self, i: u64) -> Result<TensorInfo> {
        let name = self.string(&format!("name of tensor #{i}"))?;
        let n_dims = self.u32(&format!("dimension count of tensor {name:?}"))?;
        if n_dims == 0 || n_dims > 4 {
            return Err(Error::Gguf(format!(
                "tensor {name:?} has {n_dims} dimensions (1 to 4 allowed)"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = self.u64(&format!("dimensions of tensor {name:?}"))?;
            dims.push(
                usize::try_from(d).map_err(|_| {
                    Error::Gguf(format!("tensor {name:?} dimension {d} is too large"))
                })?,
            );
        }
        let type_id = self.u32(&format!("type of tensor {name:?}"))?;
        let ty = GgmlType::from_id(type_id)
            .map_err(|e| Error::Gguf(format!("tensor {name:?}: {}", strip(e))))?;
        let offset = self.u64(&format!("offset of tensor {name:?}"))?;
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::Gguf(format!("tensor {name:?} dimensions {dims:?} overflow")))?;
        if dims[0] % ty.block_len() != 0 {
            return Err(Error::Gguf(format!(
                "tensor {name:?}: row length {} is not a multiple of the {ty:?} block ({})",
                dims[0],
                ty.block_len()
            )));
        }
        let n_bytes = ty
            .bytes_for(n)
            .ok_or_else(|| Error::Gguf(format!("tensor {name:?} size overflows")))?;
        let offset = usize::try_from(offset)
            .map_err(|_| Error::Gguf(format!("tensor {name:?} offset too large")))?;
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_bytes,
        })
    }
}
