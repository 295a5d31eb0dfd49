//! The `bench` command: per size, latency (ping-pong, half round trip, median) and bandwidth
//! (a window of sends in flight, timed on side A until B acknowledges the last message).
//! Side A measures; side B echoes and acknowledges. Buffers are registered once, host memory.

use super::args::Options;
use super::conn::{Endpoint, Side};
use super::driver::{self, Buf, Ctl, RecvOp, RecvPart, SendOp};
use super::pattern;
use super::report::{median, BenchRow};
use std::time::Instant;

const BW_MIN_MSGS: usize = 8;
const ACK_SIZE: usize = 8;
const TAG_PING: i32 = 1;
const TAG_DATA: i32 = 2;
const TAG_ACK: i32 = 3;

/// Everything both sides must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchPlan {
    pub sizes: Vec<usize>,
    pub window: usize,
    pub iters: usize,
    /// Latency iterations are capped so that large sizes move at most about this many bytes.
    pub lat_bytes: usize,
    /// Bytes each bandwidth run moves per size (message count clamped to 8..=bw_max_msgs).
    pub bw_bytes: usize,
    pub bw_max_msgs: usize,
}

impl BenchPlan {
    /// The plan of a `bench` command line.
    pub fn from_options(o: &Options) -> Self {
        BenchPlan {
            sizes: sizes(o.min, o.max, o.factor),
            window: o.window,
            iters: o.iters,
            lat_bytes: o.lat_bytes,
            bw_bytes: o.bw_bytes,
            bw_max_msgs: o.bw_max_msgs,
        }
    }

    fn buf_len(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0).max(ACK_SIZE)
    }
}

/// `min, min*factor, ...` up to `max` (inclusive when hit exactly).
pub fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        match s.checked_mul(factor.max(2)) {
            Some(n) => s = n,
            None => break,
        }
    }
    v
}

/// Timed latency iterations for `size` (`iters` capped by the volume `lat_bytes`, at least 3).
pub fn lat_iters(size: usize, iters: usize, lat_bytes: usize) -> usize {
    iters.min(lat_bytes / size.max(1)).max(3)
}

/// Timed bandwidth messages for `size` when a run moves about `bw_bytes` in at most
/// `max_msgs` messages (and at least 8).
pub fn bw_iters(size: usize, bw_bytes: usize, max_msgs: usize) -> usize {
    (bw_bytes / size.max(1)).clamp(BW_MIN_MSGS, max_msgs.max(BW_MIN_MSGS))
}

/// Offset of the `i`-th in-flight message: distinct slots when `window` of them fit.
fn slot_offset(i: usize, size: usize, window: usize, buf_len: usize) -> usize {
    if size.saturating_mul(window) <= buf_len {
        (i % window) * size
    } else {
        0
    }
}

/// GB/s (1e9 bytes per second).
pub fn gbps(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        f64::NAN
    }
}

struct Bufs {
    send: Buf,
    recv: Buf,
}

/// Runs the plan on one side; side A hands each measured row to `row`.
pub fn run_side(
    ep: &Endpoint<'_>,
    side: Side,
    plan: &BenchPlan,
    ctl: &Ctl<'_>,
    row: &mut dyn FnMut(BenchRow),
) -> Result<(), String> {
    let len = plan.buf_len();
    let mut send = Buf::register(ep.plugin, &ep.send, len)?;
    let recv = match Buf::register(ep.plugin, &ep.recv, len) {
        Ok(b) => b,
        Err(e) => {
            let _ = send.deregister(ep.plugin, &ep.send);
            return Err(e);
        }
    };
    pattern::fill(
        send.bytes_mut(),
        pattern::seed(side.index() as u64, len, 0, 0),
    );
    let mut bufs = Bufs { send, recv };
    for &size in &plan.sizes {
        let result = match side {
            Side::A => measure(ep, &mut bufs, size, plan, ctl).map(&mut *row),
            Side::B => serve(ep, &mut bufs, size, plan, ctl),
        };
        if let Err(e) = result {
            driver::leak(vec![bufs.send, bufs.recv]);
            return Err(format!("size {size}: {e}"));
        }
    }
    bufs.send.deregister(ep.plugin, &ep.send)?;
    bufs.recv.deregister(ep.plugin, &ep.recv)
}

fn measure(
    ep: &Endpoint<'_>,
    b: &mut Bufs,
    size: usize,
    plan: &BenchPlan,
    ctl: &Ctl<'_>,
) -> Result<BenchRow, String> {
    let n_lat = lat_iters(size, plan.iters, plan.lat_bytes);
    let warm_lat = (n_lat / 10).max(1);
    let mut samples = Vec::with_capacity(n_lat);
    for i in 0..warm_lat + n_lat {
        let t0 = Instant::now();
        let rreq = driver::post_recv_one(ep, &mut b.recv, size, TAG_PING, ctl)?;
        let sreq = driver::post_send_one(ep, &mut b.send, size, TAG_PING, ctl)?;
        driver::wait(ep, sreq, &mut [0], ctl)?;
        let mut got = [-1];
        driver::wait(ep, rreq, &mut got, ctl)?;
        let half_rtt_us = t0.elapsed().as_secs_f64() * 1e6 / 2.0;
        if usize::try_from(got[0]).ok() != Some(size) {
            return Err(format!("pong of {} bytes, expected {size}", got[0]));
        }
        if i >= warm_lat {
            samples.push(half_rtt_us);
        }
    }
    let n_bw = bw_iters(size, plan.bw_bytes, plan.bw_max_msgs);
    let warm_bw = n_bw.min(plan.window);
    bandwidth_send(ep, b, size, warm_bw, plan, ctl)?;
    let t0 = Instant::now();
    bandwidth_send(ep, b, size, n_bw, plan, ctl)?;
    let secs = t0.elapsed().as_secs_f64();
    Ok(BenchRow {
        size,
        lat_us: median(&mut samples),
        bw_gbps: gbps(size * n_bw, secs),
        lat_iters: n_lat,
        bw_iters: n_bw,
    })
}

/// Side A of one bandwidth round: `n` sends, then B's acknowledgement.
fn bandwidth_send(
    ep: &Endpoint<'_>,
    b: &mut Bufs,
    size: usize,
    n: usize,
    plan: &BenchPlan,
    ctl: &Ctl<'_>,
) -> Result<(), String> {
    let len = b.send.len();
    let sends: Vec<SendOp> = (0..n)
        .map(|i| SendOp {
            buf: 0,
            off: slot_offset(i, size, plan.window, len),
            size,
            tag: TAG_DATA,
        })
        .collect();
    let ack = [RecvOp {
        parts: vec![RecvPart {
            buf: 0,
            off: 0,
            size: ACK_SIZE,
            tag: TAG_ACK,
        }],
    }];
    let bw_ctl = Ctl {
        window: plan.window,
        ..*ctl
    };
    let sizes = driver::run(
        ep,
        &sends,
        std::slice::from_mut(&mut b.send),
        &ack,
        std::slice::from_mut(&mut b.recv),
        &bw_ctl,
    )?;
    if sizes[0][0] != ACK_SIZE as i32 {
        return Err(format!("acknowledgement of {} bytes", sizes[0][0]));
    }
    Ok(())
}

fn serve(
    ep: &Endpoint<'_>,
    b: &mut Bufs,
    size: usize,
    plan: &BenchPlan,
    ctl: &Ctl<'_>,
) -> Result<(), String> {
    let n_lat = lat_iters(size, plan.iters, plan.lat_bytes);
    let total = (n_lat / 10).max(1) + n_lat;
    // The receive for the next ping is posted before the pong goes out.
    let mut rreq = Some(driver::post_recv_one(ep, &mut b.recv, size, TAG_PING, ctl)?);
    for i in 0..total {
        let mut got = [-1];
        if let Some(r) = rreq.take() {
            driver::wait(ep, r, &mut got, ctl)?;
        }
        if usize::try_from(got[0]).ok() != Some(size) {
            return Err(format!("ping of {} bytes, expected {size}", got[0]));
        }
        if i + 1 < total {
            rreq = Some(driver::post_recv_one(ep, &mut b.recv, size, TAG_PING, ctl)?);
        }
        let sreq = driver::post_send_one(ep, &mut b.send, size, TAG_PING, ctl)?;
        driver::wait(ep, sreq, &mut [0], ctl)?;
    }
    let n_bw = bw_iters(size, plan.bw_bytes, plan.bw_max_msgs);
    for n in [n_bw.min(plan.window), n_bw] {
        bandwidth_recv(ep, b, size, n, plan, ctl)?;
    }
    Ok(())
}

/// Side B of one bandwidth round: `n` receives, then the acknowledgement.
fn bandwidth_recv(
    ep: &Endpoint<'_>,
    b: &mut Bufs,
    size: usize,
    n: usize,
    plan: &BenchPlan,
    ctl: &Ctl<'_>,
) -> Result<(), String> {
    let len = b.recv.len();
    let recvs: Vec<RecvOp> = (0..n)
        .map(|i| RecvOp {
            parts: vec![RecvPart {
                buf: 0,
                off: slot_offset(i, size, plan.window, len),
                size,
                tag: TAG_DATA,
            }],
        })
        .collect();
    let bw_ctl = Ctl {
        window: plan.window,
        ..*ctl
    };
    let sizes = driver::run(
        ep,
        &[],
        std::slice::from_mut(&mut b.send),
        &recvs,
        std::slice::from_mut(&mut b.recv),
        &bw_ctl,
    )?;
    if let Some(bad) = sizes.iter().position(|s| s[0] != size as i32) {
        return Err(format!(
            "bandwidth message {bad} arrived with {} bytes, expected {size}",
            sizes[bad][0]
        ));
    }
    let ack = [SendOp {
        buf: 0,
        off: 0,
        size: ACK_SIZE,
        tag: TAG_ACK,
    }];
    driver::run(
        ep,
        &ack,
        std::slice::from_mut(&mut b.send),
        &[],
        std::slice::from_mut(&mut b.recv),
        ctl,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_ladder() {
        assert_eq!(
            sizes(8, 64 << 20, 4),
            [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2097152, 8388608, 33554432]
        );
        assert_eq!(sizes(1024, 4096, 2), [1024, 2048, 4096]);
        assert_eq!(sizes(5, 5, 4), [5]);
        assert_eq!(sizes(usize::MAX / 2, usize::MAX, 4), [usize::MAX / 2]);
    }

    #[test]
    fn iteration_counts() {
        assert_eq!(lat_iters(8, 200, 256 << 20), 200);
        assert_eq!(lat_iters(64 << 20, 200, 256 << 20), 4);
        assert_eq!(lat_iters(1 << 30, 200, 256 << 20), 3);
        assert_eq!(lat_iters(1 << 20, 200, 16 << 20), 16);
        assert_eq!(bw_iters(8, 1 << 30, 20_000), 20_000);
        assert_eq!(bw_iters(1 << 20, 1 << 30, 20_000), 1024);
        assert_eq!(bw_iters(1 << 30, 1 << 30, 20_000), BW_MIN_MSGS);
        assert_eq!(bw_iters(64 << 10, 64 << 20, 20_000), 1024);
        assert_eq!(bw_iters(8, 64 << 20, 500), 500);
    }

    #[test]
    fn slots() {
        assert_eq!(slot_offset(0, 100, 4, 400), 0);
        assert_eq!(slot_offset(5, 100, 4, 400), 100);
        assert_eq!(slot_offset(5, 101, 4, 400), 0);
    }

    #[test]
    fn bandwidth_units() {
        assert_eq!(gbps(2_000_000_000, 1.0), 2.0);
        assert!(gbps(1, 0.0).is_nan());
    }
}
