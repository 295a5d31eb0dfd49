//! GPUDirect entry points through the C ABI of the built `.so` on a fabric without GPU memory
//! (`sock` on loopback here; Soft-RoCE in `scripts/softroce/test-verbs.sh`, where rxe has no
//! dma-buf and the host no CUDA driver): what NCCL sees must be exactly what it saw before
//! GPUDirect support — host memory only, `forceFlush` 0, host-memory flushes complete at
//! once — and the new paths refuse GPU memory cleanly. Each test runs once per ext-net version.

mod so;

use nccl_net_abi::common::{NCCL_INVALID_ARGUMENT, NCCL_PTR_CUDA};
use nccl_net_loader::NcclError;
use so::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Descriptors of this process open on the memfd named `name`.
fn fds_on(name: &str) -> usize {
    let want = format!("/memfd:{name} ");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with(&want))
        .count()
}

fn memfd(name: &str) -> OwnedFd {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: memfd_create with a valid name; the new descriptor is owned below.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nothing else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn devices_offer_host_memory_only_and_no_forced_flush(abi: Abi) {
    let p = plugin_for(abi);
    for d in 0..p.devices().unwrap() {
        let props = p.properties(d).unwrap();
        assert_eq!(props.ptr_support, NCCL_PTR_HOST, "device {d}");
        assert_eq!(props.force_flush, 0, "device {d}");
    }
}

fn host_memory_flush_completes_at_once_and_empty_flush_is_null(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let mut rb = RegBuf::new(p, &recv, vec![0; 4096]);
    let ptr = rb.ptr();
    let r = p
        .iflush(&recv, &[ptr], &[4096], &[rb.mr()])
        .unwrap()
        .expect("a host-memory flush gives a request");
    let mut sizes = [];
    assert!(p.test(&r, &mut sizes).unwrap(), "complete at once");
    // Nothing received in any buffer: nothing to flush, no request (as NCCL's IB transport).
    assert!(p
        .iflush(&recv, &[ptr, ptr], &[0, 0], &[rb.mr(), rb.mr()])
        .unwrap()
        .is_none());
    rb.dereg(p, &recv);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

fn dmabuf_registration_of_host_memory_ignores_and_keeps_no_fd(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let name = format!("abi-gdr-host-{abi:?}");
    let fd = memfd(&name);
    let mut buf = vec![0u8; 8192];
    let mr = p
        .reg_mr_dma_buf(
            &send,
            buf.as_mut_ptr(),
            8192,
            NCCL_PTR_HOST,
            0,
            fd.as_raw_fd(),
        )
        .unwrap();
    assert_eq!(fds_on(&name), 1, "only the caller's descriptor");
    drop(fd);
    assert_eq!(fds_on(&name), 0);
    p.dereg_mr(&send, mr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

fn gpu_memory_is_refused_without_gpu_direct(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let name = format!("abi-gdr-cuda-{abi:?}");
    let fd = memfd(&name);
    let mut buf = vec![0u8; 8192];
    let inval = Err(NcclError(NCCL_INVALID_ARGUMENT));
    assert_eq!(
        p.reg_mr_dma_buf(
            &send,
            buf.as_mut_ptr(),
            8192,
            NCCL_PTR_CUDA,
            0,
            fd.as_raw_fd()
        )
        .map(|_| ()),
        inval
    );
    assert_eq!(
        p.reg_mr(&send, buf.as_mut_ptr(), 8192, NCCL_PTR_CUDA)
            .map(|_| ()),
        inval
    );
    assert_eq!(fds_on(&name), 1, "the refused call kept nothing");
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

per_abi!(
    devices_offer_host_memory_only_and_no_forced_flush,
    host_memory_flush_completes_at_once_and_empty_flush_is_null,
    dmabuf_registration_of_host_memory_ignores_and_keeps_no_fd,
    gpu_memory_is_refused_without_gpu_direct,
);
