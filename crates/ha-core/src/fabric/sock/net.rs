//! Socket plumbing for the `sock` fabric: source-bound non-blocking connect, listener,
//! socket options, gathered `sendmsg` and raw `recv` into caller memory. All `libc` here but
//! the delayed-ACK cap's option number (`delack.rs`, through [`setsockopt_int`] and
//! [`getsockopt_int`]).

use std::io;
use std::mem;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Socket buffer size asked for data streams (only where the kernel lets us force it).
const SOCK_BUF_BYTES: libc::c_int = 4 << 20;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A `sockaddr_storage` and its length for `addr`.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            mem::size_of::<libc::sockaddr_in>()
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
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

pub(super) fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` outlives the call and the length passed is its size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// An integer socket option of `fd`.
pub(super) fn getsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v`/`len` are valid out-parameters of the size passed.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(v)
}

/// Large buffers where allowed: `SO_*BUFFORCE` (root) pins 4 MiB; otherwise the kernel's
/// autotuning is left alone (a plain `SO_*BUF` would cap it at `net.core.*mem_max`).
fn big_buffers(fd: RawFd) {
    let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCK_BUF_BYTES);
    let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCK_BUF_BYTES);
}

/// Options of every data stream: no Nagle, big buffers, blocking, receive timeout `tick`,
/// kernel keep-alive (see [`keepalive`]).
pub fn tune_stream(s: &TcpStream, tick: Duration) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(tick))?;
    big_buffers(s.as_raw_fd());
    keepalive(s.as_raw_fd())
}

/// Seconds of silence from the peer before the kernel probes it (`TCP_KEEPIDLE`), and between
/// probes (`TCP_KEEPINTVL`): the smallest the kernel takes.
const KEEPALIVE_SECS: libc::c_int = 1;
/// Unanswered keep-alive probes before the kernel itself ends the connection
/// (`TCP_KEEPCNT`): a backstop; the fabric's own judge ([`super::liveness`]) decides first.
const KEEPALIVE_PROBES: libc::c_int = 20;

/// Kernel keep-alive: a stream that has been silent for a second is probed by the kernel,
/// which the peer's kernel answers whether or not the peer's process runs. So a stream whose
/// bytes were all acknowledged still tells a live peer from a dead link (unanswered probes),
/// which is what the liveness judge reads from `TCP_INFO`. `TCP_USER_TIMEOUT` is deliberately
/// NOT set: with it, Linux also ends a connection whose receive window stays closed for that
/// long, i.e. exactly the peer that is stopped with its buffer full (measured, see
/// bench/results/2026-11-25-tcp-liveness.md).
pub fn keepalive(fd: RawFd) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_SECS)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_SECS)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES)
}

/// What TCP says about a stream right now (`TCP_INFO`), as far as liveness goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSample {
    /// The connection is `ESTABLISHED`.
    pub established: bool,
    /// Segments sent and not acknowledged by the peer's kernel.
    pub unacked: u32,
    /// Zero-window or keep-alive probes sent and not answered.
    pub probes: u8,
    /// Time since the last acknowledgement from the peer's kernel arrived.
    pub since_ack: Duration,
    /// The peer's receive window is closed (or the kernel does not say): probes are window
    /// probes, not keep-alive ones.
    pub zero_window: bool,
    /// Bytes written to the stream and not sent yet.
    pub unsent: u32,
    /// The kernel's smoothed round-trip time and its variation.
    pub rtt: Duration,
    pub rttvar: Duration,
    /// The kernel's retransmission timeout (at least 200 ms on Linux), doubled by each
    /// retransmission timeout that fired without an answer.
    pub rto: Duration,
    /// The kernel's back-off count: raised by each retransmission timeout (which doubles
    /// `rto`), and also by zero-window probes (which do not).
    pub backoff: u8,
    /// Retransmission timeouts that fired since the last acknowledgement of new data (only
    /// the retransmission timer raises it).
    pub retransmits: u8,
}

/// How long after resending a lone segment a live peer's kernel may take to acknowledge it:
/// the resend arrives in order, and Linux may hold an in-order ACK back for its delayed-ACK
/// timer (40 ms at first, `TCP_DELACK_MIN`).
pub const RESEND_ACK_WAIT: Duration = Duration::from_millis(40);

/// Linux's least retransmission timeout (`TCP_RTO_MIN`): the floor of the first timeout
/// [`TcpSample::silence`] derives, so a back-off count raised by zero-window probes (which do
/// not double `rto`) cannot shrink it.
const RTO_MIN: Duration = Duration::from_millis(200);

/// How long a live peer's kernel may leave this stream's data unacknowledged: Linux holds an
/// ACK back (up to 40 ms, `TCP_DELACK_MIN`, or the cap of a peer that says `PROMPT`,
/// `delack.rs`) while the receiving thread has not read what arrived. The responder reads continuously, except while a WRITE_WITH_IMM waits for a
/// receive; it then sends a keep-alive every [`super::responder::KEEPALIVE`] (10 ms), which
/// carries the kernel's acknowledgement (measured: 40 ms of silence with 50 ms keep-alives,
/// 8–12 ms with 10 ms ones, `a_responder_waiting_for_a_receive_keeps_the_link_from_looking_silent`).
/// The floor leaves 2.5 keep-alive periods (15 ms beyond one) for a responder thread that
/// waits for a CPU; one kept off longer still delays its kernel's ACK, and the sender then
/// asks the standby (`transport::link::silence`): a false alarm re-arms at once and doubles
/// that connection's window. The peer's 10 ms keep-alive is part of protocol version 5.
pub const SILENCE_FLOOR: Duration = Duration::from_millis(25);

impl TcpSample {
    /// How long the link has left this stream's data unanswered: the time since the last
    /// acknowledgement while TCP waits for one — segments in flight, or, the peer's window
    /// open, data TCP could send and did not (a device without carrier drops what TCP hands
    /// it: nothing counts as in flight, TCP probes, the bytes stay unsent) — less what the
    /// link's own round trip explains (smoothed RTT + 4 × its variation): on a long or jittery
    /// link an acknowledgement is simply later. With a single segment in flight, less TCP's
    /// retransmission timeout instead: if that one segment is lost, nothing after it can be
    /// acknowledged before TCP resends it (no duplicate ACKs; the tail-loss probe waits about
    /// as long), so a live but lossy link is silent that long. Once a retransmission timeout
    /// has fired (`retransmits` > 0: TCP resent the segment and doubled its timeout), the
    /// allowance is the first timeout (`rto` halved `backoff` times, at least the smaller of
    /// `rto` and [`RTO_MIN`]) plus [`RESEND_ACK_WAIT`], counted from the last acknowledgement
    /// like the rest, instead of the doubled timeout, which only waits longer on a link that
    /// left the segment and its resend unanswered (cuts found after 431–470 ms; with this rule
    /// 215–280 ms, bench/results/2026-11-27-sock-lone-segment.md). A peer that acknowledges
    /// promptly (`peer_prompt`: its kernel's delayed ACK is capped below the silence floor,
    /// `delack.rs`) gets neither allowance: its kernel answers a lone segment that arrived
    /// within a few milliseconds, so a longer silence is a dead link or a lost segment, both
    /// worth asking the standby about (and a resend must not end a suspicion already begun). Zero when nothing waits (a closed
    /// window is the peer's choice, not silence).
    pub fn silence(&self, peer_prompt: bool) -> Duration {
        let waiting =
            self.unacked > 0 || (!self.zero_window && (self.probes > 0 || self.unsent > 0));
        let round_trip = self.rtt + self.rttvar * 4;
        let allowed = if self.unacked == 1 && !peer_prompt {
            if self.retransmits == 0 {
                round_trip.max(self.rto)
            } else {
                let first_rto =
                    (self.rto / (1u32 << self.backoff.min(16))).max(self.rto.min(RTO_MIN));
                round_trip.max(first_rto + RESEND_ACK_WAIT)
            }
        } else {
            round_trip
        };
        if waiting {
            self.since_ack.saturating_sub(allowed)
        } else {
            Duration::ZERO
        }
    }
}

/// `TCP_ESTABLISHED` of the kernel's `tcp_states.h` (libc does not export it).
const TCP_ESTABLISHED: u8 = 1;

/// Sample `TCP_INFO` of stream `fd`.
pub fn tcp_sample(fd: RawFd) -> io::Result<TcpSample> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info`/`len` are valid out-parameters of the size passed; the kernel writes at
    // most `len` bytes and reports how many.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        )
    })?;
    // `tcpi_snd_wnd` came late (Linux 6.2); a kernel that does not fill it reads as a closed
    // window, the cautious reading.
    let full = len as usize >= mem::offset_of!(libc::tcp_info, tcpi_snd_wnd) + 4;
    Ok(TcpSample {
        established: info.tcpi_state == TCP_ESTABLISHED,
        unacked: info.tcpi_unacked,
        probes: info.tcpi_probes,
        since_ack: Duration::from_millis(u64::from(info.tcpi_last_ack_recv)),
        zero_window: !full || info.tcpi_snd_wnd == 0,
        unsent: info.tcpi_notsent_bytes,
        rtt: Duration::from_micros(u64::from(info.tcpi_rtt)),
        rttvar: Duration::from_micros(u64::from(info.tcpi_rttvar)),
        rto: Duration::from_micros(u64::from(info.tcpi_rto)),
        backoff: info.tcpi_backoff,
        retransmits: info.tcpi_retransmits,
    })
}

/// Have the kernel acknowledge what arrived on `fd` now instead of delaying the ACK (Linux
/// holds it up to 200 ms on a stream whose reader sends nothing back). Best effort.
pub fn quickack(fd: RawFd) {
    let _ = setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1);
}

/// Traffic class of a stream's packets: `IP_TOS` (IPv4) or `IPV6_TCLASS` (IPv6). For TCP the
/// kernel keeps managing the two ECN bits itself; the DSCP bits are `tc`'s.
pub fn set_traffic_class(s: &TcpStream, tc: u8) -> io::Result<()> {
    let v = libc::c_int::from(tc);
    match s.local_addr()? {
        SocketAddr::V4(_) => setsockopt_int(s.as_raw_fd(), libc::IPPROTO_IP, libc::IP_TOS, v),
        SocketAddr::V6(_) => {
            setsockopt_int(s.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_TCLASS, v)
        }
    }
}

/// A listener on `ip:0` (accepted streams inherit its buffer sizes).
pub fn listen(ip: IpAddr) -> io::Result<TcpListener> {
    let family = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = cvt(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    big_buffers(fd.as_raw_fd());
    let (ss, len) = sockaddr(SocketAddr::new(ip, 0));
    // SAFETY: `ss` holds a valid address of length `len`.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    // SAFETY: listen(2) on a descriptor we own.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 1024) })?;
    Ok(TcpListener::from(fd))
}

/// Wait up to `ms` for `events` on `fd`; returns the revents (0 on timeout).
pub fn poll_one(fd: RawFd, events: libc::c_short, ms: libc::c_int) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(if n == 0 { 0 } else { p.revents })
}

/// Wait up to `ms` for `stream` to be readable (bytes, its end or an error) or `kick` (an
/// eventfd) to be: `(stream ready, kicked)`, both false on timeout or interruption.
pub fn poll_stream_or_kick(
    stream: RawFd,
    kick: Option<RawFd>,
    ms: libc::c_int,
) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: stream,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: kick.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let n = if kick.is_some() { 2 } else { 1 };
    if poll_many(&mut fds[..n], ms)? == 0 {
        return Ok((false, false));
    }
    Ok((fds[0].revents != 0, n == 2 && fds[1].revents != 0))
}

/// An eventfd that cuts a reader's long wait short ([`poll_stream_or_kick`]).
pub struct KickFd(std::os::fd::OwnedFd);

impl KickFd {
    pub fn new() -> io::Result<KickFd> {
        // SAFETY: eventfd creates a new descriptor; no pointers involved.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(KickFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Make it readable (a full counter is readable already: the error is ignored).
    pub fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to the eventfd this value owns.
        let _ = unsafe { libc::write(self.raw(), (&one as *const u64).cast(), 8) };
    }
}

/// Read an eventfd's counter back to zero (non-blocking; nothing to read is fine).
pub fn drain_kick(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live local from an eventfd the caller keeps open.
    let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// `poll(2)` over `fds`; returns how many have events (0 on timeout or interruption).
pub fn poll_many(fds: &mut [libc::pollfd], ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: `fds` is a valid, exclusively borrowed slice of pollfd of the length passed.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// Connect to `dst` from `src` (port 0), so traffic leaves through the rail owning `src`.
/// Gives up at `deadline`, or early when `abort()` turns true (checked every few ms).
pub fn connect_from(
    src: IpAddr,
    dst: SocketAddr,
    deadline: Instant,
    abort: &dyn Fn() -> bool,
) -> io::Result<TcpStream> {
    let family = if src.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    big_buffers(raw);
    setsockopt_int(raw, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    let (ss, len) = sockaddr(SocketAddr::new(src, 0));
    // SAFETY: `ss` holds a valid address of length `len`.
    cvt(unsafe { libc::bind(raw, &ss as *const _ as *const libc::sockaddr, len) })?;
    let (ds, dlen) = sockaddr(dst);
    // SAFETY: `ds` holds a valid address of length `dlen`.
    let r = unsafe { libc::connect(raw, &ds as *const _ as *const libc::sockaddr, dlen) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        loop {
            if abort() {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    "connect aborted",
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
            }
            let ms = (deadline - now).as_millis().clamp(1, 20) as libc::c_int;
            if poll_one(raw, libc::POLLOUT, ms)? != 0 {
                break;
            }
        }
        let mut err: libc::c_int = 0;
        let mut elen = mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `err`/`elen` are valid out-parameters of the right size.
        cvt(unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                &mut err as *mut libc::c_int as *mut libc::c_void,
                &mut elen,
            )
        })?;
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
    }
    Ok(TcpStream::from(fd))
}

/// Send every byte described by `iovs` (which is consumed/adjusted in place), blocking until
/// the socket took them all.
pub fn sendmsg_all(fd: RawFd, iovs: &mut [libc::iovec]) -> io::Result<()> {
    sendmsg_loop(fd, iovs, libc::MSG_NOSIGNAL)
}

/// Write what the socket takes now, without blocking: the iovecs are advanced past what was
/// written (what is left of them is unsent).
pub fn sendmsg_now(fd: RawFd, iovs: &mut [libc::iovec]) -> io::Result<()> {
    sendmsg_loop(fd, iovs, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
}

/// `sendmsg` until every iovec is written or, with `MSG_DONTWAIT` in `flags`, until the socket
/// would block (that ends the loop without error; the iovecs tell what is left).
fn sendmsg_loop(fd: RawFd, iovs: &mut [libc::iovec], flags: libc::c_int) -> io::Result<()> {
    let mut first = 0;
    while first < iovs.len() {
        if iovs[first].iov_len == 0 {
            first += 1;
            continue;
        }
        let rest = &mut iovs[first..];
        let n_iov = rest.len().min(1024);
        // SAFETY: msghdr is plain old data; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = rest.as_mut_ptr();
        msg.msg_iovlen = n_iov as _;
        // SAFETY: the iovecs point at memory the caller keeps valid for the call (headers on
        // its stack/buffers, payloads inside pinned registrations); MSG_NOSIGNAL avoids SIGPIPE.
        let r = unsafe { libc::sendmsg(fd, &msg, flags) };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if flags & libc::MSG_DONTWAIT != 0 => return Ok(()),
                _ => return Err(e),
            }
        }
        advance(iovs, &mut first, r as usize);
    }
    Ok(())
}

/// Move `iovs[first..]` past `n` written bytes.
fn advance(iovs: &mut [libc::iovec], first: &mut usize, mut n: usize) {
    while n > 0 {
        let iov = &mut iovs[*first];
        if n >= iov.iov_len {
            n -= iov.iov_len;
            iov.iov_len = 0;
            *first += 1;
        } else {
            // SAFETY: advancing within the same buffer by fewer bytes than its length.
            iov.iov_base = unsafe { (iov.iov_base as *mut u8).add(n) } as *mut libc::c_void;
            iov.iov_len -= n;
            n = 0;
        }
    }
}

/// An iovec over `len` bytes at `ptr`.
pub fn iov(ptr: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: ptr as *mut libc::c_void,
        iov_len: len,
    }
}

/// Outcome of one `recv`.
pub enum Recv {
    Data(usize),
    Eof,
    /// Nothing read: the receive timeout expired ([`recv_into`]) or nothing was buffered
    /// ([`recv_now`]).
    Idle,
}

/// One `recv` of up to `len` bytes into `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes for the duration of the call.
pub unsafe fn recv_into(fd: RawFd, dst: *mut u8, len: usize) -> io::Result<Recv> {
    // SAFETY: forwarded caller guarantee.
    unsafe { recv_flags(fd, dst, len, 0) }
}

/// [`recv_into`] that never blocks: `Recv::Idle` when nothing is buffered.
///
/// # Safety
/// As [`recv_into`].
pub unsafe fn recv_now(fd: RawFd, dst: *mut u8, len: usize) -> io::Result<Recv> {
    // SAFETY: forwarded caller guarantee.
    unsafe { recv_flags(fd, dst, len, libc::MSG_DONTWAIT) }
}

/// # Safety
/// As [`recv_into`].
unsafe fn recv_flags(fd: RawFd, dst: *mut u8, len: usize, flags: libc::c_int) -> io::Result<Recv> {
    loop {
        // SAFETY: the caller guarantees `dst..dst+len` is writable.
        let r = unsafe { libc::recv(fd, dst as *mut libc::c_void, len, flags) };
        if r > 0 {
            return Ok(Recv::Data(r as usize));
        }
        if r == 0 {
            return Ok(if len == 0 { Recv::Data(0) } else { Recv::Eof });
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => return Ok(Recv::Idle),
            _ => return Err(e),
        }
    }
}

/// `shutdown(2)` both directions, ignoring errors (used to unblock threads).
pub fn shutdown(fd: RawFd) {
    // SAFETY: shutdown(2) on a descriptor the caller keeps open; errors are irrelevant.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}
