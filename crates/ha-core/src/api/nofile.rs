//! The open-file limit at init, on `sock` (whose connections hold sockets): the soft limit
//! raised towards the hard one (NCCL does so only in the process hosting its bootstrap root),
//! and a warning when even that is low.

use crate::config::{Config, FabricKind};
use crate::fabric::fd_limit::{self, NofileLimit};

/// A limit below this is worth a warning for `sock`.
const SOCK_LOW: u64 = 4096;
/// Descriptors of a `sock` connection (a send and a receive comm, with the standby) at the
/// high end of what was measured (8–12; more once large messages stripe over lanes), and of
/// the plugin without any connection.
const PER_CONN: u64 = 12;
const BASE: u64 = 16;

/// On `sock`: raise the soft limit (one INFO line when it moves), and warn when it stays low.
/// Never fails init: an error from running out names the limit itself.
pub fn at_init(cfg: &Config) {
    if cfg.fabric != FabricKind::Sock {
        return;
    }
    let now = match fd_limit::raise_nofile() {
        Ok((before, after)) => {
            if after.soft != before.soft {
                tracing::info!(
                    "NET/HA : raised this process's open-file limit (RLIMIT_NOFILE) from {} to \
                     {} (hard {}): a `sock` connection holds 8–12 descriptors",
                    before.soft,
                    after.soft,
                    after.hard
                );
            }
            Some(after)
        }
        Err(e) => {
            tracing::warn!("NET/HA : could not raise the open-file limit: {e}");
            fd_limit::nofile().ok()
        }
    };
    if let Some(msg) = now.and_then(|l| low_for_sock(cfg.fabric, l)) {
        tracing::warn!("NET/HA : {msg}");
    }
}

/// The warning for a soft limit too low for `sock`, if it is.
fn low_for_sock(fabric: FabricKind, l: NofileLimit) -> Option<String> {
    (fabric == FabricKind::Sock && l.soft < SOCK_LOW).then(|| {
        format!(
            "this process's open-file limit is {} (hard {}): a `sock` connection (a send and a \
             receive comm) holds 8–12 descriptors, so about {} fit; raise `ulimit -Hn` and \
             `ulimit -n` for a job with more",
            l.soft,
            l.hard,
            l.soft.saturating_sub(BASE) / PER_CONN,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_limit_is_named_for_sock_only() {
        let l = NofileLimit {
            soft: 1024,
            hard: 1024,
        };
        let m = low_for_sock(FabricKind::Sock, l).expect("1024 is low for sock");
        assert!(
            m.contains("limit is 1024 (hard 1024)") && m.contains("so about 84 fit"),
            "{m}"
        );
        assert_eq!(low_for_sock(FabricKind::Verbs, l), None);
        let ample = NofileLimit {
            soft: SOCK_LOW,
            hard: SOCK_LOW,
        };
        assert_eq!(low_for_sock(FabricKind::Sock, ample), None);
    }
}
