//! Fast detection of a dead active link (`HA_NCCL_SILENCE_MS`), checked at every tick.
//!
//! The soft timeout waits for a work request's completion, which a large write on a busy link
//! legitimately delays, so it must be long (a second). The link can say more, below the
//! payload and below the peer's threads:
//! - `sock` (`QueuePair::link_silence`): how long the peer's kernel has left segments
//!   unacknowledged, whatever the size of the write they belong to;
//! - elsewhere (`verbs`): beats — zero-length writes on the active path every quarter window
//!   while the connection waits or has work out, which the peer's NIC acknowledges even when
//!   its process is stopped — and how long the path then went without any completion, judged
//!   only while at most [`MAX_AHEAD`] payload bytes are out on it (a receiver's clear-to-sends
//!   and beats; a sender's large write is the receiver's to judge, whose beats it does not
//!   delay: a queue pair's two directions queue apart).
//!
//! What a live link may legitimately leave unanswered is no silence (`QueuePair::silence_floor`):
//! on `verbs` a lost packet stalls everything behind it until it is resent, so the window is at
//! least twice the queue pair's local ACK timeout (`HA_NCCL_QP_TIMEOUT` 14: 67 ms, a 134 ms
//! window); on `sock` the peer's kernel delays its acknowledgement by up to 40 ms while the
//! peer's thread has not read, which the peer's responder bounds with a keep-alive every 10 ms
//! while it waits for a receive (a 25 ms floor), and the fabric discounts the link's round trip,
//! or TCP's retransmission timeout while a single segment is out — unless the peer's kernel caps
//! its delayed ACK and says so (`PROMPT`, `fabric/sock/delack.rs`): then the round trip alone.
//!
//! Silence alone is not proof: a `sock` peer process that is stopped or descheduled leaves small
//! segments unacknowledged for up to the kernel's delayed-ACK time (40–200 ms, or the cap of a
//! peer that says `PROMPT`). So silence only raises a suspicion, and the standby decides:
//!
//! 1. the active path's link has been silent for the window (work out on it all that time,
//!    an unsignaled clear-to-send included: a receiver waiting for data has nothing else);
//! 2. the standby — verified, port up — is asked with a probe whether the peer answers there;
//! 3. once it has answered (after the suspicion began) and the active link then stayed silent
//!    for [`margin`] (a fifth of the window, at least 5 ms) more, with no acknowledgement at
//!    all since the suspicion began, traffic moves: the ordinary fenced failover (nothing
//!    lost, nothing doubled).
//!
//! A stopped peer answers on neither path: nothing moves, and when it runs again both paths
//! answer together (the active link's acknowledgement ends the suspicion within the margin).
//! A failover that proves false (the old path re-arms at once) widens the window with the
//! adaptive soft timeout (`HA_NCCL_RTO_ADAPTIVE`). Sampling the fabric costs a system call on
//! `sock`, so it is done only once the oldest work request (signaled or not) has been out for
//! the window, and then at most every sixteenth of it.

use super::{Event, Link};
use std::time::{Duration, Instant};

/// A suspicion on the active path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Suspect {
    /// The silent active path.
    path: usize,
    /// The standby asked.
    to: usize,
    /// When the suspicion began (the standby's answer must come after it).
    since: Instant,
}

/// The state of the silence check of one connection.
#[derive(Clone, Debug, Default)]
pub struct SilenceWatch {
    /// No fabric sample before this.
    next_sample: Option<Instant>,
    suspect: Option<Suspect>,
    /// Suspicions raised and cleared without a move (the link answered again, or the standby
    /// did not): counted for tests and logs.
    pub cleared: u64,
    /// Beats sent (fabrics without a link signal of their own).
    pub beats: u64,
}

impl SilenceWatch {
    fn clear(&mut self) {
        if self.suspect.take().is_some() {
            self.cleared += 1;
        }
    }

    /// Whether a suspicion is open.
    pub fn suspected(&self) -> bool {
        self.suspect.is_some()
    }
}

/// Most payload bytes out on a path for its answers to count as the link's (a beat behind more
/// would measure the payload): 64 KiB is 5 µs at 100 Gb/s and, on the slowest rail here
/// (Soft-RoCE under emulation, ~10 MB/s), 6.5 ms — a quarter of the default window.
pub const MAX_AHEAD: u64 = 64 << 10;

/// How long the active link must stay silent after the standby answered: a peer that was only
/// stopped answers on its active link about when it answers on the standby.
pub fn margin(window: Duration) -> Duration {
    (window / 5).max(Duration::from_millis(5))
}

impl Link {
    /// The silence window in force: `HA_NCCL_SILENCE_MS`, widened as the soft timeout is.
    pub(crate) fn silence_window(&self) -> Duration {
        let base = self.cfg.rto.as_millis().max(1);
        let factor = (self.rto.current().as_millis() / base).max(1);
        self.cfg
            .silence
            .saturating_mul(u32::try_from(factor).unwrap_or(u32::MAX))
    }

    /// The silence check of the active path `a` (see the module doc).
    pub(super) fn check_silence(&mut self, a: usize, now: Instant) -> Event {
        let window = self.silence_window();
        if window.is_zero() || self.paths.len() < 2 {
            return Event::Nothing;
        }
        let beats = !self.path(a).qp.reports_link_silence();
        // What a live link may legitimately leave unanswered is no silence yet.
        let window = window.max(self.path(a).qp.silence_floor());
        if window == Duration::MAX {
            return Event::Nothing;
        }
        if beats {
            if let Err(ev) = self.beat(a, now, window) {
                return ev;
            }
        }
        let out_for = match self.path(a).oldest_posted() {
            Some(t) => self.clock.elapsed(t, now),
            None => Duration::ZERO,
        };
        if out_for < window {
            self.silence.clear();
            return Event::Nothing;
        }
        if self.silence.next_sample.is_some_and(|t| now < t) {
            return Event::Nothing;
        }
        self.silence.next_sample = now.checked_add((window / 16).max(Duration::from_millis(1)));
        let quiet = if beats {
            self.path(a).unanswered(now, MAX_AHEAD)
        } else {
            self.path(a).qp.link_silence()
        };
        let Some(quiet) = quiet else {
            self.silence.clear();
            return Event::Nothing;
        };
        let silent = quiet.min(out_for);
        let Some(to) = self.move_target(a, true).filter(|_| silent >= window) else {
            // The link answers, or there is nothing verified to move to (the soft timeout and
            // the fabric's retry window decide then).
            self.silence.clear();
            return Event::Nothing;
        };
        let s = match self.silence.suspect {
            Some(s) if s.path == a && s.to == to && quiet >= now.duration_since(s.since) => s,
            _ => {
                // A new suspicion (or the link answered since the last one): ask the standby.
                self.silence.clear();
                self.silence.suspect = Some(Suspect {
                    path: a,
                    to,
                    since: now,
                });
                tracing::debug!(
                    "NET/HA : {}: path {a}: link silent for {silent:?}: asking path {to}",
                    self.name
                );
                return self.ask(to);
            }
        };
        match self.path(to).last_answer().filter(|&r| r >= s.since) {
            Some(r) if now.duration_since(r) >= margin(window) => {
                self.silence.suspect = None;
                // If the path re-arms at the first attempt, this was a false alarm.
                self.soft_lost = Some(a);
                let cause = format!(
                    "link silent for {} ms (nothing acknowledged below the peer's threads, HA_NCCL_SILENCE_MS {} ms) while path {to} answers",
                    silent.as_millis(),
                    window.as_millis()
                );
                self.soft_failover(a, cause, true)
            }
            Some(_) => Event::Nothing,
            None if self.path(to).probe_in_flight() => Event::Nothing,
            // The probe completed before the suspicion (or not at all): ask again.
            None => self.ask(to),
        }
    }

    /// Where the fabric says nothing of its link (`verbs`): a beat — a zero-length write, which
    /// the peer's NIC acknowledges whether or not the peer's process runs — on the active path
    /// every quarter window while the connection waits or has work out there, unless a probe is
    /// on its way or more than [`MAX_AHEAD`] payload bytes are ahead of it (a beat behind a large
    /// write would only measure the write).
    fn beat(&mut self, a: usize, now: Instant, window: Duration) -> Result<(), Event> {
        let busy = self.waiting_since.is_some() || self.path(a).oldest_posted().is_some();
        let addr = self.peer_addr;
        let p = self.path_mut(a);
        if !busy || !p.probe_due(now, window / 4) || p.unanswered(now, MAX_AHEAD).is_none() {
            return Ok(());
        }
        if let Err(e) = p.probe(addr) {
            self.silence.clear();
            return Err(self.path_error(
                a,
                crate::fabric::WcStatus::LocQpOpErr,
                format!("beat: {e}"),
            ));
        }
        self.silence.beats += 1;
        Ok(())
    }

    /// Probe the standby `to` now (unless a probe is already on its way there).
    fn ask(&mut self, to: usize) -> Event {
        let addr = self.peer_addr;
        let p = self.path_mut(to);
        if p.probe_in_flight() {
            return Event::Nothing;
        }
        match p.probe(addr) {
            Ok(()) => Event::Nothing,
            Err(e) => {
                self.silence.clear();
                self.path_error(
                    to,
                    crate::fabric::WcStatus::LocQpOpErr,
                    format!("probe: {e}"),
                )
            }
        }
    }
}
