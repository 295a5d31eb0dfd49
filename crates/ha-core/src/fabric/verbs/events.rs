//! Asynchronous device events (`ibv_get_async_event`) as the verbs fabric reports them: per
//! fabric device (one HCA port) a health flag, an event counter and the recent events, which
//! a consumer (the failover engine) reads or waits on.
//!
//! Health: `PORT_ERR` clears it, `PORT_ACTIVE` sets it again, `DEVICE_FATAL` clears it for
//! good, `CQ_ERR` (the device's shared completion queue overran: completions of every
//! connection on it may be lost, so none of them can trust its accounting) clears it until the
//! device is opened afresh (with new queues). GID/LID changes and QP errors are counted and
//! kept but leave the flag alone (a QP error is that connection's business; its completions
//! say so too). Events arrive only while the device is open (some PD of it is alive); each
//! `open_pd` re-reads the port state.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Kind of an asynchronous event (`ibv_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEventKind {
    CqErr,
    QpFatal,
    QpReqErr,
    QpAccessErr,
    CommEstablished,
    SqDrained,
    PathMigrated,
    PathMigErr,
    DeviceFatal,
    PortActive,
    PortErr,
    LidChange,
    PkeyChange,
    SmChange,
    SrqErr,
    SrqLimitReached,
    QpLastWqeReached,
    ClientReregister,
    GidChange,
    WqFatal,
    Other(u32),
}

impl AsyncEventKind {
    pub fn from_raw(t: u32) -> AsyncEventKind {
        use AsyncEventKind::*;
        match t {
            0 => CqErr,
            1 => QpFatal,
            2 => QpReqErr,
            3 => QpAccessErr,
            4 => CommEstablished,
            5 => SqDrained,
            6 => PathMigrated,
            7 => PathMigErr,
            8 => DeviceFatal,
            9 => PortActive,
            10 => PortErr,
            11 => LidChange,
            12 => PkeyChange,
            13 => SmChange,
            14 => SrqErr,
            15 => SrqLimitReached,
            16 => QpLastWqeReached,
            17 => ClientReregister,
            18 => GidChange,
            19 => WqFatal,
            n => Other(n),
        }
    }

    /// Events about one queue pair (the event carries a QP).
    pub fn is_qp_event(self) -> bool {
        use AsyncEventKind::*;
        matches!(
            self,
            QpFatal
                | QpReqErr
                | QpAccessErr
                | CommEstablished
                | SqDrained
                | PathMigrated
                | PathMigErr
                | QpLastWqeReached
        )
    }

    /// Errors (logged at warn level).
    pub fn is_error(self) -> bool {
        use AsyncEventKind::*;
        matches!(
            self,
            CqErr
                | QpFatal
                | QpReqErr
                | QpAccessErr
                | PathMigErr
                | DeviceFatal
                | PortErr
                | SrqErr
                | WqFatal
        )
    }
}

/// One event as recorded for a fabric device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// 1-based position in this device's event sequence (equals the counter after it).
    pub seq: u64,
    pub kind: AsyncEventKind,
    /// Queue pair the event is about, for QP events.
    pub qp_num: Option<u32>,
    pub at: Instant,
}

/// How many recent events a device keeps.
const RECENT: usize = 64;

struct State {
    healthy: bool,
    fatal: bool,
    /// A completion queue of this device overran (until the device is opened afresh).
    cq_lost: bool,
    count: u64,
    recent: VecDeque<AsyncEvent>,
}

/// Health and events of one fabric device.
pub struct PortEvents {
    name: String,
    state: Mutex<State>,
    cv: Condvar,
}

impl PortEvents {
    pub fn new(name: String, healthy: bool) -> PortEvents {
        PortEvents {
            name,
            state: Mutex::new(State {
                healthy,
                fatal: false,
                cq_lost: false,
                count: 0,
                recent: VecDeque::with_capacity(RECENT),
            }),
            cv: Condvar::new(),
        }
    }

    /// Device name (`rxe0a:1`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// False after `PORT_ERR` (until `PORT_ACTIVE`), after `CQ_ERR` (until reopened) and
    /// forever after `DEVICE_FATAL`.
    pub fn healthy(&self) -> bool {
        self.state.lock().healthy
    }

    /// Events recorded so far (of every kind).
    pub fn event_count(&self) -> u64 {
        self.state.lock().count
    }

    /// The kept events with `seq > after`, oldest first (at most the last 64).
    pub fn events_after(&self, after: u64) -> Vec<AsyncEvent> {
        let s = self.state.lock();
        s.recent.iter().filter(|e| e.seq > after).copied().collect()
    }

    /// Wait up to `timeout` for an event with `seq > after` that satisfies `pred`.
    pub fn wait_for(
        &self,
        after: u64,
        timeout: Duration,
        pred: impl Fn(&AsyncEvent) -> bool,
    ) -> Option<AsyncEvent> {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock();
        loop {
            if let Some(e) = s.recent.iter().find(|e| e.seq > after && pred(e)) {
                return Some(*e);
            }
            if self.cv.wait_until(&mut s, deadline).timed_out() {
                return s.recent.iter().find(|e| e.seq > after && pred(e)).copied();
            }
        }
    }

    /// Record an event and apply its effect on health.
    pub fn record(&self, kind: AsyncEventKind, qp_num: Option<u32>) -> AsyncEvent {
        let mut s = self.state.lock();
        match kind {
            AsyncEventKind::PortErr => s.healthy = false,
            AsyncEventKind::PortActive => s.healthy = !s.fatal && !s.cq_lost,
            AsyncEventKind::CqErr => {
                s.cq_lost = true;
                s.healthy = false;
            }
            AsyncEventKind::DeviceFatal => {
                s.fatal = true;
                s.healthy = false;
            }
            _ => {}
        }
        s.count += 1;
        let e = AsyncEvent {
            seq: s.count,
            kind,
            qp_num,
            at: Instant::now(),
        };
        if s.recent.len() == RECENT {
            s.recent.pop_front();
        }
        s.recent.push_back(e);
        self.cv.notify_all();
        e
    }

    /// Set health from a fresh port query (device (re)opened, its queues new), unless the
    /// device died.
    pub fn set_port_active(&self, active: bool) {
        let mut s = self.state.lock();
        s.cq_lost = false;
        s.healthy = active && !s.fatal;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn health_transitions() {
        let p = PortEvents::new("d:1".into(), true);
        assert!(p.healthy());
        p.record(AsyncEventKind::GidChange, None);
        assert!(p.healthy());
        p.record(AsyncEventKind::PortErr, None);
        assert!(!p.healthy());
        p.record(AsyncEventKind::PortActive, None);
        assert!(p.healthy());
        p.record(AsyncEventKind::QpFatal, Some(17));
        assert!(p.healthy());
        p.record(AsyncEventKind::DeviceFatal, None);
        p.record(AsyncEventKind::PortActive, None);
        p.set_port_active(true);
        assert!(!p.healthy(), "fatal is sticky");
        assert_eq!(p.event_count(), 6);
        let kinds: Vec<_> = p.events_after(4).iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [AsyncEventKind::DeviceFatal, AsyncEventKind::PortActive]
        );
        assert_eq!(p.events_after(0)[3].qp_num, Some(17));
    }

    /// A completion-queue overrun loses completions of every connection on the device: their
    /// paths there must fail over (before, `CQ_ERR` left the device healthy and the
    /// connections waited on completions that were gone).
    #[test]
    fn a_completion_queue_overrun_makes_the_device_unhealthy_until_reopened() {
        let p = PortEvents::new("d:1".into(), true);
        p.record(AsyncEventKind::CqErr, None);
        assert!(!p.healthy(), "CQ_ERR must take the device out of service");
        p.record(AsyncEventKind::PortActive, None);
        assert!(!p.healthy(), "a port event does not repair a lost queue");
        p.set_port_active(true);
        assert!(p.healthy(), "reopened with fresh queues: usable again");
    }

    #[test]
    fn keeps_the_last_64() {
        let p = PortEvents::new("d:1".into(), true);
        for _ in 0..100 {
            p.record(AsyncEventKind::GidChange, None);
        }
        let all = p.events_after(0);
        assert_eq!(all.len(), 64);
        assert_eq!(all[0].seq, 37);
        assert_eq!(all[63].seq, 100);
    }

    #[test]
    fn wait_for_wakes_on_record() {
        let p = Arc::new(PortEvents::new("d:1".into(), true));
        p.record(AsyncEventKind::PortErr, None);
        let after = p.event_count();
        let p2 = p.clone();
        let t = std::thread::spawn(move || {
            p2.wait_for(after, Duration::from_secs(30), |e| {
                e.kind == AsyncEventKind::PortActive
            })
        });
        p.record(AsyncEventKind::GidChange, None);
        p.record(AsyncEventKind::PortActive, None);
        let e = t.join().unwrap().expect("event");
        assert_eq!((e.seq, e.kind), (3, AsyncEventKind::PortActive));
        // Already-seen events do not satisfy a later wait.
        assert!(p.wait_for(3, Duration::from_millis(1), |_| true).is_none());
    }

    #[test]
    fn raw_kinds() {
        use ibverbs_sys as sys;
        let k = AsyncEventKind::from_raw;
        assert_eq!(k(sys::IBV_EVENT_PORT_ERR), AsyncEventKind::PortErr);
        assert_eq!(k(sys::IBV_EVENT_PORT_ACTIVE), AsyncEventKind::PortActive);
        assert_eq!(k(sys::IBV_EVENT_GID_CHANGE), AsyncEventKind::GidChange);
        assert_eq!(k(sys::IBV_EVENT_DEVICE_FATAL), AsyncEventKind::DeviceFatal);
        assert_eq!(k(sys::IBV_EVENT_QP_FATAL), AsyncEventKind::QpFatal);
        assert_eq!(k(sys::IBV_EVENT_CQ_ERR), AsyncEventKind::CqErr);
        assert_eq!(k(sys::IBV_EVENT_WQ_FATAL), AsyncEventKind::WqFatal);
        assert_eq!(AsyncEventKind::from_raw(77), AsyncEventKind::Other(77));
        assert!(AsyncEventKind::QpReqErr.is_qp_event());
        assert!(!AsyncEventKind::CqErr.is_qp_event());
        assert!(AsyncEventKind::PortErr.is_error() && !AsyncEventKind::PortActive.is_error());
    }
}
