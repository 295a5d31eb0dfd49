//! Out-of-band TCP used by the connection handshake: non-blocking listener and streams.
//!
//! Nothing here ever blocks: `connect` only starts the connection, `try_accept`, `try_read`
//! and `try_write` report "not now" instead of waiting. Every socket is non-blocking,
//! close-on-exec and has `TCP_NODELAY`; writes use `MSG_NOSIGNAL`, so a vanished peer is an
//! error, never a `SIGPIPE` in NCCL's process.

use crate::fabric::counters::{Held, Resource};
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What one [`OobStream::try_read`] produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// This many bytes were read (more than 0 unless the buffer was empty).
    Data(usize),
    /// No data available now.
    WouldBlock,
    /// The peer closed its side; no more data will come.
    Eof,
}

/// A non-blocking listening socket.
pub struct OobListener {
    listener: TcpListener,
    local: SocketAddr,
    _held: Held,
}

impl OobListener {
    /// Listen on `ip`, on a port the kernel picks.
    pub fn bind(ip: IpAddr) -> io::Result<Self> {
        // std creates the socket with SOCK_CLOEXEC and sets SO_REUSEADDR.
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        Ok(OobListener {
            listener,
            local,
            _held: Held::new(Resource::Socket),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// A pending connection, or `None` if none is waiting.
    pub fn try_accept(&self) -> io::Result<Option<OobStream>> {
        match self.listener.accept() {
            Ok((stream, _)) => {
                // Accepted sockets do not inherit O_NONBLOCK; std's accept4 sets CLOEXEC.
                stream.set_nonblocking(true)?;
                stream.set_nodelay(true)?;
                Ok(Some(OobStream {
                    stream,
                    connected: true,
                    _held: Held::new(Resource::Socket),
                }))
            }
            Err(e) if is_transient_accept_error(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for OobListener {
    fn as_raw_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }
}

/// `accept` errors that mean "nothing to accept right now".
fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
    ) || e.raw_os_error() == Some(libc::EPROTO)
}

/// A non-blocking TCP connection (either side).
pub struct OobStream {
    stream: TcpStream,
    /// Established (always true on the accepting side).
    connected: bool,
    _held: Held,
}

/// `SocketAddr` as a `sockaddr_storage` and its length.
fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for every sockaddr type.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

impl OobStream {
    /// Start connecting to `addr` and return at once; drive it with
    /// [`OobStream::poll_connected`]. An immediate refusal is returned as an error.
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let family = match addr {
            SocketAddr::V4(_) => libc::AF_INET,
            SocketAddr::V6(_) => libc::AF_INET6,
        };
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created socket that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let stream = TcpStream::from(owned);
        stream.set_nodelay(true)?;
        let (storage, len) = to_sockaddr(&addr);
        // SAFETY: `storage` holds a valid sockaddr of `len` bytes for `fd`'s family.
        let rc = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                &storage as *const _ as *const libc::sockaddr,
                len,
            )
        };
        let connected = if rc == 0 {
            true
        } else {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINPROGRESS) | Some(libc::EINTR) => false,
                _ => return Err(e),
            }
        };
        Ok(OobStream {
            stream,
            connected,
            _held: Held::new(Resource::Socket),
        })
    }

    /// `true` once the connection is established; `Err` if it failed (refused, unreachable,
    /// timed out by the kernel). Never blocks.
    pub fn poll_connected(&mut self) -> io::Result<bool> {
        if self.connected {
            return Ok(true);
        }
        // SO_ERROR holds the connect failure, if any (and clears it).
        if let Some(e) = self.stream.take_error()? {
            return Err(e);
        }
        // getpeername fails with ENOTCONN while the handshake is still in flight.
        match self.stream.peer_addr() {
            Ok(_) => {
                self.connected = true;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Write what the socket buffer takes now; `Ok(0)` when it would block.
    pub fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            // SAFETY: `buf` is valid for `buf.len()` bytes for the duration of the call.
            let n = unsafe {
                libc::send(
                    self.stream.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            }
        }
    }

    /// Read what is available now.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        if buf.is_empty() {
            return Ok(ReadOutcome::Data(0));
        }
        loop {
            return match self.stream.read(buf) {
                Ok(0) => Ok(ReadOutcome::Eof),
                Ok(n) => Ok(ReadOutcome::Data(n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(ReadOutcome::WouldBlock),
                Err(e) => Err(e),
            };
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }
}

impl AsRawFd for OobStream {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::{Duration, Instant};

    const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    /// Generous: the loops below finish in milliseconds unless the machine is very loaded.
    const DEADLINE: Duration = Duration::from_secs(30);

    /// Poll `f` until it yields `Some`, or panic after [`DEADLINE`].
    fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }

    /// A connected (client, server) pair on 127.0.0.1.
    fn pair() -> (OobStream, OobStream) {
        let l = OobListener::bind(LOCALHOST).unwrap();
        let mut c = OobStream::connect(l.local_addr()).unwrap();
        let mut accepted = None;
        until("connect + accept", || {
            if accepted.is_none() {
                accepted = l.try_accept().unwrap();
            }
            (c.poll_connected().unwrap() && accepted.is_some()).then_some(())
        });
        (c, accepted.unwrap())
    }

    fn flags(fd: RawFd) -> (bool, bool) {
        // SAFETY: fcntl queries on a descriptor we own.
        let (fl, fdfl) = unsafe {
            (
                libc::fcntl(fd, libc::F_GETFL),
                libc::fcntl(fd, libc::F_GETFD),
            )
        };
        assert!(fl >= 0 && fdfl >= 0);
        (fl & libc::O_NONBLOCK != 0, fdfl & libc::FD_CLOEXEC != 0)
    }

    #[test]
    fn sockets_are_nonblocking_cloexec_nodelay() {
        let l = OobListener::bind(LOCALHOST).unwrap();
        assert_eq!(flags(l.as_raw_fd()), (true, true));
        assert_eq!(l.local_addr().ip(), LOCALHOST);
        assert_ne!(l.local_addr().port(), 0);
        // Nothing pending: returns at once.
        assert!(l.try_accept().unwrap().is_none());

        let (c, s) = pair();
        for st in [&c, &s] {
            assert_eq!(flags(st.as_raw_fd()), (true, true));
            assert!(st.stream.nodelay().unwrap());
        }
        assert_eq!(c.peer_addr().unwrap(), s.local_addr().unwrap());
        assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
        assert_eq!(c.peer_addr().unwrap().ip(), LOCALHOST);
    }

    /// Byte `i` of the test stream `seed`.
    fn pat(seed: usize, i: usize) -> u8 {
        (i.wrapping_mul(seed) ^ (i >> 11)) as u8
    }

    /// One side of a pattern transfer: writes `pat(seed, ..)` up to `total`, reads and checks.
    struct Flow {
        seed: usize,
        sent: usize,
        received: usize,
        total: usize,
    }

    impl Flow {
        /// Offer the next bytes; returns how many the socket took.
        fn write(&mut self, st: &mut OobStream) -> usize {
            let len = (self.total - self.sent).min(64 << 10);
            let bytes: Vec<u8> = (self.sent..self.sent + len)
                .map(|i| pat(self.seed, i))
                .collect();
            let n = st.try_write(&bytes).unwrap();
            self.sent += n;
            n
        }

        fn read(&mut self, st: &mut OobStream, buf: &mut [u8]) {
            if let ReadOutcome::Data(n) = st.try_read(buf).unwrap() {
                for (k, b) in buf[..n].iter().enumerate() {
                    let i = self.received + k;
                    assert_eq!(*b, pat(self.seed, i), "stream {} byte {i}", self.seed);
                }
                self.received += n;
                assert!(self.received <= self.total, "more bytes than sent");
            }
        }
    }

    #[test]
    fn exchange_bytes_both_ways() {
        let (mut c, mut s) = pair();
        let mut buf = [0u8; 64];
        // Connected but idle: no data, and reading does not block.
        assert_eq!(s.try_read(&mut buf).unwrap(), ReadOutcome::WouldBlock);
        assert_eq!(c.try_read(&mut buf).unwrap(), ReadOutcome::WouldBlock);

        let mut up = Flow {
            seed: 7,
            sent: 0,
            received: 0,
            total: 1 << 30, // until the buffers fill; fixed below
        };
        // Nobody reads yet: the client's writes must reach "would block" (Ok(0)), since
        // socket buffers are finite.
        until("a full socket buffer", || {
            (up.write(&mut c) == 0).then_some(())
        });
        assert!(up.sent > 0 && up.sent < up.total);
        up.total = up.sent + (4 << 20);
        let mut down = Flow {
            seed: 13,
            sent: 0,
            received: 0,
            total: 3 << 20,
        };
        // Now drive both directions in one loop until every byte arrived, verified.
        let mut chunk = vec![0u8; 256 << 10];
        until("exchange", || {
            up.write(&mut c);
            down.write(&mut s);
            up.read(&mut s, &mut chunk);
            down.read(&mut c, &mut chunk);
            (up.received == up.total && down.received == down.total).then_some(())
        });
        assert_eq!(s.try_read(&mut buf).unwrap(), ReadOutcome::WouldBlock);
        assert_eq!(c.try_read(&mut buf).unwrap(), ReadOutcome::WouldBlock);
    }

    #[test]
    fn connect_to_closed_port_fails() {
        let addr = {
            let l = OobListener::bind(LOCALHOST).unwrap();
            l.local_addr()
        }; // dropped: nothing listens there any more
        let err = match OobStream::connect(addr) {
            Err(e) => e,
            Ok(mut c) => until("connect failure", || match c.poll_connected() {
                Ok(true) => panic!("connected to a closed port"),
                Ok(false) => None,
                Err(e) => Some(e),
            }),
        };
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    }

    #[test]
    fn eof_after_peer_close_delivers_data_first() {
        let (mut c, mut s) = pair();
        assert_eq!(c.try_write(b"last words").unwrap(), 10);
        drop(c);
        let mut got = Vec::new();
        let mut buf = [0u8; 4];
        until("eof", || match s.try_read(&mut buf).unwrap() {
            ReadOutcome::Data(n) => {
                got.extend_from_slice(&buf[..n]);
                None
            }
            ReadOutcome::WouldBlock => None,
            ReadOutcome::Eof => Some(()),
        });
        assert_eq!(got, b"last words");
        // EOF is sticky.
        assert_eq!(s.try_read(&mut buf).unwrap(), ReadOutcome::Eof);
    }

    #[test]
    fn write_to_closed_peer_is_an_error_not_sigpipe() {
        // The test harness ignores SIGPIPE; NCCL's process does not. Restore the default
        // disposition so a write without MSG_NOSIGNAL would kill this test binary.
        // SAFETY: signal(2) with a valid signal number and disposition.
        let old = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let (mut c, s) = pair();
        drop(s);
        let err = until("write error", || c.try_write(&[1u8; 4096]).err());
        // SAFETY: as above, restoring the previous disposition.
        unsafe { libc::signal(libc::SIGPIPE, old) };
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{err}"
        );
    }

    #[test]
    fn ipv6_loopback_when_available() {
        let Ok(l) = OobListener::bind("::1".parse().unwrap()) else {
            eprintln!("SKIPPED ipv6_loopback_when_available: cannot bind ::1");
            return;
        };
        let mut c = OobStream::connect(l.local_addr()).unwrap();
        let mut s = None;
        until("v6 connect + accept", || {
            if s.is_none() {
                s = l.try_accept().unwrap();
            }
            (c.poll_connected().unwrap() && s.is_some()).then_some(())
        });
        let mut s = s.unwrap();
        assert_eq!(c.try_write(b"v6").unwrap(), 2);
        let mut got = Vec::new();
        let mut buf = [0u8; 8];
        until("v6 data", || {
            if let ReadOutcome::Data(n) = s.try_read(&mut buf).unwrap() {
                got.extend_from_slice(&buf[..n]);
            }
            (got.len() >= 2).then_some(())
        });
        assert_eq!(got, b"v6");
    }
}
