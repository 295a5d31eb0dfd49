//! `ha-gdr-probe`: the GPUDirect RDMA self-test of nccl-net-ha, for a GPU host (no cargo
//! needed there: `scripts/build.sh` puts it in `dist/`).
//!
//! ```text
//! ha-gdr-probe [--plugin PATH] [--require-gpu] [--expect-no-nic]
//! ha-gdr-probe --detect-only
//! ```
//!
//! 1. Detection, for real, with the plugin's own code: the CUDA driver (`dlopen`) and its
//!    GPUs' GPUDirect / dma-buf attributes, nvidia-peermem, and per RDMA NIC the dma-buf
//!    probe and the verdict ("GPU Direct RDMA enabled/disabled" and why).
//! 2. A real dma-buf: GPU memory exported with `cuMemGetHandleForAddressRange`, checked with
//!    the plugin's descriptor check, then handed to the loaded plugin's `regMrDmaBuf` (on the
//!    `sock` fabric, where only host memory registers): host memory with that fd registers
//!    and GPU memory is refused, and in both cases the plugin keeps no descriptor on the
//!    dma-buf (NCCL closes it right after the call).
//! 3. The plugin's `init` with `HA_NCCL_FABRIC=verbs` in a child process: on a host without
//!    RDMA NICs it must report the CUDA driver's GPUDirect facts and then fail cleanly with
//!    "no RDMA device".
//!
//! Prints one `PASS`/`FAIL`/`INFO`/`SKIP` line per check; exits 0 when nothing failed, 1
//! otherwise, 2 on bad usage. `--detect-only` prints step 1 and exits 0, or 3 when the host
//! has no RDMA NIC (for `scripts/nccl/gdr-check.sh`).

mod detect;
mod plugin;

use std::path::PathBuf;

/// What the checks found.
#[derive(Default)]
pub struct Report {
    pub failed: usize,
}

impl Report {
    pub fn pass(&mut self, what: &str) {
        println!("gdr-probe: PASS {what}");
    }
    pub fn fail(&mut self, what: &str) {
        self.failed += 1;
        println!("gdr-probe: FAIL {what}");
    }
    pub fn info(&self, what: &str) {
        println!("gdr-probe: INFO {what}");
    }
    pub fn skip(&self, what: &str) {
        println!("gdr-probe: SKIP {what}");
    }
    pub fn check(&mut self, ok: bool, what: &str) {
        if ok {
            self.pass(what)
        } else {
            self.fail(what)
        }
    }
}

struct Args {
    plugin: Option<PathBuf>,
    require_gpu: bool,
    expect_no_nic: bool,
    detect_only: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: ha-gdr-probe [--plugin PATH] [--require-gpu] [--expect-no-nic]\n       ha-gdr-probe --detect-only"
    );
    std::process::exit(2)
}

fn parse(args: &[String]) -> Args {
    let mut a = Args {
        plugin: None,
        require_gpu: false,
        expect_no_nic: false,
        detect_only: false,
    };
    let mut it = args.iter();
    while let Some(x) = it.next() {
        match x.as_str() {
            "--plugin" => a.plugin = Some(it.next().unwrap_or_else(|| usage()).into()),
            "--require-gpu" => a.require_gpu = true,
            "--expect-no-nic" => a.expect_no_nic = true,
            "--detect-only" => a.detect_only = true,
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    a
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(plugin::CHILD_FLAG) {
        std::process::exit(plugin::child_init(args.get(1).unwrap_or_else(|| usage())));
    }
    let a = parse(&args);
    let mut r = Report::default();
    let facts = detect::run(&mut r, a.require_gpu, a.expect_no_nic);
    if a.detect_only {
        std::process::exit(if facts.nics == 0 { 3 } else { 0 });
    }
    plugin::dmabuf_checks(&mut r, &facts, a.plugin.as_deref());
    match a.plugin.as_deref() {
        Some(p) => plugin::verbs_init_check(&mut r, p, &facts),
        None => r.skip("plugin checks: no --plugin given"),
    }
    println!(
        "gdr-probe: {} ({} failed)",
        if r.failed == 0 { "OK" } else { "FAILED" },
        r.failed
    );
    std::process::exit(i32::from(r.failed != 0));
}
