//! Grouped receives (`irecv` of several buffers, matched by tag) through the C ABI of the built
//! `libnccl_net_ha.so`, with eager sends off (`HA_NCCL_SOCK_EAGER=0`: a `sock` device then
//! advertises `maxRecvs` 8; with them on it advertises 1, see `abi_sock.rs`). Each test runs
//! once per ext-net version (`so::per_abi!`); `scripts/softroce/test-verbs.sh` runs them again
//! on `verbs`.

mod so;

use nccl_net_loader::PluginV8;
use so::*;

/// The plugin with eager sends off (this binary's first and only environment).
fn plugin(abi: Abi) -> &'static PluginV8 {
    let p = plugin_for_with(abi, &[("HA_NCCL_SOCK_EAGER", "0")]);
    assert_eq!(p.properties(connect_dev()).unwrap().max_recvs, 8);
    p
}

fn multi_recv_with_tags_in_shuffled_order(abi: Abi) {
    let p = plugin(abi);
    let (send, recv, _) = connect_pair(p);
    let mut send_slot = Some(send);
    for n in 1..=8usize {
        let size = move |i: usize| 1000 * (i + 1) + n;
        let send_c = send_slot.take().unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                let send = &send_c;
                let mut bufs: Vec<RegBuf> = (0..n)
                    .map(|i| RegBuf::new(p, send, pattern((n * 10 + i) as u64, size(i))))
                    .collect();
                // Posted in reverse tag order: tags, not order, choose the buffer.
                let mut reqs = Vec::new();
                for i in (0..n).rev() {
                    let ptr = bufs[i].ptr();
                    let tag = 100 + i as i32;
                    reqs.push(until_some(|| {
                        p.isend(send, ptr, size(i) as i32, tag, bufs[i].mr())
                            .unwrap()
                    }));
                }
                for r in &reqs {
                    wait(p, r, &mut [0]).unwrap();
                }
                for b in &mut bufs {
                    b.dereg(p, send);
                }
                send_c
            });
            let mut bufs: Vec<RegBuf> = (0..n)
                .map(|_| RegBuf::new(p, &recv, vec![0; 9000]))
                .collect();
            let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.ptr()).collect();
            let caps = vec![9000; n];
            let tags: Vec<i32> = (0..n).map(|i| 100 + i as i32).collect();
            let r = {
                let mrs: Vec<_> = bufs.iter().map(|b| b.mr()).collect();
                until_some(|| p.irecv(&recv, &ptrs, &caps, &tags, &mrs).unwrap())
            };
            let mut sizes = vec![-1; n];
            wait(p, &r, &mut sizes).unwrap();
            for i in 0..n {
                assert_eq!(sizes[i] as usize, size(i), "n={n} buffer {i}");
                assert!(bufs[i].data[..size(i)] == pattern((n * 10 + i) as u64, size(i)));
            }
            for b in &mut bufs {
                b.dereg(p, &recv);
            }
            send_slot = Some(h.join().unwrap());
        });
    }
    p.close_send(send_slot.unwrap()).unwrap();
    p.close_recv(recv).unwrap();
}

fn multi_recv_buffers_sharing_one_registration(abi: Abi) {
    // NCCL often registers one region and receives into several parts of it.
    let p = plugin(abi);
    let (send, recv, _) = connect_pair(p);
    let mut rb = RegBuf::new(p, &recv, vec![0; 4 * 1024]);
    let mut sb = RegBuf::new(
        p,
        &send,
        (0..4).flat_map(|i| pattern(40 + i, 1024)).collect(),
    );
    let (rp, sp) = (rb.ptr(), sb.ptr());
    let ptrs: Vec<*mut u8> = (0..4).map(|i| rp.wrapping_add(i * 1024)).collect();
    let r = {
        let mrs = vec![rb.mr(); 4];
        p.irecv(&recv, &ptrs, &[1024; 4], &[0, 1, 2, 3], &mrs)
            .unwrap()
            .unwrap()
    };
    let sends: Vec<_> = (0..4)
        .map(|i| {
            let ptr = sp.wrapping_add(i * 1024);
            until_some(|| p.isend(&send, ptr, 1024, i as i32, sb.mr()).unwrap())
        })
        .collect();
    for s in &sends {
        wait(p, s, &mut [0]).unwrap();
    }
    let mut sizes = [0; 4];
    wait(p, &r, &mut sizes).unwrap();
    assert_eq!(sizes, [1024; 4]);
    assert!(rb.data == sb.data);
    rb.dereg(p, &recv);
    sb.dereg(p, &send);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

per_abi!(
    multi_recv_with_tags_in_shuffled_order,
    multi_recv_buffers_sharing_one_registration,
);
