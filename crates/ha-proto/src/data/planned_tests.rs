//! Planned switches of the data protocol (a return to the preferred path, a drain), driven with
//! no fabric on the simulated path of `failover_tests`, mixed at random points with failovers.
//! A planned switch fences nothing: the sender stops posting and waits until everything it
//! posted on the old path completed, the receiver stops posting clear-to-sends and waits until
//! its own landed and it delivered everything the sender posted; then the receiver re-posts its
//! open clear-to-sends with the new path's keys (next epoch) and says `Switch`, and the sender
//! applies it. Checked: nothing is ever replayed by a planned switch, and as for failovers every
//! request completes exactly once with the right bytes, nothing lands after its receive
//! completed, each path only sees its own keys.
//!
//! The case where the target dies as the receiver switches to it: the receiver's re-posts on
//! it never land, it fails back over at once (next epoch again), and the sender — which never
//! saw the first `Switch` — takes the second one as the commit of its plan followed by a
//! failover: two switches applied in a row, the first one's clear-to-sends missing.

use super::failover_tests::{key_of, Msg, Sim};
use super::layout::CtsEntry;
use proptest::prelude::*;

impl Sim {
    /// Re-post the receiver's open clear-to-sends with the current epoch's key; land them
    /// unless `lost`.
    fn repost_open(&mut self, lost: bool) {
        let key = key_of(self.r.epoch());
        for (seq, _slot, entries) in self.r.open_requests() {
            let rekeyed: Vec<CtsEntry> = entries
                .iter()
                .map(|e| CtsEntry { rkey: key, ..*e })
                .collect();
            let (words, word) = self.r.repost(seq, &rekeyed);
            if !lost {
                self.land_cts(word, &words);
            }
        }
    }

    /// A planned switch (see the module doc); `target_dies`: the target fails as the receiver
    /// switches to it. Returns the number of sends the sender replayed (must be 0).
    fn planned_switch(&mut self, target_dies: bool) -> usize {
        // The drain: what both sides posted on the old path completes, in order.
        while let Some(m) = self.wire.to_r.pop_front() {
            self.land_at_r(m);
        }
        while let Some(Msg::Cts { word, words }) = self.wire.to_s.pop_front() {
            self.land_cts(word, &words);
        }
        while let Some(Msg::Ack { seq }) = self.wire.acks.pop_front() {
            self.ack(seq);
        }
        let upto = self.s.posted_upto();
        let delivered = self.r.delivered();
        if delivered != upto {
            self.violations.push(format!(
                "planned switch: receiver delivered {delivered}, sender posted {upto}"
            ));
        }
        self.r.next_epoch();
        let first = key_of(self.r.epoch());
        self.repost_open(target_dies);
        let mut replayed = 0;
        if target_dies {
            // The receiver fails back over from the dead target: its fence drains nothing new.
            let h = self.r.delivered();
            self.r.next_epoch();
            self.repost_open(false);
            let second = key_of(self.r.epoch());
            self.key = second;
            let commit = self
                .s
                .apply_switch(&self.fifo, upto, |_, _, _, _| Some(first))
                .expect("commit of the plan");
            let back = self
                .s
                .apply_switch(&self.fifo, h, |_, _, _, _| Some(second))
                .expect("failover back");
            replayed += commit.len() + back.len();
        } else {
            self.key = first;
            let batches = self
                .s
                .apply_switch(&self.fifo, delivered, |_, _, _, _| Some(first))
                .expect("planned switch");
            replayed += batches.len();
        }
        assert_eq!(self.s.epoch(), self.r.epoch());
        replayed
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn planned_switches_among_failovers_replay_nothing_and_complete_everything_exactly_once(
        plan in proptest::collection::vec((1usize..=8, any::<u64>()), 1..40),
        start in prop_oneof![Just(1u64), Just((1u64 << 31) - 5), Just((1u64 << 48) - 5)],
        steps in proptest::collection::vec(any::<u8>(), 0..600),
        switches in proptest::collection::vec(
            (0usize..600, 0u8..3, (0usize..6, 0usize..12, 0usize..6, 0usize..4)),
            1..=4,
        ),
    ) {
        let mut sim = Sim::new(&plan, start);
        let mut at = switches.clone();
        at.sort_by_key(|s| s.0);
        let mut epochs = 0u32;
        let mut replayed = 0;
        let mut apply = |sim: &mut Sim, kind: u8, f: (usize, usize, usize, usize)| match kind {
            0 => {
                sim.fail_and_switch(f.0, f.1, f.2, f.3);
                epochs += 1;
            }
            1 => {
                replayed += sim.planned_switch(false);
                epochs += 1;
            }
            _ => {
                replayed += sim.planned_switch(true);
                epochs += 2;
            }
        };
        let mut next = 0;
        for (i, &c) in steps.iter().enumerate() {
            while next < at.len() && at[next].0 == i {
                apply(&mut sim, at[next].1, at[next].2);
                next += 1;
            }
            sim.step(c);
        }
        while next < at.len() {
            apply(&mut sim, at[next].1, at[next].2);
            next += 1;
        }
        let mut guard = 0;
        while !sim.all_done() {
            for c in 0..7 { sim.step(c); }
            guard += 1;
            prop_assert!(guard < 20_000, "no progress after the switches");
        }
        prop_assert_eq!(replayed, 0, "a planned switch replayed");
        prop_assert!(sim.violations.is_empty(), "{:?}", sim.violations);
        prop_assert_eq!(sim.r.duplicates(), 0);
        prop_assert_eq!(sim.s.live_requests(), 0);
        prop_assert_eq!(sim.r.live_requests(), 0);
        prop_assert_eq!(sim.s.epoch(), epochs);
    }
}

/// A multi-receive half matched when the plan commits and its target dies at once: the
/// clear-to-send re-posted on the dead target never lands. Before the sender re-read such a
/// receive lazily, applying the commit failed the connection (`BadCts`) although the receiver
/// re-posted it again on the path it failed back to.
#[test]
fn a_half_matched_receive_survives_a_commit_whose_clear_to_sends_never_landed() {
    let mut sim = Sim::new(&[(3, 0x0a0b_0c0d), (1, 5)], 1);
    sim.post_recv();
    let Some(Msg::Cts { word, words }) = sim.wire.to_s.pop_front() else {
        panic!("no clear-to-send");
    };
    sim.land_cts(word, &words);
    // One of the three sends is matched: the receive is in the sender's `cur`.
    sim.step(2);
    assert_eq!(sim.planned_switch(true), 0);
    let mut guard = 0;
    while !sim.all_done() {
        for c in 0..7 {
            sim.step(c);
        }
        guard += 1;
        assert!(guard < 1000, "no progress");
    }
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    assert_eq!(sim.s.epoch(), 2);
}
