//! The operators' drain list (`HA_NCCL_DRAIN_FILE`, default `/run/nccl-net-ha/drain`): device
//! or interface names, one per line (commas and blanks also separate; `#` starts a comment),
//! watched by every process using the plugin. A connection whose active path is on a listed
//! device moves to its other path with a planned switch, and stays off it until the name is
//! removed.
//!
//! Why a file: it is node-wide without a daemon or a socket, every process of every job sees
//! it (including ones started later), it survives a process restart, and an operator scripts
//! it with what is on every node (`echo mlx5_0 >> /run/nccl-net-ha/drain`, config management,
//! `ha-harness drain mlx5_0`). Checking it costs one atomic load per tick; at most every
//! [`CHECK_EVERY`] one tick `stat`s the file and re-reads it only when its inode, size or
//! modification time changed.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// How often the file is looked at.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// What identifies a version of the file: (inode, size, modification time).
type Stamp = (u64, u64, Option<SystemTime>);

#[derive(Default)]
struct Seen {
    stamp: Option<Stamp>,
    names: Vec<String>,
}

/// One drain file, watched.
pub struct DrainList {
    path: PathBuf,
    start: Instant,
    /// When the next look is due, in ns since `start`.
    next_ns: AtomicU64,
    /// Bumped whenever the list of names changes.
    generation: AtomicU64,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for DrainList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DrainList({})", self.path.display())
    }
}

impl DrainList {
    pub fn new(path: impl Into<PathBuf>) -> DrainList {
        DrainList {
            path: path.into(),
            start: Instant::now(),
            next_ns: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            seen: Mutex::new(Seen::default()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Look at the file if it is time (at most every [`CHECK_EVERY`], one caller at a time);
    /// returns the generation of the list, which changes whenever the names do.
    pub fn poll(&self, now: Instant) -> u64 {
        let at = now.saturating_duration_since(self.start).as_nanos() as u64;
        let due = self.next_ns.load(Ordering::Relaxed);
        if at >= due
            && self
                .next_ns
                .compare_exchange(
                    due,
                    at + CHECK_EVERY.as_nanos() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.reread();
        }
        self.generation.load(Ordering::Acquire)
    }

    fn reread(&self) {
        let stamp = std::fs::metadata(&self.path).ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.ino(), m.len(), m.modified().ok())
        });
        let mut seen = self.seen.lock();
        if seen.stamp == stamp {
            return;
        }
        seen.stamp = stamp;
        // A file that cannot be read (absent, a directory, no permission) drains nothing.
        let names = std::fs::read_to_string(&self.path)
            .map(|t| parse(&t))
            .unwrap_or_default();
        if names != seen.names {
            tracing::info!(
                "NET/HA : drain list {}: {}",
                self.path.display(),
                if names.is_empty() {
                    "nothing drained".to_string()
                } else {
                    format!("drained {}", names.join(", "))
                }
            );
            seen.names = names;
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Whether the device named `device` (as the fabric names it) is on the list.
    pub fn drained(&self, device: &str) -> bool {
        self.seen
            .lock()
            .names
            .iter()
            .any(|n| names_device(n, device))
    }
}

/// The names in a drain file's text.
pub fn parse(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        for name in line.split([',', ' ', '\t']).filter(|n| !n.is_empty()) {
            if !out.iter().any(|o| o == name) {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// Whether drain entry `entry` names device `device`: its full name (`mlx5_0:1`,
/// `sock:eth1`), the name without the fabric prefix (`eth1`), or the device without its port
/// (`mlx5_0`: every port of it).
pub fn names_device(entry: &str, device: &str) -> bool {
    entry == device
        || device.strip_prefix("sock:") == Some(entry)
        || device.split_once(':').is_some_and(|(d, port)| {
            d == entry && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_comments_and_separators() {
        let t = "# maintenance 12:00\nmlx5_0\n  eth1, eth2\t# cable\n\nmlx5_0\n";
        assert_eq!(parse(t), ["mlx5_0", "eth1", "eth2"]);
        assert!(names_device("mlx5_0", "mlx5_0:1"));
        assert!(names_device("mlx5_0:1", "mlx5_0:1"));
        assert!(!names_device("mlx5_0:2", "mlx5_0:1"));
        assert!(!names_device("mlx5_1", "mlx5_10:1"));
        assert!(names_device("r0a", "sock:r0a"));
        assert!(names_device("sock:r0a", "sock:r0a"));
        assert!(!names_device("sock", "sock:r0a"), "the fabric is no device");
        assert!(!names_device("r0", "sock:r0a"));
    }

    #[test]
    fn the_file_is_reread_only_when_it_changes_and_at_most_every_check() {
        let dir = std::env::temp_dir().join(format!("ha-drain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("drain");
        let _ = std::fs::remove_file(&path);
        let list = DrainList::new(&path);
        let t0 = Instant::now();
        let g0 = list.poll(t0);
        assert!(!list.drained("sock:r0a"), "no file: nothing drained");
        std::fs::write(&path, "r0a\n").unwrap();
        assert_eq!(list.poll(t0 + CHECK_EVERY / 2), g0, "not looked at yet");
        assert!(!list.drained("sock:r0a"));
        let g1 = list.poll(t0 + CHECK_EVERY * 2);
        assert_ne!(g1, g0);
        assert!(list.drained("sock:r0a") && !list.drained("sock:r1a"));
        // Rewritten with the same names (new inode): same generation.
        std::fs::write(dir.join("new"), "# again\nr0a\n").unwrap();
        std::fs::rename(dir.join("new"), &path).unwrap();
        assert_eq!(list.poll(t0 + CHECK_EVERY * 4), g1);
        std::fs::write(&path, "").unwrap();
        let g2 = list.poll(t0 + CHECK_EVERY * 6);
        assert_ne!(g2, g1);
        assert!(!list.drained("sock:r0a"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
