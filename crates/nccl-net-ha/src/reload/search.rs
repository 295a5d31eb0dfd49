//! What NCCL's `dlopen("libnccl-net.so")` would open, found the way glibc's loader looks: the
//! loading NCCL's search directories (its RPATH, `LD_LIBRARY_PATH`, its RUNPATH), then
//! `/etc/ld.so.cache`, then the system directories; and whether that file is this plugin
//! (same device and inode, so a symbolic link to it counts). Plain file reads, no loading.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The outcome of the lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The first match is this plugin's file.
    Ours(PathBuf),
    /// The first match is another library (another vendor's plugin).
    Other(PathBuf),
    /// No match: `dlopen` fails.
    Nothing,
}

/// Where glibc's cache lives.
const LD_CACHE: &str = "/etc/ld.so.cache";

/// Find `name` in `dirs` (the order `dlinfo(RTLD_DI_SERINFO)` gives, system directories
/// last), consulting `ld.so.cache` just before the system directories, as glibc does.
pub(crate) fn find(name: &str, dirs: &[PathBuf], own: Option<&Path>) -> Found {
    let cache = std::fs::read(LD_CACHE).unwrap_or_default();
    find_with_cache(name, dirs, &cache, own)
}

fn find_with_cache(name: &str, dirs: &[PathBuf], cache: &[u8], own: Option<&Path>) -> Found {
    let split = dirs.len() - dirs.iter().rev().take_while(|d| is_system_dir(d)).count();
    let (first, system) = dirs.split_at(split);
    let in_dirs = |ds: &[PathBuf]| {
        ds.iter()
            .map(|d| d.join(name))
            .find(|p| p.metadata().is_ok_and(|m| m.is_file()))
    };
    let hit = in_dirs(first)
        .or_else(|| {
            cache_lookup(cache, name)
                .into_iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
        .or_else(|| in_dirs(system));
    match hit {
        None => Found::Nothing,
        Some(p) if own.is_some_and(|o| same_file(o, &p)) => Found::Ours(p),
        Some(p) => Found::Other(p),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// glibc's trusted directories: `/lib`, `/usr/lib`, `/lib64`, `/usr/lib64` and the
/// multiarch `/lib/<triplet>`, `/usr/lib/<triplet>`.
fn is_system_dir(d: &Path) -> bool {
    let s = d.to_string_lossy();
    let s = s.trim_end_matches('/');
    let rest = s.strip_prefix("/usr").unwrap_or(s);
    matches!(rest, "/lib" | "/lib64")
        || rest
            .strip_prefix("/lib/")
            .is_some_and(|t| !t.contains('/') && t.contains("-linux-"))
}

/// `FLAG_ELF_LIBC6` and this machine's `FLAG_*_LIB64` (glibc `ldconfig.h`), `None`: any.
fn cache_flags() -> Option<i32> {
    if cfg!(target_arch = "x86_64") {
        Some(0x0303)
    } else if cfg!(target_arch = "aarch64") {
        Some(0x0a03)
    } else {
        None
    }
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn c_str_at(b: &[u8], off: usize) -> Option<&str> {
    let tail = b.get(off..)?;
    let end = tail.iter().position(|&c| c == 0)?;
    std::str::from_utf8(&tail[..end]).ok()
}

const MAGIC_OLD: &[u8] = b"ld.so-1.7.0";
const MAGIC_NEW: &[u8] = b"glibc-ld.so.cache1.1";
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;

/// The paths `ld.so.cache` holds for library `name` (this machine's ABI), in cache order.
/// The file is glibc's "new" format (alone, or after the old one); anything else or any
/// out-of-range offset yields nothing.
pub(crate) fn cache_lookup(cache: &[u8], name: &str) -> Vec<String> {
    let start = if cache.starts_with(MAGIC_NEW) {
        0
    } else if cache.starts_with(MAGIC_OLD) {
        // The old table (12-byte entries after a 16-byte header), then the new format at the
        // next 8-byte boundary.
        let Some(n) = u32_at(cache, 12) else {
            return Vec::new();
        };
        (16 + n as usize * 12).next_multiple_of(8)
    } else {
        return Vec::new();
    };
    let Some(new) = cache.get(start..).filter(|c| c.starts_with(MAGIC_NEW)) else {
        return Vec::new();
    };
    let Some(nlibs) = u32_at(new, 20) else {
        return Vec::new();
    };
    let want = cache_flags();
    (0..nlibs as usize)
        .filter_map(|i| {
            let e = NEW_HEADER + i * NEW_ENTRY;
            let flags = u32_at(new, e)? as i32;
            let key = c_str_at(new, u32_at(new, e + 4)? as usize)?;
            if key != name || want.is_some_and(|w| flags != w) {
                return None;
            }
            Some(c_str_at(new, u32_at(new, e + 8)? as usize)?.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new-format cache holding `(flags, key, value)` entries.
    fn cache(entries: &[(i32, &str, &str)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let base = NEW_HEADER + entries.len() * NEW_ENTRY;
        let mut table = Vec::new();
        for (flags, k, v) in entries {
            let ko = base + strings.len();
            strings.extend_from_slice(k.as_bytes());
            strings.push(0);
            let vo = base + strings.len();
            strings.extend_from_slice(v.as_bytes());
            strings.push(0);
            table.extend_from_slice(&flags.to_le_bytes());
            table.extend_from_slice(&(ko as u32).to_le_bytes());
            table.extend_from_slice(&(vo as u32).to_le_bytes());
            table.extend_from_slice(&[0; 12]);
        }
        let mut out = MAGIC_NEW.to_vec();
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.resize(NEW_HEADER, 0);
        out.extend(table);
        out.extend(strings);
        out
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "nccl-net-ha-search-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn parses_the_new_cache_format_and_filters_the_abi() {
        let flags = cache_flags().unwrap_or(0x0303);
        let c = cache(&[
            (flags, "libfoo.so", "/usr/lib/libfoo.so"),
            (0x0003, "libnccl-net.so", "/other-abi/libnccl-net.so"),
            (flags, "libnccl-net.so", "/opt/a/libnccl-net.so"),
            (flags, "libnccl-net.so", "/opt/b/libnccl-net.so"),
        ]);
        let got = cache_lookup(&c, "libnccl-net.so");
        if cache_flags().is_some() {
            assert_eq!(got, ["/opt/a/libnccl-net.so", "/opt/b/libnccl-net.so"]);
        }
        assert!(cache_lookup(&c, "libbar.so").is_empty());
        // Garbage and truncation give nothing instead of a panic.
        assert!(cache_lookup(b"not a cache", "libfoo.so").is_empty());
        for cut in [0, 10, 20, 30, 60, c.len() - 3] {
            let _ = cache_lookup(&c[..cut], "libnccl-net.so");
        }
    }

    #[test]
    fn reads_this_machines_cache() {
        let Ok(c) = std::fs::read(LD_CACHE) else {
            println!("SKIPPED: no {LD_CACHE}");
            return;
        };
        let libc = cache_lookup(&c, "libc.so.6");
        assert!(
            libc.iter().any(|p| Path::new(p).is_file()),
            "libc.so.6 from {LD_CACHE}: {libc:?}"
        );
    }

    #[test]
    fn system_dirs() {
        for d in [
            "/lib",
            "/usr/lib/",
            "/lib64",
            "/usr/lib/x86_64-linux-gnu",
            "/lib/aarch64-linux-gnu",
        ] {
            assert!(is_system_dir(Path::new(d)), "{d}");
        }
        for d in [
            "/opt/lib",
            "/usr/local/lib",
            "/usr/lib/x86_64-linux-gnu/nccl",
            "lib",
        ] {
            assert!(!is_system_dir(Path::new(d)), "{d}");
        }
    }

    #[test]
    fn first_match_in_search_order_decides() {
        let d = scratch("order");
        let (a, b, sys) = (d.join("a"), d.join("b"), PathBuf::from("/usr/lib"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let own = d.join("libnccl-net-ha.so");
        std::fs::write(&own, b"plugin").unwrap();
        let dirs = vec![a.clone(), b.clone(), sys];
        let name = "libnccl-net-test-only.so";
        assert_eq!(
            find_with_cache(name, &dirs, &[], Some(&own)),
            Found::Nothing
        );
        std::os::unix::fs::symlink(&own, b.join(name)).unwrap();
        assert_eq!(
            find_with_cache(name, &dirs, &[], Some(&own)),
            Found::Ours(b.join(name))
        );
        std::fs::write(a.join(name), b"another plugin").unwrap();
        assert_eq!(
            find_with_cache(name, &dirs, &[], Some(&own)),
            Found::Other(a.join(name))
        );
        // The cache comes after the non-system directories, before the system ones.
        std::fs::remove_file(a.join(name)).unwrap();
        std::fs::remove_file(b.join(name)).unwrap();
        let flags = cache_flags().unwrap_or(0x0303);
        let c = cache(&[(flags, name, own.to_str().unwrap())]);
        assert_eq!(
            find_with_cache(name, &dirs, &c, Some(&own)),
            Found::Ours(own.clone())
        );
        std::fs::write(b.join(name), b"another plugin").unwrap();
        assert_eq!(
            find_with_cache(name, &dirs, &c, Some(&own)),
            Found::Other(b.join(name))
        );
        assert_eq!(
            find_with_cache(name, &dirs, &c, None),
            Found::Other(b.join(name))
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
