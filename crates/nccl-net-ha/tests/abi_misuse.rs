//! The ABI misuse table: every entry point of the v8 table called the wrong way (NULL, forged,
//! stale or wrong-kind handles, negative sizes, too many buffers, NULL out-pointers, bad
//! device indices, calls out of order) through the built `.so`, with NCCL's logger replaced by
//! a recorder. Each row states the `ncclResult_t` and a fragment of the WARN line; the test
//! runs every row and checks both, with the process alive and every call returning.
//!
//! `docs/abi-misuse.md` holds the same table, rendered from [`CASES`]: the test fails when
//! the document differs (`UPDATE_DOCS=1 cargo test -p nccl-net-ha --test abi_misuse` rewrites it).

mod so;

use nccl_net_abi::common::{
    NcclDebugLogger, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_LOG_WARN,
    NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_REMOTE_ERROR, NCCL_SUCCESS,
};
use nccl_net_abi::v8::{NcclNetPropertiesV8, NcclNetV8};
use nccl_net_loader::{Abi, Comm, NcclError, PluginV8};
use so::{connect_pair, pattern, so_path, until_some, wait, RegBuf, NCCL_PTR_HOST};
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_ulong, c_void};
use std::path::Path;
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What one row expects.
struct Case {
    entry: &'static str,
    misuse: &'static str,
    code: c_int,
    /// Fragment of the WARN line the call logs; empty = the call logs no WARN line.
    log: &'static str,
    run: fn(&PluginV8) -> Seen,
}

/// What a row's call returned and what was logged meanwhile.
struct Seen {
    code: c_int,
    warns: Vec<String>,
}

const INVAL: c_int = NCCL_INVALID_ARGUMENT;
const USAGE: c_int = NCCL_INVALID_USAGE;
const OK: c_int = NCCL_SUCCESS;

/// A forged handle: the address of nothing the plugin made.
const FORGED: *mut c_void = 0x1234 as *mut c_void;

// ---------------------------------------------------------------------------------------
// The log recorder: a C logger (ncclDebugLogger_t is variadic, which Rust cannot define).

const RECORDER_C: &str = r#"
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
static pthread_mutex_t mx = PTHREAD_MUTEX_INITIALIZER;
static char buf[1 << 16];
static size_t used;
void rec_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  (void)flags; (void)file; (void)line;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&mx);
  int n = snprintf(buf + used, sizeof buf - used, "%d %s\n", level, msg);
  if (n > 0) { used += (size_t)n; if (used >= sizeof buf) used = sizeof buf - 1; }
  pthread_mutex_unlock(&mx);
}
/* Copies the lines logged since the last call into out (NUL-terminated) and forgets them. */
size_t rec_take(char* out, size_t cap) {
  pthread_mutex_lock(&mx);
  size_t n = used < cap - 1 ? used : cap - 1;
  memcpy(out, buf, n);
  out[n] = 0;
  used = 0;
  pthread_mutex_unlock(&mx);
  return n;
}
"#;

type LoggerFn = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);
type TakeFn = unsafe extern "C" fn(*mut c_char, usize) -> usize;

struct Recorder {
    logger: NcclDebugLogger,
    take: TakeFn,
}

impl Recorder {
    fn build() -> Recorder {
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("misuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, lib) = (dir.join("rec.c"), dir.join("librec.so"));
        std::fs::write(&src, RECORDER_C).unwrap();
        let out = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-pthread", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("run cc (a C compiler builds the log recorder)");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = CString::new(lib.to_str().unwrap()).unwrap();
        // SAFETY: dlopen of the library just built from RECORDER_C (no constructors).
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen of the recorder failed");
        let _ = std::fs::remove_dir_all(&dir);
        let sym = |name: &CStr| {
            // SAFETY: live handle, NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            assert!(!p.is_null(), "missing {name:?}");
            p
        };
        // SAFETY: both symbols are C functions of RECORDER_C with exactly these signatures
        // (`rec_logger` has ncclDebugLogger_t's); the library is never unloaded.
        unsafe {
            Recorder {
                logger: Some(std::mem::transmute::<*mut c_void, LoggerFn>(sym(
                    c"rec_logger",
                ))),
                take: std::mem::transmute::<*mut c_void, TakeFn>(sym(c"rec_take")),
            }
        }
    }

    /// WARN lines logged since the last call.
    fn take_warns(&self) -> Vec<String> {
        let mut buf = vec![0u8; 1 << 16];
        // SAFETY: `buf` is writable for its whole length, which is passed as the capacity.
        let n = unsafe { (self.take)(buf.as_mut_ptr().cast(), buf.len()) };
        let warn = format!("{NCCL_LOG_WARN} ");
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .filter_map(|l| l.strip_prefix(&warn).map(str::to_string))
            .collect()
    }
}

fn recorder() -> &'static Recorder {
    static R: OnceLock<Recorder> = OnceLock::new();
    R.get_or_init(Recorder::build)
}

/// The plugin, initialised once with the recorder as NCCL's logger.
fn plugin() -> &'static PluginV8 {
    static P: OnceLock<PluginV8> = OnceLock::new();
    P.get_or_init(|| {
        for (k, v) in [
            ("HA_NCCL_FABRIC", "sock"),
            ("NCCL_SOCKET_IFNAME", "lo"),
            ("NCCL_DEBUG", "WARN"),
        ] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
        let p = PluginV8::open_abi(&so_path(), Some(Abi::V8)).expect("dlopen plugin");
        let init = t(&p).init.expect("init entry");
        // SAFETY: `init` takes ncclDebugLogger_t; the recorder's logger has that signature
        // and lives for the process.
        let rc = unsafe { init(recorder().logger) };
        assert_eq!(rc, NCCL_SUCCESS, "init");
        // The loader's own init (a NULL logger keeps the recorder) gives it its default context.
        p.init().expect("loader init");
        p
    })
}

/// Run the misuse `f` and collect what it returned and logged.
fn observe(f: impl FnOnce() -> c_int) -> Seen {
    recorder().take_warns();
    let code = f();
    Seen {
        code,
        warns: recorder().take_warns(),
    }
}

fn t(p: &PluginV8) -> &NcclNetV8 {
    p.table_v8().expect("the v8 table")
}

// ---------------------------------------------------------------------------------------
// Setups shared by rows.

/// A connected pair and one registered 64-byte buffer on each side.
struct Pair {
    send: Option<Comm>,
    recv: Option<Comm>,
    sb: RegBuf,
    rb: RegBuf,
}

impl Pair {
    fn new(p: &PluginV8) -> Pair {
        let (send, recv, _) = connect_pair(p);
        let sb = RegBuf::new(p, &send, pattern(1, 64));
        let rb = RegBuf::new(p, &recv, vec![0; 64]);
        Pair {
            send: Some(send),
            recv: Some(recv),
            sb,
            rb,
        }
    }
    fn s(&self) -> *mut c_void {
        self.send.as_ref().unwrap().as_ptr()
    }
    fn r(&self) -> *mut c_void {
        self.recv.as_ref().unwrap().as_ptr()
    }
    /// Deregister and close whatever the row left open.
    fn close(mut self, p: &PluginV8) {
        if let Some(s) = self.send.take() {
            if self.sb.mr.is_some() {
                self.sb.dereg(p, &s);
            }
            p.close_send(s).unwrap();
        }
        if let Some(r) = self.recv.take() {
            if self.rb.mr.is_some() {
                self.rb.dereg(p, &r);
            }
            p.close_recv(r).unwrap();
        }
    }
}

/// `irecv` of `n` buffers of `size` bytes in `pair`'s receive buffer (raw entry point).
fn raw_irecv(
    p: &PluginV8,
    comm: *mut c_void,
    pair: &mut Pair,
    n: c_int,
    size: c_int,
    req: *mut *mut c_void,
) -> c_int {
    let k = n.clamp(1, 16) as usize;
    let mut data = vec![pair.rb.ptr().cast::<c_void>(); k];
    let mut sizes = vec![size; k];
    let mut tags = vec![0; k];
    let mut mrs = vec![pair.rb.mr().as_ptr(); k];
    // SAFETY: the arrays hold max(n, 1) valid elements and outlive the call; `comm` may be
    // bad on purpose (the plugin must reject it); `req` is NULL or a live local.
    unsafe {
        t(p).irecv.unwrap()(
            comm,
            n,
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mrs.as_mut_ptr(),
            req,
        )
    }
}

/// `isend` of `size` bytes of `pair`'s send buffer with `mr` (raw entry point).
fn raw_isend(
    p: &PluginV8,
    comm: *mut c_void,
    data: *mut u8,
    size: c_int,
    mr: *mut c_void,
    req: *mut *mut c_void,
) -> c_int {
    // SAFETY: `data` points into a live registered buffer of at least 64 bytes or is
    // deliberately out of its registration (rejected before any access); `comm`/`mr` may be
    // bad on purpose; `req` is NULL or a live local.
    unsafe { t(p).isend.unwrap()(comm, data.cast(), size, 0, mr, req) }
}

/// A completed send/receive of 8 bytes on `pair`: (send request, recv request).
fn completed(p: &PluginV8, pair: &mut Pair) -> (*mut c_void, *mut c_void) {
    let rp = pair.rb.ptr();
    let sp = pair.sb.ptr();
    let recv = pair.recv.as_ref().unwrap();
    let send = pair.send.as_ref().unwrap();
    let rr = p
        .irecv(recv, &[rp], &[8], &[0], &[pair.rb.mr()])
        .unwrap()
        .unwrap();
    let sr = until_some(|| p.isend(send, sp, 8, 0, pair.sb.mr()).unwrap());
    wait(p, &sr, &mut [0]).unwrap();
    wait(p, &rr, &mut [0]).unwrap();
    (sr.as_ptr(), rr.as_ptr())
}

fn test_raw(p: &PluginV8, req: *mut c_void) -> c_int {
    let mut done = 0;
    let mut sizes = [0 as c_int; 8];
    // SAFETY: `req` may be bad on purpose; `done` and `sizes` are live locals with room for
    // any request's sizes.
    unsafe { t(p).test.unwrap()(req, &mut done, sizes.as_mut_ptr()) }
}

/// A request the plugin never made (`rows` of `test`).
fn forged_request() -> *mut c_void {
    // Kind byte of a receive request, comm slot 0xffff: no such comm.
    (0x16ff_ffff_0000_0001u64 as usize) as *mut c_void
}

/// Run `f` on a fresh pair (observed), then close what it left open.
fn with_pair(p: &PluginV8, f: impl FnOnce(&mut Pair) -> c_int) -> Seen {
    let mut pair = Pair::new(p);
    let s = observe(|| f(&mut pair));
    pair.close(p);
    s
}

fn handle_of_closed_listen(p: &PluginV8) -> [u8; NCCL_NET_HANDLE_MAXSIZE] {
    let (h, l) = p.listen(0).unwrap();
    p.close_listen(l).unwrap();
    h
}

fn raw_connect(p: &PluginV8, dev: c_int, h: *mut c_void, out: *mut *mut c_void) -> c_int {
    let mut dc = null_mut();
    // SAFETY: `h` is NULL or a live 128-byte handle; `out` NULL or a live local.
    unsafe { t(p).connect.unwrap()(dev, h, out, &mut dc) }
}

/// `connect` steps with `h` until it errors (or gives a comm, a failure of the row).
fn connect_until_error(p: &PluginV8, h: &mut [u8; NCCL_NET_HANDLE_MAXSIZE]) -> c_int {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut comm = null_mut();
        let rc = raw_connect(p, 0, h.as_mut_ptr().cast(), &mut comm);
        if rc != OK {
            return rc;
        }
        assert!(comm.is_null(), "connected to a closed listener");
        assert!(
            Instant::now() < deadline,
            "connect neither failed nor finished"
        );
        std::thread::yield_now();
    }
}

// ---------------------------------------------------------------------------------------
// The table.

static CASES: &[Case] = &[
    Case {
        entry: "init",
        misuse: "called a second time",
        code: OK,
        log: "",
        run: |p| {
            observe(|| {
                // SAFETY: a NULL logger is allowed.
                unsafe { t(p).init.unwrap()(None) }
            })
        },
    },
    Case {
        entry: "devices",
        misuse: "NULL `ndev`",
        code: INVAL,
        log: "NET/HA devices: ndev is NULL",
        run: |p| {
            observe(|| {
                // SAFETY: NULL out-pointer on purpose.
                unsafe { t(p).devices.unwrap()(null_mut()) }
            })
        },
    },
    Case {
        entry: "getProperties",
        misuse: "device -1",
        code: INVAL,
        log: "NET/HA getProperties: device -1 does not exist",
        run: |p| {
            observe(|| {
                let mut props = std::mem::MaybeUninit::<NcclNetPropertiesV8>::zeroed();
                // SAFETY: `props` is writable; the device index is bad on purpose.
                unsafe { t(p).get_properties.unwrap()(-1, props.as_mut_ptr()) }
            })
        },
    },
    Case {
        entry: "getProperties",
        misuse: "device past the last (99)",
        code: INVAL,
        log: "NET/HA getProperties: device 99 does not exist",
        run: |p| {
            observe(|| {
                let mut props = std::mem::MaybeUninit::<NcclNetPropertiesV8>::zeroed();
                // SAFETY: as above.
                unsafe { t(p).get_properties.unwrap()(99, props.as_mut_ptr()) }
            })
        },
    },
    Case {
        entry: "getProperties",
        misuse: "NULL `props`",
        code: INVAL,
        log: "NET/HA getProperties: props is NULL",
        run: |p| {
            observe(|| {
                // SAFETY: NULL out-pointer on purpose.
                unsafe { t(p).get_properties.unwrap()(0, null_mut()) }
            })
        },
    },
    Case {
        entry: "listen",
        misuse: "device 99",
        code: INVAL,
        log: "NET/HA listen: device 99 does not exist",
        run: |p| {
            observe(|| {
                let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
                let mut l = null_mut();
                // SAFETY: live handle buffer and out-pointer; bad device on purpose.
                unsafe { t(p).listen.unwrap()(99, h.as_mut_ptr().cast(), &mut l) }
            })
        },
    },
    Case {
        entry: "listen",
        misuse: "NULL `handle`",
        code: INVAL,
        log: "NET/HA listen: handle is NULL",
        run: |p| {
            observe(|| {
                let mut l = null_mut();
                // SAFETY: NULL handle on purpose.
                unsafe { t(p).listen.unwrap()(0, null_mut(), &mut l) }
            })
        },
    },
    Case {
        entry: "listen",
        misuse: "NULL `listenComm`",
        code: INVAL,
        log: "NET/HA listen: listenComm is NULL",
        run: |p| {
            observe(|| {
                let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
                // SAFETY: NULL out-pointer on purpose.
                unsafe { t(p).listen.unwrap()(0, h.as_mut_ptr().cast(), null_mut()) }
            })
        },
    },
    Case {
        entry: "connect",
        misuse: "device 99",
        code: INVAL,
        log: "NET/HA connect: device 99 does not exist",
        run: |p| {
            let (mut h, l) = p.listen(0).unwrap();
            let s = observe(|| raw_connect(p, 99, h.as_mut_ptr().cast(), &mut null_mut()));
            p.close_listen(l).unwrap();
            s
        },
    },
    Case {
        entry: "connect",
        misuse: "NULL `handle`",
        code: INVAL,
        log: "NET/HA connect: handle is NULL",
        run: |p| observe(|| raw_connect(p, 0, null_mut(), &mut null_mut())),
    },
    Case {
        entry: "connect",
        misuse: "NULL `sendComm`",
        code: INVAL,
        log: "NET/HA connect: sendComm is NULL",
        run: |p| {
            let (mut h, l) = p.listen(0).unwrap();
            let s = observe(|| raw_connect(p, 0, h.as_mut_ptr().cast(), null_mut()));
            p.close_listen(l).unwrap();
            s
        },
    },
    Case {
        entry: "connect",
        misuse: "handle of zeros (not from `listen`)",
        code: INVAL,
        log: "NET/HA connect: bad connect handle",
        run: |p| {
            let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
            observe(|| raw_connect(p, 0, h.as_mut_ptr().cast(), &mut null_mut()))
        },
    },
    Case {
        entry: "connect",
        misuse: "handle of a closed listen comm (steps until it fails)",
        code: NCCL_REMOTE_ERROR,
        log: "Connection refused",
        run: |p| {
            let mut h = handle_of_closed_listen(p);
            observe(|| connect_until_error(p, &mut h))
        },
    },
    Case {
        entry: "accept",
        misuse: "NULL `listenComm`",
        code: INVAL,
        log: "NET/HA accept: listenComm is NULL",
        run: |p| {
            observe(|| {
                let (mut r, mut dc) = (null_mut(), null_mut());
                // SAFETY: NULL comm on purpose; live out-pointers.
                unsafe { t(p).accept.unwrap()(null_mut(), &mut r, &mut dc) }
            })
        },
    },
    Case {
        entry: "accept",
        misuse: "forged `listenComm`",
        code: INVAL,
        log: "is not a handle of this plugin",
        run: |p| {
            observe(|| {
                let (mut r, mut dc) = (null_mut(), null_mut());
                // SAFETY: forged comm on purpose (never dereferenced); live out-pointers.
                unsafe { t(p).accept.unwrap()(FORGED, &mut r, &mut dc) }
            })
        },
    },
    Case {
        entry: "accept",
        misuse: "closed `listenComm`",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            let (_, l) = p.listen(0).unwrap();
            let lp = l.as_ptr();
            p.close_listen(l).unwrap();
            observe(|| {
                let (mut r, mut dc) = (null_mut(), null_mut());
                // SAFETY: stale comm on purpose; live out-pointers.
                unsafe { t(p).accept.unwrap()(lp, &mut r, &mut dc) }
            })
        },
    },
    Case {
        entry: "accept",
        misuse: "a send comm as `listenComm`",
        code: INVAL,
        log: "listenComm is a send comm, not a listen comm",
        run: |p| {
            with_pair(p, |pair| {
                let (mut r, mut dc) = (null_mut(), null_mut());
                // SAFETY: wrong-kind comm on purpose; live out-pointers.
                unsafe { t(p).accept.unwrap()(pair.s(), &mut r, &mut dc) }
            })
        },
    },
    Case {
        entry: "accept",
        misuse: "NULL `recvComm`",
        code: INVAL,
        log: "NET/HA accept: recvComm is NULL",
        run: |p| {
            let (_, l) = p.listen(0).unwrap();
            let s = observe(|| {
                let mut dc = null_mut();
                // SAFETY: live listen comm; NULL out-pointer on purpose.
                unsafe { t(p).accept.unwrap()(l.as_ptr(), null_mut(), &mut dc) }
            });
            p.close_listen(l).unwrap();
            s
        },
    },
    Case {
        entry: "regMr",
        misuse: "NULL `comm`",
        code: INVAL,
        log: "NET/HA regMr: comm is NULL",
        run: |p| {
            observe(|| {
                let mut buf = [0u8; 8];
                let mut mh = null_mut();
                // SAFETY: NULL comm on purpose; live buffer and out-pointer.
                unsafe {
                    t(p).reg_mr.unwrap()(
                        null_mut(),
                        buf.as_mut_ptr().cast(),
                        8,
                        NCCL_PTR_HOST,
                        &mut mh,
                    )
                }
            })
        },
    },
    Case {
        entry: "regMr",
        misuse: "forged `comm`",
        code: INVAL,
        log: "is not a send or receive comm of this plugin",
        run: |p| {
            observe(|| {
                let mut buf = [0u8; 8];
                let mut mh = null_mut();
                // SAFETY: forged comm on purpose (never dereferenced).
                unsafe {
                    t(p).reg_mr.unwrap()(FORGED, buf.as_mut_ptr().cast(), 8, NCCL_PTR_HOST, &mut mh)
                }
            })
        },
    },
    Case {
        entry: "regMr",
        misuse: "closed `comm`",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            let (send, recv, _) = connect_pair(p);
            let sp = send.as_ptr();
            p.close_send(send).unwrap();
            let s = observe(|| {
                let mut buf = [0u8; 8];
                let mut mh = null_mut();
                // SAFETY: stale comm on purpose.
                unsafe {
                    t(p).reg_mr.unwrap()(sp, buf.as_mut_ptr().cast(), 8, NCCL_PTR_HOST, &mut mh)
                }
            });
            p.close_recv(recv).unwrap();
            s
        },
    },
    Case {
        entry: "regMr",
        misuse: "size 0",
        code: INVAL,
        log: "NET/HA regMr: regMr of 0 bytes",
        run: |p| {
            with_pair(p, |pair| {
                let mut mh = null_mut();
                // SAFETY: live comm and buffer; size 0 on purpose.
                unsafe {
                    t(p).reg_mr.unwrap()(pair.s(), pair.sb.ptr().cast(), 0, NCCL_PTR_HOST, &mut mh)
                }
            })
        },
    },
    Case {
        entry: "regMr",
        misuse: "NULL `data`",
        code: INVAL,
        log: "NET/HA regMr: regMr of bad range 0x0+8",
        run: |p| {
            with_pair(p, |pair| {
                let mut mh = null_mut();
                // SAFETY: NULL data on purpose (never dereferenced).
                unsafe { t(p).reg_mr.unwrap()(pair.s(), null_mut(), 8, NCCL_PTR_HOST, &mut mh) }
            })
        },
    },
    Case {
        entry: "regMr",
        misuse: "`NCCL_PTR_CUDA` memory",
        code: INVAL,
        log: "memory type 2 is not supported by this device",
        run: |p| {
            with_pair(p, |pair| {
                let mut mh = null_mut();
                // SAFETY: live comm and buffer; unsupported type on purpose.
                unsafe {
                    t(p).reg_mr.unwrap()(pair.s(), pair.sb.ptr().cast(), 8, NCCL_PTR_CUDA, &mut mh)
                }
            })
        },
    },
    Case {
        entry: "regMr",
        misuse: "NULL `mhandle`",
        code: INVAL,
        log: "NET/HA regMr: mhandle is NULL",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: NULL out-pointer on purpose.
                unsafe {
                    t(p).reg_mr.unwrap()(
                        pair.s(),
                        pair.sb.ptr().cast(),
                        8,
                        NCCL_PTR_HOST,
                        null_mut(),
                    )
                }
            })
        },
    },
    Case {
        entry: "regMrDmaBuf",
        misuse: "`NCCL_PTR_DMABUF` memory, fd -1",
        code: INVAL,
        log: "memory type 4 is not supported by this device",
        run: |p| {
            with_pair(p, |pair| {
                let mut mh = null_mut();
                // SAFETY: live comm and buffer; unsupported type on purpose.
                unsafe {
                    t(p).reg_mr_dma_buf.unwrap()(
                        pair.s(),
                        pair.sb.ptr().cast(),
                        8,
                        NCCL_PTR_DMABUF,
                        0,
                        -1,
                        &mut mh,
                    )
                }
            })
        },
    },
    Case {
        entry: "regMrDmaBuf",
        misuse: "`NCCL_PTR_CUDA` with a dma-buf fd on a device without GPU Direct RDMA",
        code: INVAL,
        log: "memory type 2 is not supported by this device (ptrSupport 1): a dma-buf registration (fd 0) needs NCCL_PTR_DMABUF",
        run: |p| {
            with_pair(p, |pair| {
                let mut mh = null_mut();
                // SAFETY: live comm and buffer; fd 0 (stdin) is never used: the device
                // cannot register dma-bufs.
                unsafe {
                    t(p).reg_mr_dma_buf.unwrap()(
                        pair.s(),
                        pair.sb.ptr().cast(),
                        8,
                        NCCL_PTR_CUDA,
                        0,
                        0,
                        &mut mh,
                    )
                }
            })
        },
    },
    Case {
        entry: "regMrDmaBuf",
        misuse: "`NCCL_PTR_CUDA`, fd -1, without nvidia-peermem",
        code: INVAL,
        log: "GPU memory without a dma-buf fd needs NCCL_PTR_CUDA",
        run: |p| {
            with_pair(p, |pair| {
                let mut mh = null_mut();
                // SAFETY: live comm and buffer; unsupported type on purpose.
                unsafe {
                    t(p).reg_mr_dma_buf.unwrap()(
                        pair.s(),
                        pair.sb.ptr().cast(),
                        8,
                        NCCL_PTR_CUDA,
                        0,
                        -1,
                        &mut mh,
                    )
                }
            })
        },
    },
    Case {
        entry: "deregMr",
        misuse: "NULL `comm`",
        code: INVAL,
        log: "NET/HA deregMr: comm is NULL",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: NULL comm on purpose.
                unsafe { t(p).dereg_mr.unwrap()(null_mut(), pair.sb.mr().as_ptr()) }
            })
        },
    },
    Case {
        entry: "deregMr",
        misuse: "NULL `mhandle`",
        code: INVAL,
        log: "NET/HA deregMr: mhandle is NULL",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: NULL handle on purpose.
                unsafe { t(p).dereg_mr.unwrap()(pair.s(), null_mut()) }
            })
        },
    },
    Case {
        entry: "deregMr",
        misuse: "forged `mhandle`",
        code: INVAL,
        log: "is not a handle of this plugin",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: forged handle on purpose (never dereferenced).
                unsafe { t(p).dereg_mr.unwrap()(pair.s(), FORGED) }
            })
        },
    },
    Case {
        entry: "deregMr",
        misuse: "a comm as `mhandle`",
        code: INVAL,
        log: "mhandle is a send comm, not a memory handle",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: wrong-kind handle on purpose.
                unsafe { t(p).dereg_mr.unwrap()(pair.s(), pair.s()) }
            })
        },
    },
    Case {
        entry: "deregMr",
        misuse: "the same `mhandle` twice",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                let send = pair.send.take().unwrap();
                pair.sb.dereg(p, &send);
                pair.send = Some(send);
                // SAFETY: stale handle on purpose.
                unsafe { t(p).dereg_mr.unwrap()(pair.s(), mr) }
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "NULL `sendComm`",
        code: INVAL,
        log: "NET/HA isend: sendComm is NULL",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                raw_isend(p, null_mut(), pair.sb.ptr(), 8, mr, &mut null_mut())
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "forged `sendComm`",
        code: INVAL,
        log: "is not a handle of this plugin",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                raw_isend(p, FORGED, pair.sb.ptr(), 8, mr, &mut null_mut())
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "a recv comm as `sendComm`",
        code: INVAL,
        log: "sendComm is a recv comm, not a send comm",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                raw_isend(p, pair.r(), pair.sb.ptr(), 8, mr, &mut null_mut())
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "closed `sendComm`",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            with_pair(p, |pair| {
                let sp = pair.s();
                let mr = pair.sb.mr().as_ptr();
                let send = pair.send.take().unwrap();
                pair.sb.dereg(p, &send);
                p.close_send(send).unwrap();
                raw_isend(p, sp, pair.sb.ptr(), 8, mr, &mut null_mut())
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "size -1",
        code: INVAL,
        log: "NET/HA isend: send size -1 is negative",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                raw_isend(p, pair.s(), pair.sb.ptr(), -1, mr, &mut null_mut())
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "NULL `mhandle`",
        code: INVAL,
        log: "NET/HA isend: mhandle is NULL",
        run: |p| {
            with_pair(p, |pair| {
                raw_isend(p, pair.s(), pair.sb.ptr(), 8, null_mut(), &mut null_mut())
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "deregistered `mhandle`",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                let send = pair.send.take().unwrap();
                pair.sb.dereg(p, &send);
                pair.send = Some(send);
                raw_isend(p, pair.s(), pair.sb.ptr(), 8, mr, &mut null_mut())
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "buffer outside its registration",
        code: USAGE,
        log: "lies outside its registration",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                raw_isend(
                    p,
                    pair.s(),
                    pair.sb.ptr().wrapping_add(60),
                    8,
                    mr,
                    &mut null_mut(),
                )
            })
        },
    },
    Case {
        entry: "isend",
        misuse: "NULL `request`",
        code: INVAL,
        log: "NET/HA isend: request is NULL",
        run: |p| {
            with_pair(p, |pair| {
                let mr = pair.sb.mr().as_ptr();
                raw_isend(p, pair.s(), pair.sb.ptr(), 8, mr, null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "n = 0",
        code: INVAL,
        log: "NET/HA irecv: irecv of 0 buffers (1..=8 supported)",
        run: |p| {
            with_pair(p, |pair| {
                raw_irecv(p, pair.r(), pair, 0, 8, &mut null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "n = -1",
        code: INVAL,
        log: "NET/HA irecv: irecv count -1 is negative",
        run: |p| {
            with_pair(p, |pair| {
                raw_irecv(p, pair.r(), pair, -1, 8, &mut null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "n = 9 > 8 (the most any `irecv` takes, whatever `maxRecvs` says)",
        code: INVAL,
        log: "NET/HA irecv: irecv of 9 buffers (1..=8 supported)",
        run: |p| {
            with_pair(p, |pair| {
                raw_irecv(p, pair.r(), pair, 9, 8, &mut null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "n = 2 > maxRecvs (1 on `sock` with eager sends, `HA_NCCL_SOCK_EAGER`)",
        code: USAGE,
        log: "NET/HA irecv: irecv of 2 buffers on a connection with eager sends (HA_NCCL_SOCK_EAGER)",
        run: |p| {
            with_pair(p, |pair| {
                raw_irecv(p, pair.r(), pair, 2, 8, &mut null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "size -1",
        code: INVAL,
        log: "NET/HA irecv: receive size -1 is negative",
        run: |p| {
            with_pair(p, |pair| {
                raw_irecv(p, pair.r(), pair, 1, -1, &mut null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "NULL `data` array",
        code: INVAL,
        log: "NET/HA irecv: data is NULL",
        run: |p| {
            with_pair(p, |pair| {
                let (mut sizes, mut tags) = ([8], [0]);
                let mut mrs = [pair.rb.mr().as_ptr()];
                let mut req = null_mut();
                // SAFETY: live comm and arrays except `data`, NULL on purpose.
                unsafe {
                    t(p).irecv.unwrap()(
                        pair.r(),
                        1,
                        null_mut(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mrs.as_mut_ptr(),
                        &mut req,
                    )
                }
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "NULL `mhandles` array",
        code: INVAL,
        log: "NET/HA irecv: mhandles is NULL",
        run: |p| {
            with_pair(p, |pair| {
                let (mut sizes, mut tags) = ([8], [0]);
                let mut data = [pair.rb.ptr().cast::<c_void>()];
                let mut req = null_mut();
                // SAFETY: live comm and arrays except `mhandles`, NULL on purpose.
                unsafe {
                    t(p).irecv.unwrap()(
                        pair.r(),
                        1,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        null_mut(),
                        &mut req,
                    )
                }
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "NULL `recvComm`",
        code: INVAL,
        log: "NET/HA irecv: recvComm is NULL",
        run: |p| {
            with_pair(p, |pair| {
                raw_irecv(p, null_mut(), pair, 1, 8, &mut null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "a send comm as `recvComm`",
        code: INVAL,
        log: "recvComm is a send comm, not a recv comm",
        run: |p| {
            with_pair(p, |pair| {
                let s = pair.s();
                raw_irecv(p, s, pair, 1, 8, &mut null_mut())
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "closed `recvComm`",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            with_pair(p, |pair| {
                let rp = pair.r();
                // The registration stays: handles are global, only the comm is gone.
                let recv = pair.recv.take().unwrap();
                let mr = pair.rb.mr.take();
                p.close_recv(recv).unwrap();
                pair.rb.mr = mr;
                let rc = raw_irecv(p, rp, pair, 1, 8, &mut null_mut());
                let mr = pair.rb.mr.take().unwrap();
                // SAFETY: a live registration, deregistered through the still-open send comm.
                unsafe { t(p).dereg_mr.unwrap()(pair.s(), mr.as_ptr()) };
                rc
            })
        },
    },
    Case {
        entry: "irecv",
        misuse: "NULL `request`",
        code: INVAL,
        log: "NET/HA irecv: request is NULL",
        run: |p| with_pair(p, |pair| raw_irecv(p, pair.r(), pair, 1, 8, null_mut())),
    },
    Case {
        entry: "iflush",
        misuse: "NULL `recvComm`",
        code: INVAL,
        log: "NET/HA iflush: recvComm is NULL",
        run: |p| {
            observe(|| {
                let mut req = null_mut();
                // SAFETY: NULL comm on purpose; arrays unused for n = 1 host memory.
                unsafe {
                    t(p).iflush.unwrap()(
                        null_mut(),
                        1,
                        null_mut(),
                        null_mut(),
                        null_mut(),
                        &mut req,
                    )
                }
            })
        },
    },
    Case {
        entry: "iflush",
        misuse: "n = -1",
        code: INVAL,
        log: "NET/HA iflush: iflush of -1 buffers",
        run: |p| {
            with_pair(p, |pair| {
                let mut req = null_mut();
                // SAFETY: live comm; bad count on purpose.
                unsafe {
                    t(p).iflush.unwrap()(pair.r(), -1, null_mut(), null_mut(), null_mut(), &mut req)
                }
            })
        },
    },
    Case {
        entry: "iflush",
        misuse: "n = 9 > maxRecvs (8)",
        code: INVAL,
        log: "NET/HA iflush: iflush of 9 buffers",
        run: |p| {
            with_pair(p, |pair| {
                let mut req = null_mut();
                // SAFETY: live comm; bad count on purpose.
                unsafe {
                    t(p).iflush.unwrap()(pair.r(), 9, null_mut(), null_mut(), null_mut(), &mut req)
                }
            })
        },
    },
    Case {
        entry: "iflush",
        misuse: "n = 1, NULL `data`",
        code: INVAL,
        log: "NET/HA iflush: data is NULL",
        run: |p| {
            with_pair(p, |pair| {
                let mut req = null_mut();
                let mut sizes = [8 as c_int];
                let mut mh = [pair.rb.mr().as_ptr()];
                // SAFETY: live comm; NULL data array on purpose, the others live.
                unsafe {
                    t(p).iflush.unwrap()(
                        pair.r(),
                        1,
                        null_mut(),
                        sizes.as_mut_ptr(),
                        mh.as_mut_ptr(),
                        &mut req,
                    )
                }
            })
        },
    },
    Case {
        entry: "iflush",
        misuse: "forged `mhandle`",
        code: INVAL,
        log: "NET/HA iflush: mhandle 0x1234 is not a handle of this plugin",
        run: |p| {
            with_pair(p, |pair| {
                let mut req = null_mut();
                let mut data = [pair.rb.ptr().cast::<c_void>()];
                let mut sizes = [8 as c_int];
                let mut mh = [FORGED];
                // SAFETY: live comm and arrays; forged handle on purpose (never dereferenced).
                unsafe {
                    t(p).iflush.unwrap()(
                        pair.r(),
                        1,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        mh.as_mut_ptr(),
                        &mut req,
                    )
                }
            })
        },
    },
    Case {
        entry: "iflush",
        misuse: "NULL `request`",
        code: INVAL,
        log: "NET/HA iflush: request is NULL",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: live comm; NULL out-pointer on purpose.
                unsafe {
                    t(p).iflush.unwrap()(
                        pair.r(),
                        1,
                        null_mut(),
                        null_mut(),
                        null_mut(),
                        null_mut(),
                    )
                }
            })
        },
    },
    Case {
        entry: "test",
        misuse: "NULL `request`",
        code: INVAL,
        log: "NET/HA test: request is NULL",
        run: |p| observe(|| test_raw(p, null_mut())),
    },
    Case {
        entry: "test",
        misuse: "forged `request` (a request of a comm that never existed)",
        code: USAGE,
        log: "request belongs to a connection that was closed",
        run: |p| observe(|| test_raw(p, forged_request())),
    },
    Case {
        entry: "test",
        misuse: "arbitrary pointer as `request`",
        code: INVAL,
        log: "is not a request of this plugin",
        run: |p| observe(|| test_raw(p, FORGED)),
    },
    Case {
        entry: "test",
        misuse: "a comm as `request`",
        code: INVAL,
        log: "is not a request of this plugin",
        run: |p| with_pair(p, |pair| test_raw(p, pair.s())),
    },
    Case {
        entry: "test",
        misuse: "NULL `done`",
        code: INVAL,
        log: "NET/HA test: done is NULL",
        run: |p| {
            with_pair(p, |pair| {
                let (sr, _) = completed(p, pair);
                // SAFETY: a (completed) request; NULL `done` on purpose.
                unsafe { t(p).test.unwrap()(sr, null_mut(), null_mut()) }
            })
        },
    },
    Case {
        entry: "test",
        misuse: "a send request already reported done",
        code: USAGE,
        log: "NET/HA test: unknown or already completed request",
        run: |p| {
            with_pair(p, |pair| {
                let (sr, _) = completed(p, pair);
                test_raw(p, sr)
            })
        },
    },
    Case {
        entry: "test",
        misuse: "a receive request already reported done",
        code: USAGE,
        log: "NET/HA test: unknown or already completed request",
        run: |p| {
            with_pair(p, |pair| {
                let (_, rr) = completed(p, pair);
                test_raw(p, rr)
            })
        },
    },
    Case {
        entry: "test",
        misuse: "a receive whose comm was closed while it was in flight",
        code: USAGE,
        log: "request belongs to a connection that was closed",
        run: |p| {
            with_pair(p, |pair| {
                let mut req = null_mut();
                assert_eq!(raw_irecv(p, pair.r(), pair, 1, 8, &mut req), OK);
                assert!(!req.is_null());
                let recv = pair.recv.take().unwrap();
                let mr = pair.rb.mr.take().unwrap();
                p.close_recv(recv).unwrap();
                // SAFETY: a live registration, deregistered through the still-open send comm.
                unsafe { t(p).dereg_mr.unwrap()(pair.s(), mr.as_ptr()) };
                test_raw(p, req)
            })
        },
    },
    Case {
        entry: "test",
        misuse: "a receive whose peer closed its send comm (polled until it fails)",
        code: NCCL_REMOTE_ERROR,
        log: "NET/HA test: the connection's only path failed",
        run: |p| {
            let mut pair = Pair::new(p);
            let mut req = null_mut();
            assert_eq!(raw_irecv(p, pair.r(), &mut pair, 1, 8, &mut req), OK);
            let send = pair.send.take().unwrap();
            pair.sb.dereg(p, &send);
            p.close_send(send).unwrap();
            let s = observe(|| {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let mut done = 0;
                    let mut sizes = [0 as c_int; 1];
                    // SAFETY: a live request; live out-pointers.
                    let rc = unsafe { t(p).test.unwrap()(req, &mut done, sizes.as_mut_ptr()) };
                    assert!(
                        rc != OK || done == 0,
                        "a receive completed without a sender"
                    );
                    if rc != OK {
                        return rc;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "the receive neither failed nor completed"
                    );
                    std::thread::yield_now();
                }
            });
            pair.close(p);
            s
        },
    },
    Case {
        entry: "closeSend",
        misuse: "NULL",
        code: INVAL,
        log: "NET/HA closeSend: sendComm is NULL",
        run: |p| {
            observe(|| {
                // SAFETY: NULL comm on purpose.
                unsafe { t(p).close_send.unwrap()(null_mut()) }
            })
        },
    },
    Case {
        entry: "closeSend",
        misuse: "forged",
        code: INVAL,
        log: "is not a handle of this plugin",
        run: |p| {
            observe(|| {
                // SAFETY: forged comm on purpose (never dereferenced).
                unsafe { t(p).close_send.unwrap()(FORGED) }
            })
        },
    },
    Case {
        entry: "closeSend",
        misuse: "a recv comm",
        code: INVAL,
        log: "sendComm is a recv comm, not a send comm",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: wrong-kind comm on purpose.
                unsafe { t(p).close_send.unwrap()(pair.r()) }
            })
        },
    },
    Case {
        entry: "closeSend",
        misuse: "twice",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            with_pair(p, |pair| {
                let sp = pair.s();
                let send = pair.send.take().unwrap();
                pair.sb.dereg(p, &send);
                p.close_send(send).unwrap();
                // SAFETY: stale comm on purpose.
                unsafe { t(p).close_send.unwrap()(sp) }
            })
        },
    },
    Case {
        entry: "closeSend",
        misuse: "with a send in flight (posted, never tested)",
        code: OK,
        log: "",
        run: |p| {
            with_pair(p, |pair| {
                let mut rreq = null_mut();
                assert_eq!(raw_irecv(p, pair.r(), pair, 1, 8, &mut rreq), OK);
                let mr = pair.sb.mr().as_ptr();
                let sp = pair.sb.ptr();
                let send = pair.send.take().unwrap();
                let sreq = until_some(|| {
                    let mut req = null_mut();
                    assert_eq!(raw_isend(p, send.as_ptr(), sp, 8, mr, &mut req), OK);
                    (!req.is_null()).then_some(req)
                });
                pair.sb.dereg(p, &send);
                // SAFETY: a live send comm, closed once (`send` is not used again).
                let rc = unsafe { t(p).close_send.unwrap()(send.as_ptr()) };
                // Its request is gone with it.
                assert_eq!(test_raw(p, sreq), USAGE, "test of a closed comm's request");
                rc
            })
        },
    },
    Case {
        entry: "closeRecv",
        misuse: "NULL",
        code: INVAL,
        log: "NET/HA closeRecv: recvComm is NULL",
        run: |p| {
            observe(|| {
                // SAFETY: NULL comm on purpose.
                unsafe { t(p).close_recv.unwrap()(null_mut()) }
            })
        },
    },
    Case {
        entry: "closeRecv",
        misuse: "a send comm",
        code: INVAL,
        log: "recvComm is a send comm, not a recv comm",
        run: |p| {
            with_pair(p, |pair| {
                // SAFETY: wrong-kind comm on purpose.
                unsafe { t(p).close_recv.unwrap()(pair.s()) }
            })
        },
    },
    Case {
        entry: "closeRecv",
        misuse: "twice",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            with_pair(p, |pair| {
                let rp = pair.r();
                let recv = pair.recv.take().unwrap();
                pair.rb.dereg(p, &recv);
                p.close_recv(recv).unwrap();
                // SAFETY: stale comm on purpose.
                unsafe { t(p).close_recv.unwrap()(rp) }
            })
        },
    },
    Case {
        entry: "closeRecv",
        misuse: "with a receive in flight",
        code: OK,
        log: "",
        run: |p| {
            with_pair(p, |pair| {
                let mut req = null_mut();
                assert_eq!(raw_irecv(p, pair.r(), pair, 1, 8, &mut req), OK);
                assert!(!req.is_null());
                let recv = pair.recv.take().unwrap();
                pair.rb.dereg(p, &recv);
                // SAFETY: a live recv comm, closed once (`recv` is not used again).
                unsafe { t(p).close_recv.unwrap()(recv.as_ptr()) }
            })
        },
    },
    Case {
        entry: "closeListen",
        misuse: "NULL",
        code: INVAL,
        log: "NET/HA closeListen: listenComm is NULL",
        run: |p| {
            observe(|| {
                // SAFETY: NULL comm on purpose.
                unsafe { t(p).close_listen.unwrap()(null_mut()) }
            })
        },
    },
    Case {
        entry: "closeListen",
        misuse: "twice",
        code: USAGE,
        log: "was already closed",
        run: |p| {
            let (_, l) = p.listen(0).unwrap();
            let lp = l.as_ptr();
            p.close_listen(l).unwrap();
            observe(|| {
                // SAFETY: stale comm on purpose.
                unsafe { t(p).close_listen.unwrap()(lp) }
            })
        },
    },
    Case {
        entry: "closeListen",
        misuse: "with a connect in progress (the connector then fails)",
        code: OK,
        log: "",
        run: |p| {
            let (mut h, l) = p.listen(0).unwrap();
            let mut comm = null_mut();
            assert_eq!(raw_connect(p, 0, h.as_mut_ptr().cast(), &mut comm), OK);
            assert!(comm.is_null(), "connected before the listener accepted");
            let s = observe(|| {
                // SAFETY: a live listen comm, closed once (`l` is not used again).
                unsafe { t(p).close_listen.unwrap()(l.as_ptr()) }
            });
            let rc = connect_until_error(p, &mut h);
            assert_ne!(rc, OK, "the connector must fail once its listener is gone");
            s
        },
    },
];

// ---------------------------------------------------------------------------------------
// The document.

fn code_name(c: c_int) -> String {
    if c == OK {
        "`ncclSuccess`".into()
    } else {
        format!("`{}`", NcclError(c).name())
    }
}

/// The markdown table of [`CASES`].
fn markdown() -> String {
    let mut s = String::from(
        "| Entry point | Misuse | Result | WARN line contains |\n| --- | --- | --- | --- |\n",
    );
    for c in CASES {
        let log = if c.log.is_empty() {
            "*(nothing)*".to_string()
        } else {
            format!("`{}`", c.log.trim_end())
        };
        s += &format!(
            "| `{}` | {} | {} | {log} |\n",
            c.entry,
            c.misuse,
            code_name(c.code)
        );
    }
    s
}

const START: &str = "<!-- misuse-table:start -->\n";
const END: &str = "<!-- misuse-table:end -->";

#[test]
fn every_misuse_gets_its_documented_code_and_log_line() {
    let p = plugin();
    let mut failures = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let seen = (c.run)(p);
        if std::env::var_os("MISUSE_SHOW").is_some() {
            eprintln!(
                "row {i} {} {}: {} {:?}",
                c.entry, c.misuse, seen.code, seen.warns
            );
        }
        let logged = if c.log.is_empty() {
            // Nothing about this entry point.
            !seen
                .warns
                .iter()
                .any(|w| w.starts_with(&format!("NET/HA {}:", c.entry)))
        } else {
            seen.warns.iter().any(|w| w.contains(c.log))
        };
        if seen.code != c.code || !logged {
            failures.push(format!(
                "row {i} `{}` {}: expected {} and a WARN with {:?}; got {} and {:?}",
                c.entry,
                c.misuse,
                code_name(c.code),
                c.log,
                code_name(seen.code),
                seen.warns
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every entry point of the v8 table has rows (the optional NULL ones excepted).
    let missing: Vec<&str> = [
        "init",
        "devices",
        "getProperties",
        "listen",
        "connect",
        "accept",
        "regMr",
        "regMrDmaBuf",
        "deregMr",
        "isend",
        "irecv",
        "iflush",
        "test",
        "closeSend",
        "closeRecv",
        "closeListen",
    ]
    .into_iter()
    .filter(|e| !CASES.iter().any(|c| c.entry == *e))
    .collect();
    assert!(
        missing.is_empty(),
        "entry points without a row: {missing:?}"
    );
    // The process is alive and the plugin still works after all of it.
    let (send, recv, _) = connect_pair(p);
    let mut sb = RegBuf::new(p, &send, pattern(9, 4096));
    let mut rb = RegBuf::new(p, &recv, vec![0; 4096]);
    let (sp, rp) = (sb.ptr(), rb.ptr());
    let rr = p
        .irecv(&recv, &[rp], &[4096], &[1], &[rb.mr()])
        .unwrap()
        .unwrap();
    let sr = until_some(|| p.isend(&send, sp, 4096, 1, sb.mr()).unwrap());
    wait(p, &sr, &mut [0]).unwrap();
    let mut sz = [0];
    wait(p, &rr, &mut sz).unwrap();
    assert_eq!(sz[0], 4096);
    assert!(rb.data == sb.data);
    sb.dereg(p, &send);
    rb.dereg(p, &recv);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

#[test]
fn the_document_shows_the_tested_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/abi-misuse.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    let expected = markdown();
    let span = doc
        .find(START)
        .map(|s| s + START.len())
        .and_then(|s| doc[s..].find(END).map(|e| (s, s + e)));
    if let Some((s, e)) = span {
        if doc[s..e] == expected {
            return;
        }
    }
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        let (s, e) = span.expect("docs/abi-misuse.md lacks the misuse-table markers");
        std::fs::write(&path, format!("{}{expected}{}", &doc[..s], &doc[e..])).unwrap();
        eprintln!("docs/abi-misuse.md table regenerated");
        return;
    }
    panic!(
        "docs/abi-misuse.md's table is stale or its markers are missing (run `UPDATE_DOCS=1 \
         cargo test -p nccl-net-ha --test abi_misuse` to regenerate it). Expected between the markers:\n{expected}"
    );
}
