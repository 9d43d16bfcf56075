//! Bounds-checked little-endian cursor over the bytes of a GGUF file.
//!
//! Every read checks the remaining length first, so a truncated or corrupt file yields a
//! [`ModelError::BadGguf`] naming the file and the byte offset, never a panic.

use std::path::Path;

use crate::ModelError;

/// A position in a byte slice; reads advance it.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], path: &'a Path) -> Self {
        Self {
            bytes,
            pos: 0,
            path,
        }
    }

    /// Current byte offset from the start of the file.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current position.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// A [`ModelError::BadGguf`] for this file.
    pub(crate) fn err(&self, msg: impl Into<String>) -> ModelError {
        ModelError::BadGguf {
            path: self.path.to_path_buf(),
            msg: msg.into(),
        }
    }

    /// Take `n` bytes; `what` names the field in the error when the file ends first.
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes at offset {} but only {} remain",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, ModelError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn i8(&mut self, what: &str) -> Result<i8, ModelError> {
        Ok(i8::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, ModelError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i16(&mut self, what: &str) -> Result<i16, ModelError> {
        Ok(i16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i32(&mut self, what: &str) -> Result<i32, ModelError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i64(&mut self, what: &str) -> Result<i64, ModelError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn f32(&mut self, what: &str) -> Result<f32, ModelError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn f64(&mut self, what: &str) -> Result<f64, ModelError> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF `bool`: one byte, 0 or 1 (anything else is an error).
    pub(crate) fn bool(&mut self, what: &str) -> Result<bool, ModelError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(format!("{what}: bool byte is {b}, expected 0 or 1"))),
        }
    }

    /// A u64 used as a length or count, checked to fit in `usize`.
    pub(crate) fn len(&mut self, what: &str) -> Result<usize, ModelError> {
        let n = self.u64(what)?;
        usize::try_from(n).map_err(|_| self.err(format!("{what} {n} does not fit in memory")))
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8 (no terminator).
    /// The length is checked against the bytes left before anything is allocated.
    pub(crate) fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > self.remaining() as u64 {
            return Err(self.err(format!(
                "{what}: string length {n} at offset {at} runs past the end of the file ({} bytes left)",
                self.remaining()
            )));
        }
        let bytes = self.take(n as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.err(format!("{what}: string at offset {at} is not UTF-8: {e}")))
    }
}
