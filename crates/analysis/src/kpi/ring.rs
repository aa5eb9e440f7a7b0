//! [`Ring`]: one window length's time slots of one series.
//!
//! Slot `i` covers `[i·slot, (i + 1)·slot)` of Unix time and lives at position `i mod slots`; a
//! position is reused (reset) when a newer slot index lands on it, so nothing is ever moved
//! and expired data costs nothing until overwritten.

use sketches_ddsketch::Config;

use super::accumulator::Accumulator;
use super::config::SloConfig;
use crate::record::RequestRecord;

/// One window length's ring geometry.
#[derive(Clone, Copy, Debug)]
pub(super) struct RingSpec {
    /// Window length.
    pub window_nanos: u64,
    /// Slot length.
    pub slot_nanos: u64,
    /// Slots in the ring.
    pub slots: u64,
}

/// A slot: its absolute index (`time / slot_nanos`) and what it accumulated.
#[derive(Clone)]
pub(super) struct Slot {
    /// Absolute slot index.
    pub index: u64,
    /// What the slot accumulated.
    pub acc: Accumulator,
    /// Finest ring only: whether the slot was already rolled up into the coarser rings (see
    /// [`super::KpiWindows`]); always `false` elsewhere.
    pub rolled: bool,
}

/// One window length's slots of one series.
#[derive(Clone, Default)]
pub(super) struct Ring {
    slots: Vec<Option<Box<Slot>>>,
    /// Newest slot index written.
    newest: Option<u64>,
}

impl Ring {
    pub(super) fn add(
        &mut self,
        spec: &RingSpec,
        now: u64,
        config: &Config,
        slo: &SloConfig,
        r: &RequestRecord,
    ) -> bool {
        let index = now / spec.slot_nanos;
        if let Some(newest) = self.newest
            && index.saturating_add(spec.slots) <= newest
        {
            return true; // older than the whole window: treat as handed on
        }
        if self.slots.is_empty() {
            self.slots.resize_with(spec.slots as usize, || None);
        }
        let pos = (index % spec.slots) as usize;
        let slot = self.slots[pos].get_or_insert_with(|| {
            Box::new(Slot {
                index,
                acc: Accumulator::default(),
                rolled: false,
            })
        });
        if slot.index != index {
            slot.index = index;
            slot.acc = Accumulator::default();
            slot.rolled = false;
        }
        slot.acc.add(config, slo, r);
        let rolled = slot.rolled;
        if let Some(newest) = self.newest
            && newest < index
        {
            // The previous slot is complete: give back its spare capacity.
            if let Some(prev) = &mut self.slots[(newest % spec.slots) as usize]
                && prev.index == newest
            {
                prev.acc.shrink();
            }
        }
        self.newest = Some(self.newest.map_or(index, |n| n.max(index)));
        rolled
    }

    /// The newest slot index written.
    pub(super) fn newest(&self) -> Option<u64> {
        self.newest
    }

    /// The slots not yet rolled up (finest ring only).
    pub(super) fn unrolled(&self) -> impl Iterator<Item = &Slot> {
        self.slots
            .iter()
            .flatten()
            .map(|s| &**s)
            .filter(|s| !s.rolled)
    }

    /// Marks every slot older than `before` rolled up, handing each to `roll` first, and gives
    /// back its spare capacity (a complete slot: its distributions turn sparse again).
    pub(super) fn roll_up(&mut self, before: u64, mut roll: impl FnMut(u64, &Accumulator)) {
        for slot in self.slots.iter_mut().flatten() {
            if !slot.rolled && slot.index < before {
                roll(slot.index, &slot.acc);
                slot.rolled = true;
                slot.acc.shrink();
            }
        }
    }

    /// Merges a whole accumulator into slot `index` (history restored from a store); ignored
    /// when that slot is older than the ring's window.
    /// Returns whether the slot it landed in was already rolled up (or it landed nowhere).
    pub(super) fn absorb(&mut self, spec: &RingSpec, index: u64, acc: &Accumulator) -> bool {
        let Some(slot) = self.restored_slot(spec, index, false) else {
            return true;
        };
        slot.acc.merge(acc);
        slot.rolled
    }

    /// Merges restored history into slot `index` as a slot already rolled up, so that it is never
    /// handed on (to coarser rings or a tap) a second time; ignored when that slot is older than
    /// the ring's window, or holds live records not yet rolled up (restore before recording).
    /// Returns whether it landed.
    pub(super) fn absorb_settled(
        &mut self,
        spec: &RingSpec,
        index: u64,
        acc: &Accumulator,
    ) -> bool {
        match self.restored_slot(spec, index, true) {
            Some(slot) if slot.rolled => {
                slot.acc.merge(acc);
                true
            }
            _ => false,
        }
    }

    /// Merges the slots of `from` (same geometry) still inside its window into this ring, as
    /// restored history: `settled` for a finest ring whose slots `from` has already rolled up
    /// and handed on (see [`Self::absorb_settled`]).
    pub(super) fn merge_from(&mut self, spec: &RingSpec, from: &Ring, settled: bool) {
        let Some(newest) = from.newest else {
            return;
        };
        for slot in from.live(newest, spec.slots) {
            if settled {
                self.absorb_settled(spec, slot.index, &slot.acc);
            } else {
                self.absorb(spec, slot.index, &slot.acc);
            }
        }
    }

    /// Slot `index` for restored history, made (empty, `rolled` as given) if the ring held
    /// another index there; `None` when `index` is older than the ring's window.
    fn restored_slot(&mut self, spec: &RingSpec, index: u64, rolled: bool) -> Option<&mut Slot> {
        if let Some(newest) = self.newest
            && index.saturating_add(spec.slots) <= newest
        {
            return None;
        }
        if self.slots.is_empty() {
            self.slots.resize_with(spec.slots as usize, || None);
        }
        self.newest = Some(self.newest.map_or(index, |n| n.max(index)));
        let pos = (index % spec.slots) as usize;
        let slot = self.slots[pos].get_or_insert_with(|| {
            Box::new(Slot {
                index,
                acc: Accumulator::default(),
                rolled,
            })
        });
        if slot.index != index {
            slot.index = index;
            slot.acc = Accumulator::default();
            slot.rolled = rolled;
        }
        Some(slot)
    }

    /// Bytes held: the ring itself, its slot table and every slot's heap.
    pub(super) fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.slots.len() * std::mem::size_of::<Option<Box<Slot>>>()
            + self
                .slots
                .iter()
                .flatten()
                .map(|s| std::mem::size_of::<Slot>() + s.acc.heap_bytes())
                .sum::<usize>()
    }

    /// The slots with index in `(current − n, current]`.
    pub(super) fn live(&self, current: u64, n: u64) -> impl Iterator<Item = &Slot> {
        self.slots
            .iter()
            .flatten()
            .map(|s| &**s)
            .filter(move |s| s.index <= current && s.index.saturating_add(n) > current)
    }
}
