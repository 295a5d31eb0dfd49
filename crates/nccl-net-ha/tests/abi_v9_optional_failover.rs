//! Receives NCCL marks completion-optional (`NCCL_NET_OPTIONAL_RECV_COMPLETION`, v9+) across a
//! failover: two `sock` rails on loopback (127.0.0.1 primary, 127.0.0.2 standby); with all
//! receives posted with the hint, half the messages go through, then every connected stream
//! of the primary rail is shut down in-process and the rest follow over the standby. Every
//! request still completes, each message lands once in its own buffer, a later receive gets
//! the next message (not a replayed duplicate), and the connection's statistics show the
//! failover. One test per binary: it shuts down this process's rail sockets.

mod so;

use so::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::BorrowedFd;

/// The local address of socket `fd` (IPv4 only).
fn local_v4(fd: i32) -> Option<SocketAddr> {
    // SAFETY: `fd` is a descriptor of this process listed a moment ago; `getsockname` only
    // writes into the live locals.
    unsafe {
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::getsockname(fd, (&mut sa as *mut libc::sockaddr_in).cast(), &mut len) != 0
            || i32::from(sa.sin_family) != libc::AF_INET
        {
            return None;
        }
        let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
        Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sa.sin_port)))
    }
}

/// Whether `fd` is a listening socket.
fn listening(fd: i32) -> bool {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as in `local_v4`; live out-parameters of the right size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    rc == 0 && v != 0
}

/// Shut down every connected TCP stream bound to `ip` (the rail's data streams; listeners
/// stay): the link "dies" under the plugin. Returns how many.
fn cut_rail(ip: Ipv4Addr) -> usize {
    let mut n = 0;
    let fds = tcp_sockets();
    let listen_ports: Vec<u16> = fds
        .iter()
        .filter(|&&fd| listening(fd))
        .filter_map(|&fd| local_v4(fd).map(|a| a.port()))
        .collect();
    for fd in fds {
        let Some(local) = local_v4(fd) else { continue };
        if listening(fd) || local.ip() != IpAddr::V4(ip) || listen_ports.contains(&local.port()) {
            continue;
        }
        // SAFETY: the descriptor is open (listed just now) and stays owned by the plugin; it
        // is only borrowed for the shutdown call.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        let s = shutdown_both(b);
        n += usize::from(s);
    }
    n
}

fn shutdown_both(fd: BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: plain shutdown(2) of a borrowed, open socket.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) == 0 }
}

#[test]
fn optional_completion_receives_survive_a_failover_exactly_once() {
    if !runs(Abi::V9) {
        return;
    }
    if on_verbs() {
        println!("SKIPPED on verbs: the cut shuts down sock rail streams");
        return;
    }
    let stats = std::env::temp_dir().join(format!("ha-optional-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    let stats_s = stats.to_string_lossy().into_owned();
    let p = plugin_for_with(
        Abi::V9,
        &[
            ("HA_NCCL_SOCK_RAILS", "127.0.0.1,127.0.0.2"),
            ("HA_NCCL_STATS_FILE", stats_s.as_str()),
        ],
    );
    assert_eq!(p.devices().unwrap(), 2, "two rails");
    let (send, recv, _) = connect_pair(p);
    const N: usize = 32;
    const SZ: usize = 16 << 10;
    let mut rb = RegBuf::new(p, &recv, vec![0; (N + 1) * SZ]);
    let mut sb = RegBuf::new(
        p,
        &send,
        (0..=N).flat_map(|i| pattern(500 + i as u64, SZ)).collect(),
    );
    let (rp, sp) = (rb.ptr(), sb.ptr());
    let recvs: Vec<_> = (0..N)
        .map(|i| {
            p.irecv_sized(
                &recv,
                &[rp.wrapping_add(i * SZ)],
                &[SZ],
                &[0],
                &[rb.mr()],
                true,
            )
            .unwrap()
            .expect("32 receives may be outstanding")
        })
        .collect();
    // The sender runs on its own thread while this one keeps testing the receives, as
    // NCCL's proxy drives both: the receiver's side of the failover runs in its calls.
    let sp = sp as usize;
    let (cut, send, mut sb) = std::thread::scope(|s| {
        let sender = s.spawn(move || {
            let send_one = |i: usize| {
                let ptr = (sp + i * SZ) as *mut u8;
                let r = until_some(|| p.isend_sized(&send, ptr, SZ, 0, sb.mr()).unwrap());
                wait(p, &r, &mut [0]).expect("send completes");
            };
            for i in 0..N / 2 {
                send_one(i);
            }
            let cut = cut_rail(Ipv4Addr::new(127, 0, 0, 1));
            for i in N / 2..N {
                send_one(i);
            }
            (cut, send, sb)
        });
        for (i, r) in recvs.iter().enumerate() {
            let mut sz = [-1];
            wait(p, r, &mut sz).expect("receive completes");
            assert_eq!(sz[0] as usize, SZ, "message {i}");
        }
        sender.join().unwrap()
    });
    assert!(cut >= 2, "primary rail streams shut down: {cut}");
    assert!(
        rb.data[..N * SZ] == sb.data[..N * SZ],
        "every message in its own buffer"
    );
    // Exactly once: the next receive gets the next message, not a replayed one.
    let last = p
        .irecv_sized(
            &recv,
            &[rp.wrapping_add(N * SZ)],
            &[SZ],
            &[0],
            &[rb.mr()],
            true,
        )
        .unwrap()
        .unwrap();
    let ptr = (sp + N * SZ) as *mut u8;
    let r = until_some(|| p.isend_sized(&send, ptr, SZ, 0, sb.mr()).unwrap());
    wait(p, &r, &mut [0]).unwrap();
    let mut sz = [-1];
    wait(p, &last, &mut sz).unwrap();
    assert_eq!(sz[0] as usize, SZ);
    assert!(
        rb.data[N * SZ..] == pattern(500 + N as u64, SZ),
        "the next message"
    );
    rb.dereg(p, &recv);
    sb.dereg(p, &send);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    let lines = std::fs::read_to_string(&stats).unwrap_or_default();
    let _ = std::fs::remove_file(&stats);
    assert!(
        lines
            .lines()
            .any(|l| !l.contains("\"failovers\":0,") && l.contains("\"failovers\":")),
        "a failover in the statistics: {lines}"
    );
}
