//! The two ranks of a drill, run as child processes of the test (`HA_ROLE=send|recv`): they
//! stream verified messages through the plugin and report what arrived on stdout.

use crate::so;
use crate::{MAX_MSG, WINDOW};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

fn dir() -> PathBuf {
    PathBuf::from(std::env::var("HA_DIR").expect("HA_DIR"))
}

/// Message `seq`: its size and bytes (the first 8 bytes carry `seq`).
fn message(seq: u64) -> Vec<u8> {
    let size = 16 + (seq.wrapping_mul(7919) % (MAX_MSG as u64 - 16)) as usize;
    let mut v = so::pattern(seq, size);
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v
}

const END: u64 = u64::MAX;

pub fn role_send() -> i32 {
    let p = so::plugin();
    // The receiver's handle arrives on stdin (hex), forwarded by the test.
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() || line.trim().len() != 256 {
        println!("FAIL no handle");
        return 1;
    }
    let mut h = [0u8; 128];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&line.trim()[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    let send = so::until_some(|| p.connect(0, &mut h).expect("connect"));
    let stop = dir().join("stop");
    let mut bufs: Vec<so::RegBuf> = (0..WINDOW)
        .map(|_| so::RegBuf::new(p, &send, vec![0; MAX_MSG]))
        .collect();
    let mut inflight = std::collections::VecDeque::new();
    let mut seq = 0u64;
    let mut ended = false;
    loop {
        while inflight.len() < WINDOW && !ended {
            let k = (seq as usize) % WINDOW;
            let msg = if stop.exists() {
                ended = true;
                let mut m = vec![0u8; 16];
                m[..8].copy_from_slice(&END.to_le_bytes());
                m
            } else {
                message(seq)
            };
            bufs[k].data[..msg.len()].copy_from_slice(&msg);
            let ptr = bufs[k].ptr();
            let r = match so::until_some_result(|| {
                p.isend(&send, ptr, msg.len() as i32, 0, bufs[k].mr())
            }) {
                Ok(r) => r,
                Err(e) => {
                    println!("FAIL isend {seq}: {e}");
                    return 1;
                }
            };
            inflight.push_back(r);
            seq += 1;
        }
        let Some(r) = inflight.pop_front() else { break };
        if let Err(e) = so::wait(p, &r, &mut [0]) {
            println!("FAIL send test: {e}");
            return 1;
        }
    }
    println!("SENT {seq}");
    let _ = std::io::stdout().flush();
    // Close only once the receiver has everything (the test says BYE).
    let mut bye = String::new();
    let _ = std::io::stdin().read_line(&mut bye);
    for b in &mut bufs {
        b.dereg(p, &send);
    }
    if let Err(e) = p.close_send(send) {
        println!("FAIL closeSend: {e}");
        return 1;
    }
    0
}

pub fn role_recv() -> i32 {
    let p = so::plugin();
    let dev: i32 = std::env::var("HA_DEV")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (h, listen) = p.listen(dev).expect("listen");
    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
    println!("HANDLE {hex}");
    let _ = std::io::stdout().flush();
    let recv = so::until_some(|| p.accept(&listen).expect("accept"));
    let mut bufs: Vec<so::RegBuf> = (0..WINDOW)
        .map(|_| so::RegBuf::new(p, &recv, vec![0; MAX_MSG]))
        .collect();
    let mut inflight = std::collections::VecDeque::new();
    let (mut next_post, mut expect) = (0u64, 0u64);
    let start = Instant::now();
    let mut last = start;
    let mut gaps = Vec::new();
    loop {
        while inflight.len() < WINDOW {
            let k = (next_post as usize) % WINDOW;
            bufs[k].data.fill(0);
            let ptr = bufs[k].ptr();
            match p.irecv(&recv, &[ptr], &[MAX_MSG as i32], &[0], &[bufs[k].mr()]) {
                Ok(Some(r)) => {
                    inflight.push_back((k, r));
                    next_post += 1;
                }
                Ok(None) => break,
                Err(e) => {
                    println!("FAIL irecv: {e}");
                    return 1;
                }
            }
        }
        let Some((k, r)) = inflight.pop_front() else {
            continue;
        };
        let mut sz = [0];
        if let Err(e) = so::wait(p, &r, &mut sz) {
            println!("FAIL recv test at message {expect}: {e}");
            return 1;
        }
        let now = Instant::now();
        gaps.push(now.duration_since(last).as_millis() as u64);
        last = now;
        let got = &bufs[k].data[..sz[0] as usize];
        let seq = u64::from_le_bytes(got[..8].try_into().unwrap());
        if seq == END {
            break;
        }
        if seq != expect {
            println!("FAIL message {expect}: got message {seq} (lost, duplicated or reordered)");
            return 1;
        }
        if got != message(seq).as_slice() {
            println!("FAIL message {seq}: bytes differ");
            return 1;
        }
        if bufs[k].data[sz[0] as usize..].iter().any(|&b| b != 0) {
            println!("FAIL message {seq}: bytes written past its size");
            return 1;
        }
        expect += 1;
        if expect % 200 == 0 {
            println!("PROGRESS {expect}");
        }
    }
    let mut top = gaps.clone();
    top.sort_unstable_by(|a, b| b.cmp(a));
    println!("GAP1 {}", top.first().copied().unwrap_or(0));
    println!("GAP2 {}", top.get(1).copied().unwrap_or(0));
    println!("MESSAGES {expect}");
    for b in &mut bufs {
        b.dereg(p, &recv);
    }
    if let Err(e) = p.close_recv(recv) {
        println!("FAIL closeRecv: {e}");
        return 1;
    }
    let _ = p.close_listen(listen);
    println!("DONE");
    let _ = std::io::stdout().flush();
    0
}
