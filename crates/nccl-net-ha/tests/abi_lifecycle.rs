//! Threads and resources live only while connections do: after the last comm of the plugin
//! closes, no thread of the plugin is left (one test per binary, so nothing else runs here).

mod so;

use so::*;

/// Names of this process's threads that belong to the plugin (`ha-*`, `sock-*`).
fn plugin_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| n.starts_with("ha-") || n.starts_with("sock-"))
        .collect()
}

/// Wait (bounded) for a condition that background threads make true.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::yield_now();
    }
    f()
}

#[test]
fn threads_start_with_the_first_comm_and_stop_with_the_last() {
    let p = plugin();
    assert!(plugin_threads().is_empty(), "init alone starts no thread");
    for round in 0..3 {
        let (send, recv, _) = connect_pair(p);
        // A new thread names itself once it runs: wait for the name to show.
        assert!(
            eventually(|| plugin_threads().iter().any(|n| n == "ha-progress")),
            "round {round}: progress thread runs: {:?}",
            plugin_threads()
        );
        let mut sb = RegBuf::new(p, &send, pattern(round, 4096));
        let mut rb = RegBuf::new(p, &recv, vec![0; 4096]);
        let (sp, rp) = (sb.ptr(), rb.ptr());
        let rr = p
            .irecv(&recv, &[rp], &[4096], &[0], &[rb.mr()])
            .unwrap()
            .unwrap();
        let sr = until_some(|| p.isend(&send, sp, 4096, 0, sb.mr()).unwrap());
        wait(p, &sr, &mut [0]).unwrap();
        wait(p, &rr, &mut [0]).unwrap();
        assert!(rb.data == pattern(round, 4096));
        sb.dereg(p, &send);
        rb.dereg(p, &recv);
        p.close_send(send).unwrap();
        p.close_recv(recv).unwrap();
        assert!(
            eventually(|| plugin_threads().is_empty()),
            "round {round}: threads left after the last close: {:?}",
            plugin_threads()
        );
    }
}
