//! Connection setup between the two harness endpoints, the way NCCL does it: each side
//! `listen`s, the 128-byte handles are exchanged out of band, then each side loops
//! `connect` (to the peer's handle) and `accept` (on its own listen comm), both non-blocking,
//! until both return a comm or the deadline passes. Each endpoint ends up with a send comm to
//! the peer and a receive comm from the peer.

use super::backoff::Backoff;
use super::wire::Handle;
use nccl_net_loader::{Comm, Plugin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The two endpoints. In `procs` mode A is the parent and B the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Side {
    pub fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }

    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
}

/// Carries listen handles between the endpoints.
pub trait HandleExchange {
    /// Gives our handle to the peer and returns the peer's, or fails at `deadline`.
    fn exchange(&mut self, mine: &Handle, deadline: Instant) -> Result<Handle, String>;
}

/// Handle exchange between two threads of one process.
pub struct ChannelExchange {
    tx: mpsc::Sender<Handle>,
    rx: mpsc::Receiver<Handle>,
}

/// A connected pair of channel exchanges, one per endpoint.
pub fn channel_pair() -> (ChannelExchange, ChannelExchange) {
    let (tx_ab, rx_ab) = mpsc::channel();
    let (tx_ba, rx_ba) = mpsc::channel();
    (
        ChannelExchange {
            tx: tx_ab,
            rx: rx_ba,
        },
        ChannelExchange {
            tx: tx_ba,
            rx: rx_ab,
        },
    )
}

/// Waits for a handle from `rx` until `deadline`.
pub fn recv_handle(rx: &mpsc::Receiver<Handle>, deadline: Instant) -> Result<Handle, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    rx.recv_timeout(left).map_err(|e| match e {
        mpsc::RecvTimeoutError::Timeout => "peer did not send its listen handle in time".into(),
        mpsc::RecvTimeoutError::Disconnected => {
            "peer stopped before sending its listen handle".into()
        }
    })
}

impl HandleExchange for ChannelExchange {
    fn exchange(&mut self, mine: &Handle, deadline: Instant) -> Result<Handle, String> {
        self.tx
            .send(*mine)
            .map_err(|_| "peer stopped before taking our listen handle".to_string())?;
        recv_handle(&self.rx, deadline)
    }
}

/// One connected endpoint: a send comm to the peer and a receive comm from it.
pub struct Endpoint<'p> {
    pub plugin: &'p Plugin,
    pub dev: i32,
    pub send: Comm,
    pub recv: Comm,
}

impl Endpoint<'_> {
    /// Closes both comms (all requests must be complete).
    pub fn close(self) -> Result<(), String> {
        let s = self.plugin.close_send(self.send);
        let r = self.plugin.close_recv(self.recv);
        s.map_err(|e| format!("closeSend: {e}"))?;
        r.map_err(|e| format!("closeRecv: {e}"))
    }
}

/// Listens, exchanges handles and loops connect/accept until both complete.
pub fn establish<'p>(
    plugin: &'p Plugin,
    dev: i32,
    xchg: &mut dyn HandleExchange,
    timeout: Duration,
    abort: &AtomicBool,
) -> Result<Endpoint<'p>, String> {
    let (handle, listen) = plugin
        .listen(dev)
        .map_err(|e| format!("listen(dev {dev}): {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut peer = match xchg.exchange(&handle, deadline) {
        Ok(h) => h,
        Err(e) => {
            // Nothing connected to it yet: closing cannot strand a peer.
            let _ = plugin.close_listen(listen);
            return Err(e);
        }
    };
    let mut send = None;
    let mut recv = None;
    let mut backoff = Backoff::new(true);
    loop {
        let mut progress = false;
        if send.is_none() {
            send = plugin
                .connect(dev, &mut peer)
                .map_err(|e| format!("connect(dev {dev}): {e}"))?;
            progress |= send.is_some();
        }
        if recv.is_none() {
            recv = plugin.accept(&listen).map_err(|e| format!("accept: {e}"))?;
            progress |= recv.is_some();
        }
        if let (Some(_), Some(_)) = (&send, &recv) {
            break;
        }
        if abort.load(Ordering::Relaxed) {
            return Err("aborted during connection setup (the peer failed)".into());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "connection setup did not finish within {}s (connect {}, accept {})",
                timeout.as_secs(),
                if send.is_some() { "done" } else { "pending" },
                if recv.is_some() { "done" } else { "pending" },
            ));
        }
        if progress {
            backoff.reset();
        } else {
            backoff.snooze();
        }
    }
    // NCCL closes the listen comm as soon as its one accept is done.
    plugin
        .close_listen(listen)
        .map_err(|e| format!("closeListen: {e}"))?;
    match (send, recv) {
        (Some(send), Some(recv)) => Ok(Endpoint {
            plugin,
            dev,
            send,
            recv,
        }),
        _ => Err("connection setup ended without both comms".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl_net_abi::common::NCCL_NET_HANDLE_MAXSIZE;

    #[test]
    fn sides() {
        assert_eq!(Side::A.peer(), Side::B);
        assert_eq!(Side::B.peer(), Side::A);
        assert_eq!((Side::A.index(), Side::B.index()), (0, 1));
    }

    #[test]
    fn channel_exchange_swaps_handles() {
        let (mut a, mut b) = channel_pair();
        let deadline = Instant::now() + Duration::from_secs(30);
        let ha = [1u8; NCCL_NET_HANDLE_MAXSIZE];
        let hb = [2u8; NCCL_NET_HANDLE_MAXSIZE];
        let t = std::thread::spawn(move || b.exchange(&hb, deadline));
        assert_eq!(a.exchange(&ha, deadline), Ok(hb));
        assert_eq!(t.join().unwrap(), Ok(ha));
    }

    #[test]
    fn channel_exchange_reports_a_vanished_peer() {
        let (mut a, b) = channel_pair();
        drop(b);
        let deadline = Instant::now() + Duration::from_secs(30);
        let err = a
            .exchange(&[0u8; NCCL_NET_HANDLE_MAXSIZE], deadline)
            .unwrap_err();
        assert!(err.contains("peer stopped"), "{err}");
    }
}
