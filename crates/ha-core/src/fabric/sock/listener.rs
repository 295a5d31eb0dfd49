//! The listener of a `sock` protection domain: one thread accepting streams on the rail's
//! port, reading each stream's hello and handing the stream to the queue pair it names.

use super::domain::PdShared;
use super::net;
use super::wire::{Hello, HELLO_LEN};
use super::{spawn, Tunables};
use crate::fabric::counters::{self, Counted, Held, Resource};
use crate::fabric::{FabricError, Result};
use std::io::Read;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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

impl PdCore {
    /// Listen on `ip:0` for device `dev` and start the listener thread.
    pub fn open(dev: usize, ip: IpAddr, tun: Tunables) -> Result<PdCore> {
        let listener = net::listen(ip)
            .map(counters::socket)
            .map_err(|e| FabricError::io(format!("sock: listen on {ip}"), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| FabricError::io("sock: listener address", e))?
            .port();
        let shared = Arc::new(PdShared::new(dev, ip, port, tun));
        let stop = Arc::new(AtomicBool::new(false));
        let l2 = listener
            .try_clone()
            .map(counters::socket)
            .map_err(|e| FabricError::io("sock: clone listener", e))?;
        let (sh, st) = (shared.clone(), stop.clone());
        let thread = spawn(format!("sock-lsn-{}", shared.id), move || {
            listen_loop(l2, sh, st)
        })?;
        Ok(PdCore {
            shared,
            stop,
            listener,
            thread: Some(thread),
            _held: Held::new(Resource::Pd),
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
