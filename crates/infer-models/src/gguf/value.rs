//! GGUF metadata values (`gguf_type` in ggml's `gguf.h`) and their parsing.

use super::reader::Cursor;
use crate::ModelError;

/// Deepest array nesting accepted (arrays of arrays of …); real files use at most 2.
const MAX_DEPTH: usize = 8;

/// Preallocate at most this many elements of an array; longer ones grow as they are read, so
/// a corrupt count can never cause a large allocation before the data is actually there.
const MAX_PREALLOC: usize = 1 << 16;

/// One metadata value. Scalars keep their GGUF type (variant = GGUF type: `U8` is type 0 …
/// `F64` type 12; strings are UTF-8); arrays are typed ([`GgufArray`]).
#[derive(Clone, Debug, PartialEq)]
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
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A GGUF array: all elements share one type. Nested arrays hold their own typed arrays.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// GGUF value type ids (ggml `enum gguf_type`).
mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl GgufValue {
    /// ggml `enum gguf_type` id of this value (what the writer stores before it).
    pub(super) fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => ty::U8,
            GgufValue::I8(_) => ty::I8,
            GgufValue::U16(_) => ty::U16,
            GgufValue::I16(_) => ty::I16,
            GgufValue::U32(_) => ty::U32,
            GgufValue::I32(_) => ty::I32,
            GgufValue::F32(_) => ty::F32,
            GgufValue::Bool(_) => ty::BOOL,
            GgufValue::String(_) => ty::STRING,
            GgufValue::Array(_) => ty::ARRAY,
            GgufValue::U64(_) => ty::U64,
            GgufValue::I64(_) => ty::I64,
            GgufValue::F64(_) => ty::F64,
        }
    }
}

impl GgufArray {
    /// ggml `enum gguf_type` id of the array's elements.
    pub(super) fn type_id(&self) -> u32 {
        match self {
            GgufArray::U8(_) => ty::U8,
            GgufArray::I8(_) => ty::I8,
            GgufArray::U16(_) => ty::U16,
            GgufArray::I16(_) => ty::I16,
            GgufArray::U32(_) => ty::U32,
            GgufArray::I32(_) => ty::I32,
            GgufArray::F32(_) => ty::F32,
            GgufArray::Bool(_) => ty::BOOL,
            GgufArray::String(_) => ty::STRING,
            GgufArray::Array(_) => ty::ARRAY,
            GgufArray::U64(_) => ty::U64,
            GgufArray::I64(_) => ty::I64,
            GgufArray::F64(_) => ty::F64,
        }
    }
}

/// Smallest number of bytes one element of type `t` occupies in the file (for count checks).
fn min_size(t: u32) -> Option<usize> {
    Some(match t {
        ty::U8 | ty::I8 | ty::BOOL => 1,
        ty::U16 | ty::I16 => 2,
        ty::U32 | ty::I32 | ty::F32 => 4,
        ty::U64 | ty::I64 | ty::F64 | ty::STRING => 8,
        ty::ARRAY => 12,
        _ => return None,
    })
}

impl GgufValue {
    /// Read one value of GGUF type `t` (already read) for metadata key `key`.
    pub(crate) fn read(c: &mut Cursor<'_>, t: u32, key: &str) -> Result<Self, ModelError> {
        Self::read_depth(c, t, key, 0)
    }

    fn read_depth(c: &mut Cursor<'_>, t: u32, key: &str, depth: usize) -> Result<Self, ModelError> {
        Ok(match t {
            ty::U8 => Self::U8(c.u8(key)?),
            ty::I8 => Self::I8(c.i8(key)?),
            ty::U16 => Self::U16(c.u16(key)?),
            ty::I16 => Self::I16(c.i16(key)?),
            ty::U32 => Self::U32(c.u32(key)?),
            ty::I32 => Self::I32(c.i32(key)?),
            ty::F32 => Self::F32(c.f32(key)?),
            ty::BOOL => Self::Bool(c.bool(key)?),
            ty::STRING => Self::String(c.string(key)?),
            ty::ARRAY => Self::Array(GgufArray::read(c, key, depth)?),
            ty::U64 => Self::U64(c.u64(key)?),
            ty::I64 => Self::I64(c.i64(key)?),
            ty::F64 => Self::F64(c.f64(key)?),
            _ => return Err(c.err(format!("metadata '{key}': unknown value type {t}"))),
        })
    }

    /// The GGUF type name (`u32`, `string`, `array`, …), for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::F32(_) => "f32",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F64(_) => "f64",
        }
    }

    /// Any integer type whose value is non-negative, widened to u64; `None` otherwise.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, widened to i64 (`None` for a u64 above `i64::MAX` and non-integers).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => i64::try_from(v).ok(),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => None,
        }
    }

    /// An `f32` or `f64` value as f64 (integers are not floats here: `None`).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A `bool` value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A `string` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// An `array` value.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Read `n` elements with `f`, growing the vector as data arrives (see [`MAX_PREALLOC`]).
fn read_vec<T>(
    c: &mut Cursor<'_>,
    n: usize,
    mut f: impl FnMut(&mut Cursor<'_>) -> Result<T, ModelError>,
) -> Result<Vec<T>, ModelError> {
    let mut v = Vec::with_capacity(n.min(MAX_PREALLOC));
    for _ in 0..n {
        v.push(f(c)?);
    }
    Ok(v)
}

impl GgufArray {
    /// Read an array body (element type u32, count u64, elements) for key `key`.
    fn read(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Self, ModelError> {
        if depth >= MAX_DEPTH {
            return Err(c.err(format!(
                "metadata '{key}': arrays nested deeper than {MAX_DEPTH}"
            )));
        }
        let t = c.u32(key)?;
        let at = c.pos();
        let n = c.len(key)?;
        let Some(min) = min_size(t) else {
            return Err(c.err(format!("metadata '{key}': unknown array element type {t}")));
        };
        if n > c.remaining() / min {
            return Err(c.err(format!(
                "metadata '{key}': array count {n} at offset {at} cannot fit in the {} bytes left (truncated or corrupt)",
                c.remaining()
            )));
        }
        Ok(match t {
            ty::U8 => Self::U8(read_vec(c, n, |c| c.u8(key))?),
            ty::I8 => Self::I8(read_vec(c, n, |c| c.i8(key))?),
            ty::U16 => Self::U16(read_vec(c, n, |c| c.u16(key))?),
            ty::I16 => Self::I16(read_vec(c, n, |c| c.i16(key))?),
            ty::U32 => Self::U32(read_vec(c, n, |c| c.u32(key))?),
            ty::I32 => Self::I32(read_vec(c, n, |c| c.i32(key))?),
            ty::F32 => Self::F32(read_vec(c, n, |c| c.f32(key))?),
            ty::BOOL => Self::Bool(read_vec(c, n, |c| c.bool(key))?),
            ty::STRING => Self::String(read_vec(c, n, |c| c.string(key))?),
            ty::ARRAY => Self::Array(read_vec(c, n, |c| Self::read(c, key, depth + 1))?),
            ty::U64 => Self::U64(read_vec(c, n, |c| c.u64(key))?),
            ty::I64 => Self::I64(read_vec(c, n, |c| c.i64(key))?),
            _ => Self::F64(read_vec(c, n, |c| c.f64(key))?),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::I8(v) => v.len(),
            Self::U16(v) => v.len(),
            Self::I16(v) => v.len(),
            Self::U32(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::String(v) => v.len(),
            Self::Array(v) => v.len(),
            Self::U64(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::F64(v) => v.len(),
        }
    }

    /// True for an array of no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements as i64 when the array has an integer type (each element must fit in i64).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn w<T: Copy + TryInto<i64>>(v: &[T]) -> Option<Vec<i64>> {
            v.iter().map(|&x| x.try_into().ok()).collect()
        }
        match self {
            Self::U8(v) => w(v),
            Self::I8(v) => w(v),
            Self::U16(v) => w(v),
            Self::I16(v) => w(v),
            Self::U32(v) => w(v),
            Self::I32(v) => w(v),
            Self::U64(v) => w(v),
            Self::I64(v) => w(v),
            _ => None,
        }
    }
}
