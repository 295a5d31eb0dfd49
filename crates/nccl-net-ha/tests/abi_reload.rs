//! Communicators re-created in one process, the way NCCL loads, unloads and reloads the
//! plugin library: a stand-in libnccl (`reload/fake_nccl.c`, loaded `RTLD_LOCAL` as PyTorch
//! loads NCCL) opens the library by name through its RUNPATH, hands the plugin its logger,
//! takes one reference per communicator and `dlclose`s the library after the last one, then
//! opens it again for the next round, and (2.28/2.29) forgets the name on the way. Each round
//! makes two communicators (contexts, or v8's once-per-load `init`), moves verified data,
//! closes everything and waits until no plugin thread is left, so every `init` after the
//! first runs on a plugin with nothing open. Each scenario runs in a process of its own (the
//! WARN is once per process, and once a process has opened the plugin as `libnccl-net.so`
//! glibc keeps that name on the resident image):
//! * NCCL 2.30.7 (name kept), ext-net v12: three rounds, each after a real `dlclose`; the
//!   image stays mapped (`-z nodelete`), so the table is the same and `init` runs again on the
//!   old state; the plugin logs the version it found; no WARN.
//! * NCCL 2.28.9 with `NCCL_NET_PLUGIN_REF_COUNT=1`, v11: never unloaded; three rounds; no WARN.
//! * NCCL 2.28.9 with `libnccl-net.so` (a symlink to the plugin) in the RUNPATH folder: rounds
//!   1 and 2 open `libnccl-net.so` and get the plugin; no WARN.
//! * NCCL 2.28.9 with no remedy: round 0 works and logs exactly one WARN naming
//!   `NCCL_NET_PLUGIN_REF_COUNT` (two `init` calls); round 1 fails to find `libnccl-net.so`,
//!   as PyTorch's second `init_process_group()` does.
//! * v8 (once-per-load `init`), NCCL 2.30.7: three rounds across `dlclose`.

mod so;

use nccl_net_loader::{Abi, Plugin};
use so::*;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

type SetVersionFn = unsafe extern "C" fn(c_int);
type CountFn = unsafe extern "C" fn() -> c_int;
type LineFn = unsafe extern "C" fn(c_int, *mut c_char, c_int) -> c_int;
type SetupFn = unsafe extern "C" fn(*const c_char, c_int, c_int);
type AcquireFn = unsafe extern "C" fn() -> *mut c_void;
type TextFn = unsafe extern "C" fn() -> *const c_char;
type Sym = *mut c_void;
type LoggerFn =
    unsafe extern "C" fn(c_int, std::os::raw::c_ulong, *const c_char, c_int, *const c_char, ...);

/// The stand-in libnccl's C functions.
struct Fake {
    logger: Sym,
    set_version: SetVersionFn,
    lines: CountFn,
    line: LineFn,
    setup: SetupFn,
    acquire: AcquireFn,
    release: CountFn,
    opened: TextFn,
    error: TextFn,
}

fn dl_sym(h: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "fake libnccl lacks {name:?}");
    p
}

impl Fake {
    /// Build `libfakenccl.so` in `dir` with RUNPATH `dir` and load it `RTLD_LOCAL`.
    fn build(dir: &Path) -> Fake {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reload/fake_nccl.c");
        let lib = dir.join("libfakenccl.so");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg(format!("-Wl,-rpath,{},--enable-new-dtags", dir.display()))
            .args(["-ldl", "-lpthread"])
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let c = CString::new(lib.as_os_str().as_bytes()).unwrap();
        // SAFETY: loading the library just built (no constructors); never closed, because the
        // plugin keeps calling its logger.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", lib.display());
        let f = |n: &CStr| dl_sym(h, n);
        // SAFETY: each symbol is the C function of fake_nccl.c with exactly the signature it
        // is transmuted to.
        unsafe {
            let logger_of = std::mem::transmute::<Sym, AcquireFn>(f(c"fake_logger"));
            Fake {
                logger: logger_of(),
                set_version: std::mem::transmute::<Sym, SetVersionFn>(f(c"fake_set_version")),
                lines: std::mem::transmute::<Sym, CountFn>(f(c"fake_lines")),
                line: std::mem::transmute::<Sym, LineFn>(f(c"fake_line")),
                setup: std::mem::transmute::<Sym, SetupFn>(f(c"fake_slot_setup")),
                acquire: std::mem::transmute::<Sym, AcquireFn>(f(c"fake_slot_acquire")),
                release: std::mem::transmute::<Sym, CountFn>(f(c"fake_slot_release")),
                opened: std::mem::transmute::<Sym, TextFn>(f(c"fake_opened")),
                error: std::mem::transmute::<Sym, TextFn>(f(c"fake_error")),
            }
        }
    }

    /// A fresh plugin slot for NCCL `version` (`fixed`: 2.30's unload keeps the name).
    fn slot(&self, version: i32, name: &str, initial_refs: i32, fixed: bool) {
        let n = CString::new(name).unwrap();
        // SAFETY: plain C calls with a live NUL-terminated string.
        unsafe {
            (self.set_version)(version);
            (self.setup)(n.as_ptr(), initial_refs, c_int::from(fixed));
        }
    }

    fn acquire(&self) -> Result<*mut c_void, String> {
        // SAFETY: plain C call.
        let h = unsafe { (self.acquire)() };
        if h.is_null() {
            Err(self.text(self.error))
        } else {
            Ok(h)
        }
    }

    fn release(&self) -> bool {
        // SAFETY: plain C call.
        unsafe { (self.release)() == 1 }
    }

    fn text(&self, f: TextFn) -> String {
        // SAFETY: the fake returns pointers to its static NUL-terminated buffers.
        unsafe { CStr::from_ptr(f()) }
            .to_string_lossy()
            .into_owned()
    }

    fn log(&self) -> Vec<String> {
        // SAFETY: plain C calls; `buf` is a live buffer of the length passed.
        unsafe {
            (0..(self.lines)())
                .map(|i| {
                    let mut buf = [0 as c_char; 1024];
                    assert_eq!((self.line)(i, buf.as_mut_ptr(), 1024), 0);
                    CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
                })
                .collect()
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.starts_with("WARN") && l.contains("NCCL_NET_PLUGIN_REF_COUNT"))
            .collect()
    }
}

/// Names of this process's threads that belong to the plugin (`ha-*`, `sock-*`).
fn plugin_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| n.starts_with("ha-") || n.starts_with("sock-"))
        .collect()
}

fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::yield_now();
    }
    f()
}

/// What one round saw.
struct Round {
    /// The name the library was opened under.
    opened: String,
    /// Address of the table NCCL would use.
    table: usize,
    /// Whether the last release dlclosed the library.
    closed: bool,
}

/// Send `msgs` messages of distinct sizes from `send` to `recv`, checking bytes and sizes.
fn move_data(p: &Plugin, send: &nccl_net_loader::Comm, recv: &nccl_net_loader::Comm, seed: u64) {
    for (i, len) in [1usize, 4096 + seed as usize, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let want = pattern(seed * 10 + i as u64, len);
        let mut sb = RegBuf::new(p, send, want.clone());
        let mut rb = RegBuf::new(p, recv, vec![0; len]);
        let (sp, rp) = (sb.ptr(), rb.ptr());
        let tag = i as i32;
        let rr = until_some(|| {
            p.irecv(recv, &[rp], &[len as i32], &[tag], &[rb.mr()])
                .unwrap()
        });
        let sr = until_some(|| p.isend(send, sp, len as i32, tag, sb.mr()).unwrap());
        wait(p, &sr, &mut [0]).unwrap();
        let mut got = [0];
        wait(p, &rr, &mut got).unwrap();
        assert_eq!(got[0] as usize, len);
        assert!(rb.data == want, "round {seed}: bytes of message {i}");
        sb.dereg(p, send);
        rb.dereg(p, recv);
    }
}

/// One round: two communicators' references, `init` (per communicator from v11, once per
/// load before), a connection carrying verified data, everything closed, both references
/// released.
fn round(fake: &Fake, abi: Abi, seed: u64) -> Result<Round, String> {
    let h = fake.acquire()?;
    let h2 = fake.acquire()?;
    assert_eq!(h, h2, "one library per slot");
    let opened = fake.text(fake.opened);
    // SAFETY: the fake holds the library open until the releases below, and nothing from
    // this wrapper is used after them.
    let mut p = unsafe { Plugin::from_handle(h, Path::new(&opened), Some(abi)) }?;
    // SAFETY: the fake's logger has ncclDebugLogger_t's signature (variadic, C ABI).
    p.set_logger(Some(unsafe {
        std::mem::transmute::<Sym, LoggerFn>(fake.logger)
    }));
    let contexts = if abi >= Abi::V11 {
        vec![
            p.init_context(0xa000 + seed, -1).expect("init A"),
            p.init_context(0xb000 + seed, -1).expect("init B"),
        ]
    } else {
        vec![p.init_context(0, -1).expect("init")]
    };
    let (ca, cb) = (&contexts[0], contexts.last().unwrap());
    let (mut handle, listen) = p.listen_in(cb, 0).expect("listen");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if send.is_none() {
            send = p.connect_in(ca, 0, &mut handle).expect("connect");
        }
        if recv.is_none() {
            recv = p.accept(&listen).expect("accept");
        }
        std::thread::yield_now();
    }
    p.close_listen(listen).unwrap();
    let (send, recv) = (send.unwrap(), recv.unwrap());
    move_data(&p, &send, &recv, seed);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    let table = p.table_addr();
    for c in contexts {
        p.finalize(c).expect("finalize");
    }
    drop(p);
    assert!(
        eventually(|| plugin_threads().is_empty()),
        "round {seed}: plugin threads left after closing everything: {:?}",
        plugin_threads()
    );
    let first = fake.release();
    let closed = fake.release();
    assert!(!first, "the first release keeps the library");
    Ok(Round {
        opened,
        table,
        closed,
    })
}

/// Whether the plugin's image is still mapped (`dlopen(RTLD_NOLOAD)` of its file).
fn resident(so: &Path) -> bool {
    let c = CString::new(so.as_os_str().as_bytes()).unwrap();
    // SAFETY: RTLD_NOLOAD loads nothing; the reference it may take is dropped at once.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    }
}

struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The scenario a child process runs (`HA_RELOAD_SCENARIO`).
const SCENARIO_VAR: &str = "HA_RELOAD_SCENARIO";

/// Run `scenario` in a fresh process (this test binary, running only [`child`]): each
/// scenario starts with nothing loaded, as a user's job does. `env` is its environment.
fn in_child(scenario: &str, env: &[(&str, &str)]) {
    so_path(); // build the plugin once, here
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(SCENARIO_VAR, scenario)
        .env("HA_NCCL_FABRIC", "sock")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_DEBUG", "INFO")
        .env_remove("NCCL_NET_PLUGIN_REF_COUNT")
        .env_remove("CARGO");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the scenario's child process");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "scenario {scenario} failed:\n{text}");
    assert!(
        text.contains(&format!("scenario {scenario} passed")),
        "scenario {scenario} did not run:\n{text}"
    );
}

#[test]
fn nccl_2_30_keeps_the_name() {
    in_child("2.30", &[]);
}

#[test]
fn nccl_2_28_with_ref_count_1() {
    in_child("ref-count", &[("NCCL_NET_PLUGIN_REF_COUNT", "1")]);
}

#[test]
fn nccl_2_28_with_the_default_name_installed() {
    in_child("default-name", &[]);
}

#[test]
fn nccl_2_28_without_remedy_warns_once_and_the_reload_fails() {
    in_child("none", &[]);
}

#[test]
fn v8_init_once_per_load() {
    in_child("v8", &[]);
}

/// The body of every scenario; does nothing unless started by [`in_child`].
#[test]
fn child() {
    let Ok(scenario) = std::env::var(SCENARIO_VAR) else {
        return;
    };
    let so = so_path();
    let dir = Scratch(std::env::temp_dir().join(format!(
        "nccl-net-ha-reload-{scenario}-{}",
        std::process::id()
    )));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    // NCCL_NET_PLUGIN=ha finds "libnccl-net-ha.so" on libnccl's search path.
    std::os::unix::fs::symlink(&so, dir.0.join("libnccl-net-ha.so")).unwrap();
    let fake = Fake::build(&dir.0);
    let no_warnings = Vec::<String>::new();
    match scenario.as_str() {
        "2.30" => {
            fake.slot(23007, "ha", 0, true);
            let rounds: Vec<Round> = (0..3).map(|r| round(&fake, Abi::V12, r).unwrap()).collect();
            for r in &rounds {
                assert!(r.closed, "2.30 dlcloses after the last communicator");
                assert_eq!(r.opened, "libnccl-net-ha.so");
                assert_eq!(
                    r.table, rounds[0].table,
                    "the same image after each dlclose"
                );
            }
            assert!(
                resident(&so),
                "-z nodelete keeps the image mapped after dlclose"
            );
            let info = "INFO NET/HA : loaded by NCCL 2.30.7 through ext-net v12";
            assert!(fake.log().iter().any(|l| l == info), "{:?}", fake.log());
            assert_eq!(fake.warnings(), no_warnings);
        }
        "ref-count" => {
            fake.slot(22809, "ha", 1, false);
            for r in 0..3 {
                let got = round(&fake, Abi::V11, r).unwrap();
                assert!(!got.closed, "REF_COUNT=1 keeps the library loaded");
            }
            let info = "INFO NET/HA : loaded by NCCL 2.28.9 through ext-net v11";
            assert!(fake.log().iter().any(|l| l == info), "{:?}", fake.log());
            assert_eq!(fake.warnings(), no_warnings);
        }
        "default-name" => {
            std::os::unix::fs::symlink(&so, dir.0.join("libnccl-net.so")).unwrap();
            fake.slot(22809, "ha", 0, false);
            let rounds: Vec<Round> = (0..3).map(|r| round(&fake, Abi::V11, r).unwrap()).collect();
            let opened: Vec<&str> = rounds.iter().map(|r| r.opened.as_str()).collect();
            assert_eq!(
                opened,
                ["libnccl-net-ha.so", "libnccl-net.so", "libnccl-net.so"]
            );
            assert!(rounds
                .iter()
                .all(|r| r.closed && r.table == rounds[0].table));
            assert_eq!(fake.warnings(), no_warnings);
        }
        "none" => {
            fake.slot(22809, "ha", 0, false);
            assert!(round(&fake, Abi::V11, 0).unwrap().closed);
            let warnings = fake.warnings();
            assert_eq!(warnings.len(), 1, "one WARN for two inits: {warnings:?}");
            for part in [
                "NCCL 2.28.9 unloads a net plugin",
                "will look for libnccl-net.so only and not find it",
                "Set NCCL_NET_PLUGIN_REF_COUNT=1",
            ] {
                assert!(
                    warnings[0].contains(part),
                    "{part:?} not in {}",
                    warnings[0]
                );
            }
            let err = round(&fake, Abi::V11, 1).err().expect("the reload fails");
            assert!(err.contains("libnccl-net.so: cannot open"), "{err}");
            assert_eq!(fake.warnings().len(), 1);
        }
        "v8" => {
            fake.slot(23007, "ha", 0, true);
            let rounds: Vec<Round> = (0..3).map(|r| round(&fake, Abi::V8, r).unwrap()).collect();
            assert!(rounds
                .iter()
                .all(|r| r.closed && r.opened == "libnccl-net-ha.so"));
            assert_eq!(fake.warnings(), no_warnings);
        }
        other => panic!("unknown scenario {other}"),
    }
    println!("scenario {scenario} passed");
}
