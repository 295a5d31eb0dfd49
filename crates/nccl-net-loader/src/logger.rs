//! A logger to hand a plugin's `init`, printing to stderr, for tools that are not NCCL: some
//! plugins call the logger they are given without checking it (nccl-rdma-sharp-plugins does),
//! so NULL crashes them. Rust cannot define a C-variadic function, so this one declares the
//! fixed arguments and the first variadic one; it prints that argument when the format is
//! exactly `"%s"` (how this project's plugin logs) and the format itself otherwise (other
//! plugins' arguments are never read). WARN always; INFO and TRACE when `NCCL_DEBUG` asks.

use nccl_net_abi::common::{NcclDebugLogger, NCCL_LOG_INFO, NCCL_LOG_TRACE, NCCL_LOG_WARN};
use std::ffi::CStr;
use std::io::Write as _;
use std::os::raw::{c_char, c_int, c_ulong};

type Fixed =
    unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, *const c_char);
type Variadic = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

fn wanted(level: c_int) -> bool {
    let debug = std::env::var("NCCL_DEBUG")
        .unwrap_or_default()
        .to_ascii_uppercase();
    match level {
        NCCL_LOG_WARN => debug != "VERSION" && debug != "NONE",
        NCCL_LOG_INFO => debug == "INFO" || debug == "TRACE",
        NCCL_LOG_TRACE => debug == "TRACE",
        _ => false,
    }
}

/// # Safety
/// Called by a plugin as `ncclDebugLogger_t`: `file` and `fmt` NULL or NUL-terminated; when
/// `fmt` is `"%s"`, `arg` is the string argument that format requires.
unsafe extern "C" fn print(
    level: c_int,
    _flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    arg: *const c_char,
) {
    if fmt.is_null() || !wanted(level) {
        return;
    }
    // SAFETY: NUL-terminated per the logger's contract, read during the call only.
    let f = unsafe { CStr::from_ptr(fmt) };
    let text = if f.to_bytes() == b"%s" && !arg.is_null() {
        // SAFETY: the format "%s" makes `arg` a NUL-terminated string (the caller's contract).
        unsafe { CStr::from_ptr(arg) }.to_string_lossy()
    } else {
        f.to_string_lossy()
    };
    let level = if level == NCCL_LOG_WARN {
        "WARN"
    } else {
        "INFO"
    };
    let at = if file.is_null() {
        String::new()
    } else {
        // SAFETY: as `fmt`.
        format!(
            " [{}:{line}]",
            unsafe { CStr::from_ptr(file) }.to_string_lossy()
        )
    };
    // One write per line (`eprintln!` writes each piece apart: lines of processes sharing
    // stderr would interleave).
    let _ = std::io::stderr().write_all(format!("plugin {level}{at} {text}\n").as_bytes());
}

/// The logger a tool passes to `plugin`'s `init`: none for this project's plugin (without one
/// it prints its own lines, `HA NET INFO ...`, which the drill scripts read), the stderr
/// logger for any other (NCCL always passes one; some plugins call it unchecked).
pub fn logger_for(plugin_name: &str) -> NcclDebugLogger {
    if plugin_name == "HA" {
        None
    } else {
        stderr_logger()
    }
}

/// The stderr logger, where the calling convention passes the first variadic argument where a
/// sixth fixed one goes (x86-64 System V, AArch64 Linux); `None` elsewhere.
pub fn stderr_logger() -> NcclDebugLogger {
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        // SAFETY: on these targets a C call through a variadic pointer passes the fixed
        // arguments and the first pointer-sized variadic one in the same registers as a call
        // of a six-argument function, and the callee returns nothing: `print` reads exactly
        // what the caller passed (its sixth argument only for the format "%s").
        Some(unsafe { std::mem::transmute::<Fixed, Variadic>(print) })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_logger_takes_a_variadic_call() {
        let Some(log) = stderr_logger() else {
            return; // not a target where it exists
        };
        // SAFETY: a well-formed ncclDebugLogger_t call ("%s" and its string), and one whose
        // format takes arguments that are not passed (never read: only "%s" reads one).
        unsafe {
            log(
                NCCL_LOG_WARN,
                0,
                c"t.c".as_ptr(),
                1,
                c"%s".as_ptr(),
                c"logger test".as_ptr(),
            );
            log(NCCL_LOG_WARN, 0, std::ptr::null(), 2, c"%d %s".as_ptr());
            log(NCCL_LOG_INFO, 0, std::ptr::null(), 3, std::ptr::null());
        }
        assert!(logger_for("HA").is_none());
        assert!(logger_for("IBext_v11").is_some());
    }
}
