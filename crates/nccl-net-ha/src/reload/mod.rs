//! Re-created communicators on NCCL 2.28 and 2.29. Those releases unload a net plugin after
//! its last communicator is destroyed and, in doing so, forget the name it was loaded under
//! (fixed in 2.30): the next communicator of the process (PyTorch's
//! `destroy_process_group()` then `init_process_group()`, an elastic trainer's restart) looks
//! only for `libnccl-net.so`, so it fails with `NCCL_NET=HA` ("Failed to initialize any NET
//! plugin") or silently runs on another network. Nothing the plugin does at run time avoids
//! it (NCCL reads `NCCL_NET_PLUGIN_REF_COUNT` once, before loading us), so every `init` checks
//! whether this process is exposed and, if so, says once, as a WARN, what the user can do.
//!
//! The facts come from [`probe`] (which NCCL loaded us: its `ncclGetVersion`, found through
//! the logger it passed to `init`; where its `dlopen("libnccl-net.so")` would look) and
//! [`search`] (what that lookup finds); [`assess`] turns them into the verdict, without I/O.

mod probe;
mod search;

use nccl_net_abi::common::NcclDebugLogger;
use parking_lot::Mutex;
use search::Found;
use std::sync::atomic::{AtomicBool, Ordering};

/// The name NCCL 2.28/2.29 reload a plugin under once they forgot its own.
pub(crate) const DEFAULT_PLUGIN_NAME: &str = "libnccl-net.so";
/// The environment variable that keeps NCCL from unloading the plugin.
pub(crate) const REF_COUNT_VAR: &str = "NCCL_NET_PLUGIN_REF_COUNT";

/// `NCCL_VERSION(2, 28, 0)` and `NCCL_VERSION(2, 30, 0)`: the releases that forget the name.
const FIRST_AFFECTED: i32 = 22800;
const FIRST_FIXED: i32 = 23000;

/// What is known about the NCCL that called `init`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// `ncclGetVersion` of the loading NCCL (`None`: not found).
    pub version: Option<i32>,
    /// The ext-net version NCCL called `init` through.
    pub abi: u32,
    /// Whether this library exports v12 (then only NCCL 2.28/2.29 pick v11).
    pub exports_v12: bool,
    /// `NCCL_NET_PLUGIN_REF_COUNT` as set (`None`: unset).
    pub ref_count: Option<String>,
    /// What NCCL's `dlopen("libnccl-net.so")` would open.
    pub reload_finds: Found,
}

/// The outcome of [`assess`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Re-created communicators find this plugin again (the reason, for tests and logs).
    Safe(&'static str),
    /// They will not: the WARN to log.
    Exposed(String),
}

/// `2.28.9` for 22809 (`NCCL_VERSION`: `X*1000+Y*100+Z` up to 2.8, `X*10000+Y*100+Z` after).
pub(crate) fn version_name(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100)
    }
}

/// Whether the process is exposed to the forgotten-name reload, and what to tell the user.
pub(crate) fn assess(f: &Facts) -> Verdict {
    let nccl = match f.version {
        Some(v) if !(FIRST_AFFECTED..FIRST_FIXED).contains(&v) => {
            return Verdict::Safe("this NCCL keeps the plugin's name when it unloads it");
        }
        Some(v) => format!("NCCL {}", version_name(v)),
        // The version is unknown; the ABI NCCL chose still tells: only 2.28/2.29 take v11
        // over v12.
        None if f.abi == 11 && f.exports_v12 => "NCCL 2.28 or 2.29 (it chose ext-net v11)".into(),
        None => return Verdict::Safe("the loading NCCL's version is unknown"),
    };
    let kept = f
        .ref_count
        .as_deref()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|n| n > 0);
    if kept {
        return Verdict::Safe("NCCL_NET_PLUGIN_REF_COUNT keeps the plugin loaded");
    }
    let instead = match &f.reload_finds {
        Found::Ours(_) => {
            return Verdict::Safe("libnccl-net.so on the loader path is this plugin");
        }
        Found::Other(p) => format!("will load {} instead of this plugin", p.display()),
        Found::Nothing => format!("will look for {DEFAULT_PLUGIN_NAME} only and not find it"),
    };
    Verdict::Exposed(format!(
        "NET/HA : {nccl} unloads a net plugin when the last communicator is destroyed and then \
         forgets the plugin's name (fixed in NCCL 2.30): a communicator created after that in \
         this process (e.g. destroy_process_group() then init_process_group()) {instead}, and \
         fails with NCCL_NET=HA or silently uses another network. Set \
         {REF_COUNT_VAR}=1 (keeps the plugin loaded), or also install this library as \
         {DEFAULT_PLUGIN_NAME} ahead of any other on the loader path; see the README section \
         \"Re-creating communicators\""
    ))
}

/// At most one WARN per process (the image stays loaded: `-z nodelete`).
static WARNED: AtomicBool = AtomicBool::new(false);
/// The (version, ABI) last announced in the INFO line.
static ANNOUNCED: Mutex<Option<(Option<i32>, u32)>> = Mutex::new(None);

/// Called by every `init` (`abi`: the version NCCL called) after the logger is installed.
/// Without a logger the caller is not NCCL (a test or tool): nothing to check.
pub(crate) fn on_init(logger: NcclDebugLogger, abi: u32) {
    let Some(logger) = logger else {
        return;
    };
    if WARNED.load(Ordering::Relaxed) {
        return;
    }
    let nccl = probe::loading_nccl(logger as *const ());
    let version = nccl.as_ref().and_then(|n| n.version);
    {
        let mut last = ANNOUNCED.lock();
        if *last != Some((version, abi)) {
            *last = Some((version, abi));
            let who = version.map_or("an NCCL of unknown version".into(), |v| {
                format!("NCCL {}", version_name(v))
            });
            tracing::info!(
                init = true,
                "NET/HA : loaded by {who} through ext-net v{abi}"
            );
        }
    }
    let dirs = nccl.map(|n| n.search_dirs).unwrap_or_default();
    let facts = Facts {
        version,
        abi,
        exports_v12: cfg!(ha_abi_v12),
        ref_count: std::env::var(REF_COUNT_VAR).ok(),
        reload_finds: search::find(DEFAULT_PLUGIN_NAME, &dirs, probe::own_path().as_deref()),
    };
    match assess(&facts) {
        Verdict::Safe(why) => tracing::debug!("NET/HA : re-created communicators: {why}"),
        Verdict::Exposed(msg) => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(init = true, "{msg}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn facts(version: Option<i32>, abi: u32) -> Facts {
        Facts {
            version,
            abi,
            exports_v12: true,
            ref_count: None,
            reload_finds: Found::Nothing,
        }
    }

    fn exposed(f: &Facts) -> String {
        match assess(f) {
            Verdict::Exposed(m) => m,
            Verdict::Safe(why) => panic!("{f:?} judged safe: {why}"),
        }
    }

    #[test]
    fn versions_name_like_nccl() {
        assert_eq!(version_name(22809), "2.28.9");
        assert_eq!(version_name(23007), "2.30.7");
        assert_eq!(version_name(22907), "2.29.7");
        assert_eq!(version_name(2804), "2.8.4");
    }

    #[test]
    fn only_2_28_and_2_29_are_exposed() {
        for v in [22800, 22803, 22809, 22902, 22907, 22999] {
            let m = exposed(&facts(Some(v), 11));
            assert!(m.contains(&format!("NCCL {}", version_name(v))), "{m}");
        }
        for v in [22703, 22605, 23000, 23003, 23007, 2804] {
            assert!(
                matches!(assess(&facts(Some(v), 11)), Verdict::Safe(_)),
                "{v}"
            );
        }
        // The exact version wins over the ABI hint.
        assert!(matches!(assess(&facts(Some(23007), 11)), Verdict::Safe(_)));
        assert!(!exposed(&facts(Some(22809), 10)).is_empty());
    }

    #[test]
    fn unknown_version_falls_back_on_the_abi_nccl_chose() {
        let m = exposed(&facts(None, 11));
        assert!(
            m.contains("NCCL 2.28 or 2.29 (it chose ext-net v11)"),
            "{m}"
        );
        // v12 means 2.30+; v10 and older (or a library without v12) say nothing for sure.
        for (abi, v12) in [(12, true), (10, true), (8, true), (11, false)] {
            let f = Facts {
                exports_v12: v12,
                ..facts(None, abi)
            };
            assert!(matches!(assess(&f), Verdict::Safe(_)), "{f:?}");
        }
    }

    #[test]
    fn ref_count_of_one_or_more_keeps_the_plugin() {
        for (v, safe) in [
            ("1", true),
            (" 2 ", true),
            ("0", false),
            ("", false),
            ("yes", false),
            ("-1", false),
        ] {
            let f = Facts {
                ref_count: Some(v.into()),
                ..facts(Some(22809), 11)
            };
            assert_eq!(matches!(assess(&f), Verdict::Safe(_)), safe, "{v:?}");
        }
    }

    #[test]
    fn an_installed_default_name_decides_by_what_it_is() {
        let ours = Facts {
            reload_finds: Found::Ours(PathBuf::from("/opt/ha/libnccl-net.so")),
            ..facts(Some(22809), 11)
        };
        assert!(matches!(assess(&ours), Verdict::Safe(_)));
        let other = Facts {
            reload_finds: Found::Other(PathBuf::from(
                "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
            )),
            ..facts(Some(22809), 11)
        };
        let m = exposed(&other);
        assert!(
            m.contains("will load /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so instead"),
            "{m}"
        );
    }

    #[test]
    fn the_warning_names_the_variable_the_cause_and_the_remedies() {
        let m = exposed(&facts(Some(22809), 11));
        for part in [
            "NET/HA : NCCL 2.28.9 unloads a net plugin",
            "forgets the plugin's name (fixed in NCCL 2.30)",
            "will look for libnccl-net.so only and not find it",
            "NCCL_NET_PLUGIN_REF_COUNT=1",
            "install this library as libnccl-net.so",
            "Re-creating communicators",
        ] {
            assert!(m.contains(part), "{part:?} missing from {m}");
        }
    }
}
