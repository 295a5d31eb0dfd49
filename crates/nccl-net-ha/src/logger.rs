//! [`LogSink`] that forwards log lines to the `ncclDebugLogger_t` NCCL hands to `init`.

use ha_core::api::log::{Level, LogSink};
use nccl_net_abi::common::{
    NcclDebugLogger, NCCL_INIT, NCCL_LOG_INFO, NCCL_LOG_TRACE, NCCL_LOG_WARN, NCCL_NET,
};
use std::ffi::CString;
use std::os::raw::c_int;

/// Forwards each line to NCCL's logger (`None` = drop everything).
#[derive(Clone, Copy, Debug)]
pub struct NcclLoggerSink(pub NcclDebugLogger);

/// NUL-terminated copy of `s`; interior NULs (which C would cut the text at) become `\0`.
fn c_text(s: &str) -> CString {
    let owned = if s.contains('\0') {
        s.replace('\0', "\\0")
    } else {
        s.to_owned()
    };
    CString::new(owned).unwrap_or_default()
}

impl LogSink for NcclLoggerSink {
    fn log(&self, level: Level, subsys_init: bool, file: &str, line: u32, msg: &str) {
        let Some(logger) = self.0 else {
            return;
        };
        let level = match level {
            Level::Warn => NCCL_LOG_WARN,
            Level::Info => NCCL_LOG_INFO,
            Level::Trace => NCCL_LOG_TRACE,
        };
        let flags = if subsys_init {
            NCCL_NET | NCCL_INIT
        } else {
            NCCL_NET
        };
        let file = c_text(file);
        let msg = c_text(msg);
        let line = c_int::try_from(line).unwrap_or(c_int::MAX);
        // SAFETY: `logger` is the function NCCL passed to `init`, which stays valid for the
        // life of the process. The format is the literal "%s" and exactly one argument follows,
        // a pointer to a NUL-terminated string, so the variadic call is well-formed whatever
        // the message contains. `file` and `msg` are NUL-terminated and outlive the call.
        unsafe {
            logger(
                level,
                flags,
                file.as_ptr(),
                line,
                c"%s".as_ptr(),
                msg.as_ptr(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use std::os::raw::{c_char, c_ulong};
    use std::path::PathBuf;
    use std::process::Command;

    /// A C logger that formats with `vsnprintf` and remembers the last call.
    const RECORDER_C: &str = r#"
#include <stdarg.h>
#include <stdio.h>
static char last_fmt[64], last_file[512], last_msg[4096];
static int last_level, last_line, calls;
static unsigned long last_flags;
void rec_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  snprintf(last_fmt, sizeof last_fmt, "%s", fmt);
  snprintf(last_file, sizeof last_file, "%s", file);
  last_level = level; last_flags = flags; last_line = line; calls++;
}
const char* rec_fmt(void) { return last_fmt; }
const char* rec_file(void) { return last_file; }
const char* rec_msg(void) { return last_msg; }
int rec_level(void) { return last_level; }
int rec_line(void) { return last_line; }
int rec_calls(void) { return calls; }
unsigned long rec_flags(void) { return last_flags; }
"#;

    type StrFn = unsafe extern "C" fn() -> *const c_char;
    type IntFn = unsafe extern "C" fn() -> c_int;
    type ULongFn = unsafe extern "C" fn() -> c_ulong;
    type LoggerFn = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);
    type Sym = *mut libc::c_void;

    struct Recorder {
        logger: NcclDebugLogger,
        fmt: StrFn,
        file: StrFn,
        msg: StrFn,
        level: IntFn,
        line: IntFn,
        calls: IntFn,
        flags: ULongFn,
    }

    #[derive(Debug, PartialEq, Eq)]
    struct Call {
        fmt: String,
        file: String,
        msg: String,
        level: c_int,
        line: c_int,
        flags: c_ulong,
    }

    impl Recorder {
        fn calls(&self) -> c_int {
            // SAFETY: a symbol of the loaded recorder with this exact C signature.
            unsafe { (self.calls)() }
        }

        fn last(&self) -> Call {
            let s = |f: StrFn| {
                // SAFETY: the recorder's getters return pointers to its static NUL-terminated
                // buffers, which live as long as the (never unloaded) library.
                unsafe { CStr::from_ptr(f()).to_string_lossy().into_owned() }
            };
            // SAFETY: symbols of the loaded recorder with these exact C signatures.
            let (level, line, flags) = unsafe { ((self.level)(), (self.line)(), (self.flags)()) };
            Call {
                fmt: s(self.fmt),
                file: s(self.file),
                msg: s(self.msg),
                level,
                line,
                flags,
            }
        }
    }

    fn build_recorder() -> Recorder {
        let dir = std::env::temp_dir().join(format!(
            "nccl-net-ha-logger-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let src: PathBuf = dir.join("rec.c");
        let lib: PathBuf = dir.join("librec.so");
        std::fs::write(&src, RECORDER_C).unwrap();
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = CString::new(lib.to_str().unwrap()).unwrap();
        // SAFETY: dlopen of a library we just built; its constructor-free code is benign.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!handle.is_null(), "dlopen of the recorder failed");
        let sym = |name: &CStr| {
            // SAFETY: `handle` is a live dlopen handle and `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            assert!(!p.is_null(), "missing symbol {name:?}");
            p
        };
        // SAFETY: each symbol is a C function defined in RECORDER_C with exactly the signature
        // it is transmuted to (`rec_logger` has ncclDebugLogger_t's signature).
        unsafe {
            Recorder {
                logger: Some(std::mem::transmute::<Sym, LoggerFn>(sym(c"rec_logger"))),
                fmt: std::mem::transmute::<Sym, StrFn>(sym(c"rec_fmt")),
                file: std::mem::transmute::<Sym, StrFn>(sym(c"rec_file")),
                msg: std::mem::transmute::<Sym, StrFn>(sym(c"rec_msg")),
                level: std::mem::transmute::<Sym, IntFn>(sym(c"rec_level")),
                line: std::mem::transmute::<Sym, IntFn>(sym(c"rec_line")),
                calls: std::mem::transmute::<Sym, IntFn>(sym(c"rec_calls")),
                flags: std::mem::transmute::<Sym, ULongFn>(sym(c"rec_flags")),
            }
        }
    }

    #[test]
    fn forwards_to_the_c_logger() {
        let rec = build_recorder();
        let sink = NcclLoggerSink(rec.logger);
        assert_eq!(rec.calls(), 0);

        sink.log(Level::Warn, false, "src/a.rs", 42, "link down dev=1");
        assert_eq!(rec.calls(), 1);
        assert_eq!(
            rec.last(),
            Call {
                fmt: "%s".into(),
                file: "src/a.rs".into(),
                msg: "link down dev=1".into(),
                level: NCCL_LOG_WARN,
                line: 42,
                flags: NCCL_NET,
            }
        );

        sink.log(Level::Info, true, "src/init.rs", 7, "ready");
        let c = rec.last();
        assert_eq!(
            (c.level, c.flags, c.msg.as_str()),
            (NCCL_LOG_INFO, NCCL_NET | NCCL_INIT, "ready")
        );

        // printf directives in the message are data, not format; interior NULs are escaped.
        sink.log(Level::Trace, false, "f\0.rs", u32::MAX, "100% %s %n a\0b");
        let c = rec.last();
        assert_eq!(c.level, NCCL_LOG_TRACE);
        assert_eq!(c.msg, "100% %s %n a\\0b");
        assert_eq!(c.file, "f\\0.rs");
        assert_eq!(c.line, c_int::MAX);
        assert_eq!(rec.calls(), 3);

        // A NULL logger drops lines.
        NcclLoggerSink(None).log(Level::Warn, false, "x", 1, "dropped");
        assert_eq!(rec.calls(), 3);
    }

    #[test]
    fn c_text_escapes_nul() {
        assert_eq!(c_text("abc").as_bytes(), b"abc");
        assert_eq!(c_text("a\0").as_bytes(), b"a\\0");
        assert_eq!(c_text("").as_bytes(), b"");
    }
}
