//! Process-wide plugin state, built once by `init`: configuration, fabric, engine and the
//! handle tables.

use super::error::{ApiError, ApiResult, Code};
use super::handles::{Kind, Registry};
use crate::config::{Config, FabricKind};
use crate::engine::Engine;
use crate::fabric::sock::{SockConfig, SockFabric, SockRail};
use crate::fabric::verbs::gdr::GdrMode;
use crate::fabric::DeviceInfo;
use crate::fabric::{netif, Fabric};
use crate::transport::connect::PendingConnect;
use crate::transport::drain_list::DrainList;
use crate::transport::ha::{parse_standby_map, standby_for, HaCfg, HomeCfg};
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
    super::nofile::at_init(&cfg);
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
            let rails = sock_rails(&specs, &ifs).map_err(ApiError::arg)?;
            Arc::new(
                SockFabric::new(SockConfig {
                    rails,
                    retry_timeout: cfg.sock_retry,
                    segment_bytes: cfg.sock_segment,
                    inline_bytes: cfg.sock_inline,
                    inline_gate: Some(crate::fabric::sock::InlineGate::process()),
                    spin: cfg.sock_spin,
                    lanes: cfg.sock_lanes,
                    delack_max: cfg.sock_delack_max,
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
    let map = parse_standby_map(&cfg.standby_map, fabric.devices().len()).map_err(ApiError::arg)?;
    for w in init_warnings(&cfg, fabric.kind(), fabric.devices(), &map) {
        tracing::warn!("NET/HA : {w}");
    }
    let ha = HaCfg {
        max_poll: cfg.test_max_poll as usize,
        keepalive: cfg.keepalive,
        enable_backup: cfg.enable_backup,
        standby_map: cfg.standby_map.clone(),
        rto: cfg.rto,
        silence: cfg.silence,
        heartbeat: cfg.heartbeat,
        failback: cfg.failback,
        rearm_hold: cfg.rearm_hold,
        handshake_timeout: cfg.handshake_timeout,
        traffic_class: None,
        eager_bytes: cfg.sock_eager,
        home: HomeCfg {
            rearm_backoff_max: cfg.rearm_backoff_max,
            return_home: cfg.return_home,
            rto_adaptive: cfg.rto_adaptive,
            return_hold: cfg.return_hold,
            return_hold_max: cfg.return_hold_max,
            drain: (!cfg.drain_file.is_empty())
                .then(|| std::sync::Arc::new(DrainList::new(&cfg.drain_file))),
        },
    };
    crate::transport::stats::set_interval(cfg.stats_interval);
    crate::fabric::stages::enable(&cfg.stages);
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

/// Resolve `HA_NCCL_SOCK_RAILS` (or the OOB interface) into rails, refusing what cannot give
/// a working standby: a name or address that is not this host's (checked by binding it, as the
/// fabric will), the same address twice. Rails sharing an interface are warned about. Every
/// message names the variable.
fn sock_rails(specs: &[String], ifs: &[netif::Interface]) -> Result<Vec<SockRail>, String> {
    let mut rails = Vec::new();
    for s in specs {
        let (name, ip) = netif::resolve_rail(s, ifs)
            .map_err(|e| format!("HA_NCCL_SOCK_RAILS: rail {s:?}: {e}"))?;
        crate::fabric::sock::check_rail_address(ip).map_err(|e| {
            format!("HA_NCCL_SOCK_RAILS: rail {s:?}: {ip} is not an address of this host ({e})")
        })?;
        rails.push(SockRail { name, ip });
    }
    let resolved: Vec<(String, std::net::IpAddr)> = specs
        .iter()
        .cloned()
        .zip(rails.iter().map(|r| r.ip))
        .collect();
    for w in netif::check_rails(&resolved, ifs)? {
        tracing::warn!("NET/HA : {w}");
    }
    Ok(rails)
}

/// What init says once, loudly, about a configuration that runs without the protection the
/// user asked for (or with timers that fight each other).
fn init_warnings(
    cfg: &Config,
    fabric: &str,
    devs: &[DeviceInfo],
    map: &[(usize, usize)],
) -> Vec<String> {
    let mut out = Vec::new();
    if cfg.enable_backup && devs.len() == 1 {
        out.push(format!(
            "HA_NCCL_ENABLE_BACKUP=1 but fabric {fabric} has one device ({}): every connection runs without a standby path and a link failure ends it; give it a second rail (HA_NCCL_SOCK_RAILS) or NIC",
            devs[0].name
        ));
    }
    if fabric == "verbs" && cfg.enable_backup {
        for (d, info) in devs.iter().enumerate() {
            let Some(s) = standby_for(d, devs, map) else {
                continue;
            };
            if info.pci_path.is_some() && info.pci_path == devs[s].pci_path {
                out.push(format!(
                    "device {} and its standby {} are ports of one NIC ({}): a NIC failure takes both down (choose another standby with HA_NCCL_STANDBY_MAP)",
                    info.name,
                    devs[s].name,
                    info.pci_path.as_deref().unwrap_or("")
                ));
            }
        }
    }
    if fabric == "sock" && cfg.rto <= cfg.sock_retry {
        out.push(format!(
            "HA_NCCL_RTO_MS ({:?}) is not above HA_NCCL_SOCK_RETRY_MS ({:?}): the soft timeout may move traffic to the standby before the fabric's own retries give up",
            cfg.rto, cfg.sock_retry
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::LinkLayer;

    fn dev(name: &str, pci: Option<&str>) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            pci_path: pci.map(String::from),
            guid: 1,
            speed_mbps: 100_000,
            port: 1,
            link_layer: LinkLayer::InfiniBand,
            limits: Default::default(),
            ptr_support: 1,
            max_msg_bytes: 1 << 30,
        }
    }

    /// Finding: a rail given as an address this host does not have passed init and failed
    /// later at connect (`listen on 192.0.2.1: Cannot assign requested address`), not naming
    /// the variable. Now init refuses it like a bad interface name.
    #[test]
    fn a_rail_address_not_on_this_host_is_refused_at_init() {
        let ifs = netif::interfaces().unwrap();
        let e = sock_rails(&["192.0.2.1".to_string()], &ifs).unwrap_err();
        assert!(
            e.starts_with("HA_NCCL_SOCK_RAILS: rail \"192.0.2.1\""),
            "{e}"
        );
        assert!(e.contains("not an address of this host"), "{e}");
        let e = sock_rails(&["nosuchif0".to_string()], &ifs).unwrap_err();
        assert!(
            e.starts_with("HA_NCCL_SOCK_RAILS: rail \"nosuchif0\""),
            "{e}"
        );
        // Loopback aliases are this host's.
        let r = sock_rails(&["127.0.0.1".to_string(), "127.0.0.2".to_string()], &ifs).unwrap();
        assert_eq!(r.len(), 2);
        let e = sock_rails(&["lo".to_string(), "lo".to_string()], &ifs).unwrap_err();
        assert!(e.contains("same address"), "{e}");
    }

    /// Finding: with one rail and the standby enabled (the default), "one path (no standby)"
    /// showed only at INFO, per connection. Now init warns once.
    #[test]
    fn running_without_a_standby_is_warned_once_at_init() {
        let cfg = Config::default();
        let w = init_warnings(&cfg, "sock", &[dev("sock:eth0", None)], &[]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("HA_NCCL_ENABLE_BACKUP=1 but fabric sock has one device"));
        let off = Config {
            enable_backup: false,
            ..Config::default()
        };
        assert!(init_warnings(&off, "sock", &[dev("sock:eth0", None)], &[]).is_empty());
        let two = [dev("sock:a", None), dev("sock:b", None)];
        assert!(init_warnings(&cfg, "sock", &two, &[]).is_empty());
    }

    #[test]
    fn a_verbs_standby_on_the_primarys_nic_is_warned() {
        let cfg = Config::default();
        let nic = Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0");
        let devs = [dev("mlx5_0:1", nic), dev("mlx5_0:2", nic)];
        let w = init_warnings(&cfg, "verbs", &devs, &[]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("ports of one NIC") && w[0].contains("HA_NCCL_STANDBY_MAP"));
        let other = Some("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        let devs = [dev("mlx5_0:1", nic), dev("mlx5_1:1", other)];
        assert!(init_warnings(&cfg, "verbs", &devs, &[]).is_empty());
    }
}
