//! One connection's counters as atomics ([`ConnStats`]), so the stats writer can read them
//! while the link (on NCCL's thread) counts into them, and the events the link reports through
//! them. Only the link writes; relaxed ordering is enough (each value is read on its own).

use super::format::{nums, strs, Field, Line};
use super::{unix_ms, unix_ms_at, writer, Stats};
use crate::fabric::counters;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// A counter the link increments and any thread reads.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Bytes and work requests posted on one path index (across the queue pairs it had).
#[derive(Debug, Default)]
pub struct PathCounters {
    pub bytes: Counter,
    pub wrs: Counter,
}

/// A path's handle on its counters (a path not yet part of a link counts into its own).
pub type PathMeter = Arc<PathCounters>;

/// What the standby path is worth right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standby {
    /// Connected and proven by a completion: a failover has somewhere to go.
    Ok,
    /// Connected, not proven yet (just after setup or a re-arm).
    Verifying,
    /// Lost; a re-arm is under way.
    Rearming,
    /// Lost: no redundancy until it is re-armed.
    Lost,
    /// The connection has one path (`HA_NCCL_ENABLE_BACKUP=0`, or a peer without a standby).
    None,
}

impl Standby {
    const ALL: [Standby; 5] = [
        Standby::Ok,
        Standby::Verifying,
        Standby::Rearming,
        Standby::Lost,
        Standby::None,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Standby::Ok => "ok",
            Standby::Verifying => "verifying",
            Standby::Rearming => "rearming",
            Standby::Lost => "lost",
            Standby::None => "none",
        }
    }
}

/// Where the connection stands: the active path, the failover phase, the standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    pub active: usize,
    /// `normal`, `failing` or `dead`.
    pub phase: &'static str,
    pub standby: Standby,
}

const PHASES: [&str; 4] = ["normal", "failing", "dead", "planned"];

/// What moved traffic from one path to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchKind {
    Failover,
    /// Back to the preferred path once it was healthy for the return hold.
    Return,
    /// Off a device an operator drained.
    Drain,
}

impl SwitchKind {
    pub fn name(self) -> &'static str {
        match self {
            SwitchKind::Failover => "failover",
            SwitchKind::Return => "return",
            SwitchKind::Drain => "drain",
        }
    }
}

/// The live counters and state of one connection, and who it is.
#[derive(Debug)]
pub struct ConnStats {
    /// Process-unique connection number.
    pub id: u64,
    /// The link's name (`send [dev 0 qp 5 | dev 1 qp 6]`).
    pub comm: String,
    pub role: &'static str,
    /// Device name of each path.
    pub devices: Vec<String>,
    /// `HA_NCCL_STATS_FILE` (empty: none).
    pub file: String,
    pub paths: [PathMeter; 2],
    pub failovers: Counter,
    pub replays: Counter,
    pub rearms: Counter,
    pub rearm_failed: Counter,
    pub standby_lost: Counter,
    pub stale_dropped: Counter,
    pub late_ticks: Counter,
    pub last_failover_unix_ms: Counter,
    pub last_failover_us: Counter,
    pub returns: Counter,
    pub drains: Counter,
    pub plans_aborted: Counter,
    pub rearm_attempts: Counter,
    /// Since when the failed path had work waiting (at the detection of the failover under
    /// way; 0: none).
    waiting_since_unix_ms: Counter,
    active: AtomicUsize,
    phase: AtomicU8,
    standby: AtomicU8,
    closed: AtomicBool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// This host's name (`/proc/sys/kernel/hostname`; empty if unreadable).
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

impl ConnStats {
    pub fn new(role: &'static str, comm: String, devices: Vec<String>, file: &str) -> ConnStats {
        let paths = devices.len();
        ConnStats {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            comm,
            role,
            devices,
            file: file.to_string(),
            paths: Default::default(),
            failovers: Counter::default(),
            replays: Counter::default(),
            rearms: Counter::default(),
            rearm_failed: Counter::default(),
            standby_lost: Counter::default(),
            stale_dropped: Counter::default(),
            late_ticks: Counter::default(),
            last_failover_unix_ms: Counter::default(),
            last_failover_us: Counter::default(),
            returns: Counter::default(),
            drains: Counter::default(),
            plans_aborted: Counter::default(),
            rearm_attempts: Counter::default(),
            waiting_since_unix_ms: Counter::default(),
            active: AtomicUsize::new(0),
            phase: AtomicU8::new(0),
            standby: AtomicU8::new(if paths > 1 { 1 } else { 4 }),
            closed: AtomicBool::new(false),
        }
    }

    /// The counters of path `i`.
    pub fn meter(&self, i: usize) -> PathMeter {
        self.paths[i.min(1)].clone()
    }

    pub fn snapshot(&self, duplicates: u64) -> Stats {
        Stats {
            bytes: [self.paths[0].bytes.get(), self.paths[1].bytes.get()],
            wrs: [self.paths[0].wrs.get(), self.paths[1].wrs.get()],
            failovers: self.failovers.get(),
            replays: self.replays.get(),
            duplicates,
            rearms: self.rearms.get(),
            rearm_failed: self.rearm_failed.get(),
            standby_lost: self.standby_lost.get(),
            stale_dropped: self.stale_dropped.get(),
            late_ticks: self.late_ticks.get(),
            last_failover_unix_ms: self.last_failover_unix_ms.get(),
            last_failover_us: self.last_failover_us.get(),
            returns: self.returns.get(),
            drains: self.drains.get(),
            plans_aborted: self.plans_aborted.get(),
            rearm_attempts: self.rearm_attempts.get(),
        }
    }

    pub fn state(&self) -> State {
        State {
            active: self.active.load(Ordering::Relaxed),
            phase: PHASES[self.phase.load(Ordering::Relaxed) as usize % PHASES.len()],
            standby: Standby::ALL[self.standby.load(Ordering::Relaxed) as usize % 5],
        }
    }

    /// Record where the connection stands.
    pub fn publish(&self, s: State) {
        self.active.store(s.active, Ordering::Relaxed);
        let phase = PHASES.iter().position(|p| *p == s.phase).unwrap_or(0);
        self.phase.store(phase as u8, Ordering::Relaxed);
        let standby = Standby::ALL
            .iter()
            .position(|b| *b == s.standby)
            .unwrap_or(0);
        self.standby.store(standby as u8, Ordering::Relaxed);
    }

    fn dev(&self, path: usize) -> String {
        self.devices.get(path).cloned().unwrap_or_default()
    }

    /// A line of this connection: the event, then who it is.
    fn line(&self, event: &str, at_ms: u64) -> Line {
        Line::new(event, at_ms)
            .field("host", host())
            .field("pid", std::process::id() as u64)
            .field("conn", self.id)
            .field("comm", self.comm.as_str())
            .field("role", self.role)
    }

    /// The state and counters (periodic and closing lines).
    fn with_counters(&self, mut l: Line) -> Line {
        let s = self.snapshot(0);
        let st = self.state();
        for (k, v) in [
            ("devices", strs(&self.devices)),
            ("active", Field::Num(st.active as u64)),
            ("phase", st.phase.into()),
            ("standby", st.standby.name().into()),
            ("bytes", nums(&s.bytes)),
            ("wrs", nums(&s.wrs)),
            ("failovers", s.failovers.into()),
            ("replays", s.replays.into()),
            ("rearms", s.rearms.into()),
            ("rearm_failed", s.rearm_failed.into()),
            ("standby_lost", s.standby_lost.into()),
            ("stale_dropped", s.stale_dropped.into()),
            ("late_ticks", s.late_ticks.into()),
            ("last_failover_unix_ms", s.last_failover_unix_ms.into()),
            ("last_failover_us", s.last_failover_us.into()),
            ("returns", s.returns.into()),
            ("drains", s.drains.into()),
            ("plans_aborted", s.plans_aborted.into()),
            ("rearm_attempts", s.rearm_attempts.into()),
        ] {
            l.push(k, &v);
        }
        l
    }

    /// Append an event line now (when there is a stats file).
    pub fn event(&self, event: &str, fields: &[(&str, Field)]) {
        if self.file.is_empty() {
            return;
        }
        let mut l = self.line(event, unix_ms());
        for (k, v) in fields {
            l.push(k, v);
        }
        writer::append(&self.file, &l.finish());
    }

    /// The connection is established.
    pub fn opened(&self) {
        let devs = strs(&self.devices);
        self.event("open", &[("devices", devs)]);
    }

    /// A failover started: the failed path had work waiting since `waiting` (if any).
    pub fn detected(&self, waiting: Option<Instant>) {
        self.waiting_since_unix_ms
            .set(waiting.map_or(0, unix_ms_at));
    }

    /// A failover finished: traffic moved from path `from` to `to`, `replayed` requests posted
    /// again, after detection at `since` for `cause`. Returns how long it took (µs).
    pub fn failover(
        &self,
        from: usize,
        to: usize,
        cause: &str,
        since: Instant,
        replayed: u64,
    ) -> u64 {
        let took_us = since.elapsed().as_micros() as u64;
        let now = unix_ms();
        let detect = unix_ms_at(since);
        let waiting = self.waiting_since_unix_ms.get();
        let stall_from = if waiting > 0 {
            waiting.min(detect)
        } else {
            detect
        };
        self.failovers.inc();
        self.replays.add(replayed);
        self.last_failover_unix_ms.set(now);
        self.last_failover_us.set(took_us);
        self.event(
            "failover",
            &[
                ("from", from.into()),
                ("to", to.into()),
                ("from_dev", self.dev(from).into()),
                ("to_dev", self.dev(to).into()),
                ("cause", cause.into()),
                ("detect_unix_ms", detect.into()),
                ("waiting_since_unix_ms", waiting.into()),
                ("took_us", took_us.into()),
                ("stall_ms", now.saturating_sub(stall_from).into()),
                ("replayed", replayed.into()),
                ("failovers", self.failovers.get().into()),
            ],
        );
        took_us
    }

    /// The standby path `path` was lost for `cause`.
    pub fn lost_standby(&self, path: usize, cause: &str) {
        self.standby_lost.inc();
        self.event(
            "standby_lost",
            &[
                ("path", path.into()),
                ("dev", self.dev(path).into()),
                ("cause", cause.into()),
            ],
        );
    }

    /// The connection is lost (`cause`): written at that moment, so the stats file says so even
    /// when the process ends without closing the connection (the job aborting on the error).
    pub fn lost(&self, cause: &str) {
        self.event("lost", &[("phase", "dead".into()), ("cause", cause.into())]);
    }

    /// Path `path` is back as the standby (re-armed and verified).
    pub fn rearmed(&self, path: usize) {
        self.rearms.inc();
        self.event(
            "rearmed",
            &[
                ("path", path.into()),
                ("dev", self.dev(path).into()),
                ("rearms", self.rearms.get().into()),
            ],
        );
    }

    /// The active path changed from `from` to `to` (`kind`: a failover, a return home, a
    /// drain) in `took_us`, now at `epoch`: the event carries the data bytes each path had
    /// carried at that moment, so a run's lines show bytes per path before a cut, during the
    /// failover and after the return.
    pub fn switched(&self, kind: SwitchKind, from: usize, to: usize, epoch: u32, took_us: u64) {
        let bytes = [self.paths[0].bytes.get(), self.paths[1].bytes.get()];
        self.event(
            "switch",
            &[
                ("kind", kind.name().into()),
                ("from", from.into()),
                ("to", to.into()),
                ("from_dev", self.dev(from).into()),
                ("to_dev", self.dev(to).into()),
                ("epoch", u64::from(epoch).into()),
                ("took_us", took_us.into()),
                ("bytes", nums(&bytes)),
            ],
        );
    }

    /// The periodic line at `now_ms`; `None` once the connection closed.
    pub(super) fn periodic(&self, now_ms: u64, interval_ms: u64) -> Option<String> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let l = self
            .line("periodic", now_ms)
            .field("interval_ms", interval_ms);
        Some(self.with_counters(l).finish())
    }

    /// The closing line (counters, `duplicates` dropped, the process's live resources).
    pub fn closing_line(&self, duplicates: u64, at_ms: u64, res: &counters::Resources) -> String {
        let l = self.with_counters(self.line("closed", at_ms));
        l.field("duplicates_dropped", duplicates)
            .field("resources", Field::Raw(res.to_json()))
            .finish()
    }

    /// The connection closes: log its statistics and append the closing line. No periodic
    /// line of it follows (the writer checks under the same lock it appends under).
    pub fn close(&self, duplicates: u64) {
        self.closed.store(true, Ordering::Release);
        let line = self.closing_line(duplicates, unix_ms(), &counters::snapshot());
        tracing::info!("NET/HA : stats {line}");
        if !self.file.is_empty() {
            writer::append(&self.file, &line);
        }
    }
}

impl writer::Source for ConnStats {
    fn file(&self) -> &str {
        &self.file
    }
    fn periodic(&self, now_ms: u64, interval_ms: u64) -> Option<String> {
        ConnStats::periodic(self, now_ms, interval_ms)
    }
}

/// A link's statistics: the counters, registered with the stats writer while the link lives
/// when there is a stats file.
#[derive(Debug)]
pub struct LiveStats {
    conn: Arc<ConnStats>,
    registered: bool,
}

impl LiveStats {
    pub fn new(conn: ConnStats) -> LiveStats {
        let conn = Arc::new(conn);
        let registered = !conn.file.is_empty();
        if registered {
            writer::register(conn.clone() as Arc<dyn writer::Source>);
        }
        LiveStats { conn, registered }
    }
}

impl std::ops::Deref for LiveStats {
    type Target = ConnStats;
    fn deref(&self) -> &ConnStats {
        &self.conn
    }
}

impl Drop for LiveStats {
    fn drop(&mut self) {
        if self.registered {
            writer::unregister(&(self.conn.clone() as Arc<dyn writer::Source>));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::counters::Resources;

    #[test]
    fn closing_line_has_every_field() {
        let c = ConnStats::new("send", "c1".into(), vec!["r0".into(), "r1".into()], "");
        c.paths[0].bytes.add(10);
        c.paths[1].bytes.add(20);
        c.paths[0].wrs.add(1);
        c.paths[1].wrs.add(2);
        c.replays.add(3);
        c.rearm_failed.add(6);
        c.standby_lost.add(2);
        c.stale_dropped.add(3);
        c.late_ticks.add(4);
        c.rearms.inc();
        c.failovers.inc();
        c.last_failover_unix_ms.set(5);
        c.last_failover_us.set(700);
        c.returns.add(2);
        c.drains.inc();
        c.plans_aborted.add(3);
        c.rearm_attempts.set(9);
        c.publish(State {
            active: 1,
            phase: "normal",
            standby: Standby::Lost,
        });
        let r = Resources {
            pds: 2,
            qps: 4,
            cqs: 2,
            mrs: 3,
            threads: 9,
            sockets: 12,
            connections: 2,
        };
        let j = c.closing_line(0, 99, &r);
        let head = format!(
            "{{\"event\":\"closed\",\"unix_ms\":99,\"host\":{},\"pid\":{},\"conn\":{},",
            super::super::json_str(host()),
            std::process::id(),
            c.id
        );
        assert_eq!(
            j,
            head + "\"comm\":\"c1\",\"role\":\"send\",\"devices\":[\"r0\",\"r1\"],\"active\":1,\"phase\":\"normal\",\"standby\":\"lost\",\"bytes\":[10,20],\"wrs\":[1,2],\"failovers\":1,\"replays\":3,\"rearms\":1,\"rearm_failed\":6,\"standby_lost\":2,\"stale_dropped\":3,\"late_ticks\":4,\"last_failover_unix_ms\":5,\"last_failover_us\":700,\"returns\":2,\"drains\":1,\"plans_aborted\":3,\"rearm_attempts\":9,\"duplicates_dropped\":0,\"resources\":{\"pds\":2,\"qps\":4,\"cqs\":2,\"mrs\":3,\"threads\":9,\"sockets\":12,\"connections\":2}}"
        );
        assert_eq!(c.snapshot(7).duplicates, 7);
        assert_eq!(c.state().standby, Standby::Lost);
        // Closed: no more periodic lines.
        assert!(c.periodic(100, 10).is_some());
        c.close(0);
        assert_eq!(c.periodic(101, 10), None);
    }

    #[test]
    fn a_failover_sets_the_last_failover_and_the_stall_from_the_waiting_work() {
        let c = ConnStats::new("send", "c".into(), vec!["a".into(), "b".into()], "");
        let since = Instant::now();
        c.detected(Some(since - std::time::Duration::from_millis(300)));
        let took = c.failover(0, 1, "x", since, 4);
        assert_eq!((c.failovers.get(), c.replays.get()), (1, 4));
        assert_eq!(c.last_failover_us.get(), took);
        assert!(c.last_failover_unix_ms.get() >= unix_ms_at(since));
        assert_eq!(
            c.state().standby,
            Standby::Verifying,
            "two paths, none proven"
        );
        let one = ConnStats::new("recv", "c".into(), vec!["a".into()], "");
        assert_eq!(one.state().standby, Standby::None);
    }
}
