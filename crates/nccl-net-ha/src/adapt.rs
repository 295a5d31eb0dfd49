//! Helpers every ABI version's adapters share: checking and converting the C arguments NCCL
//! passes (NULL checks, out-pointers, arrays, the 128-byte handle), handle tokens, device
//! name strings that outlive the call, and the logger / profiler callbacks `init` receives.

use super::logger::NcclLoggerSink;
use ha_core::api::ops::RecvBuf;
use ha_core::api::{log, ApiError, ApiResult};
use ha_core::fabric::DeviceInfo;
use nccl_net_abi::common::*;
use parking_lot::Mutex;
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Arc;

pub(super) fn code(c: ha_core::api::Code) -> NcclResult {
    c as NcclResult
}

pub(super) fn non_null<T>(p: *const T, what: &str) -> ApiResult<()> {
    if p.is_null() {
        Err(ApiError::arg(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Handles are tokens: the pointer value is the token.
pub(super) fn token(p: *mut c_void) -> u64 {
    p as usize as u64
}

pub(super) fn as_ptr(t: u64) -> *mut c_void {
    t as usize as *mut c_void
}

/// Write `v` through an out-pointer NCCL gave us.
pub(super) fn put<T>(out: *mut T, v: T, what: &str) -> ApiResult<()> {
    non_null(out, what)?;
    // SAFETY: `out` is non-null and, per the ext-net contract, points to a writable `T` owned
    // by the caller for the duration of the call.
    unsafe { out.write(v) };
    Ok(())
}

/// Read an input value NCCL passes by pointer.
pub(super) fn get<T: Copy>(p: *const T, what: &str) -> ApiResult<T> {
    non_null(p, what)?;
    // SAFETY: non-null; the ext-net contract gives an initialised `T` at `p` for the call.
    Ok(unsafe { p.read() })
}

/// NCCL's 128-byte handle buffer.
pub(super) fn handle_buf<'a>(p: *mut c_void) -> ApiResult<&'a mut [u8; NCCL_NET_HANDLE_MAXSIZE]> {
    non_null(p, "handle")?;
    // SAFETY: non-null; NCCL allocates NCCL_NET_HANDLE_MAXSIZE bytes for every handle and
    // keeps them alive and unshared across the listen/connect call.
    Ok(unsafe { &mut *(p as *mut [u8; NCCL_NET_HANDLE_MAXSIZE]) })
}

/// `n` elements of a C array NCCL passes in.
pub(super) fn array<'a, T>(p: *const T, n: usize, what: &str) -> ApiResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    non_null(p, what)?;
    // SAFETY: non-null, and the ext-net contract gives `n` initialised elements at `p`,
    // valid for the duration of the call.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

pub(super) fn count(n: c_int, what: &str) -> ApiResult<usize> {
    usize::try_from(n).map_err(|_| ApiError::arg(format!("{what} {n} is negative")))
}

/// The receive count of an `irecv`, checked against what the plugin advertises.
pub(super) fn recv_count(n: c_int) -> ApiResult<usize> {
    let n = count(n, "irecv count")?;
    let max = ha_core::api::ops::MAX_RECVS_ADVERTISED as usize;
    if n == 0 || n > max {
        return Err(ApiError::arg(format!(
            "irecv of {n} buffers (1..={max} supported)"
        )));
    }
    Ok(n)
}

/// The receive buffers of an `irecv`: `size(i)` converts the `i`-th C size.
pub(super) fn recv_bufs(
    n: usize,
    data: *mut *mut c_void,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    size: impl Fn(usize) -> ApiResult<i64>,
) -> ApiResult<Vec<RecvBuf>> {
    let data = array(data, n, "data")?;
    let tags = array(tags, n, "tags")?;
    let mhandles = array(mhandles, n, "mhandles")?;
    (0..n)
        .map(|i| {
            Ok(RecvBuf {
                addr: data[i] as usize,
                size: size(i)?,
                tag: tags[i],
                mr: token(mhandles[i]),
            })
        })
        .collect()
}

/// Whether NCCL marked an `irecv` completion-optional: it presets `*request` to
/// `NCCL_NET_OPTIONAL_RECV_COMPLETION` (v9+; NCCL's v8 adapter clears it first).
pub(super) fn optional_completion(request: *mut *mut c_void) -> ApiResult<bool> {
    let preset = get(request as *const *mut c_void, "request")?;
    Ok(preset as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION)
}

/// A `size_t` size as the api's signed size (sizes beyond `i64::MAX` are refused).
pub(super) fn size_t(v: usize, what: &str) -> ApiResult<i64> {
    i64::try_from(v).map_err(|_| ApiError::arg(format!("{what} size {v} is too large")))
}

/// `init`'s logger: NCCL's when given (else log lines go to stderr per `NCCL_DEBUG`).
pub(super) fn install_logger(logger: NcclDebugLogger) {
    if logger.is_some() {
        log::install(Arc::new(NcclLoggerSink(logger)));
    }
    log::ensure_subscriber();
}

/// The profiler callback of the last v10+ `init` that passed one. Stored only: the plugin
/// defines no profiler events.
static PROFILER: Mutex<NcclProfilerCallback> = Mutex::new(None);

pub(super) fn store_profiler(cb: NcclProfilerCallback) {
    if cb.is_some() {
        *PROFILER.lock() = cb;
    }
}

/// Device names live as long as the process: NCCL keeps the pointers.
static NAMES: Mutex<Vec<(CString, Option<CString>)>> = Mutex::new(Vec::new());

/// `(name, pciPath)` C strings of device `dev`, valid for the rest of the process.
pub(super) fn leak_names(dev: usize, d: &DeviceInfo) -> (*mut c_char, *mut c_char) {
    let (name, pci) = (d.name.as_str(), d.pci_path.as_deref());
    let mut names = NAMES.lock();
    while names.len() <= dev {
        names.push((CString::default(), None));
    }
    let entry = &mut names[dev];
    if entry.0.as_bytes() != name.as_bytes() {
        entry.0 = CString::new(name.replace('\0', "")).unwrap_or_default();
        entry.1 = pci.map(|p| CString::new(p.replace('\0', "")).unwrap_or_default());
    }
    // The CStrings are never dropped or replaced while their name is unchanged, and their
    // heap buffers do not move when the Vec grows.
    (
        entry.0.as_ptr() as *mut c_char,
        entry
            .1
            .as_ref()
            .map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut c_char),
    )
}

/// Write the per-buffer sizes `test` reports (NCCL's array is `int`; sizes clamp at
/// `INT_MAX`, which [`ha_core::api::ops::MAX_P2P_BYTES`] keeps NCCL far below).
pub(super) fn put_sizes(sizes: *mut c_int, got: &[u64]) {
    if sizes.is_null() {
        return;
    }
    for (i, s) in got.iter().enumerate() {
        // SAFETY: non-null; NCCL passes room for one size per buffer of the request it tests
        // (`got` has exactly that many).
        unsafe { sizes.add(i).write((*s).min(c_int::MAX as u64) as c_int) };
    }
}
