//! Host buffers for the stream: one slot per operation in flight, registered with
//! `regMr(NCCL_PTR_HOST)` once or several times (one registration per part of a multi-receive
//! group by default; NCCL itself often passes one registration for all parts, which
//! `--shared-mr` reproduces). While a request is in flight the plugin owns the slot's bytes;
//! after a failure some requests may still be in flight, so [`leak`] keeps the slots (and
//! their registrations) alive for the rest of the process.

use nccl_net_abi::common::NCCL_PTR_HOST;
use nccl_net_loader::{Comm, Mr, Plugin};

pub struct Slot {
    bytes: Vec<u8>,
    mrs: Vec<Mr>,
}

impl Slot {
    /// Allocates `len` bytes (at least 8) and registers them `regs` times (at least once).
    pub fn register(plugin: &Plugin, comm: &Comm, len: usize, regs: usize) -> Result<Slot, String> {
        let mut s = Slot {
            bytes: vec![0u8; len.max(8)],
            mrs: Vec::with_capacity(regs.max(1)),
        };
        for _ in 0..regs.max(1) {
            match plugin.reg_mr(comm, s.bytes.as_mut_ptr(), s.bytes.len(), NCCL_PTR_HOST) {
                Ok(mr) => s.mrs.push(mr),
                Err(e) => {
                    let n = s.bytes.len();
                    // Nothing was posted on this slot yet.
                    let _ = s.deregister(plugin, comm);
                    return Err(format!("regMr({n} bytes): {e}"));
                }
            }
        }
        Ok(s)
    }

    pub fn deregister(self, plugin: &Plugin, comm: &Comm) -> Result<(), String> {
        let mut first = Ok(());
        for mr in self.mrs {
            if let Err(e) = plugin.dereg_mr(comm, mr) {
                if first.is_ok() {
                    first = Err(format!("deregMr: {e}"));
                }
            }
        }
        first
    }

    /// The registration for part `j` (the last one when there are fewer).
    pub fn mr(&self, j: usize) -> &Mr {
        &self.mrs[j.min(self.mrs.len() - 1)]
    }

    /// Address of byte `off`.
    pub fn ptr(&mut self, off: usize) -> *mut u8 {
        self.bytes[off..].as_mut_ptr()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// `n` slots of `len` bytes with `regs` registrations each, on the send or receive comm.
pub fn register_all(
    plugin: &Plugin,
    comm: &Comm,
    n: usize,
    len: usize,
    regs: usize,
) -> Result<Vec<Slot>, String> {
    let mut slots = Vec::with_capacity(n);
    for _ in 0..n {
        match Slot::register(plugin, comm, len, regs) {
            Ok(s) => slots.push(s),
            Err(e) => {
                for s in slots {
                    let _ = s.deregister(plugin, comm);
                }
                return Err(e);
            }
        }
    }
    Ok(slots)
}

/// Deregisters slots after a clean run; the first failure is returned.
pub fn deregister_all(plugin: &Plugin, comm: &Comm, slots: Vec<Slot>) -> Result<(), String> {
    let mut first = Ok(());
    for s in slots {
        let r = s.deregister(plugin, comm);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Keeps slots alive forever: the plugin may still write into them after a failed run.
pub fn leak(slots: Vec<Slot>) {
    std::mem::forget(slots);
}
