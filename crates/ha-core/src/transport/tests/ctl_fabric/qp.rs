//! The wrapped queue pair: posts, completions and link signals as the test's [`Ctl`] says.

use super::Ctl;
use crate::fabric::sock::SockEndpoint;
use crate::fabric::{
    Completion, FabricError, QpState, QueuePair, Result, SendWr, WcOpcode, WcStatus,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(super) struct CtlQp {
    pub(super) inner: Box<dyn QueuePair>,
    pub(super) ctl: Arc<Ctl>,
    pub(super) qpn: u32,
    pub(super) dev: usize,
}

impl CtlQp {
    /// Work posted on a dead link: the first signaled request completes `RETRY_EXC_ERR` (the
    /// retries ran out), everything after it is flushed; the queue pair stays broken.
    fn fail_dead(&self, wrs: &[SendWr]) {
        let mut first = self.ctl.broken.lock().insert(self.qpn);
        // A device reports an error for a request whether or not it was signaled: here the
        // signaled ones and the post's last (an unsignaled clear-to-send ends its post).
        let n = wrs.len();
        for (_, w) in wrs
            .iter()
            .enumerate()
            .filter(|(k, w)| w.signaled || k + 1 == n)
        {
            self.ctl.inject(Completion {
                wr_id: w.wr_id,
                qp_num: self.qpn,
                status: if first {
                    WcStatus::RetryExcErr
                } else {
                    WcStatus::WrFlushErr
                },
                opcode: WcOpcode::RdmaWrite,
                byte_len: 0,
                imm: None,
            });
            first = false;
        }
    }
}

impl QueuePair for CtlQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }
    fn state(&self) -> QpState {
        self.inner.state()
    }
    fn local_endpoint(&self) -> Vec<u8> {
        self.inner.local_endpoint()
    }
    fn to_init(&self) -> Result<()> {
        self.inner.to_init()
    }
    fn to_rtr(&self, remote: &[u8]) -> Result<()> {
        if self.ctl.cut_at_an_end(self.dev) {
            return Err(FabricError::System(format!(
                "ctl: the link of device {} is down",
                self.dev
            )));
        }
        self.inner.to_rtr(remote)?;
        let peer = SockEndpoint::decode(remote).ok().map(|e| e.qpn);
        let mut qps = self.ctl.qps.lock();
        let me = qps.entry(self.qpn).or_default();
        me.peer = peer;
        me.connected = true;
        Ok(())
    }
    fn to_rts(&self) -> Result<()> {
        self.inner.to_rts()
    }
    fn to_err(&self) -> Result<()> {
        self.inner.to_err()
    }
    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        let eager = wrs.iter().any(|w| {
            let (kind, _, index) = ha_proto::data::layout::decode_wr_id(w.wr_id);
            kind == Some(ha_proto::data::layout::WrKind::Record) && index == 2
        });
        if eager {
            self.ctl.eager_writes.fetch_add(1, Ordering::Relaxed);
            let data = wrs
                .iter()
                .filter(|w| matches!(w.op, crate::fabric::SendOp::Write));
            if data.clone().count() > 0 && data.clone().all(|w| w.inline) {
                self.ctl.eager_inline.fetch_add(1, Ordering::Relaxed);
            }
        }
        for w in wrs {
            let (kind, _, index) = ha_proto::data::layout::decode_wr_id(w.wr_id);
            if kind == Some(ha_proto::data::layout::WrKind::Record) && index == 1 {
                self.ctl.fast_writes.fetch_add(1, Ordering::Relaxed);
                if w.inline {
                    self.ctl.fast_inline.fetch_add(1, Ordering::Relaxed);
                }
            }
            if kind == Some(ha_proto::data::layout::WrKind::Cts) {
                let c = if w.signaled {
                    &self.ctl.cts_signaled
                } else {
                    &self.ctl.cts_unsignaled
                };
                c.fetch_add(1, Ordering::Relaxed);
                *self.ctl.cts_lens.lock().entry(w.local.len).or_default() += 1;
            }
        }
        if self.ctl.link_dead(self.dev) || self.ctl.broken.lock().contains(&self.qpn) {
            self.fail_dead(wrs);
            return Ok(());
        }
        if let Some(n) = self
            .ctl
            .fail_post
            .lock()
            .get_mut(&self.qpn)
            .filter(|n| **n > 0)
        {
            *n -= 1;
            return Err(FabricError::System(format!(
                "ctl: a post on qp {} fails",
                self.qpn
            )));
        }
        if let Some(max) = *self.ctl.max_msg.lock() {
            if let Some(w) = wrs.iter().find(|w| w.local.len > max) {
                return Err(FabricError::InvalidArgument(format!(
                    "ctl: work request of {} bytes above the device's {max}",
                    w.local.len
                )));
            }
        }
        {
            let qps = self.ctl.qps.lock();
            let peer_ready = qps
                .get(&self.qpn)
                .and_then(|q| q.peer)
                .and_then(|p| qps.get(&p))
                .is_some_and(|p| p.connected);
            if !peer_ready {
                self.ctl
                    .posts_to_unconnected
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        self.inner.post_send(wrs)
    }
    fn post_recv(&self, wr_id: u64) -> Result<()> {
        self.inner.post_recv(wr_id)
    }
    fn link_alive(&self) -> Option<bool> {
        if self.ctl.hide_link.load(Ordering::Relaxed) {
            return None;
        }
        self.inner.link_alive()
    }
    fn silence_floor(&self) -> std::time::Duration {
        self.inner.silence_floor()
    }
    fn reports_link_silence(&self) -> bool {
        !self.ctl.hide_link.load(Ordering::Relaxed)
    }
    fn link_silence(&self) -> Option<std::time::Duration> {
        if self.ctl.hide_link.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(t) = self.ctl.silent.lock().get(&self.dev) {
            return Some(t.elapsed());
        }
        self.inner.link_silence()
    }
}
