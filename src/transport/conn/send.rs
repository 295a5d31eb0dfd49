//! Send side of an established connection: applies the `SendSide` machine to a path.

use super::error::Result;
use super::mr::MrHandle;
use super::path::{Keepalive, Path};
use crate::fabric::{MemoryRegion, SendOp, SendWr, Sge};
use crate::transport::data::layout::{SharedWords, RECORD_BYTES, RECORD_WORDS};
use crate::transport::data::send::{SendArgs, SendBatch, SendSide};
use crate::transport::data::{ProtoError, ReqId};
use crate::transport::handshake::RemoteBuf;

pub struct SendComm {
    // Drop order: the path (fenced QP) before the memory the peer writes into.
    pub(crate) path: Path,
    pub(crate) _fifo_mr: Box<dyn MemoryRegion>,
    pub(crate) stage_mr: Box<dyn MemoryRegion>,
    pub(crate) fifo: SharedWords,
    pub(crate) stage: SharedWords,
    pub(crate) peer_records: RemoteBuf,
    pub(crate) machine: SendSide,
    pub(crate) max_poll: usize,
    pub(crate) keepalive: Keepalive,
    /// Keeps the device (PD) alive until the registrations above are gone.
    pub(crate) _hold: crate::engine::Lease,
}

impl SendComm {
    /// Post a send of `[addr, addr+size)`; `Ok(None)` when the receiver has not posted yet.
    pub fn isend(
        &mut self,
        addr: usize,
        size: usize,
        tag: i32,
        mr: &MrHandle,
    ) -> Result<Option<ReqId>> {
        self.drain();
        if size > 0 && !mr.contains(addr, size) {
            return Err(super::error::Error::Usage(format!(
                "send buffer {addr:#x}+{size} lies outside its registration {:#x}+{}",
                mr.addr, mr.len
            )));
        }
        let lkey = mr.keys_for(&self.path.lease.dev)?.lkey;
        let args = SendArgs {
            addr: addr as u64,
            size: size as u64,
            tag,
            lkey,
        };
        match self.machine.isend(&self.fifo, args)? {
            None => {
                // No receive posted yet: make sure the peer is still there.
                if let Err(e) = self.keepalive.waiting(&*self.path.qp, self.peer_records) {
                    self.machine.fail(ProtoError::Failed {
                        status: crate::fabric::WcStatus::LocQpOpErr,
                        what: "posting a keep-alive probe",
                    });
                    return Err(e.into());
                }
                Ok(None)
            }
            Some((id, None)) => {
                self.keepalive.progress();
                Ok(Some(id))
            }
            Some((id, Some(batch))) => {
                self.keepalive.progress();
                self.post(&batch)?;
                Ok(Some(id))
            }
        }
    }

    fn post(&mut self, b: &SendBatch) -> Result<()> {
        let slot = b.slot();
        for (i, w) in b.record.iter().enumerate() {
            self.stage.store(slot * RECORD_WORDS + i, *w);
        }
        let mut wrs: Vec<SendWr> = b
            .writes
            .iter()
            .map(|w| SendWr {
                wr_id: w.wr_id,
                op: SendOp::Write,
                local: Sge {
                    addr: w.local_addr as usize,
                    len: w.len as usize,
                    lkey: w.lkey,
                },
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                signaled: false,
            })
            .collect();
        wrs.push(SendWr {
            wr_id: b.record_wr_id,
            op: SendOp::WriteWithImm(b.imm()),
            local: Sge {
                addr: self.stage.addr() + slot * RECORD_BYTES,
                len: RECORD_BYTES,
                lkey: self.stage_mr.keys().lkey,
            },
            remote_addr: self.peer_records.addr + (slot * RECORD_BYTES) as u64,
            rkey: self.peer_records.rkey,
            signaled: true,
        });
        if let Err(e) = self.path.qp.post_send(&wrs) {
            self.machine.fail(ProtoError::Failed {
                status: crate::fabric::WcStatus::LocQpOpErr,
                what: "posting the payload writes",
            });
            return Err(e.into());
        }
        Ok(())
    }

    /// `Ok(Some(size))` once the send completed.
    pub fn test(&mut self, id: ReqId) -> Result<Option<u64>> {
        self.drain();
        Ok(self.machine.test(id)?)
    }

    fn drain(&mut self) {
        for _ in 0..self.max_poll {
            match self.path.route.inbox.pop() {
                Some(c) => {
                    self.keepalive.on_completion(&c);
                    self.machine.on_completion(&c)
                }
                None => break,
            }
        }
    }

    pub fn device(&self) -> usize {
        self.path.lease.dev.dev
    }

    /// The device resources registrations for this connection are made on.
    pub fn device_res(&self) -> &std::sync::Arc<crate::engine::DeviceRes> {
        &self.path.lease.dev
    }
}
