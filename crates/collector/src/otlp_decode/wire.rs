//! The protobuf wire format as the decoders read it: wire types, and a reader of fields over a
//! byte slice that skips what it is not asked for (groups within prost's recursion limit).

use super::decoded::DecodeError;

pub(super) const VARINT: u8 = 0;
pub(super) const FIXED64: u8 = 1;
pub(super) const LEN: u8 = 2;
pub(super) const START_GROUP: u8 = 3;
pub(super) const END_GROUP: u8 = 4;
pub(super) const FIXED32: u8 = 5;

/// Nesting limit for skipped groups (prost's recursion limit).
const MAX_GROUP_DEPTH: u32 = 100;

/// A cursor over one protobuf message.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    #[cold]
    fn error(&self, what: &'static str) -> DecodeError {
        DecodeError::Protobuf {
            offset: self.pos,
            what,
        }
    }

    /// A varint; the one- and two-byte cases (keys, most lengths) stay inline.
    #[inline(always)]
    pub(super) fn varint(&mut self) -> Result<u64, DecodeError> {
        match self.buf.get(self.pos..self.pos + 2) {
            Some(&[b0, _]) if b0 < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b0))
            }
            Some(&[b0, b1]) if b1 < 0x80 => {
                self.pos += 2;
                Ok(u64::from(b0 & 0x7f) | (u64::from(b1) << 7))
            }
            _ => self.varint_slow(),
        }
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(self.error("truncated varint"));
            };
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(self.error("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(self.error("varint longer than 10 bytes"))
    }

    /// The next field's number and wire type, or `None` at the end of the message.
    #[inline(always)]
    pub(super) fn key(&mut self) -> Result<Option<(u32, u8)>, DecodeError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let wire = (key & 7) as u8;
        let field = key >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(self.error("invalid field number"));
        }
        if wire > FIXED32 {
            return Err(self.error("invalid wire type"));
        }
        Ok(Some((field as u32, wire)))
    }

    #[inline]
    pub(super) fn len_field(&mut self, wire: u8) -> Result<&'a [u8], DecodeError> {
        if wire != LEN {
            return Err(self.error("expected a length-delimited field"));
        }
        self.bytes()
    }

    #[inline]
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.varint()?).unwrap_or(usize::MAX);
        self.advance(len, "length past the end of the message")
    }

    #[inline]
    pub(super) fn varint_field(&mut self, wire: u8) -> Result<u64, DecodeError> {
        if wire != VARINT {
            return Err(self.error("expected a varint field"));
        }
        self.varint()
    }

    #[inline]
    pub(super) fn fixed64_field(&mut self, wire: u8) -> Result<u64, DecodeError> {
        if wire != FIXED64 {
            return Err(self.error("expected a fixed64 field"));
        }
        let bytes = self.take(8)?;
        let mut arr = [0u8; 8];
        arr.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(arr))
    }

    #[inline]
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        self.advance(n, "truncated fixed-width field")
    }

    /// The next `n` bytes, or the error `what` when the message ends before them.
    #[inline]
    fn advance(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or_else(|| self.error(what))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// Skips the value of a field of any wire type, groups included.
    #[inline]
    pub(super) fn skip(&mut self, field: u32, wire: u8) -> Result<(), DecodeError> {
        self.skip_at_depth(field, wire, 0)
    }

    fn skip_at_depth(&mut self, field: u32, wire: u8, depth: u32) -> Result<(), DecodeError> {
        // As prost: any field inside 100 groups is past the limit, not only a group.
        if depth >= MAX_GROUP_DEPTH {
            return Err(self.error("groups nested too deep"));
        }
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.bytes().map(drop),
            FIXED32 => self.take(4).map(drop),
            START_GROUP => loop {
                let Some((inner, inner_wire)) = self.key()? else {
                    return Err(self.error("unterminated group"));
                };
                if inner_wire == END_GROUP {
                    if inner != field {
                        return Err(self.error("mismatched end group"));
                    }
                    return Ok(());
                }
                self.skip_at_depth(inner, inner_wire, depth + 1)?;
            },
            _ => Err(self.error("unexpected end group")),
        }
    }
}
