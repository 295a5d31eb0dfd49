//! Which messages a posting thread writes onto the stream itself ("inline"), by size and by
//! how many queue pairs of the process are sending larger messages.
//!
//! Up to [`ALWAYS`] bytes (or the configured limit, `HA_NCCL_SOCK_INLINE`, if lower): always,
//! when the stream is free. Above that, up to the limit: only while no other queue pair of the
//! process has posted such a message for [`ALONE_FOR`]. NCCL's proxy thread posts for every
//! channel: at
//! 8 KiB all_reduce one channel sends 8 KiB messages, and writing them inline skips a hand-off
//! per message (−14 to −22 %); at 32 KiB four channels do, and writing theirs inline puts four
//! channels' writes one after another into that one thread (on loopback and veth a `sendmsg`
//! also runs the receiver's TCP path before it returns), where four sender threads wrote them
//! at once: 32 KiB +38 % (bench/results/2026-11-27-compact-cts.md, runs 81, 88–90). Whether
//! other queue pairs send is judged from what was just posted: a burst's first message cannot
//! know the rest is coming (a per-thread pacing rule that inlined the first of each burst still
//! cost 32 KiB). A wrong judgement (two threads posting at once) only moves a message between
//! the two ways of writing it, never changes what is written or in which order.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Messages of at most this many payload bytes go inline whenever the stream is free.
pub const ALWAYS: usize = 4096;

/// A larger message goes inline only once no other queue pair has posted a message above
/// [`ALWAYS`] for this long.
pub const ALONE_FOR: Duration = Duration::from_micros(500);

/// Who has been posting messages above [`ALWAYS`]: one per process ([`InlineGate::process`]),
/// shared by every `sock` fabric the plugin opens; a test may give its fabric one of its own.
#[derive(Debug, Default)]
pub struct InlineGate {
    /// The queue pair of the last such message (0: none yet; queue pair numbers start at 1).
    last_qpn: AtomicU32,
    /// When the last such message was posted (ns since `epoch`).
    last_ns: AtomicU64,
    /// When a queue pair other than the last one's last posted such a message (ns since
    /// `epoch`): a queue pair is alone once this is [`ALONE_FOR`] old.
    other_ns: AtomicU64,
    epoch: OnceLock<Instant>,
}

impl InlineGate {
    pub const fn new() -> InlineGate {
        InlineGate {
            last_qpn: AtomicU32::new(0),
            last_ns: AtomicU64::new(0),
            other_ns: AtomicU64::new(0),
            epoch: OnceLock::new(),
        }
    }

    /// The process's gate (every `sock` fabric the plugin opens shares it).
    pub fn process() -> &'static InlineGate {
        static GATE: InlineGate = InlineGate::new();
        &GATE
    }

    /// Whether queue pair `qpn` may write a message of `bytes` inline (limit `limit`). Every
    /// message above [`ALWAYS`] is noted, inline or not, larger than the limit included: they
    /// are what tells a queue pair it is not alone. With a limit of at most [`ALWAYS`] nothing
    /// larger can go inline, and nothing is noted.
    pub fn may_inline(&self, qpn: u32, bytes: usize, limit: usize) -> bool {
        if bytes <= ALWAYS || limit <= ALWAYS {
            return bytes <= limit;
        }
        let epoch = *self.epoch.get_or_init(Instant::now);
        let now = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.note(qpn, now) && bytes <= limit
    }

    /// Queue pair `qpn` posts a message above [`ALWAYS`] at `now_ns`: whether no other queue
    /// pair has posted one for [`ALONE_FOR`] (counted from the gate's first message when none
    /// ever did).
    fn note(&self, qpn: u32, now_ns: u64) -> bool {
        let prev = self.last_qpn.swap(qpn, Relaxed);
        let prev_ns = self.last_ns.fetch_max(now_ns, Relaxed);
        let other = if prev == qpn {
            self.other_ns.load(Relaxed)
        } else {
            // The previous poster was another queue pair: its last message is the newest
            // other one (never moved backwards, whatever the order two threads store in).
            self.other_ns.fetch_max(prev_ns, Relaxed).max(prev_ns)
        };
        Duration::from_nanos(now_ns.saturating_sub(other)) >= ALONE_FOR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const GAP: u64 = ALONE_FOR.as_nanos() as u64;

    #[test]
    fn a_lone_sender_goes_inline_once_alone_for_the_window() {
        let g = InlineGate::new();
        assert!(
            !g.note(7, 10 * US),
            "the window counts from the gate's first message"
        );
        assert!(!g.note(7, GAP - 1));
        assert!(g.note(7, GAP));
        assert!(g.note(7, 100 * GAP));
    }

    #[test]
    fn another_sender_keeps_both_out_for_the_window_after_its_last_message() {
        let g = InlineGate::new();
        let t = 5 * GAP;
        assert!(g.note(1, t), "alone");
        assert!(
            !g.note(2, t + US),
            "a second queue pair, right after the first"
        );
        assert!(
            !g.note(1, t + 2 * US),
            "the first again, right after the second"
        );
        assert!(
            !g.note(1, t + 3 * US),
            "and again: the second posted 2 us ago"
        );
        assert!(!g.note(1, t + US + GAP - 1));
        assert!(
            g.note(1, t + US + GAP),
            "the second's last message is the window old"
        );
        // The second comes back after a long pause: alone too, the first having just posted?
        assert!(
            !g.note(2, t + US + GAP + US),
            "no: the first posted 1 us ago"
        );
        // A third that posts after everyone has been quiet for the window is alone at once.
        assert!(g.note(3, t + 3 * GAP), "quiet for the window before it");
    }

    #[test]
    fn queue_pairs_taking_turns_keep_each_other_from_going_inline() {
        // Four channels, one larger message each per step, steps 130 us apart.
        let g = InlineGate::new();
        let mut inline = 0;
        for step in 0..100u64 {
            for qpn in 1..=4u32 {
                inline += u32::from(g.note(qpn, step * 130 * US + u64::from(qpn) * US));
            }
        }
        assert_eq!(inline, 0);
    }

    #[test]
    fn sizes_and_the_limit() {
        let g = InlineGate::new();
        assert!(g.may_inline(1, 8, 8192));
        assert!(g.may_inline(1, ALWAYS, ALWAYS));
        assert!(!g.may_inline(1, 8, 0), "limit 0: never");
        assert!(
            !g.may_inline(1, 2 * ALWAYS, ALWAYS),
            "above the limit: never"
        );
        assert_eq!(
            g.last_qpn.load(Relaxed),
            0,
            "nothing noted while the limit is 4 KiB"
        );
        // Queue pair 4 is alone; then a larger message above the limit from queue pair 3 is
        // noted all the same: it tells 4 it is not alone any more.
        assert!(!g.may_inline(4, 8192, 8192), "the first larger message");
        let t = Instant::now();
        while t.elapsed() < ALONE_FOR {
            std::hint::spin_loop();
        }
        assert!(g.may_inline(4, 8192, 8192), "alone for the window");
        assert!(!g.may_inline(3, 64 << 10, 8192));
        assert_eq!(g.last_qpn.load(Relaxed), 3);
        assert!(!g.may_inline(4, 8192, 8192), "queue pair 3 just posted");
    }
}
