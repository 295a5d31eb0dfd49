//! Low-level helpers of the verbs fabric: the verbs calls that `verbs.h` defines `static
//! inline` (reached through the context's ops table, as `ibv_post_send` itself does), errno
//! mapping, and the few file-descriptor primitives the fabric's threads wait on.

use super::super::{FabricError, Result};
use ibverbs_sys as sys;
use std::io;
use std::os::fd::RawFd;

/// Build a fabric error from a verbs return code that is an errno value (0 = success).
pub fn check_rc(rc: i32, what: impl FnOnce() -> String) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FabricError::io(
            what(),
            io::Error::from_raw_os_error(rc.abs()),
        ))
    }
}

/// The calling thread's errno as a fabric error.
pub fn last_error(what: impl Into<String>) -> FabricError {
    FabricError::io(what, io::Error::last_os_error())
}

/// `ibv_post_send`: returns 0 or an errno value; `bad` receives the first WR not posted.
///
/// # Safety
/// `qp` is a live queue pair and `wr` the head of a valid, null-terminated chain whose SGE
/// arrays stay valid for the duration of the call.
pub unsafe fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad: *mut *mut sys::ibv_send_wr,
) -> i32 {
    // SAFETY: the caller guarantees `qp` is live, so its context and ops table are too.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(f) => f(qp, wr, bad),
            None => libc::ENOSYS,
        }
    }
}

/// `ibv_post_recv`: returns 0 or an errno value.
///
/// # Safety
/// As [`post_send`], for a receive chain.
pub unsafe fn post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> i32 {
    // SAFETY: the caller guarantees `qp` is live, so its context and ops table are too.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(f) => f(qp, wr, bad),
            None => libc::ENOSYS,
        }
    }
}

/// `ibv_poll_cq`: number of completions written to `wc` (≤ `n`), or a negative value.
///
/// # Safety
/// `cq` is a live completion queue and `wc` points to at least `n` writable entries.
pub unsafe fn poll_cq(cq: *mut sys::ibv_cq, n: i32, wc: *mut sys::ibv_wc) -> i32 {
    // SAFETY: the caller guarantees `cq` is live, so its context and ops table are too.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(f) => f(cq, n, wc),
            None => -libc::ENOSYS,
        }
    }
}

/// `ibv_req_notify_cq` (all completions, not only solicited): 0 or an errno value.
///
/// # Safety
/// `cq` is a live completion queue.
pub unsafe fn req_notify_cq(cq: *mut sys::ibv_cq) -> i32 {
    // SAFETY: the caller guarantees `cq` is live, so its context and ops table are too.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(f) => f(cq, 0),
            None => libc::ENOSYS,
        }
    }
}

/// Put `fd` (owned by libibverbs: async or completion-channel fd) in non-blocking mode.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number has no memory effects; a bad fd yields EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An eventfd used to tell a fabric thread to stop.
pub struct WakeFd(RawFd);

impl WakeFd {
    pub fn new() -> io::Result<WakeFd> {
        // SAFETY: eventfd creates a new descriptor; no pointers involved.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WakeFd(fd))
    }

    pub fn fd(&self) -> RawFd {
        self.0
    }

    /// Make the descriptor readable (level-triggered: it stays readable).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to the eventfd this value owns.
        let _ = unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }
}

impl Drop for WakeFd {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this value owns, exactly once.
        unsafe { libc::close(self.0) };
    }
}

/// What [`wait_readable`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `fd` has something to read.
    Ready,
    /// The wake descriptor fired: stop.
    Stop,
}

/// Block until `fd` is readable or `wake` fires (the stop request wins).
pub fn wait_readable(fd: RawFd, wake: &WakeFd) -> io::Result<Wait> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a live array of two pollfd entries.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 {
            return Ok(Wait::Stop);
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
            && fds[0].revents & libc::POLLIN == 0
        {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("poll revents {:#x}", fds[0].revents),
            ));
        }
        if fds[0].revents != 0 {
            return Ok(Wait::Ready);
        }
    }
}

/// `ibv_mtu` enum value → bytes (0 for unknown values).
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_enum_to_bytes() {
        assert_eq!(mtu_bytes(sys::IBV_MTU_256), 256);
        assert_eq!(mtu_bytes(sys::IBV_MTU_1024), 1024);
        assert_eq!(mtu_bytes(sys::IBV_MTU_4096), 4096);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(6), 0);
    }

    #[test]
    fn wake_fd_stops_a_waiter() {
        let wake = WakeFd::new().unwrap();
        let other = WakeFd::new().unwrap();
        wake.wake();
        assert_eq!(wait_readable(other.fd(), &wake).unwrap(), Wait::Stop);
        other.wake();
        let idle = WakeFd::new().unwrap();
        assert_eq!(wait_readable(other.fd(), &idle).unwrap(), Wait::Ready);
    }

    #[test]
    fn check_rc_maps_errno() {
        assert!(check_rc(0, || "x".into()).is_ok());
        match check_rc(libc::ENOMEM, || "post".into()) {
            Err(FabricError::Io { context, source }) => {
                assert_eq!(context, "post");
                assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
