//! The state of one series' diagnosis, which every rule writes its findings into.

use super::config::DiagnosisConfig;
use super::finding::{Evidence, Finding, Severity};
use crate::kpi::SeriesKpis;

/// One series being diagnosed and the findings so far: the rule modules ([`super::rules`],
/// [`super::disagg`]) each add their rules to it as methods.
pub(super) struct Diagnoser<'a> {
    /// The series' KPIs.
    pub(super) s: &'a SeriesKpis,
    /// The thresholds.
    pub(super) c: &'a DiagnosisConfig,
    /// Findings in the order the rules spoke.
    pub(super) out: Vec<Finding>,
}

impl Diagnoser<'_> {
    /// Adds a finding about the series being diagnosed.
    pub(super) fn push(
        &mut self,
        rule_id: &'static str,
        severity: Severity,
        title: String,
        evidence: Vec<Evidence>,
        recommendation: String,
    ) {
        self.out.push(Finding {
            rule_id,
            severity,
            service: self.s.service.clone(),
            model: self.s.model.clone(),
            operation: self.s.operation.clone(),
            title,
            evidence,
            recommendation,
        });
    }
}
