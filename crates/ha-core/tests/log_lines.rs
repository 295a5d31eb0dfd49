//! Lines of processes that share one stderr stay whole: two ranks (or a tool and its child)
//! often write into one log file, and the drill scripts count lines in it. `eprintln!` writes
//! each piece of its format with its own `write`, so two processes logging at once fused lines
//! ("HA NET WARN HA NET WARN ..."); `StderrSink` writes each line with one call.

use ha_core::api::log::{Level, LogSink, StderrSink};
use std::process::{Command, Stdio};

const LINES: usize = 4000;
const CHILD: &str = "HA_LOG_LINES_CHILD";

#[test]
fn two_processes_logging_into_one_file_keep_every_line_whole() {
    if let Ok(id) = std::env::var(CHILD) {
        for i in 0..LINES {
            StderrSink.log(
                Level::Warn,
                false,
                "f.rs",
                1,
                &format!("child {id} line {i} end"),
            );
        }
        return;
    }
    let path = std::env::temp_dir().join(format!("ha-log-lines-{}.log", std::process::id()));
    let file = std::fs::File::create(&path).expect("log file");
    let exe = std::env::current_exe().expect("test executable");
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|id| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "two_processes_logging_into_one_file_keep_every_line_whole",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, id)
                .stdout(Stdio::null())
                // The same open file for both: one shared offset, as `cmd >log 2>&1` gives a
                // parent and the children it starts.
                .stderr(file.try_clone().expect("dup"))
                .spawn()
                .expect("child")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    let text = std::fs::read_to_string(&path).expect("read log");
    let _ = std::fs::remove_file(&path);
    let ours: Vec<&str> = text.lines().filter(|l| l.contains(" line ")).collect();
    let whole = |l: &&str| {
        let Some(rest) = l.strip_prefix("HA NET WARN child ") else {
            return false;
        };
        let mut w = rest.split(' ');
        matches!(
            (w.next(), w.next(), w.next(), w.next(), w.next()),
            (Some("a" | "b"), Some("line"), Some(n), Some("end"), None) if n.parse::<usize>().is_ok()
        )
    };
    let broken: Vec<&&str> = ours.iter().filter(|l| !whole(l)).take(3).collect();
    assert!(broken.is_empty(), "fused or torn lines: {broken:?}");
    assert_eq!(ours.len(), 2 * LINES, "every line of both processes");
}
