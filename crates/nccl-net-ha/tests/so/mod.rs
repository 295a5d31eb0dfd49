//! Shared helpers of the C-ABI integration tests: load the built `.so` once per test binary
//! and build connections through it. The fabric is the environment's (`HA_NCCL_FABRIC`,
//! default `sock` on loopback); the Soft-RoCE suite (`scripts/softroce/test-verbs.sh`) runs
//! the same binaries with `HA_NCCL_FABRIC=verbs`, `NCCL_IB_HCA` naming one rail's two ports,
//! and these test-only variables:
//! * `HA_TEST_LISTEN_DEV` / `HA_TEST_CONNECT_DEV`: the plugin devices the receiver listens on
//!   and the sender connects from (default 0 and 0); two ends of a rail put the traffic on
//!   the wire instead of a device's loopback;
//! * `HA_TEST_MAX_SIZE`: largest message the size sweeps send (bytes; default: no cap);
//! * `HA_TEST_ABI`: the ext-net versions the per-version suites run (`v8`, `v9`, `v10`,
//!   `v11`, `v12`, comma-separated, or `all`; default all) and, when it names one version, the
//!   version [`plugin`] drives (default: v11, as NCCL 2.28 picks).
//!
//! The same library is driven through each version's table ([`plugin_for`]); they share the
//! plugin's state, as they would inside one process. [`per_abi!`] turns a test function taking
//! an [`Abi`] into one `#[test]` per version (`name::v8` ... `name::v11`).
#![allow(dead_code)]

pub use nccl_net_loader::Abi;
use nccl_net_loader::{Comm, Mr, PluginV8, Request};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const NCCL_PTR_HOST: i32 = 1;

/// `target/<profile>/libnccl_net_ha.so`, next to the `deps/` folder holding this test, built
/// fresh first: integration tests cannot link a cdylib, so under `cargo test` this asks cargo
/// to (re)build the plugin (a no-op when it is up to date) rather than load a stale library.
/// Where no cargo runs the test (the Soft-RoCE guest runs the binaries directly) the library
/// must already be there.
pub fn so_path() -> PathBuf {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
        if let Ok(cargo) = std::env::var("CARGO") {
            let mut cmd = std::process::Command::new(cargo);
            cmd.args(["build", "--quiet", "-p", "nccl-net-ha", "--lib"]);
            if dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            let st = cmd.status().expect("running cargo to build the plugin");
            assert!(st.success(), "cargo build -p nccl-net-ha failed");
        }
        let so = dir.join("libnccl_net_ha.so");
        assert!(
            so.exists(),
            "{} missing: run `cargo build -p nccl-net-ha` first",
            so.display()
        );
        so
    })
    .clone()
}

/// Set the plugin's environment once per test binary (before its first `init`): the
/// defaults unless the environment (a drill's child process) says otherwise, then `extra`.
fn environment(extra: &[(&str, &str)]) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        for (k, v) in [("HA_NCCL_FABRIC", "sock"), ("NCCL_SOCKET_IFNAME", "lo")] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
        for (k, v) in extra {
            std::env::set_var(k, v);
        }
    });
}

/// The versions `HA_TEST_ABI` selects (default: all, newest first).
pub fn selected_abis() -> Vec<Abi> {
    match std::env::var("HA_TEST_ABI") {
        Err(_) => Abi::NEWEST_FIRST.to_vec(),
        Ok(v) if v.trim().is_empty() || v.trim() == "all" => Abi::NEWEST_FIRST.to_vec(),
        Ok(v) => v
            .split(',')
            .map(|a| Abi::parse(a).unwrap_or_else(|e| panic!("HA_TEST_ABI: {e}")))
            .collect(),
    }
}

/// Whether the per-version suites run `abi` (prints why not when they do not).
pub fn runs(abi: Abi) -> bool {
    let on = selected_abis().contains(&abi);
    if !on {
        println!("SKIPPED for {abi}: HA_TEST_ABI does not select it");
    }
    on
}

/// The plugin driven through version `abi`'s table, initialised (`extra` environment is
/// applied only if this is the binary's first plugin).
pub fn plugin_for_with(abi: Abi, extra: &[(&str, &str)]) -> &'static PluginV8 {
    static P: [OnceLock<PluginV8>; 5] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    P[abi.number() as usize - 8].get_or_init(|| {
        environment(extra);
        let p = PluginV8::open_abi(&so_path(), Some(abi)).expect("dlopen plugin");
        assert_eq!(p.abi(), abi);
        p.init().expect("init");
        p
    })
}

pub fn plugin_for(abi: Abi) -> &'static PluginV8 {
    plugin_for_with(abi, &[])
}

/// The version [`plugin`] drives: `HA_TEST_ABI` when it names one, else v11.
pub fn default_abi() -> Abi {
    match selected_abis().as_slice() {
        [one] => *one,
        _ => Abi::V11,
    }
}

/// The plugin, initialised once with `extra` environment for this test binary.
pub fn plugin_with(extra: &[(&str, &str)]) -> &'static PluginV8 {
    plugin_for_with(default_abi(), extra)
}

pub fn plugin() -> &'static PluginV8 {
    plugin_with(&[])
}

/// `per_abi!(f, g, ...)`: for each test function `f(abi: Abi)`, a module `f` with one
/// `#[test]` per version (`f::v8` ... `f::v12`), each skipped unless `HA_TEST_ABI` selects it.
#[macro_export]
macro_rules! per_abi {
    ($($f:ident),* $(,)?) => {$(
        mod $f {
            use super::so::{runs, Abi};
            #[test]
            fn v8() {
                if runs(Abi::V8) {
                    super::$f(Abi::V8)
                }
            }
            #[test]
            fn v9() {
                if runs(Abi::V9) {
                    super::$f(Abi::V9)
                }
            }
            #[test]
            fn v10() {
                if runs(Abi::V10) {
                    super::$f(Abi::V10)
                }
            }
            #[test]
            fn v11() {
                if runs(Abi::V11) {
                    super::$f(Abi::V11)
                }
            }
            #[test]
            fn v12() {
                if runs(Abi::V12) {
                    super::$f(Abi::V12)
                }
            }
        }
    )*};
}

/// Whether the fabric under test is `verbs` (the Soft-RoCE suite).
pub fn on_verbs() -> bool {
    std::env::var("HA_NCCL_FABRIC").is_ok_and(|v| v.trim() == "verbs")
}

/// Sockets of this process (IPv4 TCP, connected or listening) whose `IP_TOS` is `tos`.
pub fn sockets_with_tos(tos: u8) -> usize {
    tcp_sockets()
        .into_iter()
        .filter(|&fd| {
            let mut v: libc::c_int = -1;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `fd` is an open descriptor of this process (it may have been closed and
            // reused since the scan: then the call fails or reads another socket's value,
            // both harmless); `v`/`len` are live locals of the right size.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_TOS,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            rc == 0 && v == libc::c_int::from(tos)
        })
        .count()
}

/// This process's IPv4 TCP socket descriptors.
pub fn tcp_sockets() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&fd| {
            let int_opt = |level, name| {
                let mut v: libc::c_int = -1;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: as in `sockets_with_tos`: a descriptor number of this process and
                // live out-parameters; a non-socket just fails.
                let rc = unsafe {
                    libc::getsockopt(
                        fd,
                        level,
                        name,
                        (&mut v as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                (rc == 0).then_some(v)
            };
            int_opt(libc::SOL_SOCKET, libc::SO_DOMAIN) == Some(libc::AF_INET)
                && int_opt(libc::SOL_SOCKET, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        })
        .collect()
}

fn env_number(name: &str) -> Option<usize> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

/// The device the receiver listens on (`HA_TEST_LISTEN_DEV`, default 0).
pub fn listen_dev() -> i32 {
    env_number("HA_TEST_LISTEN_DEV").unwrap_or(0) as i32
}

/// The device the sender connects from (`HA_TEST_CONNECT_DEV`, default 0).
pub fn connect_dev() -> i32 {
    env_number("HA_TEST_CONNECT_DEV").unwrap_or(0) as i32
}

/// The largest message size sweeps may send (`HA_TEST_MAX_SIZE`, default unlimited).
pub fn max_size() -> usize {
    env_number("HA_TEST_MAX_SIZE").unwrap_or(usize::MAX)
}

/// A connected pair, driven the way NCCL's proxy does (non-blocking calls in a loop).
/// Returns (send comm, recv comm, connect calls that returned NULL).
pub fn connect_pair(p: &PluginV8) -> (Comm, Comm, usize) {
    let (mut handle, listen) = p.listen(listen_dev()).expect("listen");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv, mut nulls) = (None, None, 0);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if send.is_none() {
            send = p.connect(connect_dev(), &mut handle).expect("connect");
            nulls += usize::from(send.is_none());
        }
        if recv.is_none() {
            recv = p.accept(&listen).expect("accept");
        }
        std::thread::yield_now();
    }
    p.close_listen(listen).expect("closeListen");
    (send.unwrap(), recv.unwrap(), nulls)
}

/// Poll `test` until done (or error), with a deadline.
pub fn wait(
    p: &PluginV8,
    r: &Request,
    sizes: &mut [i32],
) -> Result<(), nccl_net_loader::NcclError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if p.test(r, sizes)? {
            return Ok(());
        }
        assert!(Instant::now() < deadline, "request did not complete");
        std::thread::yield_now();
    }
}

/// Retry a call that may answer "try later" (a NULL request).
pub fn until_some<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "call kept answering try-later");
        std::thread::yield_now();
    }
}

/// Deterministic content of message `seq` of `len` bytes (xorshift64, eight bytes a step:
/// cheap even unoptimised under emulation). A shorter pattern is a prefix of a longer one.
pub fn pattern(seq: u64, len: usize) -> Vec<u8> {
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v
}

/// A registered buffer.
pub struct RegBuf {
    pub data: Vec<u8>,
    pub mr: Option<Mr>,
}

impl RegBuf {
    pub fn new(p: &PluginV8, comm: &Comm, data: Vec<u8>) -> RegBuf {
        let mut data = data;
        let mr = p
            .reg_mr(comm, data.as_mut_ptr(), data.len(), NCCL_PTR_HOST)
            .expect("regMr");
        RegBuf { data, mr: Some(mr) }
    }
    pub fn ptr(&mut self) -> *mut u8 {
        self.data.as_mut_ptr()
    }
    pub fn mr(&self) -> &Mr {
        self.mr.as_ref().unwrap()
    }
    pub fn dereg(&mut self, p: &PluginV8, comm: &Comm) {
        p.dereg_mr(comm, self.mr.take().unwrap()).expect("deregMr");
    }
}

/// Retry a fallible call that may answer "try later", returning its error.
pub fn until_some_result<T>(
    mut f: impl FnMut() -> Result<Option<T>, nccl_net_loader::NcclError>,
) -> Result<T, nccl_net_loader::NcclError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        assert!(Instant::now() < deadline, "call kept answering try-later");
        std::thread::yield_now();
    }
}
