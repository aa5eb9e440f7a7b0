//! [`AttributeWriter`]: where the request span's arrival and end attributes are written, one
//! typed call per attribute, so each destination takes the value in the form it needs.
//!
//! [`StartAttributes`](crate::request_facts::StartAttributes) and
//! [`EndAttributes`](crate::end_attributes::EndAttributes) keep their values and say, in one
//! place each, which attributes a span gets and in what order. [`KeyValues`] turns every call
//! into an OpenTelemetry `KeyValue` (spans built as `SpanData` or through a tracer, samplers);
//! the OTLP encoder writes the same calls straight to protobuf, with no `KeyValue` in between.

use std::borrow::Cow;
use std::sync::Arc;

use opentelemetry::{Array, KeyValue, StringValue, Value};

/// A destination of attributes. Keys are the semantic-convention constants.
pub(crate) trait AttributeWriter {
    /// A string attribute held as a `StringValue`.
    fn string(&mut self, key: &'static str, value: &StringValue);
    /// A string attribute that is a `'static` string.
    fn static_str(&mut self, key: &'static str, value: &'static str);
    /// A string attribute held as a `Cow<'static, str>`.
    #[expect(
        clippy::ptr_arg,
        reason = "a clone of the `Cow` stays borrowed when it holds a `'static` string"
    )]
    fn cow(&mut self, key: &'static str, value: &Cow<'static, str>);
    /// A string attribute held as a shared string.
    fn shared(&mut self, key: &'static str, value: &Arc<str>);
    /// A string-array attribute of one element.
    fn shared_list(&mut self, key: &'static str, value: &Arc<str>);
    /// An integer attribute.
    fn i64(&mut self, key: &'static str, value: i64);
    /// A floating-point attribute.
    fn f64(&mut self, key: &'static str, value: f64);
    /// A boolean attribute.
    fn bool(&mut self, key: &'static str, value: bool);
}

/// Every attribute as a `KeyValue`, passed to the closure (the values a tracer's span would
/// get: `'static` strings stay static, shared strings are shared, nothing is copied).
pub(crate) struct KeyValues<F>(pub(crate) F);

impl<F: FnMut(KeyValue)> AttributeWriter for KeyValues<F> {
    #[inline]
    fn string(&mut self, key: &'static str, value: &StringValue) {
        (self.0)(KeyValue::new(key, value.clone()));
    }

    #[inline]
    fn static_str(&mut self, key: &'static str, value: &'static str) {
        (self.0)(KeyValue::new(key, value));
    }

    #[inline]
    fn cow(&mut self, key: &'static str, value: &Cow<'static, str>) {
        (self.0)(KeyValue::new(key, value.clone()));
    }

    #[inline]
    fn shared(&mut self, key: &'static str, value: &Arc<str>) {
        (self.0)(KeyValue::new(key, Arc::clone(value)));
    }

    #[inline]
    fn shared_list(&mut self, key: &'static str, value: &Arc<str>) {
        (self.0)(KeyValue::new(
            key,
            Value::Array(Array::String(vec![StringValue::from(Arc::clone(value))])),
        ));
    }

    #[inline]
    fn i64(&mut self, key: &'static str, value: i64) {
        (self.0)(KeyValue::new(key, value));
    }

    #[inline]
    fn f64(&mut self, key: &'static str, value: f64) {
        (self.0)(KeyValue::new(key, value));
    }

    #[inline]
    fn bool(&mut self, key: &'static str, value: bool) {
        (self.0)(KeyValue::new(key, value));
    }
}
