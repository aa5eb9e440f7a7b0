//! The compact binary encoding of what the collector's history store keeps from these crates'
//! aggregates — KPI [`Accumulator`](crate::kpi::Accumulator)s (per-minute rollups) and the
//! critical-path windows' slots — so that they can be merged back later: integers as LEB128
//! varints, floats as little-endian bytes, sorted bucket keys as a zigzag first key followed by
//! varint deltas, texts as a varint length and UTF-8. Each format's layout is documented where
//! it is written.

use std::fmt;

/// Why stored bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// What was wrong.
    pub reason: &'static str,
    /// Byte offset where it was found.
    pub offset: usize,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid stored data at byte {}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for DecodeError {}

/// Appends encoded values to a byte vector.
pub(crate) struct Writer<'a>(pub(crate) &'a mut Vec<u8>);

impl Writer<'_> {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }

    pub(crate) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    pub(crate) fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A text: its length, then its UTF-8 bytes.
    pub(crate) fn text(&mut self, s: &str) {
        self.varint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    /// Sorted keys: the first zigzag-encoded, the rest as deltas from the previous one.
    pub(crate) fn keys<V>(&mut self, items: &[(i32, V)], mut value: impl FnMut(&mut Self, &V)) {
        self.varint(items.len() as u64);
        let mut prev: Option<i64> = None;
        for (k, v) in items {
            let k = i64::from(*k);
            match prev {
                None => self.varint(((k << 1) ^ (k >> 63)) as u64),
                Some(p) => self.varint((k - p) as u64),
            }
            prev = Some(k);
            value(self, v);
        }
    }
}

/// Reads encoded values from a byte slice.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn error(&self, reason: &'static str) -> DecodeError {
        DecodeError {
            reason,
            offset: self.pos,
        }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or_else(|| self.error("unexpected end"))?;
        self.pos += 1;
        Ok(b)
    }

    pub(crate) fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.error("varint too long"))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.varint()?).map_err(|_| self.error("count out of range"))
    }

    pub(crate) fn f64(&mut self) -> Result<f64, DecodeError> {
        let end = self.pos + 8;
        let b = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| self.error("unexpected end"))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        self.pos = end;
        Ok(f64::from_le_bytes(a))
    }

    pub(crate) fn f32(&mut self) -> Result<f32, DecodeError> {
        let end = self.pos + 4;
        let b = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| self.error("unexpected end"))?;
        let mut a = [0u8; 4];
        a.copy_from_slice(b);
        self.pos = end;
        Ok(f32::from_le_bytes(a))
    }

    /// A length, refused when larger than the bytes left could hold (`min_item` bytes each).
    pub(crate) fn len(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.varint()?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_item.max(1) as u64) > left {
            return Err(self.error("length larger than the data"));
        }
        Ok(n as usize)
    }

    /// Reads what [`Writer::text`] wrote.
    pub(crate) fn text(&mut self) -> Result<&'a str, DecodeError> {
        let n = self.len(1)?;
        let bytes: &'a [u8] = self.bytes;
        let b = bytes
            .get(self.pos..self.pos + n)
            .ok_or_else(|| self.error("unexpected end"))?;
        self.pos += n;
        std::str::from_utf8(b).map_err(|_| self.error("text is not UTF-8"))
    }

    /// Reads what [`Writer::keys`] wrote; keys must be strictly increasing.
    pub(crate) fn keys<V>(
        &mut self,
        min_item: usize,
        mut value: impl FnMut(&mut Self) -> Result<V, DecodeError>,
    ) -> Result<Vec<(i32, V)>, DecodeError> {
        let n = self.len(min_item)?;
        let mut out = Vec::with_capacity(n);
        let mut prev: Option<i64> = None;
        for _ in 0..n {
            let raw = self.varint()?;
            let k = match prev {
                None => ((raw >> 1) as i64) ^ -((raw & 1) as i64),
                Some(p) => {
                    if raw == 0 {
                        return Err(self.error("bucket keys not increasing"));
                    }
                    p.checked_add_unsigned(raw)
                        .ok_or_else(|| self.error("bucket key out of range"))?
                }
            };
            let key = i32::try_from(k).map_err(|_| self.error("bucket key out of range"))?;
            prev = Some(k);
            out.push((key, value(self)?));
        }
        Ok(out)
    }

    /// Fails unless every byte was read.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(self.error("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let mut buf = Vec::new();
        let mut w = Writer(&mut buf);
        for v in [0, 1, 127, 128, 300, u64::MAX] {
            w.varint(v);
        }
        w.f64(-1.5);
        w.keys(
            &[(i32::MIN, 1u32), (-5, 2), (0, 3), (i32::MAX, 4)],
            |w, v| w.varint(u64::from(*v)),
        );
        let mut r = Reader::new(&buf);
        for v in [0, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(r.varint().unwrap(), v);
        }
        assert_eq!(r.f64().unwrap(), -1.5);
        let keys = r.keys(2, |r| r.u32()).unwrap();
        assert_eq!(keys, vec![(i32::MIN, 1), (-5, 2), (0, 3), (i32::MAX, 4)]);
        r.finish().unwrap();
    }

    #[test]
    fn truncated_and_oversized_input_is_refused() {
        let mut r = Reader::new(&[0x80]);
        assert_eq!(r.varint().unwrap_err().reason, "unexpected end");
        let mut r = Reader::new(&[0xff; 11]);
        assert_eq!(r.varint().unwrap_err().reason, "varint too long");
        let mut r = Reader::new(&[100, 1, 2]);
        assert!(r.len(1).is_err());
        // Keys that do not increase.
        let mut r = Reader::new(&[2, 2, 0]);
        assert_eq!(
            r.keys(1, |_| Ok(())).unwrap_err().reason,
            "bucket keys not increasing"
        );
        let r = Reader::new(&[1]);
        assert_eq!(r.finish().unwrap_err().reason, "trailing bytes");
    }
}
