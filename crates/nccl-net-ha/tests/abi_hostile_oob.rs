//! Hostile or broken clients of the OOB listener, through the C ABI of the built `.so`: a
//! client that sends nothing, garbage, a Hello with a wrong token, a truncated Hello, a Hello
//! with our token but a bogus endpoint, or closes at once or mid-handshake. None of them is
//! accepted, none gets a byte back, each is dropped (at once, or after the handshake timeout
//! when it stays silent), and good peers connecting meanwhile and afterwards are accepted and
//! carry verified data.

mod so;

use ha_proto::handle::ConnectHandle;
use ha_proto::handshake::{encode_hello, Params, PathParams};
use nccl_net_loader::{Comm, PluginV8};
use so::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// `HA_NCCL_HANDSHAKE_TIMEOUT_MS` of this test binary: long enough for a good handshake on a
/// loaded machine, short enough to see silent clients dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(4000);
const DEADLINE: Duration = Duration::from_secs(60);

fn p() -> &'static PluginV8 {
    plugin_with(&[("HA_NCCL_HANDSHAKE_TIMEOUT_MS", "4000")])
}

fn hello(token: u64, endpoint: Vec<u8>) -> Vec<u8> {
    encode_hello(
        token,
        &Params {
            flags: 0,
            paths: vec![PathParams {
                endpoint,
                rkey: 1,
                dev: 0,
            }],
            addr: 0x1000,
            len: 4096,
        },
    )
}

/// What a hostile client saw of the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Open,
    /// EOF or reset: the listener dropped it.
    Closed,
}

struct Client {
    what: &'static str,
    s: TcpStream,
    since: Instant,
    closed_at: Option<Instant>,
    /// Stays silent or incomplete, so only the handshake timeout drops it.
    waits_for_timeout: bool,
}

impl Client {
    fn new(what: &'static str, h: &ConnectHandle, send: &[u8], waits: bool) -> Client {
        let since = Instant::now();
        let mut s = TcpStream::connect(h.addr).expect("connect to the OOB listener");
        s.write_all(send).expect("write");
        s.set_nonblocking(true).unwrap();
        Client {
            what,
            s,
            since,
            closed_at: None,
            waits_for_timeout: waits,
        }
    }

    /// Poll the stream; the listener must never answer a bad client with data.
    fn poll(&mut self) -> Seen {
        if self.closed_at.is_some() {
            return Seen::Closed;
        }
        let mut b = [0u8; 256];
        match self.s.read(&mut b) {
            Ok(0) => {}
            Ok(n) => panic!("{}: the listener sent {n} bytes to a bad client", self.what),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Seen::Open,
            Err(e) if e.kind() == ErrorKind::Interrupted => return Seen::Open,
            Err(_) => {} // reset
        }
        self.closed_at = Some(Instant::now());
        Seen::Closed
    }
}

/// Drive `connect` and `accept` until the good peer's pair is up (hostile clients keep
/// their connections meanwhile); exactly one receive comm comes out.
fn connect_good_peer(p: &PluginV8, listen: &Comm, handle: &[u8; 128]) -> (Comm, Comm) {
    let mut h = *handle;
    let start = Instant::now();
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(start.elapsed() < DEADLINE, "good peer not connected");
        if send.is_none() {
            send = p.connect(connect_dev(), &mut h).expect("connect");
        }
        if let Some(c) = p.accept(listen).expect("accept") {
            assert!(recv.is_none(), "accept returned a second connection");
            recv = Some(c);
        }
        std::thread::yield_now();
    }
    (send.unwrap(), recv.unwrap())
}

/// One verified message over a pair.
fn exchange(p: &PluginV8, send: &Comm, recv: &Comm, seq: u64) {
    let n = 64 << 10;
    let mut rb = RegBuf::new(p, recv, vec![0; n]);
    let mut sb = RegBuf::new(p, send, pattern(seq, n));
    let rp = rb.ptr();
    let rr = until_some(|| p.irecv(recv, &[rp], &[n as i32], &[3], &[rb.mr()]).unwrap());
    let sp = sb.ptr();
    let sr = until_some(|| p.isend(send, sp, n as i32, 3, sb.mr()).unwrap());
    let mut sizes = [0i32];
    wait(p, &sr, &mut [0]).expect("send");
    wait(p, &rr, &mut sizes).expect("recv");
    assert_eq!(sizes[0], n as i32);
    assert!(rb.data == pattern(seq, n), "received bytes differ");
    rb.dereg(p, recv);
    sb.dereg(p, send);
}

#[test]
fn bad_clients_are_dropped_and_good_peers_accepted() {
    let p = p();
    let (handle, listen) = p.listen(listen_dev()).expect("listen");
    let h = ConnectHandle::decode(&handle).expect("our own handle");
    let good = hello(h.token, vec![0xaa; 8]);

    let mut clients = vec![
        Client::new("garbage", &h, &[0xff; 64], false),
        Client::new("wrong token", &h, &hello(h.token ^ 1, vec![1; 20]), false),
        Client::new("bogus endpoint", &h, &good, false),
        Client::new("not a Hello", &h, &[1, 0, 0, 0, 3], false),
        Client::new("silent", &h, &[], true),
        Client::new("truncated Hello", &h, &good[..good.len() / 2], true),
        Client::new("length prefix only", &h, &[0, 16, 0, 0], true),
    ];
    for _ in 0..6 {
        clients.push(Client::new("silent (many)", &h, &[], true));
    }
    // Clients that close at once or mid-Hello: gone before the listener looks at them.
    for bytes in [&[][..], &good[..9]] {
        let mut s = TcpStream::connect(h.addr).expect("connect");
        s.write_all(bytes).unwrap();
        s.shutdown(Shutdown::Both).unwrap();
    }

    // A good peer is accepted while the silent clients still hold their connections.
    let (send, recv) = connect_good_peer(p, &listen, &handle);
    let mut waiting = Vec::new();
    for c in clients.iter_mut().filter(|c| c.waits_for_timeout) {
        if c.poll() == Seen::Open {
            waiting.push(c.what);
        }
    }
    assert!(
        !waiting.is_empty(),
        "the silent clients were dropped before the good peer got through: the test did not \
         show that they cannot block it"
    );
    exchange(p, &send, &recv, 1);

    // Every bad client is dropped; none is ever accepted. Silent ones only after the timeout.
    let start = Instant::now();
    while clients.iter_mut().any(|c| c.poll() == Seen::Open) {
        assert!(
            start.elapsed() < DEADLINE,
            "not dropped: {:?}",
            clients
                .iter()
                .filter(|c| c.closed_at.is_none())
                .map(|c| c.what)
                .collect::<Vec<_>>()
        );
        assert!(
            p.accept(&listen).expect("accept").is_none(),
            "a bad client was accepted"
        );
        std::thread::yield_now();
    }
    for c in &clients {
        let after = c.closed_at.unwrap() - c.since;
        if c.waits_for_timeout {
            assert!(
                after >= HANDSHAKE_TIMEOUT,
                "{} dropped after {after:?}, before the handshake timeout",
                c.what
            );
        }
    }

    // The listener is still usable: a second good peer with the same handle.
    let (send2, recv2) = connect_good_peer(p, &listen, &handle);
    exchange(p, &send2, &recv2, 2);
    assert!(p.accept(&listen).expect("accept").is_none());
    for s in [send, send2] {
        p.close_send(s).unwrap();
    }
    for r in [recv, recv2] {
        p.close_recv(r).unwrap();
    }
    p.close_listen(listen).unwrap();
}
