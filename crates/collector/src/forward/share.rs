//! Each sender's share of the forward queue. The queue is bounded by a number of requests
//! (`forward.queue_size`); when the downstream is slow or down it fills, and every request is
//! then refused until it drains — so one sender sending fast could keep the others' requests
//! out, their KPIs included (a request refused for the queue is not analysed either). Once
//! the queue would be fuller than the soft limit's percentage (`limits.soft_limit_percent`,
//! default 75 %), a sender may add a request only while its requests already waiting hold
//! fewer places than its fair share: the queue's size ÷ the senders with requests waiting
//! (counted as at least 2, so that a sender alone leaves room for the next). The rule, its
//! threshold and its counts ([`SenderCounts`]) are the memory limiter's (see
//! [`crate::limiter`]); senders are told apart the same way (bearer token, else peer address).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::limiter::{Sender, SenderCounts};

/// The places each sender's requests hold in the forward queue.
#[derive(Debug)]
pub(super) struct QueueShares {
    capacity: usize,
    /// The share applies past this percentage of `capacity`.
    threshold_percent: usize,
    /// Requests waiting per sender.
    waiting: Mutex<SenderCounts>,
}

impl QueueShares {
    /// Shares of a queue of `capacity` requests, applied past `threshold_percent` of it.
    pub(super) fn new(capacity: usize, threshold_percent: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity: capacity.max(1),
            threshold_percent,
            waiting: Mutex::default(),
        })
    }

    fn waiting(&self) -> MutexGuard<'_, SenderCounts> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more request of `sender` while `free` places of the queue are left, or
    /// `None` when the queue is nearly full and the sender already holds its share. The place
    /// counts for the sender until the returned slot is dropped.
    pub(super) fn take(self: &Arc<Self>, sender: Sender, free: usize) -> Option<QueueSlot> {
        let mut waiting = self.waiting();
        // As the memory rule: whether the queue would be past the threshold with this one.
        let after = self.capacity.saturating_sub(free) + 1;
        let nearly_full = after * 100 > self.capacity * self.threshold_percent;
        let fair = waiting.fair_share(sender, self.capacity).max(1);
        if nearly_full && waiting.held(sender) >= fair {
            return None;
        }
        waiting.add(sender, 1);
        Some(QueueSlot {
            shares: Arc::clone(self),
            sender,
        })
    }

    /// Requests of `sender` waiting now.
    #[cfg(test)]
    fn held(&self, sender: Sender) -> usize {
        self.waiting().held(sender)
    }
}

/// One request's place in a sender's share; given back when dropped (the request left the
/// queue, or was refused after all).
#[derive(Debug)]
pub(super) struct QueueSlot {
    shares: Arc<QueueShares>,
    sender: Sender,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.shares.waiting().remove(self.sender, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_three_quarters_a_sender_at_its_share_is_refused_and_another_is_not() {
        let shares = QueueShares::new(8, 75);
        let heavy = Sender::Peer([10, 0, 0, 1].into());
        let light = Sender::Peer([10, 0, 0, 2].into());
        // Up to 6 of 8 places nobody is refused: the heavy sender takes six.
        let mut slots: Vec<_> = (0..6)
            .map(|taken| shares.take(heavy, 8 - taken).expect("up to 3/4"))
            .collect();
        assert_eq!(shares.held(heavy), 6);
        // A seventh would pass 3/4 while it holds more than 8 / 2: refused, while a light
        // sender still gets a place.
        assert!(shares.take(heavy, 2).is_none());
        let light_slot = shares.take(light, 2).expect("the light sender's share");
        assert_eq!(shares.held(light), 1);
        // Places come back as requests leave the queue.
        slots.truncate(3);
        assert_eq!(shares.held(heavy), 3);
        assert!(shares.take(heavy, 1).is_some(), "3 < 8 / 2");
        assert!(
            shares.take(heavy, 1).is_some(),
            "the slot above was given back"
        );
        drop((slots, light_slot));
        assert_eq!(shares.waiting().senders(), 0);
    }

    #[test]
    fn a_sender_alone_keeps_a_quarter_free_for_the_next() {
        let shares = QueueShares::new(4, 75);
        let one = Sender::Peer([10, 0, 0, 1].into());
        let slots: Vec<_> = (0..3).filter_map(|t| shares.take(one, 4 - t)).collect();
        assert_eq!(slots.len(), 3, "up to 3 of 4 taken freely");
        assert!(
            shares.take(one, 1).is_none(),
            "the fourth would pass 3/4: 3 ≥ 4 / 2"
        );
    }
}
