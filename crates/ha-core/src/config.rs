//! Configuration: one declarative table of every `HA_NCCL_*` knob.
//!
//! [`PARAMS`] is the single source of truth: [`Config::from_lookup`] reads and validates every
//! row, and [`markdown_table`] renders the README's configuration table from it.

use std::fmt::Write as _;
use std::time::Duration;

/// The value type of a knob, which decides how its text is parsed and validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One of the listed words (matched case-insensitively).
    Enum(&'static [&'static str]),
    /// `0`/`1`/`true`/`false`/`yes`/`no` (case-insensitive).
    Bool,
    /// Decimal integer that fits in 32 bits.
    U32,
    /// Decimal integer that fits in 64 bits.
    U64,
    /// Decimal number of milliseconds.
    Millis,
    /// Byte count: a decimal number with an optional `K`/`M`/`G` (or `KiB`/`MiB`/`GiB`) suffix,
    /// powers of 1024.
    Bytes,
    /// Comma-separated items, no empty items, no whitespace inside an item; `""` = empty list.
    List,
    /// Free text.
    Str,
}

/// One knob: its environment variable, type, default (as text, parsed like a user value) and
/// a one-line description.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    pub name: &'static str,
    pub kind: Kind,
    pub default: &'static str,
    pub doc: &'static str,
    /// Inclusive bounds for numeric kinds (`U32`, `U64`, `Millis`, `Bytes`), in the kind's unit.
    pub range: Option<(u64, u64)>,
}

/// Which fabric carries the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricKind {
    /// Real InfiniBand / RoCE through ibverbs.
    Verbs,
    /// RC semantics emulated over TCP rails.
    Sock,
}

impl FabricKind {
    /// Every variant, in the order of [`FabricKind::NAMES`].
    pub const ALL: [FabricKind; 2] = [FabricKind::Verbs, FabricKind::Sock];
    /// The `HA_NCCL_FABRIC` spelling of each variant.
    pub const NAMES: &'static [&'static str] = &["verbs", "sock"];

    pub fn name(self) -> &'static str {
        match self {
            FabricKind::Verbs => "verbs",
            FabricKind::Sock => "sock",
        }
    }
}

impl std::fmt::Display for FabricKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

pub const FABRIC: Param = Param {
    name: "HA_NCCL_FABRIC",
    kind: Kind::Enum(FabricKind::NAMES),
    default: "verbs",
    doc: "Fabric under the plugin: `verbs` for InfiniBand/RoCE NICs, `sock` to emulate RC queue pairs over TCP (hosts without RDMA, CI).",
    range: None,
};

pub const SOCK_RAILS: Param = Param {
    name: "HA_NCCL_SOCK_RAILS",
    kind: Kind::List,
    default: "",
    doc: "`sock` fabric: interface names or IP addresses, one per rail (each rail is one device to NCCL); empty = the interface `NCCL_SOCKET_IFNAME` selects.",
    range: None,
};

pub const SOCK_RETRY_MS: Param = Param {
    name: "HA_NCCL_SOCK_RETRY_MS",
    kind: Kind::Millis,
    default: "500",
    doc: "`sock` fabric: retry window. A queue pair whose work gets no answer for this long AND whose TCP stream has waited this long for any acknowledgement from the peer's kernel fails with `RETRY_EXC_ERR` (a stopped peer's kernel still acknowledges: it is waited for).",
    range: Some((250, u64::MAX)),
};

pub const SOCK_SEGMENT: Param = Param {
    name: "HA_NCCL_SOCK_SEGMENT",
    kind: Kind::Bytes,
    default: "1M",
    doc: "`sock` fabric: largest chunk one RDMA operation is cut into on the wire.",
    range: Some((4 * KIB, 64 * MIB)),
};

pub const SOCK_INLINE: Param = Param {
    name: "HA_NCCL_SOCK_INLINE",
    kind: Kind::Bytes,
    default: "8K",
    doc: "`sock` fabric: a message of at most this many payload bytes (a post whose last write carries an immediate) is written onto the stream by the posting thread itself when the stream is free: no hand-off to the queue pair's sender thread on the small-message path; 0 = always the sender thread. One above 4 KiB (a fixed threshold: at 4K or less this rule never applies) only when no other queue pair of the process has posted one in the last 500 µs (NCCL's 8 KiB all_reduce, one channel): when several channels send them, their writes stay with their sender threads, which write in parallel instead of one after another in NCCL's proxy thread (bench/results/2026-11-27-compact-cts.md). Larger messages, clear-to-send entries and probes stay with the sender thread, which batches them (inlining those cost mid-size all_reduce up to 40 %: bench/results/2026-11-26-sock-fast-path.md).",
    range: Some((0, MIB)),
};

pub const SOCK_EAGER: Param = Param {
    name: "HA_NCCL_SOCK_EAGER",
    kind: Kind::Bytes,
    default: "4K",
    doc: "`sock` fabric: a send of at most this many bytes whose clear-to-send has not arrived yet goes at once into an eager slot of the receiver (64 slots of 4 KiB per receive connection, ≈ 260 KiB of host memory), which copies it into the receive's buffer: a small message costs one trip instead of waiting for the receiver's clear-to-send. Applies to the receive connections of this process (the ring) and its sends (the limit). With it on, the devices advertise one buffer per receive (`maxRecvs` 1, as NCCL's Socket transport); 0 = off (`maxRecvs` 8, every send waits for its clear-to-send).",
    range: Some((0, 4 * KIB)),
};

pub const SOCK_SPIN_US: Param = Param {
    name: "HA_NCCL_SOCK_SPIN_US",
    kind: Kind::U64,
    default: "100",
    doc: "`sock` fabric: after the second small message (≤ 8 KiB: with two ranks, NCCL's LL steps of all_reduce up to 32 KiB) in a row, a queue pair's responder thread keeps polling its stream this many microseconds (yielding the CPU between polls) before it blocks in `recv` again, so the next step of a latency-bound collective is read by a running thread instead of one the kernel must wake (nccl-tests 8 B all_reduce 45 → 38 µs on an H100 host). A larger message ends the polling at once. Costs each receiving queue pair up to this much CPU time per small message; 0 = always block.",
    range: Some((0, 10_000)),
};

pub const SOCK_LANES: Param = Param {
    name: "HA_NCCL_SOCK_LANES",
    kind: Kind::U32,
    default: "4",
    doc: "`sock` fabric: TCP streams a queue pair spreads each WRITE of at least 512 KiB (NCCL's full pipeline step) over (its main stream plus this many minus one lanes, opened when the first such WRITE comes; each lane has a sender and a receiver thread). One stream carries what one core can copy through the kernel (bench/results/2026-11-27-sock-lanes.md); NCCL Socket's answer is `NCCL_NSOCKS_PERTHREAD`. 1 = one stream per queue pair.",
    range: Some((1, 8)),
};

pub const SOCK_DELACK_MAX_US: Param = Param {
    name: "HA_NCCL_SOCK_DELACK_MAX_US",
    kind: Kind::U64,
    default: "0",
    doc: "`sock` fabric (off by default: with 5000 CI's home drill once moved traffic off a freshly re-armed, healthy path after 32 ms of silence, bench/results/2026-11-28-sock-delack-cap.md): longest the kernel may hold back its acknowledgement of what arrives on a responder's stream (`TCP_DELACK_MAX_US`, in Linux since 2025, e.g. 6.18; an older kernel keeps its 40–200 ms, said once at INFO). A responder whose kernel took a cap of at most 10 ms says so in its ACKs, and its peer then counts a lone small segment's silence from the link's round trip instead of TCP's 200 ms retransmission timeout: link cuts under small messages found after 35–47 ms instead of up to 322 ms (bench/results/2026-11-28-sock-delack-cap.md). 0 = the kernel's. The kernel rounds it up to whole ticks of its clock and refuses less than about one tick (5000 becomes 8 ms at 250 Hz; 4000 and less are refused there); a cap it rounds above 10 ms works but earns no `PROMPT` (said once at INFO). At most 200000.",
    range: Some((0, 200_000)),
};

pub const SOCK_MAX_QP: Param = Param {
    name: "HA_NCCL_SOCK_MAX_QP",
    kind: Kind::U32,
    default: "0",
    doc: "`sock` fabric: emulate a device holding at most this many queue pairs per rail (one more fails to be created, as `ibv_create_qp` does; `maxComms` is budgeted from it); 0 = no limit. For tests of the connection budget.",
    range: None,
};

pub const SOCK_MAX_CQE: Param = Param {
    name: "HA_NCCL_SOCK_MAX_CQE",
    kind: Kind::U32,
    default: "0",
    doc: "`sock` fabric: emulate a device whose completion queues hold at most this many entries (one more overruns the queue: it loses completions and fails every later poll, as after `IBV_EVENT_CQ_ERR`; `maxComms` is budgeted from it); 0 = unbounded. For tests of the connection budget.",
    range: None,
};

pub const TEST_MAX_POLL: Param = Param {
    name: "HA_NCCL_TEST_MAX_POLL",
    kind: Kind::U32,
    default: "16",
    doc: "Most completions one `test()` call drains before returning.",
    range: Some((1, u32::MAX as u64)),
};

pub const PROGRESS_SPIN_US: Param = Param {
    name: "HA_NCCL_PROGRESS_SPIN_US",
    kind: Kind::U64,
    default: "50",
    doc: "Microseconds the progress thread keeps busy-polling after the last completion before it sleeps on its doorbell.",
    range: None,
};

pub const HANDSHAKE_TIMEOUT_MS: Param = Param {
    name: "HA_NCCL_HANDSHAKE_TIMEOUT_MS",
    kind: Kind::Millis,
    default: "30000",
    doc: "An out-of-band connection handshake that has not completed after this long is dropped.",
    range: Some((1, u64::MAX)),
};

pub const KEEPALIVE_MS: Param = Param {
    name: "HA_NCCL_KEEPALIVE_MS",
    kind: Kind::Millis,
    default: "1000",
    doc: "A connection waiting this long for its peer (a send with no posted receive, a receive with no data) probes the peer with a zero-length RDMA write, so a dead peer fails the request instead of hanging it.",
    range: Some((1, u64::MAX)),
};

pub const ENABLE_BACKUP: Param = Param {
    name: "HA_NCCL_ENABLE_BACKUP",
    kind: Kind::Bool,
    default: "1",
    doc: "Give every connection a standby path on a second device (rail); 0 = one path per connection.",
    range: None,
};

pub const STANDBY_MAP: Param = Param {
    name: "HA_NCCL_STANDBY_MAP",
    kind: Kind::Str,
    default: "",
    doc: "Standby device per primary device, `primary:standby` pairs separated by commas (e.g. `0:1,1:0`); empty = the nearest other device of the same link layer by PCI path.",
    range: None,
};

pub const RTO_MS: Param = Param {
    name: "HA_NCCL_RTO_MS",
    kind: Kind::Millis,
    default: "1000",
    doc: "Soft timeout: a work request on the active path with no completion for this long moves traffic to a verified standby (it never ends a connection). Keep it above the fabric's own retry window (`HA_NCCL_SOCK_RETRY_MS`, QP timeout x retries). The default comes from the Soft-RoCE calibration (bench/results/2026-11-26-softroce-detection-calibration.md): with `HA_NCCL_QP_TIMEOUT=14` it adds no false failover under 2 % packet loss and finds a blackhole in 0.4-0.75 s; 300 ms failed over on loss recovery.",
    range: Some((100, u64::MAX)),
};

pub const RTO_ADAPTIVE: Param = Param {
    name: "HA_NCCL_RTO_ADAPTIVE",
    kind: Kind::Bool,
    default: "1",
    doc: "Adaptive soft timeout: a soft failover (soft timeout or silent link) whose old path proves healthy at its first re-arm attempt (a false alarm: the path was only slow) doubles this connection's `HA_NCCL_RTO_MS` and `HA_NCCL_SILENCE_MS`, up to 8x; each 120 s without a false alarm halves them again, down to the configured values. One INFO line per change. 0 = always the configured values.",
    range: None,
};

pub const SILENCE_MS: Param = Param {
    name: "HA_NCCL_SILENCE_MS",
    kind: Kind::Millis,
    default: "25",
    doc: "Fast detection of a dead active link: when it answers nothing for this long, the standby is probed, and once the standby answered while the active link stayed silent, traffic moves to it (fenced failover, nothing lost). The signal lies below payload and below the peer's threads: on `sock` the peer's kernel's TCP acknowledgements (a 64 MiB write does not delay them; the link's round trip is allowed for), on `verbs` beats, zero-length writes on the active path every quarter of this window that the peer's NIC acknowledges (judged while at most 64 KiB of payload is ahead of them). What a live link may leave unanswered raises the window: on `sock` the peer kernel's delayed ACK (a 25 ms floor: the peer's responder sends a keep-alive, which carries the ACK, every 10 ms while it waits for a receive and does not read), on `verbs` twice the QP's local ACK timeout (`HA_NCCL_QP_TIMEOUT` 14: 134 ms; lower the timeout for faster detection on a lossless fabric). A stopped or descheduled peer answers on neither path: it is waited for. Widens with the adaptive soft timeout after false alarms. 0 = off (detection by the fabric's retry window and `HA_NCCL_RTO_MS` alone).",
    range: Some((0, 3_600_000)),
};

pub const HEARTBEAT_MS: Param = Param {
    name: "HA_NCCL_HEARTBEAT_MS",
    kind: Kind::Millis,
    default: "1000",
    doc: "Interval of the zero-length probe writes that check an idle standby path.",
    range: Some((1, u64::MAX)),
};

pub const FAILBACK: Param = Param {
    name: "HA_NCCL_FAILBACK",
    kind: Kind::Bool,
    default: "1",
    doc: "After a failover, rebuild a queue pair on the failed device once it works again and make it the new standby (redundancy restored); 0 = stay on one path.",
    range: None,
};

pub const REARM_HOLD_MS: Param = Param {
    name: "HA_NCCL_REARM_HOLD_MS",
    kind: Kind::Millis,
    default: "2000",
    doc: "Hold-down between a path failure and each attempt to re-arm it, so a flapping link cannot cause a failover storm.",
    range: Some((1, u64::MAX)),
};

pub const REARM_BACKOFF_MAX_MS: Param = Param {
    name: "HA_NCCL_REARM_BACKOFF_MAX_MS",
    kind: Kind::Millis,
    default: "60000",
    doc: "Re-arm attempts of a failed path that fail (the link is still down) wait longer each time: `HA_NCCL_REARM_HOLD_MS`, doubling up to this cap. They never stop while the connection lives; the port coming back (an asynchronous event) starts over from the hold-down.",
    range: Some((1, u64::MAX)),
};

pub const RETURN_HOME: Param = Param {
    name: "HA_NCCL_RETURN_HOME",
    kind: Kind::Bool,
    default: "1",
    doc: "Return home: once the path on the device NCCL chose has been healthy again (re-armed and verified) for `HA_NCCL_RETURN_HOLD_MS`, traffic moves back to it with a planned switch (drained, no replay, no error) and the other path is the standby again; 0 = stay on the path failed over to (a drained device is still left and returned to after undrain).",
    range: None,
};

pub const RETURN_HOLD_MS: Param = Param {
    name: "HA_NCCL_RETURN_HOLD_MS",
    kind: Kind::Millis,
    default: "5000",
    doc: "How long the preferred path must have been healthy again before traffic returns to it. A return followed by a failure of that path within `HA_NCCL_RETURN_HOLD_MAX_MS` doubles the hold (hysteresis: a flapping link does not pull traffic back and forth).",
    range: Some((1, u64::MAX)),
};

pub const RETURN_HOLD_MAX_MS: Param = Param {
    name: "HA_NCCL_RETURN_HOLD_MAX_MS",
    kind: Kind::Millis,
    default: "300000",
    doc: "Bound of the return hold's doubling, and the flap window: a return that lasts this long without a failure resets the hold to `HA_NCCL_RETURN_HOLD_MS`.",
    range: Some((1, u64::MAX)),
};

pub const DRAIN_FILE: Param = Param {
    name: "HA_NCCL_DRAIN_FILE",
    kind: Kind::Str,
    default: "/run/nccl-net-ha/drain",
    doc: "Operators' drain list, watched by every process using the plugin (checked at most every 100 ms): device or interface names (`mlx5_0`, `mlx5_0:1`, `sock:eth1`, `eth1`), one per line, `#` comments. Connections move off a listed device with a planned switch and stay off until it is removed (`ha-harness drain DEV` and `ha-harness undrain DEV` edit it); a connection with no other path keeps running and is reported. Empty = no drain control.",
    range: None,
};

pub const MR_POLICY: Param = Param {
    name: "HA_NCCL_MR_POLICY",
    kind: Kind::Enum(&["lazy", "eager"]),
    default: "lazy",
    doc: "When buffers are registered on the standby device: `lazy` = at the first failover that needs them, `eager` = at `regMr`. dma-buf registrations (`regMrDmaBuf`) are made on every device at once either way: NCCL closes the fd when the call returns.",
    range: None,
};

pub const STATS_FILE: Param = Param {
    name: "HA_NCCL_STATS_FILE",
    kind: Kind::Str,
    default: "",
    doc: "If set, per-connection statistics are appended here as JSON lines: an `open` line per connection, an event line at each failover, standby loss and re-arm, a `periodic` line per live connection every `HA_NCCL_STATS_INTERVAL_MS`, and a `closed` line (counters and live resources) at close (README: Live statistics). `ha-harness stats FILE` reads it; `ha-harness timeline` draws it.",
    range: None,
};

pub const STATS_INTERVAL_MS: Param = Param {
    name: "HA_NCCL_STATS_INTERVAL_MS",
    kind: Kind::Millis,
    default: "10000",
    doc: "With `HA_NCCL_STATS_FILE`: a `periodic` line per live connection (active path, standby state, bytes per path, counters) this often, written by a plugin thread that lives while connections do; 0 = events and closing lines only. Each line is about 600 bytes: mind many connections and short intervals.",
    range: Some((0, 86_400_000)),
};

pub const STAGES: Param = Param {
    name: "HA_NCCL_STAGES",
    kind: Kind::Str,
    default: "",
    doc: "Diagnostics: if set, stage timestamps (API calls, posts, completion polls, progress-thread wake-ups) are appended to `<value>.<pid>` at each close, for latency breakdowns (`scripts/stages.py`). Costs a lock per stage while on; off when empty.",
    range: None,
};

pub const QP_TIMEOUT: Param = Param {
    name: "HA_NCCL_QP_TIMEOUT",
    kind: Kind::U32,
    default: "14",
    doc: "`verbs`: RC local ACK timeout exponent (4.096 us x 2^n; 14 = 67 ms). With `HA_NCCL_QP_RETRY_CNT` it sets how fast a dead link fails a queue pair. The default comes from the Soft-RoCE calibration (bench/results/2026-11-26-softroce-detection-calibration.md): 16 (268 ms per lost packet) made loss recovery trip the 1 s soft timeout and doubled detection.",
    range: Some((1, 31)),
};

pub const QP_RETRY_CNT: Param = Param {
    name: "HA_NCCL_QP_RETRY_CNT",
    kind: Kind::U32,
    default: "7",
    doc: "`verbs`: RC transport retries before `RETRY_EXC_ERR` (0..7). Soft-RoCE (rxe) treats 7 as infinite: use 6 or less there.",
    range: Some((0, 7)),
};

pub const GDR: Param = Param {
    name: "HA_NCCL_GDR",
    kind: Kind::Enum(crate::fabric::verbs::gdr::GdrMode::NAMES),
    default: "auto",
    doc: "`verbs`: GPUDirect RDMA. `auto` = offer GPU memory (nvidia-peermem, dma-buf) on each device where detection finds it; `0` = host memory only (the CUDA driver is not loaded); `1` = required: init fails, naming each device and why, unless every device has it (with `sock` too, which has none).",
    range: None,
};

/// Why a lower bound is what it is, for the knobs whose floor is not obvious (said with the
/// error, so a refused value explains itself).
const FLOORS: &[(&str, &str)] = &[
    (
        "HA_NCCL_RTO_MS",
        "a soft timeout this short fires on healthy links (a loaded host does not run a process for that long) and fails connections over for nothing",
    ),
    (
        "HA_NCCL_SOCK_RETRY_MS",
        "a window this short declares healthy links dead: TCP itself waits up to 200 ms to acknowledge (delayed ACK) and at least 200 ms to retransmit",
    ),
];

/// Every knob, in documentation order.
pub const PARAMS: &[Param] = &[
    FABRIC,
    SOCK_RAILS,
    SOCK_RETRY_MS,
    SOCK_SEGMENT,
    SOCK_INLINE,
    SOCK_EAGER,
    SOCK_SPIN_US,
    SOCK_LANES,
    SOCK_DELACK_MAX_US,
    SOCK_MAX_QP,
    SOCK_MAX_CQE,
    TEST_MAX_POLL,
    PROGRESS_SPIN_US,
    HANDSHAKE_TIMEOUT_MS,
    KEEPALIVE_MS,
    ENABLE_BACKUP,
    STANDBY_MAP,
    RTO_MS,
    RTO_ADAPTIVE,
    SILENCE_MS,
    HEARTBEAT_MS,
    FAILBACK,
    REARM_HOLD_MS,
    REARM_BACKOFF_MAX_MS,
    RETURN_HOME,
    RETURN_HOLD_MS,
    RETURN_HOLD_MAX_MS,
    DRAIN_FILE,
    MR_POLICY,
    STATS_FILE,
    STATS_INTERVAL_MS,
    STAGES,
    QP_TIMEOUT,
    QP_RETRY_CNT,
    GDR,
];

/// Every knob's typed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `HA_NCCL_FABRIC`.
    pub fabric: FabricKind,
    /// `HA_NCCL_SOCK_RAILS` (empty = use the `NCCL_SOCKET_IFNAME` interface).
    pub sock_rails: Vec<String>,
    /// `HA_NCCL_SOCK_RETRY_MS`.
    pub sock_retry: Duration,
    /// `HA_NCCL_SOCK_SEGMENT`, in bytes.
    pub sock_segment: usize,
    /// `HA_NCCL_SOCK_INLINE`, in bytes.
    pub sock_inline: usize,
    /// `HA_NCCL_SOCK_EAGER`, in bytes (0: off).
    pub sock_eager: usize,
    /// `HA_NCCL_SOCK_SPIN_US`.
    pub sock_spin: Duration,
    /// `HA_NCCL_SOCK_LANES`: streams per queue pair for large WRITEs.
    pub sock_lanes: u16,
    /// `HA_NCCL_SOCK_DELACK_MAX_US` (`None`: 0, the kernel's).
    pub sock_delack_max: Option<Duration>,
    /// `HA_NCCL_SOCK_MAX_QP` (`None`: 0, no limit).
    pub sock_max_qp: Option<u32>,
    /// `HA_NCCL_SOCK_MAX_CQE` (`None`: 0, unbounded).
    pub sock_max_cqe: Option<u32>,
    /// `HA_NCCL_TEST_MAX_POLL`.
    pub test_max_poll: u32,
    /// `HA_NCCL_PROGRESS_SPIN_US`.
    pub progress_spin: Duration,
    /// `HA_NCCL_HANDSHAKE_TIMEOUT_MS`.
    pub handshake_timeout: Duration,
    /// `HA_NCCL_KEEPALIVE_MS`.
    pub keepalive: Duration,
    /// `HA_NCCL_ENABLE_BACKUP`.
    pub enable_backup: bool,
    /// `HA_NCCL_STANDBY_MAP`, raw (parsed against the device count by the transport).
    pub standby_map: String,
    /// `HA_NCCL_RTO_MS`.
    pub rto: Duration,
    /// `HA_NCCL_SILENCE_MS` (zero: off).
    pub silence: Duration,
    /// `HA_NCCL_HEARTBEAT_MS`.
    pub heartbeat: Duration,
    /// `HA_NCCL_FAILBACK`.
    pub failback: bool,
    /// `HA_NCCL_REARM_HOLD_MS`.
    pub rearm_hold: Duration,
    /// `HA_NCCL_REARM_BACKOFF_MAX_MS`.
    pub rearm_backoff_max: Duration,
    /// `HA_NCCL_RETURN_HOME`.
    pub return_home: bool,
    /// `HA_NCCL_RTO_ADAPTIVE`.
    pub rto_adaptive: bool,
    /// `HA_NCCL_RETURN_HOLD_MS`.
    pub return_hold: Duration,
    /// `HA_NCCL_RETURN_HOLD_MAX_MS`.
    pub return_hold_max: Duration,
    /// `HA_NCCL_DRAIN_FILE` (empty = no drain control).
    pub drain_file: String,
    /// `HA_NCCL_MR_POLICY` is `eager`.
    pub mr_eager: bool,
    /// `HA_NCCL_STATS_FILE` (empty = none).
    pub stats_file: String,
    /// `HA_NCCL_STATS_INTERVAL_MS` (zero: no periodic lines).
    pub stats_interval: Duration,
    /// `HA_NCCL_STAGES` (empty = off).
    pub stages: String,
    /// `HA_NCCL_QP_TIMEOUT`.
    pub qp_timeout: u8,
    /// `HA_NCCL_QP_RETRY_CNT`.
    pub qp_retry_cnt: u8,
    /// `HA_NCCL_GDR`.
    pub gdr: crate::fabric::verbs::gdr::GdrMode,
}

/// A knob whose value cannot be used. Each message names the variable, the offending value
/// and what is accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}={value:?} is not one of {accepted}")]
    NotOneOf {
        name: &'static str,
        value: String,
        accepted: String,
    },
    #[error("{name}={value:?} is not {expected}")]
    Malformed {
        name: &'static str,
        value: String,
        expected: String,
    },
    #[error("{name}={value:?} is out of range: accepted {accepted}")]
    OutOfRange {
        name: &'static str,
        value: String,
        accepted: String,
    },
    #[error("{name}={value:?} is too large: at most {max}")]
    TooLarge {
        name: &'static str,
        value: String,
        max: String,
    },
    #[error("{name} is set but empty; expected {expected}")]
    Empty {
        name: &'static str,
        expected: String,
    },
}

impl ConfigError {
    /// The variable the error is about.
    pub fn name(&self) -> &'static str {
        match self {
            ConfigError::NotOneOf { name, .. }
            | ConfigError::Malformed { name, .. }
            | ConfigError::OutOfRange { name, .. }
            | ConfigError::TooLarge { name, .. }
            | ConfigError::Empty { name, .. } => name,
        }
    }
}

impl Default for Config {
    /// Every knob at its default.
    fn default() -> Config {
        Config::from_lookup(|_| None).expect("PARAMS defaults are valid (unit-tested)")
    }
}

impl Config {
    /// Read every knob from the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Read every knob through `get` (`None` = unset, which selects the default).
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let text = |p: &Param| get(p.name).unwrap_or_else(|| p.default.to_string());
        let fabric_idx = parse_enum(&FABRIC, &text(&FABRIC))?;
        Ok(Config {
            fabric: FabricKind::ALL[fabric_idx],
            sock_rails: parse_list(&SOCK_RAILS, &text(&SOCK_RAILS))?,
            sock_retry: Duration::from_millis(parse_number(&SOCK_RETRY_MS, &text(&SOCK_RETRY_MS))?),
            sock_segment: usize::try_from(parse_number(&SOCK_SEGMENT, &text(&SOCK_SEGMENT))?)
                .map_err(|_| out_of_range(&SOCK_SEGMENT, &text(&SOCK_SEGMENT)))?,
            sock_inline: usize::try_from(parse_number(&SOCK_INLINE, &text(&SOCK_INLINE))?)
                .map_err(|_| out_of_range(&SOCK_INLINE, &text(&SOCK_INLINE)))?,
            sock_eager: usize::try_from(parse_number(&SOCK_EAGER, &text(&SOCK_EAGER))?)
                .map_err(|_| out_of_range(&SOCK_EAGER, &text(&SOCK_EAGER)))?,
            sock_spin: Duration::from_micros(parse_number(&SOCK_SPIN_US, &text(&SOCK_SPIN_US))?),
            sock_lanes: u16::try_from(parse_number(&SOCK_LANES, &text(&SOCK_LANES))?)
                .map_err(|_| out_of_range(&SOCK_LANES, &text(&SOCK_LANES)))?,
            sock_delack_max: micros_or_kernel(&SOCK_DELACK_MAX_US, &text(&SOCK_DELACK_MAX_US))?,
            sock_max_qp: limit(&SOCK_MAX_QP, &text(&SOCK_MAX_QP))?,
            sock_max_cqe: limit(&SOCK_MAX_CQE, &text(&SOCK_MAX_CQE))?,
            test_max_poll: u32::try_from(parse_number(&TEST_MAX_POLL, &text(&TEST_MAX_POLL))?)
                .map_err(|_| out_of_range(&TEST_MAX_POLL, &text(&TEST_MAX_POLL)))?,
            progress_spin: Duration::from_micros(parse_number(
                &PROGRESS_SPIN_US,
                &text(&PROGRESS_SPIN_US),
            )?),
            handshake_timeout: Duration::from_millis(parse_number(
                &HANDSHAKE_TIMEOUT_MS,
                &text(&HANDSHAKE_TIMEOUT_MS),
            )?),
            keepalive: Duration::from_millis(parse_number(&KEEPALIVE_MS, &text(&KEEPALIVE_MS))?),
            enable_backup: parse_bool(&ENABLE_BACKUP, &text(&ENABLE_BACKUP))?,
            standby_map: text(&STANDBY_MAP).trim().to_string(),
            rto: Duration::from_millis(parse_number(&RTO_MS, &text(&RTO_MS))?),
            silence: Duration::from_millis(parse_number(&SILENCE_MS, &text(&SILENCE_MS))?),
            heartbeat: Duration::from_millis(parse_number(&HEARTBEAT_MS, &text(&HEARTBEAT_MS))?),
            failback: parse_bool(&FAILBACK, &text(&FAILBACK))?,
            rearm_hold: Duration::from_millis(parse_number(&REARM_HOLD_MS, &text(&REARM_HOLD_MS))?),
            rearm_backoff_max: Duration::from_millis(parse_number(
                &REARM_BACKOFF_MAX_MS,
                &text(&REARM_BACKOFF_MAX_MS),
            )?),
            return_home: parse_bool(&RETURN_HOME, &text(&RETURN_HOME))?,
            rto_adaptive: parse_bool(&RTO_ADAPTIVE, &text(&RTO_ADAPTIVE))?,
            return_hold: Duration::from_millis(parse_number(
                &RETURN_HOLD_MS,
                &text(&RETURN_HOLD_MS),
            )?),
            return_hold_max: Duration::from_millis(parse_number(
                &RETURN_HOLD_MAX_MS,
                &text(&RETURN_HOLD_MAX_MS),
            )?),
            drain_file: text(&DRAIN_FILE).trim().to_string(),
            mr_eager: parse_enum(&MR_POLICY, &text(&MR_POLICY))? == 1,
            stats_file: text(&STATS_FILE).trim().to_string(),
            stats_interval: Duration::from_millis(parse_number(
                &STATS_INTERVAL_MS,
                &text(&STATS_INTERVAL_MS),
            )?),
            stages: text(&STAGES).trim().to_string(),
            qp_timeout: parse_number(&QP_TIMEOUT, &text(&QP_TIMEOUT))? as u8,
            qp_retry_cnt: parse_number(&QP_RETRY_CNT, &text(&QP_RETRY_CNT))? as u8,
            gdr: crate::fabric::verbs::gdr::GdrMode::ALL[parse_enum(&GDR, &text(&GDR))?],
        })
    }
}

/// Check `value` against `p`'s kind and range without building a [`Config`].
pub fn validate(p: &Param, value: &str) -> Result<(), ConfigError> {
    match p.kind {
        Kind::Enum(_) => parse_enum(p, value).map(drop),
        Kind::Bool => parse_bool(p, value).map(drop),
        Kind::U32 | Kind::U64 | Kind::Millis | Kind::Bytes => parse_number(p, value).map(drop),
        Kind::List => parse_list(p, value).map(drop),
        Kind::Str => Ok(()),
    }
}

/// What a kind accepts, in words (used in error messages and the README table).
fn describe_kind(kind: Kind) -> String {
    match kind {
        Kind::Enum(choices) => format!("one of {}", choices.join("|")),
        Kind::Bool => "a boolean (0/1/true/false/yes/no)".into(),
        Kind::U32 => "an unsigned 32-bit integer".into(),
        Kind::U64 => "an unsigned 64-bit integer".into(),
        Kind::Millis => "a whole number of milliseconds".into(),
        Kind::Bytes => "a byte count (plain number or with a K/M/G suffix, 1K = 1024)".into(),
        Kind::List => "a comma-separated list without empty items".into(),
        Kind::Str => "text".into(),
    }
}

/// Accepted values of a numeric kind in its own notation (`4K..=64M`, `>= 1`); `range`
/// `None` means the whole type.
fn describe_range(kind: Kind, range: Option<(u64, u64)>) -> String {
    let fmt = |v: u64| match kind {
        Kind::Bytes => format_bytes(v),
        _ => v.to_string(),
    };
    let type_max = match kind {
        Kind::U32 => u32::MAX as u64,
        _ => u64::MAX,
    };
    let (lo, hi) = range.unwrap_or((0, type_max));
    if hi == u64::MAX {
        format!(">= {}", fmt(lo))
    } else {
        format!("{}..={}", fmt(lo), fmt(hi))
    }
}

/// Shortest exact rendering of a byte count with a K/M/G suffix.
fn format_bytes(v: u64) -> String {
    for (unit, suffix) in [(GIB, "G"), (MIB, "M"), (KIB, "K")] {
        if v != 0 && v % unit == 0 {
            return format!("{}{suffix}", v / unit);
        }
    }
    v.to_string()
}

fn out_of_range(p: &Param, value: &str) -> ConfigError {
    let mut accepted = describe_range(p.kind, p.range);
    if let Some((_, why)) = FLOORS.iter().find(|(n, _)| *n == p.name) {
        accepted = format!("{accepted}: {why}");
    }
    ConfigError::OutOfRange {
        name: p.name,
        value: value.to_string(),
        accepted,
    }
}

/// A number beyond what the knob's type can hold.
fn too_large(p: &Param, value: &str) -> ConfigError {
    let type_max = match p.kind {
        Kind::U32 => u32::MAX as u64,
        _ => u64::MAX,
    };
    let max = p.range.map_or(type_max, |(_, hi)| hi.min(type_max));
    ConfigError::TooLarge {
        name: p.name,
        value: value.to_string(),
        max: match p.kind {
            Kind::Bytes => format_bytes(max),
            _ => max.to_string(),
        },
    }
}

fn malformed(p: &Param, value: &str) -> ConfigError {
    ConfigError::Malformed {
        name: p.name,
        value: value.to_string(),
        expected: describe_kind(p.kind),
    }
}

fn non_empty<'a>(p: &Param, value: &'a str) -> Result<&'a str, ConfigError> {
    let v = value.trim();
    if v.is_empty() {
        Err(ConfigError::Empty {
            name: p.name,
            expected: describe_kind(p.kind),
        })
    } else {
        Ok(v)
    }
}

fn parse_enum(p: &Param, value: &str) -> Result<usize, ConfigError> {
    let choices = match p.kind {
        Kind::Enum(c) => c,
        _ => &[],
    };
    let v = non_empty(p, value)?;
    choices
        .iter()
        .position(|c| c.eq_ignore_ascii_case(v))
        .ok_or_else(|| ConfigError::NotOneOf {
            name: p.name,
            value: value.to_string(),
            accepted: choices.join("|"),
        })
}

/// A `U32` limit where 0 means none.
fn limit(p: &Param, value: &str) -> Result<Option<u32>, ConfigError> {
    let n = u32::try_from(parse_number(p, value)?).map_err(|_| out_of_range(p, value))?;
    Ok((n > 0).then_some(n))
}

/// A time in microseconds where 0 means "the kernel's own" (`None`).
fn micros_or_kernel(p: &Param, value: &str) -> Result<Option<Duration>, ConfigError> {
    let n = parse_number(p, value)?;
    Ok((n > 0).then(|| Duration::from_micros(n)))
}

fn parse_bool(p: &Param, value: &str) -> Result<bool, ConfigError> {
    let v = non_empty(p, value)?.to_ascii_lowercase();
    match v.as_str() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(ConfigError::NotOneOf {
            name: p.name,
            value: value.to_string(),
            accepted: "0|1|true|false|yes|no".into(),
        }),
    }
}

/// Numeric kinds: digits (plus a binary suffix for `Bytes`), then the range check.
fn parse_number(p: &Param, value: &str) -> Result<u64, ConfigError> {
    let v = non_empty(p, value)?;
    let (digits, mult) = if p.kind == Kind::Bytes {
        split_byte_suffix(v).ok_or_else(|| malformed(p, value))?
    } else {
        (v, 1)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(p, value));
    }
    let type_max = if p.kind == Kind::U32 {
        u32::MAX as u64
    } else {
        u64::MAX
    };
    let n = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n <= type_max)
        .ok_or_else(|| too_large(p, value))?;
    match p.range {
        Some((lo, hi)) if n < lo || n > hi => Err(out_of_range(p, value)),
        _ => Ok(n),
    }
}

/// Split `"64K"` into `("64", 1024)`; `None` for an unknown suffix.
fn split_byte_suffix(v: &str) -> Option<(&str, u64)> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, suffix) = v.split_at(split);
    let mult = match suffix.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        _ => return None,
    };
    Some((digits, mult))
}

fn parse_list(p: &Param, value: &str) -> Result<Vec<String>, ConfigError> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() || item.chars().any(char::is_whitespace) {
                Err(malformed(p, value))
            } else {
                Ok(item.to_string())
            }
        })
        .collect()
}

/// The README's configuration table (`| Variable | Type | Default | Meaning |`), one row per
/// [`PARAMS`] entry, ending with a newline.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| Variable | Type | Default | Meaning |\n| --- | --- | --- | --- |\n");
    for p in PARAMS {
        let ty = match p.kind {
            Kind::Enum(choices) => choices
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", "),
            Kind::Bool => "bool".into(),
            Kind::U32 => "integer (u32)".into(),
            Kind::U64 => "integer (u64)".into(),
            Kind::Millis => "milliseconds".into(),
            Kind::Bytes => "bytes (K/M/G suffix = KiB/MiB/GiB)".into(),
            Kind::List => "comma-separated list".into(),
            Kind::Str => "string".into(),
        };
        let ty = match p.range {
            Some(_) => format!("{ty}, {}", describe_range(p.kind, p.range)),
            None => ty,
        };
        let default = if p.default.is_empty() {
            "*(empty)*".to_string()
        } else {
            format!("`{}`", p.default)
        };
        let _ = writeln!(out, "| `{}` | {ty} | {default} | {} |", p.name, p.doc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::{BTreeSet, HashMap};

    fn with(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    fn err_for(name: &str, value: &str) -> ConfigError {
        with(&[(name, value)]).expect_err(&format!("{name}={value:?} must be rejected"))
    }

    #[test]
    fn defaults() {
        let c = Config::default();
        assert_eq!(c.fabric, FabricKind::Verbs);
        assert!(c.sock_rails.is_empty());
        assert_eq!(c.sock_retry, Duration::from_millis(500));
        assert!(c.enable_backup && c.failback && !c.mr_eager);
        assert_eq!(c.rto, Duration::from_millis(1000));
        assert_eq!(c.sock_segment, 1 << 20);
        assert_eq!(c.sock_inline, 8 << 10);
        assert_eq!(c.sock_eager, 4 << 10);
        assert_eq!(c.sock_spin, Duration::from_micros(100));
        assert_eq!(c.sock_lanes, 4);
        assert_eq!(c.sock_delack_max, None, "off by default");
        assert_eq!((c.sock_max_qp, c.sock_max_cqe), (None, None));
        assert_eq!(c.test_max_poll, 16);
        assert_eq!(c.progress_spin, Duration::from_micros(50));
        assert_eq!(c.handshake_timeout, Duration::from_millis(30_000));
        assert_eq!(c.keepalive, Duration::from_millis(1000));
        for p in PARAMS {
            validate(p, p.default)
                .unwrap_or_else(|e| panic!("default of {} is invalid: {e}", p.name));
        }
    }

    #[test]
    fn fabric_names_match_variants() {
        for (i, f) in FabricKind::ALL.iter().enumerate() {
            assert_eq!(FabricKind::NAMES[i], f.name());
        }
        assert_eq!(FabricKind::NAMES.len(), FabricKind::ALL.len());
    }

    #[test]
    fn enum_parse() {
        assert_eq!(
            with(&[("HA_NCCL_FABRIC", "sock")]).unwrap().fabric,
            FabricKind::Sock
        );
        assert_eq!(
            with(&[("HA_NCCL_FABRIC", " VERBS ")]).unwrap().fabric,
            FabricKind::Verbs
        );
        let e = err_for("HA_NCCL_FABRIC", "rdma");
        assert_eq!(
            e.to_string(),
            r#"HA_NCCL_FABRIC="rdma" is not one of verbs|sock"#
        );
        assert!(matches!(
            err_for("HA_NCCL_FABRIC", ""),
            ConfigError::Empty { .. }
        ));
    }

    #[test]
    fn bool_parse() {
        let p = Param {
            name: "HA_NCCL_TEST_BOOL",
            kind: Kind::Bool,
            default: "0",
            doc: "",
            range: None,
        };
        for (s, v) in [
            ("1", true),
            ("true", true),
            ("YES", true),
            ("0", false),
            ("False", false),
            ("no", false),
        ] {
            assert_eq!(parse_bool(&p, s).unwrap(), v, "{s}");
        }
        let e = parse_bool(&p, "maybe").unwrap_err();
        assert_eq!(e.name(), "HA_NCCL_TEST_BOOL");
        assert!(e.to_string().contains("\"maybe\""), "{e}");
        assert!(e.to_string().contains("yes|no"), "{e}");
        assert!(matches!(
            parse_bool(&p, " "),
            Err(ConfigError::Empty { .. })
        ));
        assert!(validate(&p, "2").is_err());
    }

    #[test]
    fn u32_parse_and_range() {
        assert_eq!(
            with(&[("HA_NCCL_TEST_MAX_POLL", "1")])
                .unwrap()
                .test_max_poll,
            1
        );
        assert_eq!(
            with(&[("HA_NCCL_TEST_MAX_POLL", "4294967295")])
                .unwrap()
                .test_max_poll,
            u32::MAX
        );
        let e = err_for("HA_NCCL_TEST_MAX_POLL", "0");
        assert!(matches!(e, ConfigError::OutOfRange { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            r#"HA_NCCL_TEST_MAX_POLL="0" is out of range: accepted 1..=4294967295"#
        );
        let e = err_for("HA_NCCL_TEST_MAX_POLL", "4294967296");
        assert_eq!(
            e.to_string(),
            r#"HA_NCCL_TEST_MAX_POLL="4294967296" is too large: at most 4294967295"#
        );
        for bad in ["-1", "1.5", "ten", "0x10", "16K"] {
            let e = err_for("HA_NCCL_TEST_MAX_POLL", bad);
            assert!(matches!(e, ConfigError::Malformed { .. }), "{bad}: {e:?}");
            assert!(e.to_string().starts_with("HA_NCCL_TEST_MAX_POLL="), "{e}");
        }
    }

    #[test]
    fn emulated_sock_limits() {
        let c = with(&[("HA_NCCL_SOCK_MAX_QP", "40"), ("HA_NCCL_SOCK_MAX_CQE", "0")]).unwrap();
        assert_eq!((c.sock_max_qp, c.sock_max_cqe), (Some(40), None));
        let e = err_for("HA_NCCL_SOCK_MAX_CQE", "many");
        assert!(matches!(e, ConfigError::Malformed { .. }), "{e:?}");
    }

    #[test]
    fn u64_parse() {
        assert_eq!(
            with(&[("HA_NCCL_PROGRESS_SPIN_US", "0")])
                .unwrap()
                .progress_spin,
            Duration::ZERO
        );
        assert_eq!(
            with(&[("HA_NCCL_PROGRESS_SPIN_US", "1000000")])
                .unwrap()
                .progress_spin,
            Duration::from_secs(1)
        );
        assert!(matches!(
            err_for("HA_NCCL_PROGRESS_SPIN_US", "99999999999999999999"),
            ConfigError::TooLarge { .. }
        ));
        assert!(matches!(
            err_for("HA_NCCL_PROGRESS_SPIN_US", "5us"),
            ConfigError::Malformed { .. }
        ));
        // Polling a stream for more than 10 ms after every small message is a mistake.
        assert!(matches!(
            err_for("HA_NCCL_SOCK_SPIN_US", "10001"),
            ConfigError::OutOfRange { .. }
        ));
        // The kernel takes no cap above its own 200 ms; 0 is the kernel's own.
        assert!(matches!(
            err_for("HA_NCCL_SOCK_DELACK_MAX_US", "200001"),
            ConfigError::OutOfRange { .. }
        ));
        let kernel =
            Config::from_lookup(|n| (n == "HA_NCCL_SOCK_DELACK_MAX_US").then(|| "0".into()));
        assert_eq!(kernel.unwrap().sock_delack_max, None);
    }

    #[test]
    fn millis_parse() {
        let c = with(&[
            ("HA_NCCL_SOCK_RETRY_MS", "250"),
            ("HA_NCCL_HANDSHAKE_TIMEOUT_MS", " 1 "),
        ])
        .unwrap();
        assert_eq!(c.sock_retry, Duration::from_millis(250));
        assert_eq!(c.handshake_timeout, Duration::from_millis(1));
        let e = err_for("HA_NCCL_SOCK_RETRY_MS", "0");
        assert!(matches!(e, ConfigError::OutOfRange { .. }));
        assert_eq!(e.name(), "HA_NCCL_SOCK_RETRY_MS");
        let e = err_for("HA_NCCL_HANDSHAKE_TIMEOUT_MS", "2s");
        assert_eq!(
            e.to_string(),
            r#"HA_NCCL_HANDSHAKE_TIMEOUT_MS="2s" is not a whole number of milliseconds"#
        );
    }

    #[test]
    fn bytes_parse_suffixes_and_range() {
        let seg = |v: &str| with(&[("HA_NCCL_SOCK_SEGMENT", v)]).map(|c| c.sock_segment);
        assert_eq!(seg("4096").unwrap(), 4096);
        assert_eq!(seg("4K").unwrap(), 4096);
        assert_eq!(seg("64k").unwrap(), 65536);
        assert_eq!(seg("2M").unwrap(), 2 << 20);
        assert_eq!(seg("2MiB").unwrap(), 2 << 20);
        assert_eq!(seg("64M").unwrap(), 64 << 20);
        let e = seg("1G").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"HA_NCCL_SOCK_SEGMENT="1G" is out of range: accepted 4K..=64M"#
        );
        assert!(matches!(seg("4095"), Err(ConfigError::OutOfRange { .. })));
        assert!(matches!(seg("65537K"), Err(ConfigError::OutOfRange { .. })));
        assert!(matches!(
            seg("99999999999999999G"),
            Err(ConfigError::TooLarge { .. })
        ));
        for bad in ["1T", "M", "1.5M", "-4K", "4 K B", "K4"] {
            let e = seg(bad).unwrap_err();
            assert!(matches!(e, ConfigError::Malformed { .. }), "{bad}: {e:?}");
            assert_eq!(e.name(), "HA_NCCL_SOCK_SEGMENT");
        }
    }

    #[test]
    fn list_parse() {
        let rails = |v: &str| with(&[("HA_NCCL_SOCK_RAILS", v)]).map(|c| c.sock_rails);
        assert_eq!(rails("").unwrap(), Vec::<String>::new());
        assert_eq!(rails("eth0").unwrap(), vec!["eth0"]);
        assert_eq!(
            rails(" eth0 , 10.0.0.2,fe80::1 ").unwrap(),
            vec!["eth0", "10.0.0.2", "fe80::1"]
        );
        for bad in ["eth0,,eth1", "eth0,", "et h0"] {
            let e = rails(bad).unwrap_err();
            assert!(matches!(e, ConfigError::Malformed { .. }), "{bad}: {e:?}");
            assert!(
                e.to_string().starts_with("HA_NCCL_SOCK_RAILS="),
                "{bad}: {e}"
            );
        }
    }

    /// Finding: `HA_NCCL_RTO_MS` of 1, 2, 5 or 20 (inside the documented `>= 1`) killed
    /// healthy connections; a retry window of a few ms declares healthy links dead. Refused,
    /// with the reason.
    #[test]
    fn timeouts_that_cannot_work_are_refused_with_the_reason() {
        for v in ["1", "2", "5", "20", "99"] {
            let e = err_for("HA_NCCL_RTO_MS", v);
            assert!(matches!(e, ConfigError::OutOfRange { .. }), "{v}: {e:?}");
            let s = e.to_string();
            assert!(
                s.starts_with(&format!(
                    "HA_NCCL_RTO_MS=\"{v}\" is out of range: accepted >= 100: "
                )),
                "{s}"
            );
            assert!(s.contains("fires on healthy links"), "{s}");
        }
        assert_eq!(
            with(&[("HA_NCCL_RTO_MS", "100")]).unwrap().rto,
            Duration::from_millis(100)
        );
        let e = err_for("HA_NCCL_SOCK_RETRY_MS", "50");
        assert!(e.to_string().contains("delayed ACK"), "{e}");
        assert!(with(&[("HA_NCCL_SOCK_RETRY_MS", "250")]).is_ok());
    }

    /// A silence window beyond an hour is refused by name (it would only overflow the
    /// transport's timers); 0 turns the check off.
    #[test]
    fn the_silence_window_is_bounded() {
        let e = err_for("HA_NCCL_SILENCE_MS", "3600001");
        assert_eq!(e.name(), "HA_NCCL_SILENCE_MS");
        assert!(e.to_string().contains("HA_NCCL_SILENCE_MS"), "{e}");
        assert_eq!(
            with(&[("HA_NCCL_SILENCE_MS", "0")]).unwrap().silence,
            Duration::ZERO
        );
        assert_eq!(Config::default().silence, Duration::from_millis(25));
    }

    /// Finding: a number too large for 64 bits said "out of range: accepted >= 1".
    #[test]
    fn a_number_too_large_for_its_type_says_so() {
        let e = err_for("HA_NCCL_RTO_MS", "99999999999999999999");
        assert_eq!(
            e.to_string(),
            r#"HA_NCCL_RTO_MS="99999999999999999999" is too large: at most 18446744073709551615"#
        );
        assert_eq!(e.name(), "HA_NCCL_RTO_MS");
    }

    #[test]
    fn every_param_is_read_by_from_lookup() {
        let asked = RefCell::new(BTreeSet::new());
        Config::from_lookup(|k| {
            asked.borrow_mut().insert(k.to_string());
            None
        })
        .unwrap();
        let names: BTreeSet<String> = PARAMS.iter().map(|p| p.name.to_string()).collect();
        assert_eq!(asked.into_inner(), names);
    }

    #[test]
    fn garbage_in_each_param_is_reported_under_its_name() {
        let mut checked = 0;
        for p in PARAMS {
            let garbage = match p.kind {
                Kind::Enum(_) | Kind::Bool | Kind::U32 | Kind::U64 | Kind::Millis | Kind::Bytes => {
                    "garbage"
                }
                Kind::List => "a,,b",
                Kind::Str => continue, // any text is valid
            };
            let e = err_for(p.name, garbage);
            assert_eq!(e.name(), p.name);
            assert!(
                e.to_string().starts_with(&format!("{}=", p.name)),
                "{}: {e}",
                p.name
            );
            checked += 1;
        }
        let free_text = PARAMS
            .iter()
            .filter(|p| matches!(p.kind, Kind::Str))
            .count();
        assert_eq!(checked + free_text, PARAMS.len());
    }

    #[test]
    fn every_config_field_is_backed_by_a_param() {
        // A non-default value for every PARAMS row, and where it must show up in Config.
        // Destructuring Config exhaustively makes adding a field without a row a compile error.
        let c = with(&[
            ("HA_NCCL_FABRIC", "sock"),
            ("HA_NCCL_SOCK_RAILS", "lo"),
            ("HA_NCCL_SOCK_RETRY_MS", "700"),
            ("HA_NCCL_SOCK_SEGMENT", "8K"),
            ("HA_NCCL_SOCK_INLINE", "0"),
            ("HA_NCCL_TEST_MAX_POLL", "3"),
            ("HA_NCCL_PROGRESS_SPIN_US", "9"),
            ("HA_NCCL_HANDSHAKE_TIMEOUT_MS", "11"),
            ("HA_NCCL_KEEPALIVE_MS", "13"),
            ("HA_NCCL_ENABLE_BACKUP", "0"),
            ("HA_NCCL_STANDBY_MAP", "0:1"),
            ("HA_NCCL_RTO_MS", "170"),
            ("HA_NCCL_HEARTBEAT_MS", "19"),
            ("HA_NCCL_FAILBACK", "no"),
            ("HA_NCCL_REARM_HOLD_MS", "23"),
            ("HA_NCCL_REARM_BACKOFF_MAX_MS", "37"),
            ("HA_NCCL_RETURN_HOME", "0"),
            ("HA_NCCL_RTO_ADAPTIVE", "0"),
            ("HA_NCCL_RETURN_HOLD_MS", "41"),
            ("HA_NCCL_RETURN_HOLD_MAX_MS", "43"),
            ("HA_NCCL_DRAIN_FILE", "/tmp/d"),
            ("HA_NCCL_MR_POLICY", "eager"),
            ("HA_NCCL_STATS_FILE", "/tmp/s.json"),
            ("HA_NCCL_STAGES", "/tmp/st"),
            ("HA_NCCL_STATS_INTERVAL_MS", "47"),
            ("HA_NCCL_QP_TIMEOUT", "12"),
            ("HA_NCCL_QP_RETRY_CNT", "3"),
            ("HA_NCCL_SOCK_MAX_QP", "29"),
            ("HA_NCCL_SOCK_EAGER", "1000"),
            ("HA_NCCL_SOCK_SPIN_US", "57"),
            ("HA_NCCL_SOCK_LANES", "3"),
            ("HA_NCCL_SOCK_DELACK_MAX_US", "9000"),
            ("HA_NCCL_SOCK_MAX_CQE", "31"),
            ("HA_NCCL_GDR", "1"),
            ("HA_NCCL_SILENCE_MS", "53"),
        ])
        .unwrap();
        let Config {
            fabric,
            sock_rails,
            sock_retry,
            sock_segment,
            sock_inline,
            sock_eager,
            sock_spin,
            sock_lanes,
            sock_delack_max,
            sock_max_qp,
            sock_max_cqe,
            test_max_poll,
            progress_spin,
            handshake_timeout,
            keepalive,
            enable_backup,
            standby_map,
            rto,
            silence,
            heartbeat,
            failback,
            rearm_hold,
            rearm_backoff_max,
            return_home,
            rto_adaptive,
            return_hold,
            return_hold_max,
            drain_file,
            mr_eager,
            stats_file,
            stats_interval,
            stages,
            qp_timeout,
            qp_retry_cnt,
            gdr,
        } = c;
        assert_eq!(fabric, FabricKind::Sock);
        assert_eq!(sock_rails, vec!["lo"]);
        assert_eq!(sock_retry, Duration::from_millis(700));
        assert_eq!(sock_segment, 8192);
        assert_eq!(sock_inline, 0);
        assert_eq!(sock_eager, 1000);
        assert_eq!(sock_spin, Duration::from_micros(57));
        assert_eq!(sock_lanes, 3);
        assert_eq!(sock_delack_max, Some(Duration::from_micros(9000)));
        assert_eq!(test_max_poll, 3);
        assert_eq!(progress_spin, Duration::from_micros(9));
        assert_eq!(handshake_timeout, Duration::from_millis(11));
        assert_eq!(keepalive, Duration::from_millis(13));
        assert!(!enable_backup && !failback && mr_eager);
        assert_eq!(standby_map, "0:1");
        assert_eq!(rto, Duration::from_millis(170));
        assert_eq!(heartbeat, Duration::from_millis(19));
        assert_eq!(silence, Duration::from_millis(53));
        assert_eq!(rearm_hold, Duration::from_millis(23));
        assert_eq!(rearm_backoff_max, Duration::from_millis(37));
        assert!(!return_home);
        assert!(!rto_adaptive);
        assert_eq!(return_hold, Duration::from_millis(41));
        assert_eq!(return_hold_max, Duration::from_millis(43));
        assert_eq!(drain_file, "/tmp/d");
        assert_eq!(stats_file, "/tmp/s.json");
        assert_eq!(stats_interval, Duration::from_millis(47));
        assert_eq!(stages, "/tmp/st");
        assert_eq!((qp_timeout, qp_retry_cnt), (12, 3));
        assert_eq!((sock_max_qp, sock_max_cqe), (Some(29), Some(31)));
        assert_eq!(gdr, crate::fabric::verbs::gdr::GdrMode::Required);
        assert_eq!(PARAMS.len(), 35, "one PARAMS row per Config field");
    }

    #[test]
    fn params_are_well_formed() {
        let mut seen = BTreeSet::new();
        for p in PARAMS {
            assert!(seen.insert(p.name), "duplicate {}", p.name);
            assert!(p.name.starts_with("HA_NCCL_"), "{}", p.name);
            assert!(!p.doc.is_empty() && !p.doc.contains('|') && !p.doc.contains('\n'));
            if p.range.is_some() {
                assert!(matches!(
                    p.kind,
                    Kind::U32 | Kind::U64 | Kind::Millis | Kind::Bytes
                ));
            }
        }
    }

    #[test]
    fn markdown_table_has_one_row_per_param() {
        let t = markdown_table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| Variable | Type | Default | Meaning |");
        assert_eq!(lines[1], "| --- | --- | --- | --- |");
        assert_eq!(lines.len(), 2 + PARAMS.len());
        for (line, p) in lines[2..].iter().zip(PARAMS) {
            assert!(line.starts_with(&format!("| `{}` |", p.name)), "{line}");
            assert!(line.ends_with(&format!("| {} |", p.doc)), "{line}");
            // Four cells: five unescaped pipes.
            assert_eq!(line.matches('|').count(), 5, "{line}");
        }
        assert!(t.contains(
            "| `HA_NCCL_SOCK_SEGMENT` | bytes (K/M/G suffix = KiB/MiB/GiB), 4K..=64M | `1M` |"
        ));
        assert!(t.contains("| `HA_NCCL_FABRIC` | `verbs`, `sock` | `verbs` |"));
        assert!(t.ends_with('\n'));
    }
}
