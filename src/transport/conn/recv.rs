//! Receive side of an established connection: applies the `RecvSide` machine to a path.

use super::error::{Error, Result};
use super::mr::MrHandle;
use super::path::{Keepalive, Path};
use crate::fabric::{MemoryRegion, SendOp, SendWr, Sge, WcStatus};
use crate::transport::data::layout::{CtsEntry, SharedWords, CTS_SLOT_BYTES, CTS_SLOT_WORDS};
use crate::transport::data::recv::RecvSide;
use crate::transport::data::{ProtoError, ReqId};
use crate::transport::handshake::RemoteBuf;

/// One buffer of a (multi-)receive.
pub struct RecvArg<'a> {
    pub addr: usize,
    pub size: usize,
    pub tag: i32,
    pub mr: &'a MrHandle,
}

pub struct RecvComm {
    pub(crate) path: Path,
    pub(crate) _records_mr: Box<dyn MemoryRegion>,
    pub(crate) cts_mr: Box<dyn MemoryRegion>,
    pub(crate) records: SharedWords,
    pub(crate) cts_stage: SharedWords,
    pub(crate) peer_fifo: RemoteBuf,
    pub(crate) machine: RecvSide,
    pub(crate) max_poll: usize,
    pub(crate) keepalive: Keepalive,
    /// Keeps the device (PD) alive until the registrations above are gone.
    pub(crate) _hold: crate::engine::Lease,
}

impl RecvComm {
    /// Post a receive of 1..=8 buffers; `Ok(None)` when 32 are already outstanding.
    pub fn irecv(&mut self, bufs: &[RecvArg]) -> Result<Option<ReqId>> {
        self.drain();
        let mut entries = Vec::with_capacity(bufs.len());
        for b in bufs {
            if b.size > 0 && !b.mr.contains(b.addr, b.size) {
                return Err(Error::Usage(format!(
                    "receive buffer {:#x}+{} lies outside its registration {:#x}+{}",
                    b.addr, b.size, b.mr.addr, b.mr.len
                )));
            }
            entries.push(CtsEntry {
                addr: b.addr as u64,
                size: b.size as u64,
                rkey: b.mr.keys_for(&self.path.lease.dev)?.rkey,
                tag: b.tag,
            });
        }
        let Some((id, p)) = self.machine.post(&entries)? else {
            return Ok(None);
        };
        let base = p.slot * CTS_SLOT_WORDS;
        for (i, w) in p.cts.iter().enumerate() {
            self.cts_stage.store(base + i, *w);
        }
        let wr = SendWr {
            wr_id: p.cts_wr_id,
            op: SendOp::Write,
            local: Sge {
                addr: self.cts_stage.addr() + p.slot * CTS_SLOT_BYTES,
                len: CTS_SLOT_BYTES,
                lkey: self.cts_mr.keys().lkey,
            },
            remote_addr: self.peer_fifo.addr + (p.slot * CTS_SLOT_BYTES) as u64,
            rkey: self.peer_fifo.rkey,
            signaled: true,
        };
        let posted = self
            .path
            .qp
            .post_recv(p.recv_wr_id)
            .and_then(|_| self.path.qp.post_send(&[wr]));
        if let Err(e) = posted {
            self.machine.fail(ProtoError::Failed {
                status: WcStatus::LocQpOpErr,
                what: "posting the receive",
            });
            return Err(e.into());
        }
        Ok(Some(id))
    }

    /// `Ok(Some(sizes))` once the receive completed.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Vec<u64>>> {
        self.drain();
        let r = self.machine.test(id)?;
        if r.is_some() {
            self.keepalive.progress();
        } else if let Err(e) = self.keepalive.waiting(&*self.path.qp, self.peer_fifo) {
            // Waiting for data: make sure the sender is still there.
            self.machine.fail(ProtoError::Failed {
                status: WcStatus::LocQpOpErr,
                what: "posting a keep-alive probe",
            });
            return Err(e.into());
        }
        Ok(r)
    }

    fn drain(&mut self) {
        for _ in 0..self.max_poll {
            match self.path.route.inbox.pop() {
                Some(c) => {
                    self.keepalive.on_completion(&c);
                    self.machine.on_completion(&c, &self.records)
                }
                None => break,
            }
        }
    }

    /// Completions dropped as duplicates.
    pub fn duplicates(&self) -> u64 {
        self.machine.duplicates()
    }

    pub fn device(&self) -> usize {
        self.path.lease.dev.dev
    }

    /// The device resources registrations for this connection are made on.
    pub fn device_res(&self) -> &std::sync::Arc<crate::engine::DeviceRes> {
        &self.path.lease.dev
    }
}
