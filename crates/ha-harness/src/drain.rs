//! `ha-harness drain|undrain|drained`: edit and show the node's drain list, the file every
//! process using the plugin watches (`HA_NCCL_DRAIN_FILE`, default `/run/nccl-net-ha/drain`):
//! device or interface names, one per line, `#` comments. Connections leave a listed device
//! with a planned switch within about 100 ms and stay off it until it is removed.
//!
//! Edits keep the file's other lines and comments, and replace it atomically (a new file
//! renamed over it), so a plugin never reads half a list; concurrent editors take turns
//! through a lock file next to it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const USAGE: &str = "\
usage: ha-harness drain [--file PATH] DEV...      add DEV... to the drain list
       ha-harness undrain [--file PATH] DEV...    remove DEV... from it
       ha-harness undrain [--file PATH] --all     empty it
       ha-harness drained [--file PATH]           print the drained names, one per line

DEV is a device or interface name as the plugin's log shows it: mlx5_0 (every port),
mlx5_0:1, sock:eth1 or eth1. Every process using the plugin on this node moves its
connections off a drained device with a planned switch (no replay, no error) within about
100 ms, and keeps them off until it is undrained; a connection with no other path keeps
running and says so in the log.

The list is the file HA_NCCL_DRAIN_FILE names (default /run/nccl-net-ha/drain); --file
overrides it. Exit status: 0 = done, 1 = the file could not be written, 2 = bad usage.
";

/// The default drain list (the plugin's `HA_NCCL_DRAIN_FILE` default).
pub const DEFAULT_FILE: &str = "/run/nccl-net-ha/drain";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Drain(Vec<String>),
    Undrain(Vec<String>),
    UndrainAll,
    Show,
}

/// Parse `drain|undrain|drained [--file PATH] ...`: the file and the operation.
pub fn parse(args: &[String], env_file: Option<String>) -> Result<(PathBuf, Op), String> {
    let cmd = args.first().map(String::as_str).unwrap_or("");
    let mut file = env_file
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_FILE.into());
    let (mut names, mut all) = (Vec::new(), false);
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--file" => file = it.next().ok_or("--file needs a path")?.clone(),
            "--all" => all = true,
            "-h" | "--help" => return Err(String::new()),
            n if n.starts_with('-') => return Err(format!("unknown option {n}")),
            n => {
                if n.contains(['#', ',', ' ', '\t', '\n']) {
                    return Err(format!("{n:?} is not a device name"));
                }
                names.push(n.to_string());
            }
        }
    }
    let op = match (cmd, all, names.is_empty()) {
        ("drain", false, false) => Op::Drain(names),
        ("undrain", false, false) => Op::Undrain(names),
        ("undrain", true, true) => Op::UndrainAll,
        ("drained", false, true) => Op::Show,
        ("drain", _, _) => return Err("drain: name the device(s) to drain".into()),
        ("undrain", _, _) => return Err("undrain: name the device(s), or --all alone".into()),
        ("drained", _, _) => return Err("drained takes no names".into()),
        _ => return Err(format!("unknown command {cmd:?}")),
    };
    Ok((PathBuf::from(file), op))
}

/// The names a drain list's text holds (as the plugin reads it).
pub fn names(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        for n in line.split([',', ' ', '\t']).filter(|n| !n.is_empty()) {
            if !out.iter().any(|o| o == n) {
                out.push(n.to_string());
            }
        }
    }
    out
}

/// The text after `op`: comments and other names kept; drained names appended one per line;
/// undrained names removed from every line (a line left empty goes).
pub fn edit(text: &str, op: &Op) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    match op {
        Op::Show => return text.to_string(),
        Op::UndrainAll => lines.retain(|l| l.trim_start().starts_with('#')),
        Op::Drain(add) => {
            let have = names(text);
            for n in add {
                if !have.contains(n) && !lines.iter().any(|l| l.trim() == n) {
                    lines.push(n.clone());
                }
            }
        }
        Op::Undrain(del) => {
            lines = lines
                .into_iter()
                .filter_map(|l| {
                    let (body, comment) = match l.find('#') {
                        Some(i) => (&l[..i], Some(&l[i..])),
                        None => (l.as_str(), None),
                    };
                    let kept: Vec<&str> = body
                        .split([',', ' ', '\t'])
                        .filter(|n| !n.is_empty() && !del.iter().any(|d| d == n))
                        .collect();
                    match (kept.is_empty(), comment) {
                        (true, None) if !body.trim().is_empty() => None,
                        (true, None) => Some(l.clone()),
                        (true, Some(c)) if body.trim().is_empty() => Some(c.to_string()),
                        (true, Some(_)) => None,
                        (false, c) => Some(format!(
                            "{}{}",
                            kept.join(" "),
                            c.map_or(String::new(), |c| format!(" {c}"))
                        )),
                    }
                })
                .collect();
        }
    }
    let mut out = lines.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// Hold `<file>.lock` while editing (created exclusively; one left by a crashed editor is
/// taken over after 5 s).
struct Lock(PathBuf);

impl Lock {
    fn take(file: &Path) -> std::io::Result<Lock> {
        let path = file.with_extension("lock");
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(_) => return Ok(Lock(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if Instant::now() > until {
                        eprintln!(
                            "drain: taking over {} (left by an editor that died?)",
                            path.display()
                        );
                        let _ = std::fs::remove_file(&path);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Apply `op` to `file`; the names drained afterwards.
pub fn apply(file: &Path, op: &Op) -> std::io::Result<Vec<String>> {
    if *op == Op::Show {
        return Ok(names(&std::fs::read_to_string(file).unwrap_or_default()));
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let _lock = Lock::take(file)?;
    let old = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let new = edit(&old, op);
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(new.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, file)?;
    Ok(names(&new))
}

/// `ha-harness drain|undrain|drained ...`; the exit status.
pub fn main_with_args(args: &[String]) -> i32 {
    let (file, op) = match parse(args, std::env::var("HA_NCCL_DRAIN_FILE").ok()) {
        Ok(x) => x,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("ha-harness: {e}\n\n{USAGE}");
            return 2;
        }
    };
    match apply(&file, &op) {
        Ok(now) if op == Op::Show => {
            for n in now {
                println!("{n}");
            }
            0
        }
        Ok(now) => {
            println!(
                "drain list {}: {}",
                file.display(),
                if now.is_empty() {
                    "nothing drained".to_string()
                } else {
                    format!("drained {}", now.join(", "))
                }
            );
            0
        }
        Err(e) => {
            eprintln!(
                "ha-harness: cannot update the drain list {}: {e}",
                file.display()
            );
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn commands_and_their_errors() {
        let (f, op) = parse(&args("drain mlx5_0 eth1"), None).unwrap();
        assert_eq!(f, PathBuf::from(DEFAULT_FILE));
        assert_eq!(op, Op::Drain(vec!["mlx5_0".into(), "eth1".into()]));
        let (f, op) = parse(&args("undrain --all"), Some("/tmp/x".into())).unwrap();
        assert_eq!((f, op), (PathBuf::from("/tmp/x"), Op::UndrainAll));
        let (f, _) = parse(&args("drained --file /tmp/y"), Some("/tmp/x".into())).unwrap();
        assert_eq!(f, PathBuf::from("/tmp/y"));
        assert!(parse(&args("drain"), None)
            .unwrap_err()
            .contains("name the device"));
        assert!(parse(&args("undrain --all eth1"), None).is_err());
        assert!(parse(&args("drain a#b"), None)
            .unwrap_err()
            .contains("not a device"));
        assert!(parse(&args("drain --bogus x"), None)
            .unwrap_err()
            .contains("unknown option"));
        assert_eq!(parse(&args("drain --help"), None).unwrap_err(), "");
    }

    #[test]
    fn edits_keep_comments_and_other_names() {
        let t = "# maintenance window 12:00\nmlx5_0\neth1 eth2 # cables\n";
        let d = edit(t, &Op::Drain(vec!["eth3".into(), "mlx5_0".into()]));
        assert_eq!(
            d,
            "# maintenance window 12:00\nmlx5_0\neth1 eth2 # cables\neth3\n"
        );
        let u = edit(&d, &Op::Undrain(vec!["eth1".into(), "mlx5_0".into()]));
        assert_eq!(u, "# maintenance window 12:00\neth2 # cables\neth3\n");
        assert_eq!(names(&u), ["eth2", "eth3"]);
        let u = edit(&u, &Op::Undrain(vec!["eth2".into(), "eth3".into()]));
        assert_eq!(u, "# maintenance window 12:00\n");
        assert!(names(&u).is_empty());
        assert_eq!(edit(t, &Op::UndrainAll), "# maintenance window 12:00\n");
        assert_eq!(edit("", &Op::Drain(vec!["a".into()])), "a\n");
    }

    #[test]
    fn the_file_is_replaced_whole_and_created_with_its_folder() {
        let dir = std::env::temp_dir().join(format!("ha-drain-cli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join("sub/drain");
        assert_eq!(apply(&file, &Op::Show).unwrap(), Vec::<String>::new());
        assert_eq!(
            apply(&file, &Op::Drain(vec!["r0a".into()])).unwrap(),
            ["r0a"]
        );
        assert_eq!(
            apply(&file, &Op::Drain(vec!["r1a".into()])).unwrap(),
            ["r0a", "r1a"]
        );
        assert_eq!(
            apply(&file, &Op::Undrain(vec!["r0a".into()])).unwrap(),
            ["r1a"]
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "r1a\n");
        assert!(!file.with_extension("lock").exists(), "lock left behind");
        let code = main_with_args(&args(&format!("undrain --file {} --all", file.display())));
        assert_eq!(code, 0);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
