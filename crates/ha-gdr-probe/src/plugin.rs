//! Steps 2 and 3: a real dma-buf through the plugin's `regMrDmaBuf`, and the plugin's `init`
//! on `verbs` in a child process.

use crate::detect::Facts;
use crate::Report;
use ha_core::fabric::verbs::gdr::cuda::{DlCuda, MEMORYTYPE_DEVICE};
use ha_core::fabric::verbs::gdr::dmabuf::{check_fd, is_dmabuf_target};
use nccl_net_abi::common::{NCCL_INVALID_ARGUMENT, NCCL_PTR_CUDA, NCCL_PTR_HOST};
use nccl_net_loader::{Comm, NcclError, Plugin};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

pub const CHILD_FLAG: &str = "--child-init";
const BYTES: usize = 4 << 20;

/// Descriptors of this process that are dma-bufs.
fn dmabuf_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| is_dmabuf_target(&t.to_string_lossy()))
                .count()
        })
        .unwrap_or(0)
}

pub fn dmabuf_checks(r: &mut Report, facts: &Facts, plugin: Option<&Path>) {
    let Some(s) = facts.cuda.as_ref().filter(|s| s.any_dmabuf()) else {
        r.skip("dma-buf export: no GPU can export dma-bufs here");
        return;
    };
    let Some(gpu) = s.gpus.iter().find(|g| g.dmabuf == Some(true)) else {
        return;
    };
    let cuda = match DlCuda::load() {
        Ok(c) => c,
        Err(e) => return r.fail(&format!("loading the CUDA driver again: {e}")),
    };
    let buf = match cuda.gpu_buffer(gpu.ordinal, BYTES) {
        Ok(b) => b,
        Err(e) => {
            return r.fail(&format!(
                "cuMemAlloc of {BYTES} bytes on GPU {}: {e}",
                gpu.ordinal
            ))
        }
    };
    r.check(
        buf.memory_type() == Ok(MEMORYTYPE_DEVICE),
        &format!("GPU {} buffer {:#x} is device memory", gpu.ordinal, buf.ptr),
    );
    let before = dmabuf_fds();
    let fd = match buf.export_dmabuf() {
        Ok(fd) => fd,
        Err(e) => return r.fail(&format!("cuMemGetHandleForAddressRange: {e}")),
    };
    let raw = fd.as_raw_fd();
    match check_fd(raw) {
        Ok(t) => r.check(
            is_dmabuf_target(&t),
            &format!("exported fd {raw} is open and a dma-buf ({t}) by the plugin's check"),
        ),
        Err(e) => r.fail(&format!(
            "the plugin's check refuses the exported fd {raw}: {e}"
        )),
    }
    r.check(
        dmabuf_fds() == before + 1,
        "one dma-buf descriptor after the export",
    );
    match plugin {
        Some(p) => through_plugin(r, p, buf.ptr, raw, before + 1),
        None => r.skip("regMrDmaBuf with the real dma-buf: no --plugin given"),
    }
    drop(fd);
    r.check(
        dmabuf_fds() == before,
        "no dma-buf descriptor left after close",
    );
}

/// The plugin on `sock` (loopback): regMrDmaBuf with the real fd, host and GPU memory types.
fn through_plugin(r: &mut Report, so: &Path, gpu_ptr: u64, fd: i32, expected_fds: usize) {
    for (k, v) in [
        ("HA_NCCL_FABRIC", "sock"),
        ("HA_NCCL_SOCK_RAILS", "127.0.0.1"),
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("HA_NCCL_GDR", "auto"),
    ] {
        std::env::set_var(k, v);
    }
    let p = match Plugin::open(so).and_then(|p| p.init().map(|_| p).map_err(|e| e.to_string())) {
        Ok(p) => p,
        Err(e) => return r.fail(&format!("loading {} on sock: {e}", so.display())),
    };
    let Some((send, recv)) = pair(&p) else {
        return r.fail("sock connection through the plugin");
    };
    let mut host = vec![0u8; BYTES];
    match p.reg_mr_dma_buf(&send, host.as_mut_ptr(), BYTES, NCCL_PTR_HOST, 0, fd) {
        Ok(mr) => {
            r.pass("regMrDmaBuf(NCCL_PTR_HOST, real dma-buf fd) registers (the fd is ignored)");
            r.check(
                dmabuf_fds() == expected_fds,
                "the plugin keeps no descriptor on the dma-buf",
            );
            r.check(p.dereg_mr(&send, mr).is_ok(), "deregMr");
        }
        Err(e) => r.fail(&format!(
            "regMrDmaBuf(NCCL_PTR_HOST) with the dma-buf fd: {e}"
        )),
    }
    let got = p.reg_mr_dma_buf(&send, gpu_ptr as *mut u8, BYTES, NCCL_PTR_CUDA, 0, fd);
    r.check(
        matches!(got, Err(NcclError(NCCL_INVALID_ARGUMENT))),
        "regMrDmaBuf(NCCL_PTR_CUDA, real dma-buf fd) on sock is refused (ncclInvalidArgument)",
    );
    r.check(
        dmabuf_fds() == expected_fds,
        "the refused call kept no descriptor either",
    );
    let _ = p.close_send(send);
    let _ = p.close_recv(recv);
}

fn pair(p: &Plugin) -> Option<(Comm, Comm)> {
    let (mut handle, listen) = p.listen(0).ok()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        if Instant::now() > deadline {
            return None;
        }
        if send.is_none() {
            send = p.connect(0, &mut handle).ok()?;
        }
        if recv.is_none() {
            recv = p.accept(&listen).ok()?;
        }
        std::thread::yield_now();
    }
    let _ = p.close_listen(listen);
    Some((send?, recv?))
}

/// Child: init the plugin at `so` (environment set by the parent) and print the outcome.
pub fn child_init(so: &str) -> i32 {
    let p = match Plugin::open(Path::new(so)) {
        Ok(p) => p,
        Err(e) => {
            println!("INIT-RESULT load-error {e}");
            return 0;
        }
    };
    match p.init() {
        Ok(()) => println!("\nINIT-RESULT ok"),
        Err(NcclError(c)) => println!("\nINIT-RESULT {c}"),
    }
    0
}

/// Step 3: `init` with `HA_NCCL_FABRIC=verbs` in a child, its log on stderr (`NCCL_DEBUG=INFO`).
pub fn verbs_init_check(r: &mut Report, so: &Path, facts: &Facts) {
    let nics = facts.nics;
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return r.fail(&format!("own path: {e}")),
    };
    let out = std::process::Command::new(exe)
        .arg(CHILD_FLAG)
        .arg(so)
        .env("HA_NCCL_FABRIC", "verbs")
        .env("HA_NCCL_GDR", "auto")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return r.fail(&format!("running the init child: {e}")),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let result = stdout
        .lines()
        .find_map(|l| {
            l.split_once("INIT-RESULT ")
                .map(|(_, x)| x.trim().to_string())
        })
        .unwrap_or_else(|| "none".into());
    for l in stderr.lines().filter(|l| l.contains("NET/HA")) {
        r.info(&format!("plugin log: {l}"));
    }
    let line = |needle: &str| stderr.lines().position(|l| l.contains(needle));
    if nics > 0 {
        r.check(
            result == "ok",
            &format!("verbs init with {nics} RDMA NIC(s): {result}"),
        );
        r.check(
            line("GPU Direct RDMA enabled").is_some() || line("GPU Direct RDMA disabled").is_some(),
            "one GPU Direct RDMA line per NIC",
        );
        return;
    }
    r.check(
        result == "2",
        &format!("verbs init without RDMA NICs fails with ncclSystemError (got {result})"),
    );
    let cuda = if facts.cuda.is_some() {
        let at = line("NET/HA verbs: GPUDirect: CUDA driver ");
        r.check(
            at.is_some(),
            "the plugin found the CUDA driver (its GPUDirect line)",
        );
        at
    } else {
        let at = line("NET/HA verbs: GPUDirect: ");
        r.check(
            at.is_some(),
            "the plugin's GPUDirect line (no CUDA driver here)",
        );
        at
    };
    let verdict = line("GPU Direct RDMA disabled: no RDMA device");
    let err = line("HA_NCCL_FABRIC=verbs: no usable device: no RDMA device");
    r.check(
        verdict.is_some(),
        "the plugin says: GPU Direct RDMA disabled: no RDMA device",
    );
    r.check(err.is_some(), "init fails with \"no RDMA device\"");
    r.check(
        matches!((cuda, verdict, err), (Some(a), Some(b), Some(c)) if a < b && b < c),
        "in that order (driver found before the device list)",
    );
}
