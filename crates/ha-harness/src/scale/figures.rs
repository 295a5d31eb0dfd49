//! What `ha-harness scale` counts on each side: threads, resident memory and descriptors
//! (`/proc/self`), context switches and CPU time (`getrusage`), and the lines they travel in
//! between the two processes.

/// What one side reports for one connection count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SideFigures {
    pub threads: u64,
    pub rss_kib: u64,
    pub fds: u64,
    /// Voluntary context switches during the timed rounds.
    pub csw: u64,
}

impl SideFigures {
    /// This process now, with `csw` context switches counted over its timed rounds.
    pub(super) fn measured(csw: u64) -> SideFigures {
        let (threads, rss_kib, fds) = sample_self();
        SideFigures {
            threads,
            rss_kib,
            fds,
            csw,
        }
    }

    pub(super) fn line(&self) -> String {
        format!(
            "S {} {} {} {}",
            self.threads, self.rss_kib, self.fds, self.csw
        )
    }

    pub(super) fn parse(line: &str) -> Option<SideFigures> {
        let [threads, rss_kib, fds, csw] = numbers(line, "S ")?;
        Some(SideFigures {
            threads,
            rss_kib,
            fds,
            csw,
        })
    }
}

/// A process's voluntary context switches and CPU time; over a window (the idle one, or the
/// timed rounds' switches), the difference of two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IdleFigures {
    /// Voluntary context switches (each a sleep that a wake-up ends).
    pub csw: u64,
    /// User + system CPU time, microseconds.
    pub cpu_us: u64,
}

impl IdleFigures {
    /// This process's counters now (subtract two of them for a window).
    pub(super) fn now() -> IdleFigures {
        use nix::sys::resource::{getrusage, UsageWho};
        getrusage(UsageWho::RUSAGE_SELF).map_or(IdleFigures::default(), |u| {
            let us =
                |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
            IdleFigures {
                csw: u.voluntary_context_switches() as u64,
                cpu_us: us(u.user_time()) + us(u.system_time()),
            }
        })
    }

    pub(super) fn since(self, before: IdleFigures) -> IdleFigures {
        IdleFigures {
            csw: self.csw.saturating_sub(before.csw),
            cpu_us: self.cpu_us.saturating_sub(before.cpu_us),
        }
    }

    pub(super) fn line(&self) -> String {
        format!("I {} {}", self.csw, self.cpu_us)
    }

    pub(super) fn parse(line: &str) -> Option<IdleFigures> {
        let [csw, cpu_us] = numbers(line, "I ")?;
        Some(IdleFigures { csw, cpu_us })
    }
}

/// The `N` numbers of a figures line after its tag (`S `, `I `).
fn numbers<const N: usize>(line: &str, tag: &str) -> Option<[u64; N]> {
    let mut it = line.strip_prefix(tag)?.split_whitespace();
    let mut out = [0u64; N];
    for v in &mut out {
        *v = it.next()?.parse().ok()?;
    }
    Some(out)
}

/// `Threads:` and `VmRSS:` of `/proc/self/status` and the entries of `/proc/self/fd`.
pub(super) fn sample_self() -> (u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    (field("Threads:"), field("VmRSS:"), fds)
}
