//! The open-file limit at init: a warning when it is too low for `sock`'s descriptors.

use crate::config::{Config, FabricKind};
use crate::fabric::fd_limit::{self, NofileLimit};

/// A hard limit below this (the usual soft default) is worth a warning for `sock`.
const SOCK_LOW: u64 = 1024;
/// Descriptors of a `sock` connection with its standby, and of the plugin without any
/// connection (measured with `ha-harness scale`: 20 at one connection, 524 at 64).
const PER_CONN: u64 = 8;
const BASE: u64 = 16;

/// Warn when `sock` runs under a low hard limit (NCCL raises the soft limit to the hard one
/// when it starts, before or after this init: the hard one is what counts). Never fails
/// init: an error from running out names the limit itself.
pub fn at_init(cfg: &Config) {
    if let Some(msg) = fd_limit::nofile()
        .ok()
        .and_then(|l| low_for_sock(cfg.fabric, l))
    {
        tracing::warn!("NET/HA : {msg}");
    }
}

/// The warning for a hard limit too low for `sock`, if it is.
fn low_for_sock(fabric: FabricKind, l: NofileLimit) -> Option<String> {
    (fabric == FabricKind::Sock && l.hard < SOCK_LOW).then(|| {
        format!(
            "the open-file limit is {} (hard {}): a `sock` connection holds about 8 \
             descriptors with its standby, so at most about {} connections fit in this \
             process; raise the hard limit (`ulimit -Hn`)",
            l.soft,
            l.hard,
            l.hard.saturating_sub(BASE) / PER_CONN,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_hard_limit_is_named_for_sock_only() {
        let l = NofileLimit {
            soft: 128,
            hard: 256,
        };
        let m = low_for_sock(FabricKind::Sock, l).expect("256 is low for sock");
        assert!(
            m.contains("is 128 (hard 256)") && m.contains("at most about 30 connections"),
            "{m}"
        );
        assert_eq!(low_for_sock(FabricKind::Verbs, l), None);
        // A low soft limit alone: NCCL raises it to the hard one.
        let raisable = NofileLimit {
            soft: 128,
            hard: SOCK_LOW,
        };
        assert_eq!(low_for_sock(FabricKind::Sock, raisable), None);
    }
}
