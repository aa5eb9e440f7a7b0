//! Which labels a series carries: the configured [`Dimension`]s, and the overflow series' label.

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;

/// Label value of every configured dimension of the overflow series.
pub const OVERFLOW_LABEL: &str = "__overflow__";

/// The overflow label the critical-path windows had before they took [`OVERFLOW_LABEL`]
/// (still read in history written then).
pub(crate) const OLD_OVERFLOW_LABEL: &str = "_overflow";

/// Whether `label` names an overflow series or row ([`OVERFLOW_LABEL`] or the old label).
pub(crate) fn is_overflow_label(label: &str) -> bool {
    label == OVERFLOW_LABEL || label == OLD_OVERFLOW_LABEL
}

/// A label series are split by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dimension {
    /// `service.name`.
    Service,
    /// Model.
    Model,
    /// Operation.
    Operation,
}

/// Which of service, model and operation label a series (the configured [`Dimension`]s), looked
/// up once rather than per record; the others are left empty. The KPI windows and the
/// Prometheus exporter label alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Labelling([bool; 3]);

impl Labelling {
    /// The labelling by `dimensions`.
    pub fn new(dimensions: &[Dimension]) -> Self {
        Self(
            [Dimension::Service, Dimension::Model, Dimension::Operation]
                .map(|d| dimensions.contains(&d)),
        )
    }

    /// `value` when `d` labels series, else "".
    pub fn label<'a>(&self, d: Dimension, value: &'a str) -> &'a str {
        let i = match d {
            Dimension::Service => 0,
            Dimension::Model => 1,
            Dimension::Operation => 2,
        };
        if self.0[i] { value } else { "" }
    }

    /// A record's (service, model, operation) labels.
    pub fn labels<'a>(&self, r: &'a RequestRecord) -> (&'a str, &'a str, &'a str) {
        (
            self.label(Dimension::Service, &r.service),
            self.label(Dimension::Model, &r.model),
            self.label(Dimension::Operation, &r.operation),
        )
    }

    /// The labels of the overflow series ([`OVERFLOW_LABEL`] for each labelling dimension).
    pub fn overflow_labels(&self) -> (&'static str, &'static str, &'static str) {
        (
            self.label(Dimension::Service, OVERFLOW_LABEL),
            self.label(Dimension::Model, OVERFLOW_LABEL),
            self.label(Dimension::Operation, OVERFLOW_LABEL),
        )
    }
}
