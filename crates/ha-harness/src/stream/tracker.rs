//! Receiver-side accounting: every completed receive slot is classified (see
//! [`super::message::identify`]) and counted here, so that lost, duplicated, reordered and
//! corrupted messages are told apart:
//! - **duplicated**: an intact message that was already delivered;
//! - **reordered**: an intact message delivered for the first time after a message with a
//!   higher sequence number;
//! - **corrupted**: a slot holding nothing recognisable (its expected message is then not
//!   counted as lost as well);
//! - **lost**: a message below the horizon that never arrived and whose own slot was not
//!   corrupt. The horizon is every message posted when the stream ended cleanly, else
//!   (after an error, when later messages were legitimately still in flight) one past the
//!   highest delivered sequence number.

use super::message::Identity;

/// A growable bit set indexed by sequence number.
#[derive(Debug, Default, Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn get(&self, i: u64) -> bool {
        self.0
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn set(&mut self, i: u64) {
        let w = (i / 64) as usize;
        if w >= self.0.len() {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (i % 64);
    }
}

#[derive(Debug, Default, Clone)]
pub struct Tracker {
    delivered: Bits,
    corrupt_slots: Bits,
    max_seen: Option<u64>,
    /// Intact messages delivered for the first time.
    pub messages: u64,
    /// Their payload bytes.
    pub bytes: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    /// Description of the first problem seen (for the report).
    pub first_problem: Option<String>,
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what the slot posted for message `slot_seq` held; `size` is the size `test`
    /// reported for it.
    pub fn record(&mut self, slot_seq: u64, id: &Identity, size: usize) {
        match id {
            Identity::Message(seq) => {
                let seq = *seq;
                if self.delivered.get(seq) {
                    self.duplicated += 1;
                    self.note(|| {
                        format!("message {seq} delivered again (in the slot of message {slot_seq})")
                    });
                    return;
                }
                self.delivered.set(seq);
                if let Some(max) = self.max_seen.filter(|&m| m > seq) {
                    self.reordered += 1;
                    self.note(|| {
                        format!(
                            "message {seq} delivered after message {max} (in the slot of message {slot_seq})"
                        )
                    });
                }
                self.max_seen = Some(self.max_seen.map_or(seq, |m| m.max(seq)));
                self.messages += 1;
                self.bytes += size as u64;
            }
            Identity::Corrupt(why) => {
                self.corrupted += 1;
                self.corrupt_slots.set(slot_seq);
                self.note(|| format!("slot of message {slot_seq}: {why}"));
            }
        }
    }

    fn note(&mut self, f: impl FnOnce() -> String) {
        if self.first_problem.is_none() {
            self.first_problem = Some(f());
        }
    }

    /// Highest sequence number delivered intact.
    pub fn max_seen(&self) -> Option<u64> {
        self.max_seen
    }

    /// Messages below `horizon` that were neither delivered nor had a corrupt slot.
    pub fn lost(&self, horizon: u64) -> u64 {
        (0..horizon)
            .filter(|&s| !self.delivered.get(s) && !self.corrupt_slots.get(s))
            .count() as u64
    }

    /// The lost-message horizon: all `posted` messages after a clean end, else one past the
    /// highest delivered one.
    pub fn horizon(&self, clean: bool, posted: u64) -> u64 {
        if clean {
            posted
        } else {
            self.max_seen.map_or(0, |m| m + 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(seq: u64) -> Identity {
        Identity::Message(seq)
    }

    fn bad() -> Identity {
        Identity::Corrupt("byte 0".into())
    }

    /// Feeds (slot, identity) pairs; every message is 10 bytes.
    fn run(events: &[(u64, Identity)]) -> Tracker {
        let mut t = Tracker::new();
        for (slot, id) in events {
            t.record(*slot, id, 10);
        }
        t
    }

    fn counts(t: &Tracker, horizon: u64) -> (u64, u64, u64, u64, u64) {
        (
            t.messages,
            t.lost(horizon),
            t.duplicated,
            t.reordered,
            t.corrupted,
        )
    }

    #[test]
    fn clean_sequence() {
        let t = run(&(0..100).map(|s| (s, ok(s))).collect::<Vec<_>>());
        assert_eq!(counts(&t, t.horizon(true, 100)), (100, 0, 0, 0, 0));
        assert_eq!(t.bytes, 1000);
        assert_eq!(t.first_problem, None);
    }

    #[test]
    fn a_lost_message_shifts_later_ones_without_counting_them_reordered() {
        // Message 3 vanished: slots 3.. hold 4.., the last slot never completes.
        let mut ev: Vec<(u64, Identity)> = (0..3).map(|s| (s, ok(s))).collect();
        ev.extend((3..9).map(|s| (s, ok(s + 1))));
        let t = run(&ev);
        assert_eq!(counts(&t, t.horizon(false, 10)), (9, 1, 0, 0, 0));
    }

    #[test]
    fn a_duplicate_is_counted_once_and_not_as_a_delivery() {
        let t = run(&[(0, ok(0)), (1, ok(1)), (2, ok(1)), (3, ok(2)), (4, ok(3))]);
        assert_eq!(counts(&t, t.horizon(false, 5)), (4, 0, 1, 0, 0));
        assert!(t
            .first_problem
            .unwrap()
            .contains("message 1 delivered again"));
    }

    #[test]
    fn swapped_messages_count_one_reorder() {
        let t = run(&[(0, ok(0)), (1, ok(2)), (2, ok(1)), (3, ok(3))]);
        assert_eq!(counts(&t, t.horizon(true, 4)), (4, 0, 0, 1, 0));
    }

    #[test]
    fn a_corrupt_slot_is_not_also_lost() {
        let t = run(&[(0, ok(0)), (1, bad()), (2, ok(2))]);
        assert_eq!(counts(&t, t.horizon(true, 3)), (2, 0, 0, 0, 1));
        assert!(t
            .first_problem
            .unwrap()
            .starts_with("slot of message 1: byte 0"));
    }

    #[test]
    fn horizon_after_an_error_ignores_messages_still_in_flight() {
        let t = run(&[(0, ok(0)), (1, ok(1))]);
        // 10 posted, the stream failed after 2: nothing lost.
        assert_eq!(t.horizon(false, 10), 2);
        assert_eq!(t.lost(t.horizon(false, 10)), 0);
        // A clean end with 10 posted and 2 delivered: 8 lost.
        assert_eq!(t.lost(t.horizon(true, 10)), 8);
        assert_eq!(Tracker::new().horizon(false, 10), 0);
    }

    #[test]
    fn bits_grow_on_demand() {
        let mut b = Bits::default();
        assert!(!b.get(1_000_000));
        b.set(1_000_000);
        b.set(0);
        assert!(b.get(1_000_000) && b.get(0) && !b.get(999_999));
    }
}
