//! Integration tests through the C ABI of the built `libnccl_net_ha.so` (sock fabric on
//! loopback; `scripts/softroce/test-verbs.sh` runs them again on `verbs`, see `so`):
//! handshake, verified data of every size, 32 in flight, and bad input
//! giving clear error codes with the process alive. Each test runs once per ext-net version
//! (`name::v8` ... `name::v11`, see `so::per_abi!`; `HA_TEST_ABI` narrows the set). Sizes go
//! through each version's own size type (`int` for v8, `size_t` from v9 on).

mod so;

use nccl_net_abi::common::{
    NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_CUDA,
    NCCL_REMOTE_ERROR, NCCL_SUCCESS,
};
use nccl_net_loader::NcclError;
use so::*;
use std::os::raw::{c_int, c_void};
use std::ptr;

fn handshake_returns_null_until_both_sides_ran(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, nulls) = connect_pair(p);
    assert!(
        nulls >= 1,
        "connect must answer NULL before the acceptor ran"
    );
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// Send `sizes` one by one from a sender thread; every byte checked at the receiver.
fn exchange(abi: Abi, sizes: &[usize]) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let max = sizes.iter().copied().max().unwrap_or(0).max(1);
    let sizes_s = sizes.to_vec();
    let sender = std::thread::spawn(move || {
        let mut buf = RegBuf::new(p, &send, vec![0; max]);
        for (i, &n) in sizes_s.iter().enumerate() {
            buf.data[..n].copy_from_slice(&pattern(i as u64, n));
            let ptr = buf.ptr();
            let r = until_some(|| p.isend_sized(&send, ptr, n, 7, buf.mr()).unwrap());
            let mut sz = [0];
            wait(p, &r, &mut sz).unwrap();
        }
        buf.dereg(p, &send);
        p.close_send(send).unwrap();
    });
    let mut buf = RegBuf::new(p, &recv, vec![0; max + 16]);
    let untouched = vec![0xee; max + 16];
    for (i, &n) in sizes.iter().enumerate() {
        buf.data.fill(0xee);
        let ptr = buf.ptr();
        let r = until_some(|| {
            p.irecv_sized(&recv, &[ptr], &[max + 16], &[7], &[buf.mr()], false)
                .unwrap()
        });
        let mut sz = [-1];
        wait(p, &r, &mut sz).unwrap();
        assert_eq!(sz[0] as usize, n, "reported size of message {i}");
        assert!(
            buf.data[..n] == pattern(i as u64, n),
            "bytes of message {i} ({n} B)"
        );
        assert!(buf.data[n..] == untouched[n..], "no byte past {n}");
    }
    sender.join().unwrap();
    buf.dereg(p, &recv);
    p.close_recv(recv).unwrap();
}

fn sizes_from_zero_to_64_mib_arrive_intact(abi: Abi) {
    let all = [
        0,
        1,
        7,
        8,
        4095,
        4096,
        65537,
        1 << 20,
        (16 << 20) + 3,
        64 << 20,
    ];
    // The sweep stops where NCCL would: at the device's maxP2pBytes (v9+; Soft-RoCE ports take
    // 8 MiB) or HA_TEST_MAX_SIZE (a slow fabric, or v8, which cannot say); the cap itself, odd
    // and unaligned there, is sent too.
    let p = plugin_for(abi);
    let advertised = p.properties(connect_dev()).unwrap().max_p2p_bytes;
    let cap = max_size().min(advertised);
    let mut sizes: Vec<usize> = all.iter().copied().filter(|&n| n <= cap).collect();
    if sizes.len() < all.len() {
        sizes.push(cap);
        println!("sizes up to {cap} bytes (HA_TEST_MAX_SIZE, maxP2pBytes {advertised})");
    }
    exchange(abi, &sizes);
}

/// With eager sends on (the default on `sock`), a device advertises one buffer per receive
/// (`maxRecvs` 1) and a receive of two buffers is refused as a usage error naming the knob
/// (grouped receives: `abi_grouped.rs`, eager sends off).
fn two_buffers_are_refused_where_one_is_advertised(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    if p.properties(connect_dev()).unwrap().max_recvs == 1 {
        let mut a = RegBuf::new(p, &recv, vec![0; 64]);
        let mut b = RegBuf::new(p, &recv, vec![0; 64]);
        let r = p.irecv(
            &recv,
            &[a.ptr(), b.ptr()],
            &[64, 64],
            &[0, 1],
            &[a.mr(), b.mr()],
        );
        assert_eq!(r.err(), Some(NcclError(NCCL_INVALID_USAGE)));
        a.dereg(p, &recv);
        b.dereg(p, &recv);
    }
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

fn thirty_two_requests_in_flight_each_way(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    const N: usize = 32;
    const SZ: usize = 4096;
    std::thread::scope(|s| {
        let h = s.spawn(move || {
            let send_c = send;
            let send = &send_c;
            let mut buf = RegBuf::new(
                p,
                send,
                (0..N).flat_map(|i| pattern(i as u64, SZ)).collect(),
            );
            let base = buf.ptr();
            let reqs: Vec<_> = (0..N)
                .map(|i| {
                    // SAFETY-free pointer arithmetic: `wrapping_add` stays inside `buf`.
                    let ptr = base.wrapping_add(i * SZ);
                    until_some(|| p.isend(send, ptr, SZ as i32, 1, buf.mr()).unwrap())
                })
                .collect();
            assert_eq!(reqs.len(), N, "32 sends outstanding at once");
            for r in &reqs {
                wait(p, r, &mut [0]).unwrap();
            }
            buf.dereg(p, send);
            p.close_send(send_c).unwrap();
        });
        let mut buf = RegBuf::new(p, &recv, vec![0; N * SZ]);
        let base = buf.ptr();
        let reqs: Vec<_> = (0..N)
            .map(|i| {
                let ptr = base.wrapping_add(i * SZ);
                p.irecv(&recv, &[ptr], &[SZ as i32], &[1], &[buf.mr()])
                    .unwrap()
                    .expect("32 receives may be outstanding")
            })
            .collect();
        for r in &reqs {
            let mut sz = [0];
            wait(p, r, &mut sz).unwrap();
            assert_eq!(sz[0] as usize, SZ);
        }
        for i in 0..N {
            assert!(
                buf.data[i * SZ..(i + 1) * SZ] == pattern(i as u64, SZ),
                "message {i}"
            );
        }
        buf.dereg(p, &recv);
        h.join().unwrap();
    });
    p.close_recv(recv).unwrap();
}

fn send_larger_than_receive_fails_both_requests_and_connection_survives(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let mut sbuf = RegBuf::new(p, &send, pattern(5, 64));
    let mut rbuf = RegBuf::new(p, &recv, vec![0xaa; 32]);
    let (sp, rp) = (sbuf.ptr(), rbuf.ptr());
    let rr = p
        .irecv(&recv, &[rp], &[16], &[3], &[rbuf.mr()])
        .unwrap()
        .unwrap();
    let sr = until_some(|| p.isend(&send, sp, 64, 3, sbuf.mr()).unwrap());
    assert_eq!(wait(p, &sr, &mut [0]), Err(NcclError(NCCL_INVALID_USAGE)));
    assert_eq!(wait(p, &rr, &mut [0]), Err(NcclError(NCCL_REMOTE_ERROR)));
    assert!(rbuf.data.iter().all(|&b| b == 0xaa), "nothing written");
    // Next exchange on the same connection works.
    let rr = p
        .irecv(&recv, &[rp], &[32], &[3], &[rbuf.mr()])
        .unwrap()
        .unwrap();
    let sr = until_some(|| p.isend(&send, sp, 32, 3, sbuf.mr()).unwrap());
    wait(p, &sr, &mut [0]).unwrap();
    let mut sz = [0];
    wait(p, &rr, &mut sz).unwrap();
    assert_eq!(sz[0], 32);
    assert!(rbuf.data[..32] == pattern(5, 64)[..32]);
    sbuf.dereg(p, &send);
    rbuf.dereg(p, &recv);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

fn rc(r: c_int) -> Result<(), NcclError> {
    if r == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(NcclError(r))
    }
}

/// Raw calls through the v8 table (the entry points v9–v11 share with it; their own entry
/// points are checked in tests/abi_versions.rs).
#[test]
fn null_and_forged_pointers_are_invalid_arguments() {
    if !runs(Abi::V8) {
        return;
    }
    let p = plugin_for(Abi::V8);
    let t = p.table_v8().expect("v8 table");
    let inval = Err(NcclError(NCCL_INVALID_ARGUMENT));
    let mut req: *mut c_void = ptr::null_mut();
    let mut done: c_int = 0;
    let mut buf = [0u8; 8];
    // SAFETY (all calls below): the entry points are called with NULL or forged handles on
    // purpose; valid out-pointers are live locals; the plugin must reject without touching them.
    unsafe {
        assert_eq!(
            rc(t.isend.unwrap()(
                ptr::null_mut(),
                buf.as_mut_ptr().cast(),
                8,
                0,
                ptr::null_mut(),
                &mut req
            )),
            inval
        );
        assert_eq!(
            rc(t.isend.unwrap()(
                0x1234 as *mut c_void,
                buf.as_mut_ptr().cast(),
                8,
                0,
                ptr::null_mut(),
                &mut req
            )),
            inval
        );
        assert_eq!(
            rc(t.test.unwrap()(ptr::null_mut(), &mut done, ptr::null_mut())),
            inval
        );
        assert_eq!(
            rc(t.test.unwrap()(
                0xdead_beef as *mut c_void,
                &mut done,
                ptr::null_mut()
            )),
            inval
        );
        assert_eq!(rc(t.close_send.unwrap()(ptr::null_mut())), inval);
        assert_eq!(rc(t.close_recv.unwrap()(0x42 as *mut c_void)), inval);
        assert_eq!(rc(t.close_listen.unwrap()(ptr::null_mut())), inval);
        assert_eq!(rc(t.devices.unwrap()(ptr::null_mut())), inval);
        assert_eq!(rc(t.get_properties.unwrap()(0, ptr::null_mut())), inval);
        assert_eq!(
            rc(t.get_properties.unwrap()(99, &mut std::mem::zeroed())),
            inval
        );
        assert_eq!(rc(t.listen.unwrap()(0, ptr::null_mut(), &mut req)), inval);
    }
    // A real comm of the wrong kind.
    let (send, recv, _) = connect_pair(p);
    let mut rb = RegBuf::new(p, &recv, vec![0; 8]);
    // SAFETY: a recv comm passed where a send comm is expected; out-pointer valid.
    let r = unsafe {
        t.isend.unwrap()(
            recv.as_ptr(),
            rb.ptr().cast(),
            8,
            0,
            rb.mr().as_ptr(),
            &mut req,
        )
    };
    assert_eq!(rc(r), inval);
    // NULL request out-pointer.
    // SAFETY: valid comm and memory handle, NULL request pointer on purpose.
    let r = unsafe {
        t.isend.unwrap()(
            send.as_ptr(),
            rb.ptr().cast(),
            8,
            0,
            rb.mr().as_ptr(),
            ptr::null_mut(),
        )
    };
    assert_eq!(rc(r), inval);
    rb.dereg(p, &recv);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

fn bad_sizes_and_counts_are_invalid_arguments(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let mut rb = RegBuf::new(p, &recv, vec![0; 64]);
    let mut sb = RegBuf::new(p, &send, vec![0; 64]);
    let inval = Err(NcclError(NCCL_INVALID_ARGUMENT));
    let rp = rb.ptr();
    let nine = vec![rp; 9];
    let mrs = vec![rb.mr(); 9];
    assert_eq!(
        p.irecv(&recv, &nine, &[8; 9], &[0; 9], &mrs).map(|_| ()),
        inval
    );
    if abi == Abi::V8 {
        // Negative `int` sizes reach the plugin only through v8.
        assert_eq!(
            p.irecv(&recv, &[rp], &[-1], &[0], &[rb.mr()]).map(|_| ()),
            inval
        );
        assert_eq!(p.isend(&send, sb.ptr(), -5, 0, sb.mr()).map(|_| ()), inval);
    } else {
        // `size_t` sizes the plugin cannot carry: over its 4 GiB message limit (send), over
        // `i64::MAX` (receive).
        assert_eq!(
            p.isend_sized(&send, sb.ptr(), usize::MAX, 0, sb.mr())
                .map(|_| ()),
            inval
        );
        assert_eq!(
            p.isend_sized(&send, sb.ptr(), 1 << 32, 0, sb.mr())
                .map(|_| ()),
            inval
        );
        assert_eq!(
            p.irecv_sized(&recv, &[rp], &[usize::MAX], &[0], &[rb.mr()], false)
                .map(|_| ()),
            inval
        );
    }
    assert_eq!(
        p.reg_mr(&send, sb.ptr(), 0, NCCL_PTR_HOST).map(|_| ()),
        inval
    );
    assert_eq!(
        p.reg_mr(&send, sb.ptr(), 8, NCCL_PTR_CUDA).map(|_| ()),
        inval
    );
    // A send outside its registration.
    let far = sb.ptr().wrapping_add(60);
    assert_eq!(
        p.isend(&send, far, 8, 0, sb.mr()).map(|_| ()),
        Err(NcclError(NCCL_INVALID_USAGE))
    );
    rb.dereg(p, &recv);
    sb.dereg(p, &send);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

fn bad_handles_are_rejected_by_connect(abi: Abi) {
    let p = plugin_for(abi);
    let (good, listen) = p.listen(listen_dev()).unwrap();
    let mut wrong_magic = good;
    wrong_magic[0] ^= 0xff;
    let dev = connect_dev();
    assert_eq!(
        p.connect(dev, &mut wrong_magic).map(|_| ()),
        Err(NcclError(NCCL_INVALID_ARGUMENT))
    );
    let mut truncated = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    truncated[..20].copy_from_slice(&good[..20]);
    assert_eq!(
        p.connect(dev, &mut truncated).map(|_| ()),
        Err(NcclError(NCCL_INVALID_ARGUMENT))
    );
    let mut bad_dev = good;
    assert_eq!(
        p.connect(7, &mut bad_dev).map(|_| ()),
        Err(NcclError(NCCL_INVALID_ARGUMENT))
    );
    // A wrong token is refused by the listener, which stays usable.
    // A well-formed handle whose token (bytes 8..16) differs: re-sealed with its checksum.
    let mut forged = good;
    forged[8] ^= 1;
    let sum = ha_proto::wire::fnv1a32(&forged[..35]);
    forged[35..39].copy_from_slice(&sum.to_le_bytes());
    assert!(ha_proto::handle::ConnectHandle::decode(&forged).is_ok());
    let mut handle = good;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut forged_failed = false;
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() || !forged_failed {
        assert!(std::time::Instant::now() < deadline, "stuck");
        if !forged_failed {
            match p.connect(dev, &mut forged) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("a connector with the wrong token got a connection"),
                Err(e) => {
                    assert_eq!(e, NcclError(NCCL_REMOTE_ERROR));
                    forged_failed = true;
                }
            }
        }
        if send.is_none() {
            send = p.connect(dev, &mut handle).unwrap();
        }
        if recv.is_none() {
            recv = p.accept(&listen).unwrap();
        }
        std::thread::yield_now();
    }
    p.close_send(send.unwrap()).unwrap();
    p.close_recv(recv.unwrap()).unwrap();
    p.close_listen(listen).unwrap();
}

#[test]
fn double_close_and_double_dereg_are_invalid_usage() {
    if !runs(Abi::V8) {
        return;
    }
    let p = plugin_for(Abi::V8);
    let t = p.table_v8().expect("v8 table");
    let (send, recv, _) = connect_pair(p);
    let (sp, rp) = (send.as_ptr(), recv.as_ptr());
    let mut sb = RegBuf::new(p, &send, vec![0; 8]);
    let mr = sb.mr().as_ptr();
    sb.dereg(p, &send);
    // SAFETY: deliberately stale handles; the plugin must detect them.
    unsafe {
        assert_eq!(
            rc(t.dereg_mr.unwrap()(sp, mr)),
            Err(NcclError(NCCL_INVALID_USAGE))
        );
    }
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    // SAFETY: as above.
    unsafe {
        assert_eq!(
            rc(t.close_send.unwrap()(sp)),
            Err(NcclError(NCCL_INVALID_USAGE))
        );
        assert_eq!(
            rc(t.close_recv.unwrap()(rp)),
            Err(NcclError(NCCL_INVALID_USAGE))
        );
    }
}

fn testing_a_completed_request_is_invalid_usage(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let mut sb = RegBuf::new(p, &send, vec![1; 8]);
    let mut rb = RegBuf::new(p, &recv, vec![0; 8]);
    let (spp, rpp) = (sb.ptr(), rb.ptr());
    let rr = p
        .irecv(&recv, &[rpp], &[8], &[0], &[rb.mr()])
        .unwrap()
        .unwrap();
    let sr = until_some(|| p.isend(&send, spp, 8, 0, sb.mr()).unwrap());
    wait(p, &sr, &mut [0]).unwrap();
    wait(p, &rr, &mut [0]).unwrap();
    assert_eq!(p.test(&rr, &mut [0]), Err(NcclError(NCCL_INVALID_USAGE)));
    assert_eq!(p.test(&sr, &mut [0]), Err(NcclError(NCCL_INVALID_USAGE)));
    sb.dereg(p, &send);
    rb.dereg(p, &recv);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

per_abi!(
    handshake_returns_null_until_both_sides_ran,
    sizes_from_zero_to_64_mib_arrive_intact,
    two_buffers_are_refused_where_one_is_advertised,
    thirty_two_requests_in_flight_each_way,
    send_larger_than_receive_fails_both_requests_and_connection_survives,
    bad_sizes_and_counts_are_invalid_arguments,
    bad_handles_are_rejected_by_connect,
    testing_a_completed_request_is_invalid_usage,
);
