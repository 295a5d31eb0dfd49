//! The delayed-ACK cap of a responder's streams (`HA_NCCL_SOCK_DELACK_MAX_US`, off by
//! default: one false failover in CI's home drill, see the results file below;
//! `TCP_DELACK_MAX_US`, added to Linux in 2025; the 6.18 kernel here has it), and what the
//! requester makes of it.
//!
//! With one small segment in flight (a small message, a clear-to-send), the requester cannot
//! tell a dead link from a live peer whose kernel holds its acknowledgement back (40 ms at
//! least, while the peer's thread has not read), so a lone segment's silence counted only
//! after TCP's retransmission timeout: a quarter of the cuts under small messages were found
//! after 244–543 ms where the others take 35–50 ms (bench/results/2026-11-28-sock-delack-cap.md). A responder
//! whose kernel took a cap of a few milliseconds says so in every ACK and keep-alive frame
//! ([`super::wire::flags::PROMPT`]); its requester then counts a lone segment's silence from
//! its round trip, like any other (`TcpSample::silence`), and the standby decides as usual.
//! A peer without the cap (an older kernel, or `0`) never sets the flag: nothing changes
//! there. A live link that lost the lone segment now looks silent too; the standby answers
//! and traffic moves instead of waiting out TCP's 200 ms resend.

use super::net;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

/// `TCP_DELACK_MAX_US` of the kernel's `uapi/linux/tcp.h` (not in every libc yet).
const TCP_DELACK_MAX_US: libc::c_int = 46;

/// The longest delayed ACK a responder may have and still say its ACKs are prompt: below
/// the silence window's floor (`net::SILENCE_FLOOR`, 25 ms) with room for the kernel's clock
/// (a 5 ms cap is 8 ms at 250 Hz).
pub const PROMPT_MAX: Duration = Duration::from_millis(10);

/// What asking for the cap on one socket gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// Not asked (`HA_NCCL_SOCK_DELACK_MAX_US=0`).
    Kernel,
    /// Set.
    Set,
    /// Refused: the kernel has no such option (older than 2025).
    Unknown,
    /// Refused: shorter than the kernel's clock can time (about one tick), or above 200 ms.
    OutOfRange,
}

/// Ask for a delayed-ACK cap of `max` on `fd` (a stream a responder accepted). A refusal is
/// said once per process and changes nothing.
pub fn cap(fd: RawFd, max: Option<Duration>) -> Cap {
    let Some(max) = max else {
        return Cap::Kernel;
    };
    let us = libc::c_int::try_from(max.as_micros()).unwrap_or(libc::c_int::MAX);
    let got = match net::setsockopt_int(fd, libc::IPPROTO_TCP, TCP_DELACK_MAX_US, us) {
        Ok(()) => return Cap::Set,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Cap::OutOfRange,
        Err(_) => Cap::Unknown,
    };
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        let why = match got {
            Cap::OutOfRange => {
                "the value is shorter than this kernel's clock can time, or above 200 ms"
            }
            _ => "this kernel has no such option (Linux added it in 2025)",
        };
        tracing::info!(
            "NET/HA : sock: HA_NCCL_SOCK_DELACK_MAX_US: the kernel's delayed ACK stays ({why}); peers then wait out TCP's retransmission timeout (200 ms or more) before a lone small segment counts as silence"
        );
    }
    got
}

/// The delayed-ACK cap `fd` has (`None`: the kernel does not say).
pub fn max(fd: RawFd) -> Option<Duration> {
    net::getsockopt_int(fd, libc::IPPROTO_TCP, TCP_DELACK_MAX_US)
        .ok()
        .filter(|&v| v > 0)
        .map(|v| Duration::from_micros(v as u64))
}

/// Whether the kernel acknowledges what arrives on `fd` within [`PROMPT_MAX`] whatever the
/// reading thread does. A cap the kernel took but rounded above it is said once.
pub fn prompt(fd: RawFd) -> bool {
    let Some(m) = max(fd) else {
        return false;
    };
    if m > PROMPT_MAX {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Relaxed) {
            tracing::info!(
                "NET/HA : sock: HA_NCCL_SOCK_DELACK_MAX_US: the kernel's cap is {m:?}, above {PROMPT_MAX:?}: responders do not say PROMPT, so peers keep waiting out TCP's retransmission timeout before a lone small segment counts as silence"
            );
        }
        return false;
    }
    true
}

/// Whether this kernel takes a 5 ms cap (tests skip where it does not).
#[cfg(test)]
pub fn supported() -> bool {
    let Ok(l) = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)) else {
        return false;
    };
    let Ok(c) = std::net::TcpStream::connect(l.local_addr().expect("bound")) else {
        return false;
    };
    let Ok((s, _)) = l.accept() else {
        return false;
    };
    drop(c);
    cap(
        std::os::fd::AsRawFd::as_raw_fd(&s),
        Some(Duration::from_millis(5)),
    ) == Cap::Set
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// Where the kernel has the option, an accepted stream takes a 5 ms cap and says it
    /// acknowledges promptly; the other end, never asked, does not; a value the kernel
    /// cannot take is refused by kind and changes nothing.
    #[test]
    fn an_accepted_stream_takes_the_cap_where_the_kernel_has_it() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        match cap(s.as_raw_fd(), Some(Duration::from_millis(5))) {
            Cap::Set => {
                assert!(prompt(s.as_raw_fd()), "{:?}", max(s.as_raw_fd()));
                // Never asked on the connecting end: the kernel's 200 ms.
                assert!(!prompt(c.as_raw_fd()), "{:?}", max(c.as_raw_fd()));
                assert_eq!(
                    cap(s.as_raw_fd(), Some(Duration::from_millis(300))),
                    Cap::OutOfRange
                );
                assert!(prompt(s.as_raw_fd()), "a refused value left the cap alone");
            }
            Cap::Unknown => {
                eprintln!("SKIPPED (no TCP_DELACK_MAX_US in this kernel): no delayed-ACK cap");
                assert!(!prompt(s.as_raw_fd()));
            }
            Cap::OutOfRange => {
                eprintln!("SKIPPED: 5 ms is shorter than this kernel's clock can time");
                assert!(!prompt(s.as_raw_fd()));
            }
            Cap::Kernel => unreachable!("asked"),
        }
        assert_eq!(cap(s.as_raw_fd(), None), Cap::Kernel);
    }
}
