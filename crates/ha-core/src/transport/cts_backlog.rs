//! Clear-to-sends a receive connection could not post yet because its path's send queue had
//! no room: each waits here, in order, until completions free room (`RecvComm::pump`).
//!
//! Why room runs out: an unsignaled clear-to-send leaves the send queue only when a later
//! signaled one completes, i.e. when the peer's acknowledgement is read. With eager sends a
//! receive completes without its clear-to-send having been read, so a receiver whose
//! acknowledgements are late (on `sock`: the ack reader thread kept off a busy CPU for a few
//! milliseconds) posted one clear-to-send per message into a full queue, and the post's
//! `QueueFull` failed the path — after a failover, the connection (busy-host small-message
//! drills: 1 in 3 to 1 in 10 lost their connection, bench/results/2026-11-28-sock-delack-cap.md).
//! Waiting is flow control: the sender's sends that need these clear-to-sends wait with them.
//! A switch empties the backlog and re-posts every open receive's clear-to-send directly on
//! the new path (never through the backlog: the Switch message that follows must not overtake
//! them).

use ha_proto::data::layout::CTS_SLOT_WORDS;
use std::collections::VecDeque;

/// One clear-to-send not posted yet (the arguments of `RecvComm::post_cts`).
#[derive(Clone, Debug)]
pub(super) struct Deferred {
    pub path: usize,
    pub seq: u64,
    pub slot: usize,
    pub fifo_word: usize,
    pub cts: [u64; CTS_SLOT_WORDS],
}

/// The waiting clear-to-sends, oldest first.
#[derive(Debug, Default)]
pub(super) struct CtsBacklog {
    q: VecDeque<Deferred>,
    /// Clear-to-sends that had to wait, since the connection opened.
    pub waited: u64,
}

impl CtsBacklog {
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Queue `d` behind the others. An older one of the same FIFO slot is dropped: its
    /// receive completed (eagerly) before it went out, and `d` supersedes it in the sender's
    /// FIFO anyway.
    pub fn push(&mut self, d: Deferred) {
        self.q.retain(|o| o.slot != d.slot);
        self.q.push_back(d);
        self.waited += 1;
    }

    /// Put back the oldest one (its post found no room after all).
    pub fn push_front(&mut self, d: Deferred) {
        self.q.push_front(d);
    }

    pub fn pop_front(&mut self) -> Option<Deferred> {
        self.q.pop_front()
    }

    pub fn front(&self) -> Option<&Deferred> {
        self.q.front()
    }

    /// Forget them all (a switch re-posts every open receive's clear-to-send).
    pub fn clear(&mut self) {
        self.q.clear();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.q.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(seq: u64, slot: usize) -> Deferred {
        Deferred {
            path: 0,
            seq,
            slot,
            fifo_word: slot * CTS_SLOT_WORDS,
            cts: [seq; CTS_SLOT_WORDS],
        }
    }

    #[test]
    fn waiting_clear_to_sends_keep_their_order_and_a_newer_one_replaces_its_slots_older() {
        let mut b = CtsBacklog::default();
        b.push(d(1, 1));
        b.push(d(2, 2));
        b.push(d(65, 1)); // slot 1 again: the receive of seq 1 completed eagerly meanwhile
        assert_eq!(b.len(), 2);
        assert_eq!(b.waited, 3);
        let first = b.pop_front().unwrap();
        assert_eq!((first.seq, first.slot), (2, 2));
        b.push_front(first);
        let order: Vec<u64> = std::iter::from_fn(|| b.pop_front().map(|x| x.seq)).collect();
        assert_eq!(order, vec![2, 65]);
        b.push(d(3, 3));
        b.clear();
        assert!(b.is_empty() && b.front().is_none());
    }
}
