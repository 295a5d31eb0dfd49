//! Handles given to NCCL (`void*` comms, registrations, requests) are opaque tokens, never
//! pointers: a kind tag, a slot index and a generation. A NULL, forged, stale (closed) or
//! wrong-kind handle is detected and reported instead of dereferenced.
//!
//! Object token: `kind << 56 | gen << 16 | index` (index < 65536, gen 16 bits).
//! Request token: `kind << 56 | comm_gen(8) << 48 | comm_index(16) << 32 | req_gen(16) << 16 | req_index(16)`.

use super::error::{ApiError, ApiResult};
use ha_proto::data::ReqId;
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Listen = 0x11,
    Send = 0x12,
    Recv = 0x13,
    Mr = 0x14,
    SendReq = 0x15,
    RecvReq = 0x16,
    FlushReq = 0x17,
    Connect = 0x18,
    Context = 0x19,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            0x11 => Kind::Listen,
            0x12 => Kind::Send,
            0x13 => Kind::Recv,
            0x14 => Kind::Mr,
            0x15 => Kind::SendReq,
            0x16 => Kind::RecvReq,
            0x17 => Kind::FlushReq,
            0x18 => Kind::Connect,
            0x19 => Kind::Context,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Kind::Listen => "listen comm",
            Kind::Send => "send comm",
            Kind::Recv => "recv comm",
            Kind::Mr => "memory handle",
            Kind::SendReq | Kind::RecvReq | Kind::FlushReq => "request",
            Kind::Connect => "connect state",
            Kind::Context => "net context",
        }
    }
}

const MAX_SLOTS: usize = 1 << 16;

/// A table of live objects of one kind.
pub struct Registry<T> {
    kind: Kind,
    slots: Mutex<Slots<T>>,
}

struct Slots<T> {
    items: Vec<(u16, Option<Arc<Mutex<T>>>)>,
    free: Vec<u16>,
}

/// Decode what a token claims to be.
pub fn kind_of(token: u64) -> Option<Kind> {
    Kind::from_u8((token >> 56) as u8)
}

impl<T> Registry<T> {
    pub const fn new(kind: Kind) -> Self {
        Registry {
            kind,
            slots: Mutex::new(Slots {
                items: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    pub fn insert(&self, v: T) -> ApiResult<u64> {
        let mut s = self.slots.lock();
        let index = match s.free.pop() {
            Some(i) => i as usize,
            None if s.items.len() < MAX_SLOTS => {
                s.items.push((0, None));
                s.items.len() - 1
            }
            None => {
                return Err(ApiError::new(
                    super::error::Code::SystemError,
                    format!("too many live {}s", self.kind.name()),
                ))
            }
        };
        let slot = &mut s.items[index];
        slot.0 = slot.0.wrapping_add(1).max(1);
        slot.1 = Some(Arc::new(Mutex::new(v)));
        Ok(((self.kind as u64) << 56) | ((slot.0 as u64) << 16) | index as u64)
    }

    fn locate(&self, token: u64, what: &str) -> ApiResult<(usize, u16)> {
        if token == 0 {
            return Err(ApiError::arg(format!("{what} is NULL")));
        }
        match kind_of(token) {
            Some(k) if k == self.kind => {}
            Some(k) => {
                return Err(ApiError::arg(format!(
                    "{what} is a {}, not a {}",
                    k.name(),
                    self.kind.name()
                )))
            }
            None => {
                return Err(ApiError::arg(format!(
                    "{what} {token:#x} is not a handle of this plugin"
                )))
            }
        }
        if token & 0x00ff_ffff_0000_0000 != 0 {
            return Err(ApiError::arg(format!(
                "{what} {token:#x} is not a handle of this plugin"
            )));
        }
        Ok(((token & 0xffff) as usize, ((token >> 16) & 0xffff) as u16))
    }

    /// The live object behind `token`.
    pub fn get(&self, token: u64, what: &str) -> ApiResult<Arc<Mutex<T>>> {
        let (index, gen) = self.locate(token, what)?;
        let s = self.slots.lock();
        match s.items.get(index) {
            Some((g, Some(v))) if *g == gen => Ok(v.clone()),
            Some((g, _)) if *g >= gen && gen != 0 => Err(ApiError::usage(format!(
                "{what} {token:#x} was already closed"
            ))),
            _ => Err(ApiError::arg(format!(
                "{what} {token:#x} is not a live handle of this plugin"
            ))),
        }
    }

    /// Remove and return the object behind `token`.
    pub fn remove(&self, token: u64, what: &str) -> ApiResult<Arc<Mutex<T>>> {
        let (index, gen) = self.locate(token, what)?;
        let mut s = self.slots.lock();
        match s.items.get_mut(index) {
            Some((g, v @ Some(_))) if *g == gen => {
                let v = v.take().expect("live");
                s.free.push(index as u16);
                Ok(v)
            }
            Some((g, _)) if *g >= gen && gen != 0 => Err(ApiError::usage(format!(
                "{what} {token:#x} was already closed"
            ))),
            _ => Err(ApiError::arg(format!(
                "{what} {token:#x} is not a live handle of this plugin"
            ))),
        }
    }

    /// Live objects.
    pub fn len(&self) -> usize {
        let s = self.slots.lock();
        s.items.iter().filter(|(_, v)| v.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A request token for request `req` of comm `comm_token`.
pub fn request_token(kind: Kind, comm_token: u64, req: ReqId) -> u64 {
    let comm_index = comm_token & 0xffff;
    let comm_gen = (comm_token >> 16) & 0xff;
    ((kind as u64) << 56)
        | (comm_gen << 48)
        | (comm_index << 32)
        | ((req.gen as u64) << 16)
        | req.index as u64
}

/// Split a request token into (kind, comm index, comm gen low byte, request id).
pub fn split_request(token: u64) -> ApiResult<(Kind, usize, u8, ReqId)> {
    if token == 0 {
        return Err(ApiError::arg("request is NULL"));
    }
    match kind_of(token) {
        Some(k @ (Kind::SendReq | Kind::RecvReq | Kind::FlushReq)) => Ok((
            k,
            ((token >> 32) & 0xffff) as usize,
            ((token >> 48) & 0xff) as u8,
            ReqId {
                index: (token & 0xffff) as u16,
                gen: ((token >> 16) & 0xffff) as u16,
            },
        )),
        _ => Err(ApiError::arg(format!(
            "request {token:#x} is not a request of this plugin"
        ))),
    }
}

impl<T> Registry<T> {
    /// The comm a request token points at (its index and generation byte must match).
    pub fn get_for_request(&self, index: usize, gen_low: u8) -> ApiResult<Arc<Mutex<T>>> {
        let s = self.slots.lock();
        match s.items.get(index) {
            Some((g, Some(v))) if (*g & 0xff) as u8 == gen_low => Ok(v.clone()),
            _ => Err(ApiError::usage(
                "request belongs to a connection that was closed",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error::Code;

    #[test]
    fn tokens_roundtrip_and_detect_misuse() {
        let r: Registry<u32> = Registry::new(Kind::Send);
        let t = r.insert(7).unwrap();
        assert_eq!(*r.get(t, "sendComm").unwrap().lock(), 7);
        assert_eq!(
            r.get(0, "sendComm").unwrap_err().code,
            Code::InvalidArgument
        );
        let wrong_kind = (t & !(0xff << 56)) | ((Kind::Recv as u64) << 56);
        assert_eq!(
            r.get(wrong_kind, "sendComm").unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            r.get(0xdead_beef, "sendComm").unwrap_err().code,
            Code::InvalidArgument
        );
        r.remove(t, "sendComm").unwrap();
        let e = r.remove(t, "sendComm").unwrap_err();
        assert_eq!(e.code, Code::InvalidUsage, "double close: {e}");
        assert!(e.msg.contains("already closed"));
        // The slot is reused with a new generation; the stale token stays dead.
        let t2 = r.insert(8).unwrap();
        assert_ne!(t, t2);
        assert_eq!(r.get(t, "sendComm").unwrap_err().code, Code::InvalidUsage);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn request_tokens_carry_comm_and_request() {
        let r: Registry<u32> = Registry::new(Kind::Recv);
        let c = r.insert(1).unwrap();
        let id = ReqId { index: 5, gen: 300 };
        let t = request_token(Kind::RecvReq, c, id);
        let (k, idx, g, rid) = split_request(t).unwrap();
        assert_eq!((k, rid), (Kind::RecvReq, id));
        assert!(r.get_for_request(idx, g).is_ok());
        assert!(split_request(c).is_err(), "a comm is not a request");
    }
}
