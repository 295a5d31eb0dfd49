//! Connection handshake as sans-IO state machines (no sockets, no threads): the driver feeds
//! received bytes in, writes out what `transmit()` returns, and acts on the events.
//!
//! ```text
//! connector (send side)                     acceptor (recv side)
//!   Hello{token, flags, paths, fifo}   ──▶   check token; create + connect QPs
//!                                      ◀──   Accept{flags, paths, records}
//!   connect QPs (RTR, RTS)
//!   Ready                              ──▶   done
//!   done once Ready is written
//! ```
//! Frames: `[u32 len][u8 kind][body]`, len = 1 + body, at most [`MAX_FRAME`].

use super::handle::{HANDLE_MAGIC, PROTOCOL_VERSION};
use super::wire::{Reader, WireError, Writer};

pub const MAX_FRAME: usize = 4096;
/// At most this many paths (QPs) are described per side.
pub const MAX_PATHS: usize = 4;
const KIND_HELLO: u8 = 1;
const KIND_ACCEPT: u8 = 2;
const KIND_READY: u8 = 3;

/// A remotely writable buffer as seen through one path: address, key on that path, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

/// One path as offered to the peer: the fabric endpoint of its queue pair and the key of the
/// side's remotely written region on that path's device.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PathParams {
    pub endpoint: Vec<u8>,
    pub rkey: u32,
    /// The side's device index carrying this path (rail fabrics pair paths rail by rail).
    pub dev: u16,
}

/// What one side tells the other.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Params {
    pub flags: u16,
    /// Primary first, then the standby (if the side offers one).
    pub paths: Vec<PathParams>,
    /// The remotely written region (connector: CTS FIFO + mailbox; acceptor: completion
    /// records + mailbox).
    pub addr: u64,
    pub len: u32,
}

impl Params {
    /// The region as seen through path `i`.
    pub fn buf(&self, i: usize) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr,
            rkey: self.paths[i].rkey,
            len: self.len,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("malformed handshake message: {0}")]
    Wire(#[from] WireError),
    #[error("handshake token mismatch: the peer did not get our handle through NCCL")]
    BadToken,
    #[error("handshake frame of {0} bytes is over the limit")]
    FrameTooLarge(usize),
    #[error("unexpected handshake message kind {0} in this state")]
    Unexpected(u8),
    #[error("handshake message has {0} paths (1..={MAX_PATHS} allowed)")]
    BadPathCount(usize),
}

/// Buffers and frames bytes in both directions.
#[derive(Default)]
struct Framer {
    rx: Vec<u8>,
    tx: Vec<u8>,
    tx_off: usize,
}

impl Framer {
    fn push(&mut self, kind: u8, body: &[u8]) {
        let len = (1 + body.len()) as u32;
        self.tx.extend_from_slice(&len.to_le_bytes());
        self.tx.push(kind);
        self.tx.extend_from_slice(body);
    }

    fn pending(&self) -> &[u8] {
        &self.tx[self.tx_off..]
    }

    fn advance(&mut self, n: usize) {
        self.tx_off = (self.tx_off + n).min(self.tx.len());
        if self.tx_off == self.tx.len() {
            self.tx.clear();
            self.tx_off = 0;
        }
    }

    /// Next complete frame, if any.
    fn next(&mut self) -> Result<Option<(u8, Vec<u8>)>, HandshakeError> {
        if self.rx.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.rx[..4].try_into().expect("4")) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(HandshakeError::FrameTooLarge(len));
        }
        if self.rx.len() < 4 + len {
            return Ok(None);
        }
        let kind = self.rx[4];
        let body = self.rx[5..4 + len].to_vec();
        self.rx.drain(..4 + len);
        Ok(Some((kind, body)))
    }
}

fn put_params(w: &mut Writer, p: &Params) {
    w.u16(p.flags).u8(p.paths.len() as u8);
    for path in &p.paths {
        w.bytes8(&path.endpoint).u32(path.rkey).u16(path.dev);
    }
    w.u64(p.addr).u32(p.len);
}

fn get_params(r: &mut Reader) -> Result<Params, HandshakeError> {
    let flags = r.u16("flags")?;
    let n = r.u8("path count")? as usize;
    if n == 0 || n > MAX_PATHS {
        return Err(HandshakeError::BadPathCount(n));
    }
    let mut paths = Vec::with_capacity(n);
    for _ in 0..n {
        let endpoint = r.bytes8("path endpoint")?.to_vec();
        let rkey = r.u32("path rkey")?;
        let dev = r.u16("path device")?;
        paths.push(PathParams {
            endpoint,
            rkey,
            dev,
        });
    }
    Ok(Params {
        flags,
        paths,
        addr: r.u64("buffer address")?,
        len: r.u32("buffer length")?,
    })
}

/// Encode a Hello body (exposed for hostile-peer tests and fuzzing).
pub fn encode_hello(token: u64, p: &Params) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(HANDLE_MAGIC).u16(PROTOCOL_VERSION).u64(token);
    put_params(&mut w, p);
    let mut f = Framer::default();
    f.push(KIND_HELLO, w.as_slice());
    f.tx
}

/// Decode a Hello body: (token, params).
pub fn decode_hello(body: &[u8]) -> Result<(u64, Params), HandshakeError> {
    let mut r = Reader::new(body);
    let magic = r.u32("magic")?;
    if magic != HANDLE_MAGIC {
        return Err(WireError::BadMagic {
            found: magic,
            expected: HANDLE_MAGIC,
        }
        .into());
    }
    let v = r.u16("version")?;
    if v != PROTOCOL_VERSION {
        return Err(WireError::BadVersion {
            got: v,
            ours: PROTOCOL_VERSION,
        }
        .into());
    }
    let token = r.u64("token")?;
    let p = get_params(&mut r)?;
    r.finish()?;
    Ok((token, p))
}

fn decode_accept(body: &[u8]) -> Result<Params, HandshakeError> {
    let mut r = Reader::new(body);
    let p = get_params(&mut r)?;
    r.finish()?;
    Ok(p)
}

#[derive(Debug, PartialEq, Eq)]
enum ConnState {
    AwaitAccept,
    AwaitLocalReady,
    Ready,
}

/// Send side of the handshake.
pub struct Connector {
    f: Framer,
    state: ConnState,
}

impl Connector {
    pub fn new(token: u64, local: &Params) -> Self {
        let mut f = Framer::default();
        let hello = encode_hello(token, local);
        f.tx = hello;
        Connector {
            f,
            state: ConnState::AwaitAccept,
        }
    }

    /// Bytes waiting to be written to the peer.
    pub fn transmit(&self) -> &[u8] {
        self.f.pending()
    }

    pub fn advance_tx(&mut self, n: usize) {
        self.f.advance(n);
    }

    /// Feed received bytes; returns the acceptor's parameters once.
    pub fn receive(&mut self, data: &[u8]) -> Result<Option<Params>, HandshakeError> {
        self.f.rx.extend_from_slice(data);
        match self.f.next()? {
            None => Ok(None),
            Some((KIND_ACCEPT, body)) if self.state == ConnState::AwaitAccept => {
                let p = decode_accept(&body)?;
                self.state = ConnState::AwaitLocalReady;
                Ok(Some(p))
            }
            Some((kind, _)) => Err(HandshakeError::Unexpected(kind)),
        }
    }

    /// The local QPs are connected: tell the acceptor.
    pub fn local_ready(&mut self) {
        if self.state == ConnState::AwaitLocalReady {
            self.f.push(KIND_READY, &[]);
            self.state = ConnState::Ready;
        }
    }

    /// Ready was queued and fully written.
    pub fn is_done(&self) -> bool {
        self.state == ConnState::Ready && self.f.pending().is_empty()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum AccState {
    AwaitHello,
    AwaitLocalAccept,
    AwaitReady,
    Done,
}

/// Receive side of the handshake.
pub struct Acceptor {
    f: Framer,
    token: u64,
    state: AccState,
}

impl Acceptor {
    pub fn new(expected_token: u64) -> Self {
        Acceptor {
            f: Framer::default(),
            token: expected_token,
            state: AccState::AwaitHello,
        }
    }

    pub fn transmit(&self) -> &[u8] {
        self.f.pending()
    }

    pub fn advance_tx(&mut self, n: usize) {
        self.f.advance(n);
    }

    /// Feed received bytes; returns the connector's parameters once its Hello is verified.
    pub fn receive(&mut self, data: &[u8]) -> Result<Option<Params>, HandshakeError> {
        self.f.rx.extend_from_slice(data);
        match self.f.next()? {
            None => Ok(None),
            Some((KIND_HELLO, body)) if self.state == AccState::AwaitHello => {
                let (token, p) = decode_hello(&body)?;
                if token != self.token {
                    return Err(HandshakeError::BadToken);
                }
                self.state = AccState::AwaitLocalAccept;
                Ok(Some(p))
            }
            Some((KIND_READY, body)) if self.state == AccState::AwaitReady => {
                if !body.is_empty() {
                    return Err(WireError::Trailing(body.len()).into());
                }
                self.state = AccState::Done;
                Ok(None)
            }
            Some((kind, _)) => Err(HandshakeError::Unexpected(kind)),
        }
    }

    /// The local QPs are connected: answer the Hello.
    pub fn local_accept(&mut self, local: &Params) {
        if self.state == AccState::AwaitLocalAccept {
            let mut w = Writer::new();
            put_params(&mut w, local);
            self.f.push(KIND_ACCEPT, w.as_slice());
            self.state = AccState::AwaitReady;
        }
    }

    /// Ready was received (the connector's QPs are up).
    pub fn is_done(&self) -> bool {
        self.state == AccState::Done && self.f.pending().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(tag: u8) -> Params {
        Params {
            flags: 1,
            paths: vec![
                PathParams {
                    endpoint: vec![tag; 20],
                    rkey: tag as u32,
                    dev: 0,
                },
                PathParams {
                    endpoint: vec![tag + 1; 32],
                    rkey: 7,
                    dev: 1,
                },
            ],
            addr: 0x1000 * tag as u64,
            len: 4096,
        }
    }

    /// Move bytes from one side to the other in chunks of `chunk` bytes.
    fn pump(tx: &[u8], chunk: usize) -> Vec<Vec<u8>> {
        tx.chunks(chunk.max(1)).map(|c| c.to_vec()).collect()
    }

    #[test]
    fn full_exchange_in_any_chunking() {
        for chunk in [1usize, 3, 7, 1000] {
            let mut c = Connector::new(42, &params(1));
            let mut a = Acceptor::new(42);
            let hello = c.transmit().to_vec();
            c.advance_tx(hello.len());
            let mut got = None;
            for part in pump(&hello, chunk) {
                if let Some(p) = a.receive(&part).unwrap() {
                    got = Some(p);
                }
            }
            assert_eq!(got, Some(params(1)));
            assert!(!a.is_done());
            a.local_accept(&params(2));
            let acc = a.transmit().to_vec();
            a.advance_tx(acc.len());
            let mut peer = None;
            for part in pump(&acc, chunk) {
                if let Some(p) = c.receive(&part).unwrap() {
                    peer = Some(p);
                }
            }
            assert_eq!(peer, Some(params(2)));
            assert!(!c.is_done());
            c.local_ready();
            assert!(!c.is_done(), "Ready not yet written");
            let ready = c.transmit().to_vec();
            c.advance_tx(ready.len());
            assert!(c.is_done());
            for part in pump(&ready, chunk) {
                assert_eq!(a.receive(&part).unwrap(), None);
            }
            assert!(a.is_done());
        }
    }

    #[test]
    fn wrong_token_is_rejected() {
        let c = Connector::new(1, &params(1));
        let mut a = Acceptor::new(2);
        assert_eq!(a.receive(c.transmit()), Err(HandshakeError::BadToken));
    }

    #[test]
    fn garbage_and_oversized_frames_are_errors() {
        let mut a = Acceptor::new(1);
        assert!(matches!(
            a.receive(&[0xff, 0xff, 0xff, 0x7f, 1]),
            Err(HandshakeError::FrameTooLarge(_))
        ));
        let mut a = Acceptor::new(1);
        // A well-framed Hello whose body is junk.
        let mut junk = 9u32.to_le_bytes().to_vec();
        junk.push(KIND_HELLO);
        junk.extend_from_slice(&[7u8; 8]);
        assert!(matches!(
            a.receive(&junk),
            Err(HandshakeError::Wire(WireError::BadMagic { .. }))
        ));
        // Ready before Hello.
        let mut a = Acceptor::new(1);
        assert_eq!(
            a.receive(&[1, 0, 0, 0, KIND_READY]),
            Err(HandshakeError::Unexpected(KIND_READY))
        );
    }

    #[test]
    fn truncated_hello_waits_then_bad_path_count_fails() {
        let c = Connector::new(5, &params(1));
        let bytes = c.transmit().to_vec();
        let mut a = Acceptor::new(5);
        assert_eq!(a.receive(&bytes[..bytes.len() - 1]).unwrap(), None);
        let mut p = params(1);
        p.paths.clear();
        let bad = encode_hello(5, &p);
        let mut a = Acceptor::new(5);
        assert_eq!(a.receive(&bad), Err(HandshakeError::BadPathCount(0)));
    }
}
