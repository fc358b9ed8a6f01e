//! The GGUF container read and checked: header, metadata, tensor table and
//! where each tensor's bytes lie. Every count and length is checked against
//! the bytes left in the file before anything is allocated, so a hostile
//! header costs at most the file's own size in memory.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use super::types::TensorType;

/// GGUF value types (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type; strings and arrays have none.
    fn size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    pub fn is_integer(self) -> bool {
        use ValueType::*;
        matches!(self, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
    }
}

/// One metadata value. Numbers are kept as i128/f64 with their GGUF type;
/// arrays keep their elements when they are numbers and few (per-layer
/// values), otherwise only their type and length.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(ValueType, i128),
    Float(ValueType, f64),
    Bool(bool),
    Str(String),
    Array { elem: ValueType, len: u64, ints: Option<Vec<i128>> },
}

impl Value {
    pub fn type_of(&self) -> ValueType {
        match self {
            Value::Int(t, _) | Value::Float(t, _) => *t,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::String,
            Value::Array { .. } => ValueType::Array,
        }
    }

    pub fn as_int(&self) -> Option<i128> {
        match self {
            Value::Int(_, v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

/// A tensor as the file's table describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub kind: TensorType,
    /// From the start of the data section.
    pub offset: u64,
    pub bytes: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A GGUF file's header and tables, checked.
#[derive(Debug, Clone)]
pub struct GgufFile {
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where tensor data starts.
    pub data_offset: u64,
    pub file_size: u64,
    /// Which bytes the vocabulary can spell on their own, as
    /// `<0xNN>` tokens or as one-byte tokens (SentencePiece falls back to
    /// them for text it cannot split; llama.cpp throws, and so aborts, when
    /// one is missing).
    pub byte_tokens: [bool; 256],
}

impl GgufFile {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Why a file is not a GGUF file ggml can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufError(pub String);

impl std::fmt::Display for GgufError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(why: impl Into<String>) -> Result<T, GgufError> {
    Err(GgufError(why.into()))
}

/// ggml's limits (gguf.cpp, ggml.h).
const MAX_STRING: u64 = 1 << 30;
const MAX_ARRAY: u64 = 1 << 30;
const MAX_DIMS: u32 = 4;
const MAX_NAME: usize = 64;
/// Numeric arrays up to this length keep their values (per-layer settings).
const KEEP_INTS: u64 = 4096;
/// The vocabulary's key: its strings are checked one by one (llama.cpp
/// asserts that no two are equal).
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";

/// Bytes read from a source of known length; every length is checked
/// against what is left before it is read or allocated.
struct Cursor<R> {
    r: R,
    pos: u64,
    len: u64,
}

impl<R: Read + Seek> Cursor<R> {
    fn left(&self) -> u64 {
        self.len - self.pos
    }

    fn need(&self, n: u64, what: &dyn Fn() -> String) -> Result<(), GgufError> {
        if n > self.left() {
            return err(format!("{} needs {n} bytes at offset {} but the file ends at {} (truncated?)", what(), self.pos, self.len));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        self.need(N as u64, what)?;
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|e| GgufError(format!("{}: cannot read at offset {} ({e})", what(), self.pos)))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn skip(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<(), GgufError> {
        self.need(n, what)?;
        self.r.seek_relative(n as i64).map_err(|e| GgufError(format!("{}: cannot seek ({e})", what())))?;
        self.pos += n;
        Ok(())
    }

    /// A length-prefixed string; `keep` false skips its bytes.
    fn string(&mut self, keep: bool, what: &dyn Fn() -> String) -> Result<Option<Vec<u8>>, GgufError> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return err(format!("{}: a string of {n} bytes (ggml reads at most {MAX_STRING})", what()));
        }
        if n > self.left() {
            return err(format!("{}: a string of {n} bytes at offset {} but the file ends at {}", what(), self.pos, self.len));
        }
        if !keep {
            self.skip(n, what)?;
            return Ok(None);
        }
        let mut b = vec![0u8; n as usize];
        self.r.read_exact(&mut b).map_err(|e| GgufError(format!("{}: cannot read ({e})", what())))?;
        self.pos += n;
        Ok(Some(b))
    }

    fn scalar(&mut self, t: ValueType, what: &dyn Fn() -> String) -> Result<Value, GgufError> {
        use ValueType::*;
        Ok(match t {
            U8 => Value::Int(t, self.bytes::<1>(what)?[0] as i128),
            I8 => Value::Int(t, self.bytes::<1>(what)?[0] as i8 as i128),
            U16 => Value::Int(t, u16::from_le_bytes(self.bytes(what)?) as i128),
            I16 => Value::Int(t, i16::from_le_bytes(self.bytes(what)?) as i128),
            U32 => Value::Int(t, u32::from_le_bytes(self.bytes(what)?) as i128),
            I32 => Value::Int(t, i32::from_le_bytes(self.bytes(what)?) as i128),
            U64 => Value::Int(t, u64::from_le_bytes(self.bytes(what)?) as i128),
            I64 => Value::Int(t, i64::from_le_bytes(self.bytes(what)?) as i128),
            F32 => Value::Float(t, f32::from_le_bytes(self.bytes(what)?) as f64),
            F64 => Value::Float(t, f64::from_le_bytes(self.bytes(what)?)),
            Bool => Value::Bool(self.bytes::<1>(what)?[0] != 0),
            String => {
                let b = self.string(true, what)?.unwrap_or_default();
                Value::Str(std::string::String::from_utf8_lossy(&b).into_owned())
            }
            Array => return err(format!("{}: an array inside an array (GGUF has none)", what())),
        })
    }

    fn value(&mut self, key: &str, t: ValueType, bytes: &mut [bool; 256]) -> Result<Value, GgufError> {
        let what = || format!("metadata '{key}'");
        if t != ValueType::Array {
            return self.scalar(t, &what);
        }
        let elem_id = self.u32(&what)?;
        let elem = ValueType::from_id(elem_id).ok_or_else(|| GgufError(format!("metadata '{key}': an array of unknown type {elem_id}")))?;
        let len = self.u64(&what)?;
        if len > MAX_ARRAY {
            return err(format!("metadata '{key}': an array of {len} elements (ggml reads at most {MAX_ARRAY})"));
        }
        match elem {
            ValueType::Array => err(format!("metadata '{key}': an array of arrays (GGUF has none)")),
            ValueType::String => {
                // Each element takes at least its 8-byte length.
                self.need(len.saturating_mul(8), &|| format!("metadata '{key}' ({len} strings)"))?;
                if key == TOKENS_KEY {
                    self.tokens(len, bytes)?;
                } else {
                    for i in 0..len {
                        self.string(false, &|| format!("metadata '{key}'[{i}]"))?;
                    }
                }
                Ok(Value::Array { elem, len, ints: None })
            }
            _ => {
                let size = elem.size().unwrap_or(1);
                self.need(len.saturating_mul(size), &|| format!("metadata '{key}' ({len} × {})", elem.name()))?;
                if elem.is_integer() && len <= KEEP_INTS {
                    let mut ints = Vec::with_capacity(len as usize);
                    for _ in 0..len {
                        ints.push(self.scalar(elem, &what)?.as_int().unwrap_or_default());
                    }
                    Ok(Value::Array { elem, len, ints: Some(ints) })
                } else {
                    self.skip(len * size, &what)?;
                    Ok(Value::Array { elem, len, ints: None })
                }
            }
        }
    }

    /// The vocabulary: llama.cpp maps each string to its id and asserts
    /// (aborting the process) when two are equal; an empty one is named
    /// `[EMPTY_<id>]` first, as llama.cpp does.
    fn tokens(&mut self, len: u64, bytes: &mut [bool; 256]) -> Result<(), GgufError> {
        let mut seen: HashSet<Vec<u8>> = HashSet::with_capacity(len.min(1 << 20) as usize);
        for i in 0..len {
            let what = || format!("token {i} of '{TOKENS_KEY}'");
            let mut word = self.string(true, &what)?.unwrap_or_default();
            if word.is_empty() {
                word = format!("[EMPTY_{i}]").into_bytes();
            }
            match word.as_slice() {
                [b] => bytes[*b as usize] = true,
                [b'<', b'0', b'x', h, l, b'>'] => {
                    let hex = |c: u8| (c as char).to_digit(16).filter(|_| c.is_ascii_digit() || c.is_ascii_uppercase());
                    if let (Some(h), Some(l)) = (hex(*h), hex(*l)) {
                        bytes[(h * 16 + l) as usize] = true;
                    }
                }
                _ => {}
            }
            if !seen.insert(word) {
                return err(format!(
                    "'{TOKENS_KEY}': token {i} is a second copy of an earlier token (a vocabulary maps each text to one id)"
                ));
            }
        }
        Ok(())
    }
}

/// Reads and checks the GGUF file at `path`: what ggml's reader checks
/// (magic, version, counts, string and array lengths, types, names, shapes,
/// offsets), and that every tensor's bytes lie inside the file.
pub fn read_gguf(path: &Path) -> Result<GgufFile, GgufError> {
    let file = File::open(path).map_err(|e| GgufError(format!("cannot open it ({e})")))?;
    let len = file.metadata().map_err(|e| GgufError(format!("cannot read its size ({e})")))?.len();
    read_from(BufReader::with_capacity(1 << 20, file), len)
}

/// The same over any seekable source of `len` bytes.
pub fn read_from<R: Read + Seek>(r: R, len: u64) -> Result<GgufFile, GgufError> {
    let mut c = Cursor { r, pos: 0, len };
    let header = || "the header".to_string();
    let magic = c.bytes::<4>(&header).map_err(|_| GgufError("not a GGUF file (shorter than its magic number)".into()))?;
    if &magic != b"GGUF" {
        return err("not a GGUF file");
    }
    let version = c.u32(&header)?;
    match version {
        2 | 3 => {}
        1 => return err("GGUF version 1 (no longer read by llama.cpp; convert the model again)"),
        v => return err(format!("GGUF version {v} (llama.cpp reads versions 2 and 3)")),
    }
    let n_tensors = c.u64(&header)?;
    let n_kv = c.u64(&header)?;
    // Smallest entries: a key (8-byte length, 1 byte) with its type and a
    // 1-byte value; a tensor (name, 1 dimension, type, offset).
    if n_kv > c.left() / 14 {
        return err(format!("the header counts {n_kv} metadata entries; a file of {len} bytes cannot hold them"));
    }
    if n_tensors > c.left() / 29 {
        return err(format!("the header counts {n_tensors} tensors; a file of {len} bytes cannot hold them"));
    }

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut byte_tokens = [false; 256];
    let mut keys = HashSet::new();
    for i in 0..n_kv {
        let what = || format!("metadata entry {i}");
        let key = c.string(true, &what)?.unwrap_or_default();
        if key.is_empty() {
            return err(format!("metadata entry {i} has an empty key"));
        }
        let key = String::from_utf8_lossy(&key).into_owned();
        if !keys.insert(key.clone()) {
            return err(format!("metadata '{key}' appears twice"));
        }
        let type_id = c.u32(&what)?;
        let t = ValueType::from_id(type_id).ok_or_else(|| GgufError(format!("metadata '{key}' has unknown type {type_id}")))?;
        let value = c.value(&key, t, &mut byte_tokens)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment").map(|(_, v)| v) {
        None => 32,
        Some(Value::Int(ValueType::U32, a)) if *a > 0 && (*a as u64).is_power_of_two() => *a as u64,
        Some(Value::Int(ValueType::U32, a)) => return err(format!("general.alignment is {a}, not a power of two")),
        Some(v) => return err(format!("general.alignment is a {}, not a u32", v.type_of().name())),
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let what = || format!("tensor {i}");
        let name = c.string(true, &what)?.unwrap_or_default();
        let name = String::from_utf8_lossy(&name).into_owned();
        if name.len() >= MAX_NAME {
            return err(format!("tensor {i}'s name is {} bytes long (ggml's limit is {})", name.len(), MAX_NAME - 1));
        }
        if !names.insert(name.clone()) {
            return err(format!("tensor '{name}' appears twice"));
        }
        let twhat = || format!("tensor '{name}'");
        let n_dims = c.u32(&twhat)?;
        if n_dims > MAX_DIMS {
            return err(format!("tensor '{name}' has {n_dims} dimensions (ggml has at most {MAX_DIMS})"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let ne = c.u64(&twhat)?;
            if ne == 0 || ne > i64::MAX as u64 {
                return err(format!("tensor '{name}' has {} elements in dimension {d}", ne as i64));
            }
            dims.push(ne);
        }
        let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d).filter(|&n| n <= i64::MAX as u64));
        let Some(elements) = elements else {
            return err(format!("tensor '{name}' has a shape {dims:?} whose element count overflows"));
        };
        let type_id = c.u32(&twhat)?;
        let kind =
            TensorType::from_id(type_id).ok_or_else(|| GgufError(format!("tensor '{name}' has type {type_id}, which ggml cannot load")))?;
        if dims.first().copied().unwrap_or(1) % kind.block_size != 0 {
            return err(format!(
                "tensor '{name}' of type {} has rows of {} elements, not a multiple of its block of {}",
                kind.name,
                dims.first().copied().unwrap_or(1),
                kind.block_size
            ));
        }
        let bytes = kind.bytes(elements).ok_or_else(|| GgufError(format!("tensor '{name}' is too large to address")))?;
        let offset = c.u64(&twhat)?;
        tensors.push(TensorInfo { name, dims, kind, offset, bytes });
    }

    let data_offset = c.pos.div_ceil(alignment) * alignment;
    let data_len = len.saturating_sub(data_offset);
    // ggml expects the tensors back to back in table order, each padded to
    // the alignment, and reads each at the offset it computes.
    let mut expected = 0u64;
    for t in &tensors {
        if t.offset != expected {
            return err(format!("tensor '{}' is at offset {} of the data, where ggml expects {expected}", t.name, t.offset));
        }
        let end = t.offset.checked_add(t.bytes).filter(|&e| e <= data_len);
        let Some(end) = end else {
            return err(format!(
                "tensor '{}' ({} bytes at data offset {}) ends past the end of the file ({} bytes of data): truncated?",
                t.name, t.bytes, t.offset, data_len
            ));
        };
        expected = end.div_ceil(alignment).saturating_mul(alignment);
    }
    Ok(GgufFile { version, metadata, tensors, alignment, data_offset, file_size: len, byte_tokens })
}
