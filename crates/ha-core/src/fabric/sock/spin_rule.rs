//! When a `sock` reader thread polls its stream instead of blocking in `recv`
//! (`HA_NCCL_SOCK_SPIN_US`): the responder after small messages placed, the ack reader after
//! small messages acknowledged. Polling only where the next frame comes within microseconds
//! (a latency-bound collective's steps) spares the kernel a thread wake-up per frame.

/// When a reader polls its stream instead of blocking (`Tunables::spin`): after the second
/// message in a row (the WRITEs up to and including a WRITE_WITH_IMM) of at most
/// [`SPIN_AFTER_MAX`] bytes, placed (the responder) or acknowledged (the ack reader); a larger
/// WRITE ends the polling. Small messages in a row are a
/// latency-bound collective's steps, where the next one comes within tens of microseconds;
/// larger ones keep the stream busy by themselves, and a lone small one between them (NCCL's
/// empty sends) is no reason to poll (measured: bench/results/2026-11-27-sock-responder-spin.md).
#[derive(Default)]
pub(super) struct SpinRule {
    /// Bytes of the WRITEs placed since the last WRITE_WITH_IMM.
    msg_bytes: u64,
    /// The last message was small.
    last_small: bool,
}

/// 4 KiB of payload plus the transport's record (80 bytes) or eager header (16 bytes).
pub(super) const SPIN_AFTER_MAX: u64 = (4 << 10) + 128;

impl SpinRule {
    /// A WRITE of `total` bytes starts: `true` when it ends the polling.
    pub(super) fn write_starts(&self, total: u64) -> bool {
        total > SPIN_AFTER_MAX
    }
    /// A WRITE of `total` bytes was placed in full (or acknowledged).
    pub(super) fn write_done(&mut self, total: u64) {
        self.msg_bytes = self.msg_bytes.saturating_add(total);
    }
    /// Its WRITE_WITH_IMM ended a message: `true` when the reader should poll.
    pub(super) fn message_done(&mut self) -> bool {
        let small = self.msg_bytes <= SPIN_AFTER_MAX;
        let poll = small && self.last_small;
        self.last_small = small;
        self.msg_bytes = 0;
        poll
    }
}

#[cfg(test)]
mod tests {
    use super::{SpinRule, SPIN_AFTER_MAX};

    /// A message of `writes` (bytes of each WRITE, the last one carrying the immediate):
    /// whether any WRITE ended the polling, and whether the message starts it.
    fn message(r: &mut SpinRule, writes: &[u64]) -> (bool, bool) {
        let mut stops = false;
        for &w in writes {
            stops |= r.write_starts(w);
            r.write_done(w);
        }
        (stops, r.message_done())
    }

    #[test]
    fn polling_starts_at_the_second_small_message_in_a_row() {
        let mut r = SpinRule::default();
        // Fast 8 B sends, eager 4 KiB sends (payload + 16-byte header), records of empty sends.
        assert_eq!(message(&mut r, &[8]), (false, false));
        assert_eq!(message(&mut r, &[8]), (false, true));
        assert_eq!(message(&mut r, &[4096, 16]), (false, true));
        assert_eq!(message(&mut r, &[4096, 80]), (false, true));
        assert_eq!(message(&mut r, &[0, 80]), (false, true));
        assert_eq!(message(&mut r, &[SPIN_AFTER_MAX]), (false, true));
    }

    #[test]
    fn a_large_message_stops_polling_and_a_lone_small_one_does_not_start_it() {
        let mut r = SpinRule::default();
        message(&mut r, &[16]);
        assert_eq!(message(&mut r, &[16]), (false, true));
        // A large message's payload WRITE ends the polling; its small record does not count
        // it as small.
        assert_eq!(message(&mut r, &[256 << 10, 80]), (true, false));
        // NCCL's empty sends between large messages: never a reason to poll.
        for _ in 0..3 {
            assert_eq!(message(&mut r, &[80]), (false, false));
            assert_eq!(message(&mut r, &[128 << 10, 80]), (true, false));
        }
        // Several small WRITEs adding up to more than the limit make a large message.
        assert_eq!(message(&mut r, &[4096, 4096, 80]), (false, false));
        assert_eq!(message(&mut r, &[SPIN_AFTER_MAX + 1]), (true, false));
        assert_eq!(message(&mut r, &[8]), (false, false));
        assert_eq!(message(&mut r, &[8]), (false, true));
    }
}
