//! The stats writer with live connections: periodic lines while they are registered, none
//! after a closing line, and no thread once the last one is gone.

use super::live::{ConnStats, LiveStats};
use super::writer::{registered, running, set_interval};
use std::time::{Duration, Instant};

/// Lines of `file` with `"event":"<e>"` and `"conn":<id>`.
fn lines_of(file: &std::path::Path, e: &str, id: u64) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains(&format!("\"event\":\"{e}\"")) && l.contains(&format!("\"conn\":{id},"))
        })
        .count()
}

#[test]
fn periodic_lines_while_registered_then_the_closing_line_last_and_no_thread() {
    // Exclusive: the interval of periodic lines is the process's.
    let _l = crate::fabric::sock::tests::TEST_LOCK.write();
    let file = std::env::temp_dir().join(format!("ha-stats-writer-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let f = file.to_string_lossy().into_owned();
    set_interval(Duration::from_millis(20));
    let a = LiveStats::new(ConnStats::new("send", "a".into(), vec!["d0".into()], &f));
    let b = LiveStats::new(ConnStats::new("recv", "b".into(), vec!["d0".into()], &f));
    a.opened();
    assert!(running(), "writer started");
    // Nobody calls into the connections: the writer still reports them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines_of(&file, "periodic", a.id) < 2 || lines_of(&file, "periodic", b.id) < 2 {
        assert!(Instant::now() < deadline, "no periodic lines");
        std::thread::sleep(Duration::from_millis(5));
    }
    a.close(0);
    let (ida, idb) = (a.id, b.id);
    drop(a);
    let after_close = lines_of(&file, "periodic", ida);
    // b's lines go on; a's do not.
    let more = lines_of(&file, "periodic", idb) + 2;
    while lines_of(&file, "periodic", idb) < more {
        assert!(Instant::now() < deadline, "b's periodic lines stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(lines_of(&file, "periodic", ida), after_close);
    b.close(0);
    drop(b);
    set_interval(Duration::ZERO);
    let text = std::fs::read_to_string(&file).unwrap();
    let last_of = |id: u64| {
        text.lines()
            .rfind(|l| l.contains(&format!("\"conn\":{id},")))
            .unwrap()
            .to_string()
    };
    assert!(last_of(ida).starts_with("{\"event\":\"closed\""));
    assert!(last_of(idb).starts_with("{\"event\":\"closed\""));
    assert_eq!(lines_of(&file, "open", ida), 1);
    let _ = std::fs::remove_file(&file);
    // Other tests of this binary may hold connections with a stats file: the writer has
    // stopped unless one of them is still registered.
    if registered() == 0 {
        assert!(!running());
    }
}

/// A connection that dies says so at once, in an event line of its own with the phase and the
/// cause, so the stats file tells it even when the process then exits without closing.
#[test]
fn a_lost_connection_writes_its_line_at_once() {
    let file = std::env::temp_dir().join(format!("ha-stats-lost-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let f = file.to_string_lossy().into_owned();
    let a = LiveStats::new(ConnStats::new("recv", "a".into(), vec!["d0".into()], &f));
    a.lost("path 0 failed (probe completed with RetryExcErr) and no other path is usable");
    let text = std::fs::read_to_string(&file).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("{\"event\":\"lost\""))
        .unwrap_or_else(|| panic!("no lost line in {text}"));
    assert!(line.contains(&format!("\"conn\":{},", a.id)), "{line}");
    assert!(line.contains("\"phase\":\"dead\""), "{line}");
    assert!(line.contains("\"cause\":\"path 0 failed (probe completed with RetryExcErr) and no other path is usable\""), "{line}");
    drop(a);
    let _ = std::fs::remove_file(&file);
}
