//! Process-wide plugin state, built once by `init`: configuration, fabric, engine and the
//! handle tables.

use super::error::{ApiError, ApiResult, Code};
use super::handles::{Kind, Registry};
use crate::config::{Config, FabricKind};
use crate::engine::Engine;
use crate::fabric::sock::{SockConfig, SockFabric, SockRail};
use crate::fabric::verbs::gdr::GdrMode;
use crate::fabric::{netif, Fabric};
use crate::transport::connect::PendingConnect;
use crate::transport::ha::{parse_standby_map, HaCfg};
use crate::transport::listen::ListenComm;
use crate::transport::mr::MrHandle;
use crate::transport::recv::RecvComm;
use crate::transport::send::SendComm;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

pub struct Plugin {
    pub cfg: Config,
    /// The knobs every connection runs with.
    pub ha: HaCfg,
    pub engine: Arc<Engine>,
    /// Address the OOB listeners bind (from `NCCL_SOCKET_IFNAME`).
    pub oob_ip: IpAddr,
    pub listens: Registry<ListenComm>,
    pub connects: Registry<PendingConnect>,
    pub sends: Registry<SendComm>,
    pub recvs: Registry<RecvComm>,
    pub mrs: Registry<MrEntry>,
    /// ext-net v11 per-communicator contexts.
    pub contexts: Registry<NetContext>,
    /// Which context created a comm or pending connect (token → context token). Objects made
    /// through v8–v10 entry points have no owner.
    pub owners: Mutex<HashMap<u64, u64>>,
    /// Receives NCCL posted with `NCCL_NET_OPTIONAL_RECV_COMPLETION` (v9+).
    pub optional_recvs: AtomicU64,
}

/// One ext-net v11 context (`init` returns it; one per NCCL communicator).
#[derive(Clone, Debug)]
pub struct NetContext {
    /// NCCL's communicator hash (for logs).
    pub comm_id: u64,
    /// The communicator's traffic class for the connections it opens (`None`: default).
    pub traffic_class: Option<u8>,
    /// The last `setNetAttr` hints (kept; they do not change how the plugin runs).
    pub attr: Option<NetAttr>,
}

/// `ncclNetAttr_v11_t` as plain values: per-direction peer/flow counts and op/algo/proto bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetAttr {
    /// `{max,min}ConcurrentPeers`, `{max,min}FlowsPerPeer` of send comms.
    pub send: [i32; 4],
    /// The same for receive comms.
    pub recv: [i32; 4],
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

/// A registration and the device it was made for.
pub struct MrEntry {
    pub handle: std::sync::Arc<MrHandle>,
}

static PLUGIN: OnceLock<Result<Plugin, ApiError>> = OnceLock::new();

/// Build the plugin state once; later calls return the first outcome.
pub fn init() -> ApiResult<&'static Plugin> {
    PLUGIN.get_or_init(build).as_ref().map_err(Clone::clone)
}

/// The state, or an error if `init` was not called (or failed).
pub fn get() -> ApiResult<&'static Plugin> {
    match PLUGIN.get() {
        Some(Ok(p)) => Ok(p),
        Some(Err(e)) => Err(e.clone()),
        None => Err(ApiError::usage("the plugin was used before init()")),
    }
}

fn build() -> ApiResult<Plugin> {
    let cfg = Config::from_env().map_err(|e| ApiError::arg(e.to_string()))?;
    let ifs = netif::interfaces()
        .map_err(|e| ApiError::new(Code::SystemError, format!("listing interfaces: {e}")))?;
    let ifname = std::env::var("NCCL_SOCKET_IFNAME").ok();
    let oob = netif::select_oob(ifname.as_deref(), &ifs).ok_or_else(|| {
        ApiError::new(
            Code::SystemError,
            format!(
                "no network interface matches NCCL_SOCKET_IFNAME={}",
                ifname.as_deref().unwrap_or("(unset)")
            ),
        )
    })?;
    if cfg.gdr == GdrMode::Required && cfg.fabric != FabricKind::Verbs {
        return Err(ApiError::new(
            Code::SystemError,
            format!(
                "HA_NCCL_GDR=1 requires GPU Direct RDMA, which HA_NCCL_FABRIC={} cannot do \
                 (it moves host memory only): use HA_NCCL_FABRIC=verbs or HA_NCCL_GDR=auto",
                cfg.fabric
            ),
        ));
    }
    let fabric: Arc<dyn Fabric> = match cfg.fabric {
        FabricKind::Sock => {
            let specs = if cfg.sock_rails.is_empty() {
                vec![oob.name.clone()]
            } else {
                cfg.sock_rails.clone()
            };
            let mut rails = Vec::new();
            for s in &specs {
                let (name, ip) = netif::resolve_rail(s, &ifs)
                    .map_err(|e| ApiError::arg(format!("HA_NCCL_SOCK_RAILS: rail {s:?}: {e}")))?;
                rails.push(SockRail { name, ip });
            }
            Arc::new(
                SockFabric::new(SockConfig {
                    rails,
                    retry_timeout: cfg.sock_retry,
                    segment_bytes: cfg.sock_segment,
                    limits: crate::fabric::DeviceLimits {
                        max_qp: cfg.sock_max_qp,
                        max_cqe: cfg.sock_max_cqe,
                    },
                })
                .map_err(|e| ApiError::new(Code::SystemError, e.to_string()))?,
            )
        }
        FabricKind::Verbs => crate::fabric::verbs::open(&crate::fabric::verbs::VerbsConfig {
            qp_timeout: cfg.qp_timeout,
            qp_retry_cnt: cfg.qp_retry_cnt,
            gdr: cfg.gdr,
            ..Default::default()
        })
        .map_err(|e| {
            let hint = if matches!(e, crate::fabric::FabricError::NoDevice(_)) {
                ". On hosts without RDMA set HA_NCCL_FABRIC=sock"
            } else {
                ""
            };
            ApiError::new(
                Code::SystemError,
                format!("HA_NCCL_FABRIC=verbs: {e}{hint}"),
            )
        })?,
    };
    if fabric.devices().is_empty() {
        return Err(ApiError::new(
            Code::SystemError,
            format!("fabric {} has no devices", fabric.kind()),
        ));
    }
    let names: Vec<&str> = fabric.devices().iter().map(|d| d.name.as_str()).collect();
    tracing::info!(
        init = true,
        "NET/HA : fabric {} with {} device(s) [{}], OOB {} ({})",
        fabric.kind(),
        names.len(),
        names.join(", "),
        oob.name,
        oob.addr
    );
    parse_standby_map(&cfg.standby_map, fabric.devices().len()).map_err(ApiError::arg)?;
    if cfg.fabric == FabricKind::Sock && cfg.rto <= cfg.sock_retry {
        tracing::warn!(
            "NET/HA : HA_NCCL_RTO_MS ({:?}) is not above HA_NCCL_SOCK_RETRY_MS ({:?}): the soft timeout may fail paths over before the fabric's own retries give up",
            cfg.rto,
            cfg.sock_retry
        );
    }
    let ha = HaCfg {
        max_poll: cfg.test_max_poll as usize,
        keepalive: cfg.keepalive,
        enable_backup: cfg.enable_backup,
        standby_map: cfg.standby_map.clone(),
        rto: cfg.rto,
        heartbeat: cfg.heartbeat,
        failback: cfg.failback,
        rearm_hold: cfg.rearm_hold,
        handshake_timeout: cfg.handshake_timeout,
        traffic_class: None,
    };
    let engine = Engine::new(fabric, cfg.progress_spin);
    Ok(Plugin {
        ha,
        oob_ip: oob.addr,
        engine,
        cfg,
        listens: Registry::new(Kind::Listen),
        connects: Registry::new(Kind::Connect),
        sends: Registry::new(Kind::Send),
        recvs: Registry::new(Kind::Recv),
        mrs: Registry::new(Kind::Mr),
        contexts: Registry::new(Kind::Context),
        owners: Mutex::new(HashMap::new()),
        optional_recvs: AtomicU64::new(0),
    })
}
