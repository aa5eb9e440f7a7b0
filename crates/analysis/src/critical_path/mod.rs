//! The critical path of a trace: which span was holding up the analysed span at each instant.
//!
//! The semantics are exactly docs/reference.md#critical-path (Jaeger's algorithm with the Go
//! implementation's walk-back "at or before"):
//!
//! 1. **Tree.** A span's children are the spans whose parent id names it, ordered by start time
//!    (ties: order of arrival). Links never make a child. A CONSUMER child of a PRODUCER span is
//!    not blocking: it is removed with its whole subtree.
//! 2. **Clipping**, top-down, against the parent's already clipped window `[ps, pe]`: a child
//!    starting at or after `ps` is dropped (with its subtree) if it starts at or after `pe`, else
//!    its end is clipped to `pe`; a child starting before `ps` is dropped if it ends at or before
//!    `ps`, else it becomes `[ps, min(end, pe)]`.
//! 3. **Walk back** from the analysed span's end. On entering a span `S` with upper bound `U`,
//!    take the child that ends last at or before `U` (ties: first in child order); `S` owns
//!    `[that child's end, U]`; enter the child with `U` = its end. Back in `S`, `U` becomes the
//!    returned child's start and the next child is the one ending latest **at or before** `U`
//!    (each child is taken at most once). A span with no eligible child left owns `[its start, U]`.
//! 4. Zero-length segments are not emitted, and consecutive pieces owned by the same span are
//!    emitted as one segment; the segments tile `[start, end]` of the analysed span exactly.
//!
//! Two options, both off by default, bend the rules for imperfect clocks and are reported in
//! [`CriticalPath::adjustments`] whenever they change anything:
//! - [`CriticalPathOptions::skew_tolerance`] (CRISP): a child that ends after `U` by at most 1% of
//!   its parent's duration, but starts before `U`, still counts as ending at `U` (its end is cut
//!   to `U`).
//! - [`CriticalPathOptions::shift_remote_children`] (Jaeger's old clock-skew adjuster): a child
//!   from another service that does not fit inside its parent, but is not longer than it, is
//!   moved by `parentStart + (parentDur − childDur)/2 − childStart` (centred in the parent); its
//!   same-service descendants move with it.
//!
//! Cost: building the tree is O(n); each span on the path sorts its own children once, so the
//! whole computation is O(n log n). The walk is iterative (an explicit stack), so a chain
//! 100,000 spans deep does not touch the call stack.

mod attributed;
mod disagg;
mod naming;
mod nested;
mod path;
mod walk;
mod windows;

pub use attributed::{UNATTRIBUTED, attributed_path};
pub use disagg::{HANDOVER, disaggregated_path};
pub use nested::{aggregation_path, windows_paths};

pub use naming::aggregate_name;
pub use path::{Adjustment, CriticalPath, Segment};
pub use walk::{CriticalPathOptions, SKEW_TOLERANCE_DIVISOR, critical_path};
pub use windows::{
    CriticalPathEntry, CriticalPathSummary, CriticalPathTotal, CriticalPathWindows,
    CriticalPathWindowsConfig, OVERFLOW_LABEL, TailTriple,
};
