//! Fabric layer: the only code that touches RDMA hardware or sockets.
//!
//! A fabric exposes reliable-connected (RC) verbs semantics — protection domains, memory
//! regions with lkey/rkey, completion queues and RC queue pairs with the
//! RESET→INIT→RTR→RTS→ERR state machine — behind object-safe traits, so the transport and
//! engine above run unchanged on real verbs (`verbs`) or on the TCP emulation (`sock`).
//!
//! Everything above this layer sees memory only as addresses (`usize`) and keys; the fabric
//! is the one place that dereferences them.

pub mod counters;
pub mod doorbell;
pub mod fd_limit;
pub mod netif;
pub mod oob;
pub mod sock;
pub mod stages;
pub mod verbs;

use std::sync::Arc;

pub use doorbell::Doorbell;
/// The completion vocabulary is the protocol core's (`ha_proto::rc`): the data machines read
/// completions without depending on any fabric.
pub use ha_proto::rc::{Completion, WcOpcode, WcStatus};

/// Memory kinds a device can register, as bits (the values of NCCL's `NCCL_PTR_*`, so the
/// ABI layer passes them through unchanged).
pub const PTR_HOST: i32 = 0x1;
/// GPU memory registered through the peer-memory client (`nvidia-peermem`).
pub const PTR_CUDA: i32 = 0x2;
/// GPU memory registered through a dma-buf file descriptor.
pub const PTR_DMABUF: i32 = 0x4;

/// Errors raised synchronously by fabric calls (asynchronous failures arrive as completions).
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    #[error("no usable device: {0}")]
    NoDevice(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("queue pair in state {state:?} cannot {op}")]
    BadState { state: QpState, op: &'static str },
    #[error("queue full: {0}")]
    QueueFull(&'static str),
    #[error("malformed peer address: {0}")]
    BadPeerAddress(String),
    /// Out of descriptors, the message ends with which limit to raise ([`fd_limit::note`]).
    #[error("{context}: {source}{}", fd_limit::note(.source))]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    System(String),
}

impl FabricError {
    /// An I/O error in `context`; one of running out of descriptors also names the open-file
    /// limit and how to raise it ([`fd_limit::exhausted_note`]).
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        FabricError::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, FabricError>;

/// Link layer of a device, as NCCL and verbs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
}

/// What one device (an RDMA port, or a `sock` rail) looks like to NCCL.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Name shown in NCCL's logs (`mlx5_0:1`, `sock:eth0`).
    pub name: String,
    /// `realpath` of the device's PCI node, `None` for virtual devices.
    pub pci_path: Option<String>,
    pub guid: u64,
    pub speed_mbps: i32,
    pub port: i32,
    pub link_layer: LinkLayer,
    /// What the device can hold: queue pairs and completion-queue entries (the transport's
    /// connection budget is computed from them).
    pub limits: DeviceLimits,
    /// `NCCL_PTR_*` bits the fabric can register.
    pub ptr_support: i32,
    /// Largest message one work request may carry (verbs: the port's `max_msg_sz`).
    pub max_msg_bytes: u64,
}

/// A device's resource limits (`ibv_query_device`); `None`: no limit (the `sock` fabric
/// unless told to emulate one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Queue pairs the device holds at once (`max_qp`).
    pub max_qp: Option<u32>,
    /// Entries one completion queue holds at most (`max_cqe`).
    pub max_cqe: Option<u32>,
}

/// Memory access rights of a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const ALL: Access = Access(7);

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Keys of a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
}

/// One scatter/gather element in local memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub addr: usize,
    pub len: usize,
    pub lkey: u32,
}

/// RDMA operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Write `local` to `remote_addr`.
    Write,
    /// Write `local` to `remote_addr`, then consume one posted receive at the peer, which
    /// completes with this immediate (host order here; the wire order is the fabric's business).
    WriteWithImm(u32),
    /// Read `local.len` bytes from `remote_addr` into `local`.
    Read,
}

/// One send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub local: Sge,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Produce a completion on success (errors always complete).
    pub signaled: bool,
    /// `local` is host memory the CPU may read at post time — the plugin's own staging
    /// (clear-to-sends, completion records, control messages), or a caller's buffer NCCL
    /// registered as host memory (`NCCL_PTR_HOST`) — so a fabric may copy it into the request
    /// (verbs: `IBV_SEND_INLINE` when it fits the queue pair's inline limit). Never set for
    /// GPU memory, which the CPU cannot read.
    pub inline: bool,
}

/// RC queue pair states (the verbs subset the plugin uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Err,
}

/// What a new queue pair is asked for: queue sizes and its traffic class.
#[derive(Clone, Copy, Debug)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    /// Traffic class of the queue pair's packets; `None` = the fabric's default. `verbs`: the
    /// GRH traffic class at RTR (default `NCCL_IB_TC`); `sock`: `IP_TOS` of the streams the
    /// queue pair sends on (default: the kernel's).
    pub traffic_class: Option<u8>,
}

/// A protection domain on one device: registrations and queue pairs hang off it.
pub trait ProtectionDomain: Send + Sync {
    /// Process-unique id of this PD (keys of MR caches).
    fn id(&self) -> u64;
    /// Index of the device it belongs to.
    fn device(&self) -> usize;
    /// Register `[addr, addr+len)`. The caller promises the memory stays valid until the
    /// returned region is dropped.
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Box<dyn MemoryRegion>>;
    /// Copy `len` bytes from byte `from` of `src` (memory of the caller's, e.g. the eager ring
    /// of a connection's region) to `[addr, addr+len)`, which must lie inside a live
    /// registration of this domain with key `lkey` and local write access: the fabric checks
    /// it against its own key table and holds the registration while it copies. Fabrics whose
    /// registered memory the CPU may not write (GPU memory) refuse (the default).
    fn copy_into(
        &self,
        lkey: u32,
        addr: usize,
        src: &ha_proto::data::layout::SharedWords,
        from: usize,
        len: usize,
    ) -> Result<()> {
        let _ = (lkey, addr, src, from, len);
        Err(FabricError::InvalidArgument(
            "this fabric does not copy into registered memory".into(),
        ))
    }
    /// Register `len` bytes of the dma-buf `fd`, starting `offset` bytes into it, addressed
    /// as `[iova, iova+len)` (the buffer's virtual address, so remote addresses and keys work
    /// as for [`reg_mr`](Self::reg_mr)). `fd` need only be open during the call: the
    /// registration holds its own reference on the dma-buf. Fabrics without dma-buf support
    /// refuse (the default).
    fn reg_dmabuf_mr(
        &self,
        iova: usize,
        len: usize,
        offset: u64,
        fd: std::os::fd::RawFd,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>> {
        let _ = (iova, len, offset, fd, access);
        Err(FabricError::InvalidArgument(
            "this fabric cannot register dma-buf memory".into(),
        ))
    }
    /// A completion queue whose consumer is woken through `doorbell`.
    fn create_cq(&self, depth: u32, doorbell: Arc<Doorbell>) -> Result<Arc<dyn CompletionQueue>>;
    /// A new RC queue pair in RESET whose completions (both directions) go to `cq`.
    fn create_qp(&self, cq: &Arc<dyn CompletionQueue>, caps: QpCaps) -> Result<Box<dyn QueuePair>>;
}

/// A registration; dropping it deregisters.
pub trait MemoryRegion: Send + Sync {
    fn keys(&self) -> MrKeys;
    fn addr(&self) -> usize;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync {
    /// Move up to `max` completions into `out`; returns how many.
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize>;
}

/// An RC queue pair.
pub trait QueuePair: Send + Sync {
    fn qp_num(&self) -> u32;
    fn state(&self) -> QpState;
    /// The opaque endpoint description the peer needs for `to_rtr` (at most 64 bytes).
    fn local_endpoint(&self) -> Vec<u8>;
    /// RESET → INIT.
    fn to_init(&self) -> Result<()>;
    /// INIT → RTR, aimed at the peer's endpoint.
    fn to_rtr(&self, remote: &[u8]) -> Result<()>;
    /// RTR → RTS.
    fn to_rts(&self) -> Result<()>;
    /// Any state → ERR: every outstanding send and receive completes with `WR_FLUSH_ERR`
    /// and nothing more is placed in local memory through this QP.
    fn to_err(&self) -> Result<()>;
    /// Post send work requests (RTS only), in order.
    fn post_send(&self, wrs: &[SendWr]) -> Result<()>;
    /// Post one zero-length receive (consumed by a peer's WRITE_WITH_IMM); INIT or later.
    fn post_recv(&self, wr_id: u64) -> Result<()>;
    /// Whether the link to the peer answers below the peer's threads, as far as the fabric can
    /// tell now: `Some(true)` when it does (`sock`: the peer's kernel acknowledges TCP — a
    /// stall is then the peer's process, which no other path to the same peer would cure),
    /// `Some(false)` when it stopped answering, `None` when the fabric cannot tell (`verbs`:
    /// the NIC's retries decide, and say so with an error completion).
    fn link_alive(&self) -> Option<bool> {
        None
    }
    /// How long the link under this queue pair has left data unanswered below the peer's
    /// threads, as far as the fabric can tell now: `Some(ZERO)` when nothing waits for an
    /// answer, `None` when the fabric cannot tell (`verbs`). `sock`: the peer's kernel has
    /// not acknowledged segments in flight for that long (`TCP_INFO`) — a signal under the
    /// payload, which a large write does not delay. The caller bounds it by how long its own
    /// oldest work request has been out (an acknowledgement of earlier data may be older).
    fn link_silence(&self) -> Option<std::time::Duration> {
        None
    }
    /// Whether [`QueuePair::link_silence`] says anything here (without asking it, which may
    /// cost a system call). Where it does not, the transport sends beats of its own.
    fn reports_link_silence(&self) -> bool {
        false
    }
    /// The longest a live link may leave data unanswered without any fault (the floor of the
    /// transport's silence window, `HA_NCCL_SILENCE_MS`): `verbs`, twice the queue pair's
    /// local ACK timeout (4.096 µs × 2^`HA_NCCL_QP_TIMEOUT`: a lost packet stalls everything
    /// behind it until it is resent); `sock`, the peer kernel's delayed acknowledgement (up to
    /// 40 ms on a LAN while the peer's thread has not read what arrived, or the cap a peer that
    /// says `PROMPT` has, `sock/delack.rs`) with timer slack.
    fn silence_floor(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// A fabric: a set of devices and the way to open them.
pub trait Fabric: Send + Sync {
    /// `"sock"` or `"verbs"`.
    fn kind(&self) -> &'static str;
    fn devices(&self) -> &[DeviceInfo];
    /// Whether device `dev`'s port is usable as far as asynchronous events tell (verbs:
    /// PORT_ERR / DEVICE_FATAL clear it, PORT_ACTIVE sets it again). This is the cheapest
    /// failure signal: it arrives at once on a local link loss, while the queue pairs may take
    /// seconds to fail. Fabrics without such events always answer `true`.
    fn port_healthy(&self, _dev: usize) -> bool {
        true
    }
    /// Whether devices are rails that only reach the same rail of the peer (`sock`: a stream
    /// leaves by its destination's route, so both ends of a path must be on one rail for the
    /// primary and the standby to be disjoint). Then the acceptor builds its paths on the
    /// connector's devices.
    fn rail_affine(&self) -> bool {
        false
    }
    /// Open a new protection domain on device `dev`. The engine keeps one per device and
    /// shares it between connections; the device's resources live as long as the PD does.
    fn open_pd(&self, dev: usize) -> Result<Arc<dyn ProtectionDomain>>;
}
