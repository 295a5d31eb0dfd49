//! `init` of the built `.so` under `HA_NCCL_GDR` settings, each in a child process (the
//! plugin initialises once per process) whose stderr (the plugin's log without NCCL's
//! logger, `NCCL_DEBUG=INFO`) is checked: `HA_NCCL_GDR=1` with `sock` fails naming why; on
//! a host without RDMA devices `verbs` reports the GPUDirect facts and then fails cleanly
//! with "no RDMA device" (what the GPU machines here show, with a real CUDA driver there:
//! `ha-gdr-probe`); `HA_NCCL_GDR=0` loads nothing; a bad value is refused.

mod so;

use nccl_net_loader::{NcclError, PluginV8};
use so::so_path;

const CHILD: &str = "HA_GDR_INIT_CHILD";

/// In the child: init the plugin and print the outcome; in the parent: nothing.
fn child_init() -> bool {
    if std::env::var_os(CHILD).is_none() {
        return false;
    }
    let p = PluginV8::open_abi(&so_path(), None).expect("dlopen plugin");
    match p.init() {
        Ok(()) => println!("INIT-RESULT ok"),
        Err(NcclError(c)) => println!("INIT-RESULT {c}"),
    }
    true
}

/// Run test `name` of this binary as a child with `env`; (init result, stderr).
fn run_child(name: &str, env: &[(&str, &str)]) -> (String, String) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env_remove("HA_NCCL_GDR")
        .env_remove("NCCL_IB_HCA");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let result = stdout
        .lines()
        .find_map(|l| {
            l.split_once("INIT-RESULT ")
                .map(|(_, r)| r.trim().to_string())
        })
        .unwrap_or_else(|| panic!("child printed no result: {stdout}"));
    (result, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn host_has_rdma_devices() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn required_gdr_with_sock_fails_init_naming_why() {
    if child_init() {
        return;
    }
    let (r, err) = run_child(
        "required_gdr_with_sock_fails_init_naming_why",
        &[("HA_NCCL_FABRIC", "sock"), ("HA_NCCL_GDR", "1")],
    );
    assert_eq!(r, "2", "ncclSystemError; stderr:\n{err}");
    assert!(
        err.contains("HA_NCCL_GDR=1 requires GPU Direct RDMA, which HA_NCCL_FABRIC=sock cannot do"),
        "{err}"
    );
}

#[test]
fn verbs_without_rdma_devices_reports_gpudirect_then_fails_cleanly() {
    if child_init() {
        return;
    }
    if host_has_rdma_devices() {
        println!("SKIPPED: this host has RDMA devices");
        return;
    }
    let (r, err) = run_child(
        "verbs_without_rdma_devices_reports_gpudirect_then_fails_cleanly",
        &[("HA_NCCL_FABRIC", "verbs")],
    );
    assert_eq!(r, "2", "ncclSystemError; stderr:\n{err}");
    let gdr = err
        .lines()
        .position(|l| l.contains("NET/HA verbs: GPUDirect: "))
        .unwrap_or_else(|| panic!("no GPUDirect line:\n{err}"));
    let nodev = err
        .lines()
        .position(|l| l.contains("GPU Direct RDMA disabled: no RDMA device"))
        .unwrap_or_else(|| panic!("no verdict line:\n{err}"));
    let fail = err
        .lines()
        .position(|l| l.contains("HA_NCCL_FABRIC=verbs: no usable device: no RDMA device"))
        .unwrap_or_else(|| panic!("no init error:\n{err}"));
    assert!(gdr < nodev && nodev < fail, "order:\n{err}");
    // This build host has no CUDA driver: detection says so (the GPU machines' line names the
    // driver and its GPUs instead).
    if !std::path::Path::new("/proc/driver/nvidia").exists() {
        assert!(
            err.contains("GPUDirect: no CUDA driver (dlopen libcuda.so.1: "),
            "{err}"
        );
    }
}

#[test]
fn gdr_off_loads_nothing_and_says_so() {
    if child_init() {
        return;
    }
    if host_has_rdma_devices() {
        println!("SKIPPED: this host has RDMA devices");
        return;
    }
    let (r, err) = run_child(
        "gdr_off_loads_nothing_and_says_so",
        &[("HA_NCCL_FABRIC", "verbs"), ("HA_NCCL_GDR", "0")],
    );
    assert_eq!(r, "2", "{err}");
    assert!(
        err.contains("NET/HA verbs: GPUDirect RDMA off (HA_NCCL_GDR=0)"),
        "{err}"
    );
    assert!(!err.contains("libcuda"), "{err}");
}

#[test]
fn a_bad_gdr_value_is_refused() {
    if child_init() {
        return;
    }
    let (r, err) = run_child(
        "a_bad_gdr_value_is_refused",
        &[("HA_NCCL_FABRIC", "sock"), ("HA_NCCL_GDR", "yes")],
    );
    assert_eq!(r, "4", "ncclInvalidArgument; stderr:\n{err}");
    assert!(
        err.contains(r#"HA_NCCL_GDR="yes" is not one of auto|0|1"#),
        "{err}"
    );
}

#[test]
fn no_link_time_cuda_or_rdma_core_34_dependency() {
    if child_init() {
        return;
    }
    let so = so_path();
    let Ok(out) = std::process::Command::new("readelf")
        .args(["--dyn-syms", "--version-info", "-d"])
        .arg(&so)
        .output()
    else {
        println!("SKIPPED: readelf not installed");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("IBVERBS_1.1"),
        "{text}"
    );
    // ibv_reg_dmabuf_mr is looked up at run time: loading must not need rdma-core >= 34.
    assert!(
        !text.contains("IBVERBS_1.12"),
        "hard IBVERBS_1.12 dependency"
    );
    assert!(
        !text.contains("ibv_reg_dmabuf_mr"),
        "ibv_reg_dmabuf_mr linked directly"
    );
    // The CUDA driver is dlopen'ed: no NEEDED entry, no cu* symbol.
    assert!(!text.contains("libcuda"), "libcuda linked");
    assert!(!text.contains(" cuInit"), "cuInit linked");
}
