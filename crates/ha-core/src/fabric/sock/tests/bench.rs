//! Loopback throughput (ignored; run in release).

use super::*;

/// Throughput: `cargo test --release --lib fabric::sock::tests::bench -- --ignored --nocapture`
/// (`SOCK_BENCH_SEG=<bytes>` changes the segment size, default 1 MiB).
#[test]
#[ignore]
fn bench_write_64m_loopback() {
    let _l = TEST_LOCK.write();
    let seg = std::env::var("SOCK_BENCH_SEG").map_or(1 << 20, |v| v.parse().unwrap());
    let (_f, a, b) = pair(LONG, seg);
    const N: usize = 64 << 20;
    let mut src = Buf::new(N, 0);
    src.pattern(1);
    let dst = Buf::new(N, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let w = |i| {
        wr(
            i,
            SendOp::Write,
            (&src, 0, N, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )
    };
    for (iters, window) in [(8u64, 1u64), (32, 4)] {
        let t0 = Instant::now();
        let mut posted = 0;
        let mut done = 0;
        while done < iters {
            while posted < iters && posted - done < window {
                a.qp.post_send(&[w(posted)]).unwrap();
                posted += 1;
            }
            let mut c = Vec::new();
            while a.cq.poll(&mut c, 16).unwrap() == 0 {
                a.bell.wait(Duration::from_millis(10));
            }
            assert!(c.iter().all(|c| c.status.is_ok()));
            done += c.len() as u64;
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "sock WRITE 64 MiB x{iters}, window {window}: {:.2} GB/s",
            (iters as f64 * N as f64) / dt / 1e9
        );
    }
    assert!(dst.bytes() == src.bytes());
    // Small messages: 4 KiB WRITEs, 128 in flight.
    let iters = 20000u64;
    let t0 = Instant::now();
    let (mut posted, mut done) = (0, 0);
    let mut out = Vec::new();
    while done < iters {
        while posted < iters && posted - done < 128 {
            a.qp.post_send(&[wr(
                posted,
                SendOp::Write,
                (&src, 0, 4096, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            )])
            .unwrap();
            posted += 1;
        }
        out.clear();
        let n = a.cq.poll(&mut out, 128).unwrap();
        if n == 0 {
            a.bell.wait(Duration::from_millis(10));
        }
        done += n as u64;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "sock WRITE 4 KiB x{iters}, 128 in flight: {:.0} kWR/s, {:.2} GB/s",
        iters as f64 / dt / 1e3,
        iters as f64 * 4096.0 / dt / 1e9
    );
}
