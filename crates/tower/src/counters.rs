//! The GPU and host counters behind the phase spans' window statistics.
//!
//! With the `gpu` feature these are `infertrace-gpu`'s [`GpuTelemetry`](infertrace_gpu::GpuTelemetry)
//! and [`infertrace_gpu::RequestEnergy`]. Without it they are uninhabited
//! stand-ins with the same methods: an `Option` of one is always `None`, so the layer's code reads
//! the same either way, the compiler drops the dead branches, and the spans carry no `gpu.*`,
//! `host.*` or `process.*` attribute.

#[cfg(feature = "gpu")]
pub(crate) use infertrace_gpu::{GpuTelemetry as Counters, RequestEnergy};

#[cfg(not(feature = "gpu"))]
pub(crate) use off::{Counters, RequestEnergy};

#[cfg(not(feature = "gpu"))]
mod off {
    use std::time::Instant;

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::Meter;

    /// No counters can exist without the `gpu` feature: there is no value of this type.
    #[derive(Clone, Debug)]
    pub(crate) enum Counters {}

    impl Counters {
        pub(crate) fn begin_request(&self) -> Option<RequestEnergy> {
            match *self {}
        }

        pub(crate) fn phase_attributes(
            &self,
            _start: Instant,
            _end: Instant,
            _request: Option<&RequestEnergy>,
            _out: &mut Vec<KeyValue>,
        ) {
            match *self {}
        }

        pub(crate) fn register_metrics(&self, _meter: &Meter) {
            match *self {}
        }
    }

    /// No energy attribution without the `gpu` feature: there is no value of this type.
    #[derive(Clone, Debug)]
    pub(crate) enum RequestEnergy {}

    impl RequestEnergy {
        pub(crate) fn tokens(&self, _n: u64) {
            match *self {}
        }

        pub(crate) fn end(&self) {
            match *self {}
        }
    }
}
