//! Protection domains of the `sock` fabric: the key table, the queue pair registry and the
//! listener thread that hands incoming streams to their target queue pair.

use super::cq::SockCq;
use super::mr::{MrTable, SockMr};
use super::net;
use super::qp::{QpShared, SockQp};
use super::wire::{Hello, HELLO_LEN};
use super::{spawn, Tunables};
use crate::fabric::counters::{self, Counted, Held, Resource};
use crate::fabric::{
    Access, CompletionQueue, Doorbell, FabricError, MemoryRegion, ProtectionDomain, QpCaps,
    QueuePair, Result,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

static NEXT_PD_ID: AtomicU64 = AtomicU64::new(1);

/// What the listener and the queue pairs' threads share.
pub struct PdShared {
    pub id: u64,
    pub dev: usize,
    pub ip: IpAddr,
    pub port: u16,
    pub tun: Tunables,
    pub mrs: MrTable,
    qps: Mutex<HashMap<u32, Weak<QpShared>>>,
}

impl PdShared {
    pub fn register_qp(&self, qp: &Arc<QpShared>) {
        self.qps.lock().insert(qp.qpn, Arc::downgrade(qp));
    }
    pub fn unregister_qp(&self, qpn: u32) {
        self.qps.lock().remove(&qpn);
    }
    fn qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.qps.lock().get(&qpn).and_then(Weak::upgrade)
    }
}

/// Owns the listener thread; alive while the PD handle or any of its queue pairs is.
pub struct PdCore {
    pub shared: Arc<PdShared>,
    stop: Arc<AtomicBool>,
    listener: Counted<TcpListener>,
    thread: Option<JoinHandle<()>>,
    _held: Held,
}

impl Drop for PdCore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        net::shutdown(self.listener.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The handle `open_pd` returns.
pub struct SockPd {
    core: Arc<PdCore>,
}

impl SockPd {
    pub fn open(dev: usize, ip: IpAddr, tun: Tunables) -> Result<SockPd> {
        let listener = net::listen(ip)
            .map(counters::socket)
            .map_err(|e| FabricError::io(format!("sock: listen on {ip}"), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| FabricError::io("sock: listener address", e))?
            .port();
        let shared = Arc::new(PdShared {
            id: NEXT_PD_ID.fetch_add(1, Ordering::Relaxed),
            dev,
            ip,
            port,
            tun,
            mrs: MrTable::default(),
            qps: Mutex::new(HashMap::new()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let l2 = listener
            .try_clone()
            .map(counters::socket)
            .map_err(|e| FabricError::io("sock: clone listener", e))?;
        let (sh, st) = (shared.clone(), stop.clone());
        let thread = spawn(format!("sock-lsn-{}", shared.id), move || {
            listen_loop(l2, sh, st)
        })?;
        Ok(SockPd {
            core: Arc::new(PdCore {
                shared,
                stop,
                listener,
                thread: Some(thread),
                _held: Held::new(Resource::Pd),
            }),
        })
    }
}

fn listen_loop(l: Counted<TcpListener>, pd: Arc<PdShared>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        // Poll so a missed shutdown wake-up still ends the loop.
        match net::poll_one(l.as_raw_fd(), libc::POLLIN, 200) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
        match l.accept() {
            Ok((s, _)) => hand_over(counters::socket(s), &pd),
            Err(e) => {
                tracing::debug!("sock: accept: {e}");
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Read the hello and give the stream to its queue pair, or drop (close) it.
fn hand_over(mut s: Counted<TcpStream>, pd: &PdShared) {
    let mut b = [0u8; HELLO_LEN];
    let ok = s.set_nonblocking(false).is_ok()
        && s.set_read_timeout(Some(Duration::from_secs(1))).is_ok()
        && s.read_exact(&mut b).is_ok();
    if !ok {
        return;
    }
    let hello = match Hello::decode(&b) {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!("sock: bad hello: {e}");
            return;
        }
    };
    match pd.qp(hello.target_qpn) {
        Some(qp) => {
            if !qp.attach_inbound(s, &hello) {
                tracing::debug!("sock: stream for qp {} refused", hello.target_qpn);
            }
        }
        None => tracing::debug!("sock: stream for unknown qp {}", hello.target_qpn),
    }
}

impl ProtectionDomain for SockPd {
    fn id(&self) -> u64 {
        self.core.shared.id
    }
    fn device(&self) -> usize {
        self.core.shared.dev
    }
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Box<dyn MemoryRegion>> {
        if len == 0 {
            return Err(FabricError::InvalidArgument(
                "sock: zero-length registration".into(),
            ));
        }
        if addr == 0 || addr.checked_add(len).is_none() {
            return Err(FabricError::InvalidArgument(format!(
                "sock: bad registration {addr:#x}+{len}"
            )));
        }
        let entry = self.core.shared.mrs.insert(addr, len, access);
        Ok(Box::new(SockMr {
            entry,
            pd: self.core.shared.clone(),
            _held: Held::new(Resource::Mr),
        }))
    }
    fn create_cq(&self, _depth: u32, doorbell: Arc<Doorbell>) -> Result<Arc<dyn CompletionQueue>> {
        Ok(SockCq::create(doorbell))
    }
    fn create_qp(&self, cq: &Arc<dyn CompletionQueue>, caps: QpCaps) -> Result<Box<dyn QueuePair>> {
        if caps.max_send_wr == 0 || caps.max_recv_wr == 0 {
            return Err(FabricError::InvalidArgument(
                "sock: queue pair needs max_send_wr and max_recv_wr > 0".into(),
            ));
        }
        let cq = SockCq::resolve(cq)?;
        Ok(Box::new(SockQp::new(self.core.clone(), cq, caps)))
    }
}
