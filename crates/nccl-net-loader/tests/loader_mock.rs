//! The loader (`abi::loader::PluginV8`) against the C mock plugin: table lookup, properties,
//! non-blocking connection setup, tagged multi-receive through the wrappers, error mapping
//! and NULL table entries.

mod common;

use nccl_net_abi::common::{NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_PTR_HOST};
use nccl_net_loader::{Comm, NcclError, PluginV8, Request};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn mock() -> &'static PluginV8 {
    static P: OnceLock<PluginV8> = OnceLock::new();
    P.get_or_init(|| {
        let p = PluginV8::open(&common::mock_plugin("loader", &[])).expect("open mock");
        p.init().expect("init");
        p
    })
}

/// Connects a send comm to a receive comm, looping connect/accept like NCCL.
fn connect_pair(p: &PluginV8) -> (Comm, Comm) {
    let (mut handle, listen) = p.listen(0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = (None, None);
    let mut connect_calls = 0;
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connection setup timed out");
        if send.is_none() {
            connect_calls += 1;
            send = p.connect(0, &mut handle).unwrap();
        }
        if recv.is_none() {
            recv = p.accept(&listen).unwrap();
        }
    }
    // The mock always answers NULL first: the loop above must have retried.
    assert!(connect_calls >= 2);
    p.close_listen(listen).unwrap();
    (send.unwrap(), recv.unwrap())
}

fn wait(p: &PluginV8, req: &Request, sizes: &mut [i32]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !p.test(req, sizes).unwrap() {
        assert!(Instant::now() < deadline, "request did not complete");
    }
}

#[test]
fn table_name_properties_and_entries() {
    let p = mock();
    assert_eq!(p.name(), "MOCK");
    assert!(p.missing_entries().is_empty());
    assert!(p.table_v8().expect("v8 mock").get_device_mr.is_none());
    assert_eq!(p.devices(), Ok(1));
    let props = p.properties(0).unwrap();
    assert_eq!(props.name, "mock0");
    assert_eq!(props.pci_path, None);
    assert_eq!(props.guid, 0x1234);
    assert_eq!(props.ptr_support, NCCL_PTR_HOST);
    assert_eq!((props.speed, props.port, props.max_recvs), (100000, 1, 8));
    assert_eq!(
        p.properties(5).unwrap_err(),
        NcclError(NCCL_INVALID_ARGUMENT)
    );
}

#[test]
fn multi_recv_matches_by_tag_and_reports_sizes() {
    let p = mock();
    let (send, recv) = connect_pair(p);
    let mut src = vec![0u8; 300];
    for (i, b) in src.iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut dst = vec![0xEEu8; 3 * 128];
    let smr = p
        .reg_mr(&send, src.as_mut_ptr(), src.len(), NCCL_PTR_HOST)
        .unwrap();
    let rmr = p
        .reg_mr(&recv, dst.as_mut_ptr(), dst.len(), NCCL_PTR_HOST)
        .unwrap();
    let base = dst.as_mut_ptr();
    let bufs = [base, base.wrapping_add(128), base.wrapping_add(256)];
    let rreq = p
        .irecv(
            &recv,
            &bufs,
            &[128, 128, 128],
            &[10, 20, 30],
            &[&rmr, &rmr, &rmr],
        )
        .unwrap()
        .expect("mock accepts a receive at once");
    // Sends in the order 30, 10, 20 with 3, 1 and 2 bytes of distinct data.
    let mut sreqs = Vec::new();
    for (off, size, tag) in [(0usize, 3, 30), (100, 1, 10), (200, 2, 20)] {
        let r = p
            .isend(&send, src.as_mut_ptr().wrapping_add(off), size, tag, &smr)
            .unwrap()
            .expect("receive is posted, so the send is taken");
        sreqs.push(r);
    }
    for r in &sreqs {
        let mut s = [0];
        wait(p, r, &mut s);
    }
    let mut sizes = [0i32; 3];
    wait(p, &rreq, &mut sizes);
    assert_eq!(sizes, [1, 2, 3]);
    assert_eq!(&dst[0..2], &[100, 0xEE]);
    assert_eq!(&dst[128..131], &[200, 201, 0xEE]);
    assert_eq!(&dst[256..260], &[0, 1, 2, 0xEE]);
    p.dereg_mr(&send, smr).unwrap();
    p.dereg_mr(&recv, rmr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

#[test]
fn send_before_receive_is_try_later_and_errors_map() {
    let p = mock();
    let (send, recv) = connect_pair(p);
    let mut src = vec![7u8; 64];
    let mut dst = vec![0u8; 64];
    let smr = p
        .reg_mr(&send, src.as_mut_ptr(), 64, NCCL_PTR_HOST)
        .unwrap();
    let rmr = p
        .reg_mr(&recv, dst.as_mut_ptr(), 64, NCCL_PTR_HOST)
        .unwrap();
    // Nothing posted on the receiver yet: a NULL request, not an error.
    assert!(p
        .isend(&send, src.as_mut_ptr(), 8, 0, &smr)
        .unwrap()
        .is_none());
    // Slices of different lengths are refused without calling the plugin.
    assert_eq!(
        p.irecv(&recv, &[dst.as_mut_ptr()], &[8, 8], &[0], &[&rmr])
            .unwrap_err(),
        NcclError(NCCL_INVALID_ARGUMENT)
    );
    // A buffer outside its registration: the plugin's own error comes back.
    let outside = src.as_mut_ptr().wrapping_add(60);
    let rreq = p
        .irecv(&recv, &[dst.as_mut_ptr()], &[64], &[0], &[&rmr])
        .unwrap()
        .unwrap();
    assert_eq!(
        p.isend(&send, outside, 8, 0, &smr).unwrap_err(),
        NcclError(NCCL_INVALID_ARGUMENT)
    );
    let sreq = p
        .isend(&send, src.as_mut_ptr(), 8, 0, &smr)
        .unwrap()
        .unwrap();
    wait(p, &sreq, &mut [0]);
    let mut sizes = [0];
    wait(p, &rreq, &mut sizes);
    assert_eq!(sizes, [8]);
    assert_eq!(&dst[..9], &[7, 7, 7, 7, 7, 7, 7, 7, 0]);
    // iflush of host memory: nothing to flush.
    assert!(p
        .iflush(&recv, &[dst.as_mut_ptr()], &[8], &[&rmr])
        .unwrap()
        .is_none());
    p.dereg_mr(&send, smr).unwrap();
    p.dereg_mr(&recv, rmr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

#[test]
fn null_table_entry_is_an_internal_error() {
    let p = PluginV8::open(&common::mock_plugin("noisend", &["MOCK_NO_ISEND"])).unwrap();
    assert_eq!(p.missing_entries(), ["isend"]);
    p.init().unwrap();
    let (send, recv) = connect_pair(&p);
    let mut buf = vec![0u8; 16];
    let mr = p
        .reg_mr(&send, buf.as_mut_ptr(), 16, NCCL_PTR_HOST)
        .unwrap();
    assert_eq!(
        p.isend(&send, buf.as_mut_ptr(), 16, 0, &mr).unwrap_err(),
        NcclError(NCCL_INTERNAL_ERROR)
    );
    p.dereg_mr(&send, mr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}
