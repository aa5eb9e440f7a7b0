//! The assembler's own tables in the memory limit. A batch's reservation covers its spans (and
//! a prepared trace's its footprint, queue slot and index entry included); what the assembler
//! allocates around them is held in the limiter as fixed memory, measured after every batch it
//! takes, poll, early close and flush (the pipeline calls [`TraceAssembler::hold_tables`]), so
//! that a table's growth is held before the next batch is admitted: the map of
//! traces in flight as spans at its capacity, each such trace's spare span slots (a vector
//! grown by doubling: a 17-span trace has room for 32) and extra holds (a running sum, kept as
//! traces change; also for traces closed early until the poll hands them out), the age and
//! grace queues, the prepared queue's slots no prepared trace
//! counts, the late and early buffers, and the trace index (all of it: sized at start for
//! `max_traces_in_flight` ids, 4 MiB at the defaults, it only grows). About once a second the
//! tables far larger than their contents (after a burst) are shrunk, so that the memory goes
//! back rather than stays held.

use std::mem::size_of;
use std::time::{Duration, Instant};

use infertrace_analysis::trace::{Span, TraceId};

use super::{CompletedTrace, PendingTrace, PreparedSlot, TraceAssembler};
use crate::limiter::FixedMemory;

/// How often sparse tables are looked for and shrunk.
pub(super) const SHRINK_INTERVAL: Duration = Duration::from_secs(1);

/// A table holding less than this fraction of its capacity is shrunk (once a second).
const SHRINK_BELOW_DIVISOR: usize = 4;

impl TraceAssembler {
    /// Holds the tables' memory in `memory` from now on (see the module docs).
    pub fn hold_tables_in(&mut self, memory: FixedMemory) {
        self.table_memory = Some(memory);
        self.tables_shrunk_at = None;
    }

    /// Shrinks sparse tables when [`SHRINK_INTERVAL`] has passed since the last time (or at
    /// the first call); the caller then holds what is left ([`hold_tables`](Self::hold_tables)).
    pub fn shrink_tables_when_due(&mut self, now: Instant) {
        let due = self.table_memory.is_some()
            && self
                .tables_shrunk_at
                .is_none_or(|at| now.saturating_duration_since(at) >= SHRINK_INTERVAL);
        if due {
            self.shrink_sparse_tables();
            self.tables_shrunk_at = Some(now);
        }
    }

    /// Measures the tables (a few reads: no trace is visited) and holds their bytes, when they
    /// are held anywhere. Returns the bytes held.
    pub(crate) fn hold_tables(&mut self) -> usize {
        let bytes = self.table_bytes();
        match &mut self.table_memory {
            Some(memory) => {
                if memory.bytes() != bytes {
                    memory.set(bytes);
                }
                bytes
            }
            None => 0,
        }
    }

    /// Bytes of the tables, beyond what the batches' reservations cover.
    pub fn table_bytes(&self) -> usize {
        // hashbrown keeps 8 buckets for 7 entries of capacity, and a control byte per bucket.
        let map = self.traces.capacity() * 8 / 7 * (size_of::<(TraceId, PendingTrace)>() + 1);
        let queues = (self.by_age.capacity() + self.by_grace.capacity())
            * size_of::<(TraceId, Instant)>()
            + self.prepared.capacity().saturating_sub(self.prepared_live)
                * size_of::<PreparedSlot>();
        let buffers = (self.late.capacity() - self.late.len()) * size_of::<Span>()
            + self.early.capacity() * size_of::<CompletedTrace>();
        map + self.slack + self.early_slack + queues + buffers + self.index.table_bytes()
    }

    fn shrink_sparse_tables(&mut self) {
        let sparse = |len: usize, capacity: usize| len < capacity / SHRINK_BELOW_DIVISOR;
        if sparse(self.traces.len(), self.traces.capacity()) {
            self.traces.shrink_to(self.traces.len() * 2);
        }
        for queue in [&mut self.by_age, &mut self.by_grace] {
            if sparse(queue.len(), queue.capacity()) {
                queue.shrink_to(queue.len() * 2);
            }
        }
        if sparse(self.prepared.len(), self.prepared.capacity()) {
            self.prepared.shrink_to(self.prepared.len() * 2);
        }
        if sparse(self.late.len(), self.late.capacity()) {
            self.late.shrink_to(self.late.len() * 2);
        }
        if sparse(self.early.len(), self.early.capacity()) {
            self.early.shrink_to(self.early.len() * 2);
        }
    }
}
