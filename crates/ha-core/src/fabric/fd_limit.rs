//! The process's open-file limit (`RLIMIT_NOFILE`). Every `sock` queue pair holds a few
//! sockets: a connection (a send and a receive comm) takes 8–12 descriptors with its standby,
//! up to about 20 once large messages stripe over lanes. NCCL raises the soft limit to the
//! hard one only in the process that hosts its bootstrap root, so on `sock` the plugin raises
//! it at init in every process ([`raise_nofile`], up to [`RAISE_CAP`]). When descriptors run out anyway, errors and
//! warnings name the limit ([`exhausted_note`], [`warn_exhausted`]).

use parking_lot::Mutex;
use std::io;
use std::time::{Duration, Instant};

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

/// The most [`raise_nofile`] raises the soft limit to: room for thousands of connections,
/// while children that close every descriptor up to the limit, or `select()` users, are not
/// handed a limit of a million or more.
pub const RAISE_CAP: u64 = 1 << 16;

/// Raise the soft limit towards the hard one (at most [`RAISE_CAP`]; never lower), as NCCL's
/// bootstrap root does for its own process. Returns the limit before and after (equal when
/// there was nothing to raise). Tested in a child process (`ha-harness` `tests/nofile.rs`):
/// the limit is the whole process's.
pub fn raise_nofile() -> io::Result<(NofileLimit, NofileLimit)> {
    let before = nofile()?;
    let target = before.hard.min(RAISE_CAP);
    if before.soft >= target {
        return Ok((before, before));
    }
    let r = libc::rlimit {
        rlim_cur: target,
        rlim_max: before.hard,
    };
    // SAFETY: `r` is a valid rlimit; raising the soft limit up to the hard one needs no
    // privilege, and the kernel checks the values.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((before, nofile()?))
}

/// Whether `e` says the process (EMFILE) or the system (ENFILE) ran out of descriptors.
pub fn is_exhausted(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// What ends an error message about `e`: `"; "` and [`exhausted_note`] when `e` is running out
/// of descriptors, else nothing.
pub fn note(e: &io::Error) -> String {
    if is_exhausted(e) {
        format!("; {}", exhausted_note(e))
    } else {
        String::new()
    }
}

/// What to tell the user about exhaustion error `e`: which limit, and how to raise it.
pub fn exhausted_note(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENFILE) {
        return "the system's file table is full: raise fs.file-max (sysctl)".into();
    }
    match nofile() {
        Ok(l) => format!(
            "this process's open-file limit is {} (hard {}): raise `ulimit -n` (and \
             `ulimit -Hn`); a `sock` connection holds 8–12 descriptors, about 20 with lanes",
            l.soft, l.hard
        ),
        Err(_) => "raise the open-file limit (`ulimit -n`)".into(),
    }
}

/// At most one warning of a kind per this period: once descriptors run out, every
/// connection's threads and NCCL's calls fail the same way, many times a second.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(5);

/// Warnings held back since the last one, and when that went out.
#[derive(Debug, Default)]
pub(crate) struct WarnLimiter {
    held: u64,
    last: Option<Instant>,
}

impl WarnLimiter {
    /// A failure at `now`: `Some(held back since the last warning)` when a warning is due (at
    /// most one per [`WARN_EVERY`]), else `None` (counted).
    pub(crate) fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < WARN_EVERY)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// Count one exhaustion failure with error `e` at `now`; the warning to log, if due (only
    /// then is `what` said), with the failures held back since the last.
    fn note(
        &mut self,
        what: impl FnOnce() -> String,
        e: &io::Error,
        now: Instant,
    ) -> Option<String> {
        let more = match self.due(now)? {
            0 => String::new(),
            1 => " (1 more such failure since the last warning)".to_string(),
            n => format!(" ({n} more such failures since the last warning)"),
        };
        Some(format!("{}: {e}{more}; {}", what(), exhausted_note(e)))
    }
}

static LIMITER: Mutex<WarnLimiter> = Mutex::new(WarnLimiter {
    held: 0,
    last: None,
});

/// Log exhaustion failure `what` (formatted only when logged) through the process-wide
/// [`WarnLimiter`].
pub fn warn_exhausted(what: impl FnOnce() -> String, e: &io::Error) {
    // The lock is not held while logging: other threads running out only count.
    let w = LIMITER.lock().note(what, e, Instant::now());
    if let Some(w) = w {
        tracing::warn!("NET/HA : {w}");
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
    fn the_note_names_the_limit_or_the_system_table() {
        let n = exhausted_note(&io::Error::from_raw_os_error(libc::EMFILE));
        let l = nofile().unwrap();
        assert!(
            n.contains(&format!("open-file limit is {} (hard {})", l.soft, l.hard)),
            "{n}"
        );
        assert!(n.contains("raise `ulimit -n`"), "{n}");
        let n = exhausted_note(&io::Error::from_raw_os_error(libc::ENFILE));
        assert!(n.contains("fs.file-max") && !n.contains("ulimit"), "{n}");
    }

    #[test]
    fn the_limiter_warns_once_per_period_with_the_count() {
        let mut w = WarnLimiter::default();
        let t0 = Instant::now();
        let e = io::Error::from_raw_os_error(libc::EMFILE);
        let first = w
            .note(|| "accepting".into(), &e, t0)
            .expect("the first failure warns");
        assert!(first.starts_with("accepting: "), "{first}");
        assert!(!first.contains("more such"), "{first}");
        assert!(first.contains("open-file limit is"), "{first}");
        for k in 1..=9u64 {
            assert_eq!(
                w.note(
                    || "accepting".into(),
                    &e,
                    t0 + Duration::from_millis(k * 100)
                ),
                None
            );
        }
        let next = w
            .note(|| "connecting".into(), &e, t0 + WARN_EVERY)
            .expect("a warning after the period");
        assert!(
            next.contains("(9 more such failures since the last warning)"),
            "{next}"
        );
        assert_eq!(
            w.note(
                || "accepting".into(),
                &e,
                t0 + WARN_EVERY * 2 - Duration::from_millis(1)
            ),
            None
        );
        let last = w
            .note(|| "accepting".into(), &e, t0 + WARN_EVERY * 2)
            .unwrap();
        assert!(last.contains("(1 more such failure since"), "{last}");
    }

    #[test]
    fn an_io_error_of_exhaustion_carries_the_note_and_others_do_not() {
        let e = crate::fabric::FabricError::io(
            "sock: connecting to 10.0.0.2:5000",
            io::Error::from_raw_os_error(libc::EMFILE),
        );
        let s = e.to_string();
        assert!(
            s.starts_with("sock: connecting to 10.0.0.2:5000: Too many open files")
                && s.contains("; this process's open-file limit is"),
            "{s}"
        );
        let e = crate::fabric::FabricError::io(
            "sock: connect",
            io::Error::from_raw_os_error(libc::ECONNREFUSED),
        );
        assert!(!e.to_string().contains("open-file"), "{e}");
    }
}
