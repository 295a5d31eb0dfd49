//! The process's open-file limit (`RLIMIT_NOFILE`). Every `sock` queue pair holds a few
//! sockets: a connection takes about 4 descriptors per path, 8 with its standby (measured:
//! 524 for 64 connections). NCCL raises the soft limit to the hard one when it starts, so
//! under NCCL the hard limit (`ulimit -Hn`) bounds the connections a rank can open. When
//! descriptors run out, [`exhausted_note`] names the limit in the error: without it the
//! connecting peer only sees its handshake time out.

use std::io;

/// Soft and hard `RLIMIT_NOFILE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NofileLimit {
    pub soft: u64,
    pub hard: u64,
}

/// The current limit.
pub fn nofile() -> io::Result<NofileLimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(NofileLimit {
        soft: r.rlim_cur,
        hard: r.rlim_max,
    })
}

/// Whether `e` says the process (EMFILE) or the system (ENFILE) ran out of descriptors.
pub fn is_exhausted(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// What to tell the user when descriptors ran out: the limit, what holds descriptors, the fix.
pub fn exhausted_note() -> String {
    let limit = match nofile() {
        Ok(l) => format!("open-file limit {} (hard {})", l.soft, show(l.hard)),
        Err(_) => "open-file limit unknown".to_string(),
    };
    format!(
        "out of file descriptors: {limit}; a `sock` connection holds about 4 per path, 8 \
         with its standby: raise the hard limit, `ulimit -Hn` (NCCL raises the soft one to it)"
    )
}

fn show(v: u64) -> String {
    if v == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_is_emfile_or_enfile_only() {
        assert!(is_exhausted(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(is_exhausted(&io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!is_exhausted(&io::Error::from_raw_os_error(
            libc::ECONNREFUSED
        )));
        assert!(!is_exhausted(&io::Error::other("x")));
    }

    #[test]
    fn the_note_names_the_limit_and_the_fix() {
        let n = exhausted_note();
        let l = nofile().unwrap();
        assert!(n.contains(&format!("open-file limit {}", l.soft)), "{n}");
        assert!(n.contains("raise the hard limit, `ulimit -Hn`"), "{n}");
    }

    #[test]
    fn an_io_error_of_exhaustion_carries_the_note_and_others_do_not() {
        let e = crate::fabric::FabricError::io(
            "sock: connect",
            io::Error::from_raw_os_error(libc::EMFILE),
        );
        let s = e.to_string();
        assert!(
            s.starts_with("sock: connect (out of file descriptors: open-file limit"),
            "{s}"
        );
        let e = crate::fabric::FabricError::io(
            "sock: connect",
            io::Error::from_raw_os_error(libc::ECONNREFUSED),
        );
        assert!(!e.to_string().contains("file descriptors"), "{e}");
    }
}
