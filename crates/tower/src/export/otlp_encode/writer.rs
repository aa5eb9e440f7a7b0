//! A minimal protobuf writer for OTLP: varints, tags, length-delimited and fixed-width fields,
//! and the `KeyValue` / `AnyValue` messages of attributes, appended to a `Vec<u8>`.
//!
//! Fields are written in field-number order and proto3 defaults are left out where prost
//! leaves them out, so a message comes out byte for byte as prost encodes the same message.
//! Lengths of nested messages are computed first ([`any_value_len`]), never patched.

use opentelemetry::{Array, StringValue, Value};

/// Wire type of varint fields.
pub(crate) const VARINT: u32 = 0;
/// Wire type of 64-bit fields (`fixed64`, `double`).
pub(crate) const FIXED64: u32 = 1;
/// Wire type of length-delimited fields (strings, bytes, messages).
pub(crate) const LEN: u32 = 2;
/// Wire type of 32-bit fields (`fixed32`).
pub(crate) const FIXED32: u32 = 5;

/// Bytes the varint `v` takes.
#[inline]
pub(crate) fn varint_len(v: u64) -> usize {
    // Tags and most lengths take one or two bytes: no division for them (this is hot).
    if v < 0x80 {
        1
    } else if v < 0x4000 {
        2
    } else {
        // 1 byte per started group of 7 bits.
        (64 - v.leading_zeros() as usize).div_ceil(7)
    }
}

#[inline]
pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Writes the varint `v` into `out`, which is exactly [`varint_len`]`(v)` bytes long.
#[inline]
pub(crate) fn write_varint(out: &mut [u8], mut v: u64) {
    let last = out.len().saturating_sub(1);
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = if i == last { v as u8 } else { (v as u8) | 0x80 };
        v >>= 7;
    }
}

#[inline]
pub(crate) fn put_tag(buf: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(buf, u64::from((field << 3) | wire));
}

/// Bytes of a tag for `field`.
#[inline]
fn tag_len(field: u32) -> usize {
    varint_len(u64::from(field << 3))
}

/// Bytes a length-delimited `field` of `len` content bytes takes.
#[inline]
pub(crate) fn len_field_len(field: u32, len: usize) -> usize {
    tag_len(field) + varint_len(len as u64) + len
}

/// The tag and length of a length-delimited `field`; its `len` content bytes follow.
#[inline]
pub(crate) fn put_len_header(buf: &mut Vec<u8>, field: u32, len: usize) {
    put_tag(buf, field, LEN);
    put_varint(buf, len as u64);
}

/// A length-delimited field (string, bytes, or an encoded message).
#[inline]
pub(crate) fn put_bytes(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_len_header(buf, field, bytes.len());
    buf.extend_from_slice(bytes);
}

/// A string or bytes field, left out when empty (proto3 default).
#[inline]
pub(crate) fn put_bytes_unless_empty(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    if !bytes.is_empty() {
        put_bytes(buf, field, bytes);
    }
}

/// A varint field, left out when 0.
#[inline]
pub(crate) fn put_varint_unless_zero(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_tag(buf, field, VARINT);
        put_varint(buf, v);
    }
}

/// A `fixed64` field, left out when 0.
#[inline]
pub(crate) fn put_fixed64_unless_zero(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_tag(buf, field, FIXED64);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

/// A `fixed32` field, left out when 0.
#[inline]
pub(crate) fn put_fixed32_unless_zero(buf: &mut Vec<u8>, field: u32, v: u32) {
    if v != 0 {
        put_tag(buf, field, FIXED32);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

// `AnyValue`: oneof { string_value = 1; bool_value = 2; int_value = 3; double_value = 4;
// array_value = 5 (ArrayValue { repeated AnyValue values = 1 }) }. A oneof field is written
// even when it holds its type's default.

/// Content length of the `AnyValue` message holding `value`.
pub(crate) fn any_value_len(value: &Value) -> usize {
    match value {
        Value::Bool(_) => 2,
        Value::I64(v) => 1 + varint_len(*v as u64),
        Value::F64(_) => 9,
        Value::String(s) => len_field_len(1, s.as_str().len()),
        Value::Array(array) => len_field_len(5, array_len(array)),
        // `Value` is non-exhaustive; opentelemetry-proto cannot convert other kinds either.
        _ => 0,
    }
}

/// Content length of the `ArrayValue` message holding `array`.
fn array_len(array: &Array) -> usize {
    fn sum<T>(values: &[T], one: impl Fn(&T) -> usize) -> usize {
        values.iter().map(|v| len_field_len(1, one(v))).sum()
    }
    match array {
        Array::Bool(v) => sum(v, |_| 2),
        Array::I64(v) => sum(v, |n| 1 + varint_len(*n as u64)),
        Array::F64(v) => sum(v, |_| 9),
        Array::String(v) => sum(v, |s: &StringValue| len_field_len(1, s.as_str().len())),
        _ => 0,
    }
}

/// The content of the `AnyValue` message holding `value` ([`any_value_len`] bytes).
pub(crate) fn put_any_value(buf: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(b) => {
            put_tag(buf, 2, VARINT);
            buf.push(u8::from(*b));
        }
        Value::I64(v) => {
            put_tag(buf, 3, VARINT);
            put_varint(buf, *v as u64);
        }
        Value::F64(v) => {
            put_tag(buf, 4, FIXED64);
            buf.extend_from_slice(&v.to_le_bytes());
        }
        Value::String(s) => put_bytes(buf, 1, s.as_str().as_bytes()),
        Value::Array(array) => {
            put_len_header(buf, 5, array_len(array));
            put_array(buf, array);
        }
        _ => {}
    }
}

fn put_array(buf: &mut Vec<u8>, array: &Array) {
    fn each<T>(buf: &mut Vec<u8>, values: &[T], value: impl Fn(&T) -> Value) {
        for v in values {
            let v = value(v);
            put_len_header(buf, 1, any_value_len(&v));
            put_any_value(buf, &v);
        }
    }
    match array {
        Array::Bool(v) => each(buf, v, |b| Value::Bool(*b)),
        Array::I64(v) => each(buf, v, |n| Value::I64(*n)),
        Array::F64(v) => each(buf, v, |x| Value::F64(*x)),
        Array::String(v) => {
            for s in v {
                put_len_header(buf, 1, len_field_len(1, s.as_str().len()));
                put_bytes(buf, 1, s.as_str().as_bytes());
            }
        }
        _ => {}
    }
}

/// A `KeyValue` message (`key = 1`, `value = 2`, always present) as repeated `field`.
#[inline]
pub(crate) fn put_key_value(buf: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    let value_len = any_value_len(value);
    let len = len_field_len(1, key.len()) + len_field_len(2, value_len);
    // One capacity check for the whole attribute (the writes below then never grow `buf`).
    buf.reserve(len_field_len(field, len));
    put_len_header(buf, field, len);
    put_bytes(buf, 1, key.as_bytes());
    put_len_header(buf, 2, value_len);
    match value {
        // The usual case, without a second match on the kind.
        Value::String(s) => put_bytes(buf, 1, s.as_str().as_bytes()),
        _ => put_any_value(buf, value),
    }
}

/// A `KeyValue` message as repeated `field`, its `AnyValue` content (`value_len` bytes) written
/// by `value`: the typed attribute writers below, which need no `Value`.
#[inline]
fn put_attribute(
    buf: &mut Vec<u8>,
    field: u32,
    key: &str,
    value_len: usize,
    value: impl FnOnce(&mut Vec<u8>),
) {
    let len = len_field_len(1, key.len()) + len_field_len(2, value_len);
    buf.reserve(len_field_len(field, len));
    put_len_header(buf, field, len);
    put_bytes(buf, 1, key.as_bytes());
    put_len_header(buf, 2, value_len);
    value(buf);
}

/// [`put_key_value`] of a string value.
#[inline]
pub(crate) fn put_str_attribute(buf: &mut Vec<u8>, field: u32, key: &str, value: &str) {
    put_attribute(buf, field, key, len_field_len(1, value.len()), |buf| {
        put_bytes(buf, 1, value.as_bytes());
    });
}

/// [`put_key_value`] of an array holding the one string `value`.
#[inline]
pub(crate) fn put_str_list_attribute(buf: &mut Vec<u8>, field: u32, key: &str, value: &str) {
    let element = len_field_len(1, value.len());
    let array = len_field_len(1, element);
    put_attribute(buf, field, key, len_field_len(5, array), |buf| {
        put_len_header(buf, 5, array);
        put_len_header(buf, 1, element);
        put_bytes(buf, 1, value.as_bytes());
    });
}

/// [`put_key_value`] of an integer value.
#[inline]
pub(crate) fn put_i64_attribute(buf: &mut Vec<u8>, field: u32, key: &str, value: i64) {
    put_attribute(buf, field, key, 1 + varint_len(value as u64), |buf| {
        put_tag(buf, 3, VARINT);
        put_varint(buf, value as u64);
    });
}

/// [`put_key_value`] of a floating-point value.
#[inline]
pub(crate) fn put_f64_attribute(buf: &mut Vec<u8>, field: u32, key: &str, value: f64) {
    put_attribute(buf, field, key, 9, |buf| {
        put_tag(buf, 4, FIXED64);
        buf.extend_from_slice(&value.to_le_bytes());
    });
}

/// [`put_key_value`] of a boolean value.
#[inline]
pub(crate) fn put_bool_attribute(buf: &mut Vec<u8>, field: u32, key: &str, value: bool) {
    put_attribute(buf, field, key, 2, |buf| {
        put_tag(buf, 2, VARINT);
        buf.push(u8::from(value));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_take_the_bytes_prost_gives_them() {
        for v in [
            0_u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "{v}");
            assert_eq!(buf.len(), prost::encoding::encoded_len_varint(v), "{v}");
            let mut slice = &buf[..];
            assert_eq!(prost::encoding::decode_varint(&mut slice).ok(), Some(v));
            let mut room = vec![0xff; varint_len(v)];
            write_varint(&mut room, v);
            assert_eq!(room, buf, "{v}");
        }
    }

    #[test]
    fn any_values_are_what_prost_encodes() {
        use opentelemetry_proto::tonic::common::v1::AnyValue;
        use prost::Message as _;
        let values = [
            Value::Bool(false),
            Value::Bool(true),
            Value::I64(0),
            Value::I64(-1),
            Value::I64(i64::MAX),
            Value::F64(0.0),
            Value::F64(-2.5),
            Value::from(""),
            Value::from("größe ✓ 模型"),
            Value::from("x".repeat(10_000)),
            Value::Array(Array::String(vec!["stop".into(), "".into()])),
            Value::Array(Array::I64(vec![0, -5, 300])),
            Value::Array(Array::F64(vec![0.5])),
            Value::Array(Array::Bool(vec![true, false])),
            Value::Array(Array::String(Vec::new())),
        ];
        for value in values {
            let mut ours = Vec::new();
            put_any_value(&mut ours, &value);
            assert_eq!(ours.len(), any_value_len(&value), "{value:?}");
            let theirs = AnyValue::from(value.clone()).encode_to_vec();
            assert_eq!(ours, theirs, "{value:?}");
        }
    }

    #[test]
    fn typed_attributes_are_what_prost_encodes_for_the_same_key_value() {
        use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
        use prost::Message as _;
        // Field 9 (a span's attributes) around prost's `KeyValue`, as the encoder writes it.
        let theirs = |key: &str, value: Value| {
            let kv = KeyValue {
                key: key.to_owned(),
                value: Some(AnyValue::from(value)),
                ..KeyValue::default()
            }
            .encode_to_vec();
            let mut out = Vec::new();
            put_bytes(&mut out, 9, &kv);
            out
        };
        let long = "模".repeat(100);
        for s in ["", "chat", long.as_str()] {
            let mut ours = Vec::new();
            put_str_attribute(&mut ours, 9, "gen_ai.operation.name", s);
            assert_eq!(
                ours,
                theirs("gen_ai.operation.name", Value::from(s.to_owned()))
            );
            let mut ours = Vec::new();
            put_str_list_attribute(&mut ours, 9, "k", s);
            let list = Value::Array(Array::String(vec![StringValue::from(s.to_owned())]));
            assert_eq!(ours, theirs("k", list));
        }
        for n in [0_i64, 1, 127, 128, -1, i64::MIN, i64::MAX] {
            let mut ours = Vec::new();
            put_i64_attribute(&mut ours, 9, "infer.stream.chunks", n);
            assert_eq!(ours, theirs("infer.stream.chunks", Value::I64(n)), "{n}");
        }
        for x in [0.0_f64, -0.0, 1e-9, f64::MAX, f64::NAN] {
            let mut ours = Vec::new();
            put_f64_attribute(&mut ours, 9, "gen_ai.latency.e2e", x);
            assert_eq!(ours, theirs("gen_ai.latency.e2e", Value::F64(x)), "{x}");
        }
        for b in [false, true] {
            let mut ours = Vec::new();
            put_bool_attribute(&mut ours, 9, "gen_ai.request.stream", b);
            assert_eq!(ours, theirs("gen_ai.request.stream", Value::Bool(b)));
        }
    }
}
