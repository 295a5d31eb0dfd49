//! Link liveness of one `sock` stream, judged the way RC hardware judges it: below the peer's
//! threads. RC retries count acknowledgements from the peer's NIC, which answers whether or not
//! the peer's process runs; here the peer's kernel plays the NIC, and `TCP_INFO` says whether
//! it still answers. A peer whose process is stopped (SIGSTOP, cgroup throttling, swap, a
//! debugger) keeps acknowledging TCP — including window probes while its receive buffer is
//! full, and keep-alive probes while the stream is idle — so it is alive; a link that died
//! leaves TCP waiting for an answer that never comes.
//!
//! The rule ([`LinkWatch::observe`], pure so it is unit-tested on samples): the link is dead
//! once TCP has been *waiting* — segments unacknowledged, or probes unanswered — for a whole
//! window with no acknowledgement arriving. Waiting on *window* probes alone (the peer's
//! window closed) gets at least [`PROBE_GRACE`]: a receiver's kernel answers them, being
//! out-of-window segments, at most once per 500 ms (`net.ipv4.tcp_invalid_ratelimit`), while
//! the sender's probe timer backs off from 200 ms; measured on a stopped peer, one probe went
//! unanswered for 1.1 s (1.33 s between two acknowledgements). Keep-alive probes (window open,
//! nothing in flight) go out 1 s apart, each answered within a round trip by a live kernel:
//! they get the window.

use super::net::{self, TcpSample};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Least time window probes may stay unanswered before the link counts as dead: over twice
/// the longest unanswered stretch measured for a live (stopped) peer.
pub const PROBE_GRACE: Duration = Duration::from_millis(3000);

/// The verdict on a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The peer's kernel answers (or nothing is asked of it).
    Alive,
    /// Why the link is dead.
    Dead(String),
}

/// Watches one stream's `TCP_INFO` over time (call [`LinkWatch::check`] on every idle tick of
/// the thread reading that stream).
#[derive(Debug)]
pub struct LinkWatch {
    window: Duration,
    /// Since when TCP has been waiting for the peer's kernel without an answer.
    waiting_since: Option<Instant>,
}

impl LinkWatch {
    /// A watch that declares the link dead after `window` of unanswered waiting.
    pub fn new(window: Duration) -> LinkWatch {
        LinkWatch {
            window,
            waiting_since: None,
        }
    }

    /// Sample stream `fd` and judge it.
    pub fn check(&mut self, fd: RawFd, now: Instant) -> Liveness {
        match net::tcp_sample(fd) {
            Ok(s) => self.observe(s, now),
            Err(e) => Liveness::Dead(format!("TCP_INFO: {e}")),
        }
    }

    /// Judge one sample taken at `now`.
    pub fn observe(&mut self, s: TcpSample, now: Instant) -> Liveness {
        if !s.established {
            return Liveness::Dead("the TCP connection is no longer established".into());
        }
        if s.unacked == 0 && s.probes == 0 {
            self.waiting_since = None;
            return Liveness::Alive;
        }
        let mut since = self.waiting_since.unwrap_or(now);
        // An acknowledgement that came after the wait began starts it over.
        if let Some(acked) = now.checked_sub(s.since_ack) {
            since = since.max(acked);
        }
        self.waiting_since = Some(since);
        let limit = if s.unacked == 0 && s.zero_window {
            self.window.max(PROBE_GRACE)
        } else {
            self.window
        };
        let waited = now.saturating_duration_since(since);
        if waited < limit {
            return Liveness::Alive;
        }
        Liveness::Dead(if s.unacked > 0 {
            format!(
                "{} segment(s) unacknowledged by the peer's kernel for {} ms",
                s.unacked,
                waited.as_millis()
            )
        } else {
            format!(
                "{} probe(s) unanswered by the peer's kernel for {} ms",
                s.probes,
                waited.as_millis()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_millis(500);

    /// A sample with the peer's window closed (window probes, when `probes > 0`).
    fn sample(unacked: u32, probes: u8, since_ack_ms: u64) -> TcpSample {
        TcpSample {
            established: true,
            unacked,
            probes,
            since_ack: Duration::from_millis(since_ack_ms),
            zero_window: true,
            unsent: 0,
            rtt: Duration::from_micros(50),
            rttvar: Duration::from_micros(10),
            rto: Duration::from_millis(200),
            backoff: 0,
            retransmits: 0,
        }
    }

    /// A sample with the window open (probes are keep-alive probes).
    fn open(unacked: u32, probes: u8, since_ack_ms: u64) -> TcpSample {
        TcpSample {
            zero_window: false,
            ..sample(unacked, probes, since_ack_ms)
        }
    }

    fn ms(t0: Instant, m: u64) -> Instant {
        t0 + Duration::from_millis(m)
    }

    fn dead(l: &Liveness) -> bool {
        matches!(l, Liveness::Dead(_))
    }

    #[test]
    fn unacknowledged_data_for_a_window_is_a_dead_link() {
        let t0 = Instant::now();
        let mut w = LinkWatch::new(W);
        // Data in flight, the last ACK long ago (the link died at t0).
        assert_eq!(w.observe(sample(12, 0, 3000), t0), Liveness::Alive);
        assert_eq!(w.observe(sample(12, 0, 3250), ms(t0, 250)), Liveness::Alive);
        let v = w.observe(sample(12, 0, 3500), ms(t0, 500));
        assert!(dead(&v), "{v:?}");
        let Liveness::Dead(why) = v else {
            unreachable!()
        };
        assert!(why.contains("12 segment(s) unacknowledged"), "{why}");
    }

    #[test]
    fn acknowledgements_keep_a_busy_link_alive() {
        let t0 = Instant::now();
        let mut w = LinkWatch::new(W);
        // Always something in flight, but ACKs keep coming (a slow, congested, live link).
        for k in 0..40 {
            assert_eq!(
                w.observe(sample(30, 0, 100), ms(t0, k * 100)),
                Liveness::Alive,
                "at {} ms",
                k * 100
            );
        }
    }

    #[test]
    fn a_stopped_peer_with_a_full_buffer_is_alive() {
        // Measured on this kernel (bench/results/2026-11-25-tcp-liveness.md, paused-busy-nout):
        // zero window, window probes backing off, each answered eventually; one probe
        // unanswered for over a second (the answers are rate limited), the time since the last
        // ACK growing to seconds. Sampled as the ack reader does (every few tens of ms).
        let t0 = Instant::now();
        let mut w = LinkWatch::new(W);
        let trace: &[(u64, u8, u64)] = &[
            (1010, 0, 200),
            (1050, 1, 250),
            (1260, 1, 456),
            (1520, 1, 708),
            (1770, 1, 960),
            (2020, 1, 1212),
            (2120, 1, 1312),
            (2280, 0, 152),
            (3030, 0, 916),
            (4050, 0, 200),
            (5560, 0, 1720),
            (7070, 0, 3228),
            (7580, 0, 180),
        ];
        for &(at, probes, since_ack) in trace {
            let v = w.observe(sample(0, probes, since_ack), ms(t0, at));
            assert_eq!(v, Liveness::Alive, "at {at} ms");
        }
    }

    #[test]
    fn unanswered_probes_for_the_grace_are_a_dead_link() {
        // Measured: the link cut during a zero window (cut-zerowin-nout): probes pile up, no
        // ACK since.
        let t0 = Instant::now();
        let mut w = LinkWatch::new(W);
        assert_eq!(w.observe(sample(0, 2, 1452), ms(t0, 2270)), Liveness::Alive);
        assert_eq!(w.observe(sample(0, 2, 1960), ms(t0, 2780)), Liveness::Alive);
        assert_eq!(
            w.observe(sample(0, 3, 4468), ms(t0, 5260)),
            Liveness::Alive,
            "probes alone get PROBE_GRACE, not the 500 ms window"
        );
        let v = w.observe(sample(0, 4, 4496), ms(t0, 5290));
        assert!(dead(&v), "{v:?}");
        let Liveness::Dead(why) = v else {
            unreachable!()
        };
        assert!(why.contains("probe(s) unanswered"), "{why}");
    }

    #[test]
    fn unanswered_keepalive_probes_for_a_window_are_a_dead_link() {
        // Measured: the link cut while idle (cut-idle-nout): the first keep-alive probe goes
        // unanswered at ~1.8 s after the last traffic.
        let t0 = Instant::now();
        let mut w = LinkWatch::new(W);
        assert_eq!(w.observe(open(0, 0, 1776), ms(t0, 1780)), Liveness::Alive);
        assert_eq!(w.observe(open(0, 1, 2280), ms(t0, 2280)), Liveness::Alive);
        assert_eq!(w.observe(open(0, 1, 2532), ms(t0, 2530)), Liveness::Alive);
        let v = w.observe(open(0, 1, 2784), ms(t0, 2790));
        assert!(dead(&v), "{v:?}");
        // A live peer answers keep-alive within a round trip: no wait builds up.
        let mut w = LinkWatch::new(W);
        for k in 0..10u64 {
            let at = 1000 * k;
            assert_eq!(w.observe(open(0, 1, 1000), ms(t0, at)), Liveness::Alive);
            assert_eq!(w.observe(open(0, 0, 2), ms(t0, at + 2)), Liveness::Alive);
        }
    }

    #[test]
    fn an_answer_restarts_the_wait_and_quiet_clears_it() {
        let t0 = Instant::now();
        let mut w = LinkWatch::new(W);
        assert_eq!(w.observe(sample(1, 0, 0), t0), Liveness::Alive);
        // 400 ms later an ACK came 50 ms ago: waiting since 350 ms.
        assert_eq!(w.observe(sample(1, 0, 50), ms(t0, 400)), Liveness::Alive);
        assert_eq!(w.observe(sample(1, 0, 450), ms(t0, 800)), Liveness::Alive);
        assert!(dead(&w.observe(sample(1, 0, 500), ms(t0, 850))));
        // Everything acknowledged: not waiting any more.
        let mut w = LinkWatch::new(W);
        assert_eq!(w.observe(sample(1, 0, 10_000), t0), Liveness::Alive);
        assert_eq!(
            w.observe(sample(0, 0, 10_000), ms(t0, 400)),
            Liveness::Alive
        );
        assert_eq!(
            w.observe(sample(1, 0, 10_000), ms(t0, 800)),
            Liveness::Alive,
            "a new wait starts at its first sample"
        );
        assert!(dead(&w.observe(sample(1, 0, 10_000), ms(t0, 1300))));
    }

    #[test]
    fn silence_counts_only_while_tcp_waits_for_the_link() {
        let ms = Duration::from_millis;
        // Segments in flight: the time since the last acknowledgement, less the round trip
        // (50 us + 4 x 10 us here).
        let us = Duration::from_micros;
        assert_eq!(open(3, 0, 40).silence(false), ms(40) - us(90));
        assert_eq!(sample(3, 0, 40).silence(false), ms(40) - us(90));
        // One segment in flight: if it was lost, TCP resends it only after its retransmission
        // timeout (200 ms here): until then a lossy link is silent, not dead.
        assert_eq!(open(1, 0, 150).silence(false), Duration::ZERO);
        assert_eq!(open(1, 0, 240).silence(false), ms(40));
        // TCP resent it unanswered (its timeout doubled to 400 ms): the allowance ends when the
        // resend's answer is due (the first 200 ms + 40 ms), not after the doubled timeout.
        let resent = |backoff: u8, since| TcpSample {
            rto: ms(200) * (1 << backoff),
            backoff,
            retransmits: backoff,
            ..open(1, 0, since)
        };
        assert_eq!(resent(1, 230).silence(false), Duration::ZERO);
        assert_eq!(resent(1, 240).silence(false), Duration::ZERO);
        assert_eq!(resent(1, 300).silence(false), ms(60));
        assert_eq!(resent(2, 300).silence(false), ms(60));
        // The silence of sample `s` once `since` ms have passed since the last acknowledgement.
        let at = |s: TcpSample, since: u64| {
            TcpSample {
                since_ack: ms(since),
                ..s
            }
            .silence(false)
        };
        // Zero-window probes raise the back-off count without doubling the timeout and
        // without a retransmission: the full timeout still applies.
        let probed = TcpSample {
            backoff: 4,
            ..open(1, 0, 0)
        };
        assert_eq!(at(probed, 150), Duration::ZERO);
        assert_eq!(at(probed, 240), ms(40));
        // A retransmission after such probes: the first timeout is never taken below 200 ms.
        let mixed = TcpSample {
            rto: ms(400),
            backoff: 5,
            retransmits: 1,
            ..open(1, 0, 0)
        };
        assert_eq!(at(mixed, 240), Duration::ZERO);
        assert_eq!(at(mixed, 300), ms(60));
        // A peer that acknowledges promptly (its kernel's delayed ACK capped, `PROMPT`): a
        // lone segment's silence counts from the round trip, as several segments' does...
        assert_eq!(open(1, 0, 40).silence(true), ms(40) - us(90));
        assert_eq!(open(1, 0, 40).silence(false), Duration::ZERO);
        // ...also once TCP resent it (a resend must not end a suspicion already begun).
        assert_eq!(resent(1, 240).silence(true), ms(240) - us(90));
        assert_eq!(resent(2, 300).silence(true), ms(300) - us(90));
        // Nothing in flight is no silence, prompt peer or not.
        assert_eq!(open(0, 0, 5000).silence(true), Duration::ZERO);
        // More than one segment in flight: the round trip alone, as before.
        assert_eq!(
            TcpSample {
                backoff: 1,
                retransmits: 1,
                rto: ms(400),
                ..open(3, 0, 40)
            }
            .silence(false),
            ms(40) - us(90)
        );
        // A long, jittery link (40 ms +- 10 ms): an acknowledgement 60 ms late is no silence
        // yet; 200 ms is 80 ms of it.
        let far = |since| TcpSample {
            rtt: ms(40),
            rttvar: ms(20),
            ..open(3, 0, since)
        };
        assert_eq!(far(60).silence(false), Duration::ZERO);
        assert_eq!(far(200).silence(false), ms(80));
        // Nothing in flight, nothing to send: an idle stream is not silent.
        assert_eq!(open(0, 0, 5000).silence(false), Duration::ZERO);
        // The window open and data the link did not take (carrier lost): silent.
        let stuck = TcpSample {
            unsent: 4096,
            ..open(0, 0, 90)
        };
        assert_eq!(stuck.silence(false), ms(90) - us(90));
        assert_eq!(open(0, 2, 90).silence(false), ms(90) - us(90));
        // The window closed (a peer that does not read): its choice, not silence.
        let closed = TcpSample {
            unsent: 4096,
            ..sample(0, 2, 900)
        };
        assert_eq!(closed.silence(false), Duration::ZERO);
    }

    #[test]
    fn a_closed_connection_is_dead_at_once() {
        let mut w = LinkWatch::new(W);
        let s = TcpSample {
            established: false,
            ..sample(0, 0, 0)
        };
        assert!(dead(&w.observe(s, Instant::now())));
    }

    #[test]
    fn samples_of_a_real_loopback_stream() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        net::keepalive(c.as_raw_fd()).unwrap();
        let s = net::tcp_sample(c.as_raw_fd()).unwrap();
        assert!(s.established);
        assert_eq!((s.unacked, s.probes), (0, 0));
        // The peer never reads, its kernel still acknowledges: alive.
        c.write_all(&[7u8; 64 << 10]).unwrap();
        let mut w = LinkWatch::new(Duration::from_millis(1));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = net::tcp_sample(c.as_raw_fd()).unwrap();
            if s.unacked == 0 {
                assert_eq!(w.observe(s, Instant::now()), Liveness::Alive);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "loopback never acknowledged: {s:?}"
            );
            std::thread::yield_now();
        }
        drop(peer);
        drop(l);
        // The peer's socket closed: our side is no longer ESTABLISHED once the FIN arrived.
        let deadline = Instant::now() + Duration::from_secs(10);
        while net::tcp_sample(c.as_raw_fd()).unwrap().established {
            assert!(Instant::now() < deadline, "FIN never arrived");
            std::thread::yield_now();
        }
        assert!(dead(&w.observe(
            net::tcp_sample(c.as_raw_fd()).unwrap(),
            Instant::now()
        )));
    }
}
