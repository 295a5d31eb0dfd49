//! The exported `ncclNetPlugin_v8` table and its thin adapters: each entry point checks the
//! C pointers NCCL hands in, converts them to plain values, and calls `api::ops` under
//! `api::ops::guard` (panic-safe, errors logged and mapped to `ncclResult_t`).

use super::common::*;
use super::logger::NcclLoggerSink;
use super::v8_types::{NcclNetDeviceHandleV8, NcclNetPropertiesV8, NcclNetV8};
use crate::api::ops::{self, guard, RecvBuf};
use crate::api::{log, ApiError, ApiResult};
use parking_lot::Mutex;
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Arc;

/// NCCL loads this symbol; `name` is what `NCCL_NET=HA` matches.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v8: NcclNetV8 = NcclNetV8 {
    name: c"HA".as_ptr(),
    init: Some(init),
    devices: Some(devices),
    get_properties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
};

fn code(c: crate::api::Code) -> NcclResult {
    c as NcclResult
}

fn non_null<T>(p: *const T, what: &str) -> ApiResult<()> {
    if p.is_null() {
        Err(ApiError::arg(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Handles are tokens: the pointer value is the token.
fn token(p: *mut c_void) -> u64 {
    p as usize as u64
}

fn as_ptr(t: u64) -> *mut c_void {
    t as usize as *mut c_void
}

/// Write `v` through an out-pointer NCCL gave us.
fn put<T>(out: *mut T, v: T, what: &str) -> ApiResult<()> {
    non_null(out, what)?;
    // SAFETY: `out` is non-null and, per the ext-net contract, points to a writable `T` owned
    // by the caller for the duration of the call.
    unsafe { out.write(v) };
    Ok(())
}

/// NCCL's 128-byte handle buffer.
fn handle_buf<'a>(p: *mut c_void) -> ApiResult<&'a mut [u8; NCCL_NET_HANDLE_MAXSIZE]> {
    non_null(p, "handle")?;
    // SAFETY: non-null; NCCL allocates NCCL_NET_HANDLE_MAXSIZE bytes for every handle and
    // keeps them alive and unshared across the listen/connect call.
    Ok(unsafe { &mut *(p as *mut [u8; NCCL_NET_HANDLE_MAXSIZE]) })
}

/// `n` elements of a C array NCCL passes in.
fn array<'a, T>(p: *const T, n: usize, what: &str) -> ApiResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    non_null(p, what)?;
    // SAFETY: non-null, and the ext-net contract gives `n` initialised elements at `p`,
    // valid for the duration of the call.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

fn count(n: c_int, what: &str) -> ApiResult<usize> {
    usize::try_from(n).map_err(|_| ApiError::arg(format!("{what} {n} is negative")))
}

unsafe extern "C" fn init(logger: NcclDebugLogger) -> NcclResult {
    code(guard("init", || {
        if logger.is_some() {
            log::install(Arc::new(NcclLoggerSink(logger)));
        }
        log::ensure_subscriber();
        ops::init()
    }))
}

unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    code(guard("devices", || put(ndev, ops::devices()?, "ndev")))
}

/// Device names live as long as the process: NCCL keeps the pointers.
static NAMES: Mutex<Vec<(CString, Option<CString>)>> = Mutex::new(Vec::new());

fn leak_names(dev: usize, name: &str, pci: Option<&str>) -> (*mut c_char, *mut c_char) {
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

unsafe extern "C" fn get_properties(dev: c_int, props: *mut NcclNetPropertiesV8) -> NcclResult {
    code(guard("getProperties", || {
        let d = ops::properties(dev)?;
        let (name, pci) = leak_names(dev as usize, &d.name, d.pci_path.as_deref());
        put(
            props,
            NcclNetPropertiesV8 {
                name,
                pci_path: pci,
                guid: d.guid,
                ptr_support: d.ptr_support,
                reg_is_global: 0,
                speed: d.speed_mbps,
                port: d.port,
                latency: 0.0,
                max_comms: d.max_comms,
                max_recvs: ops::MAX_RECVS_ADVERTISED,
                net_device_type: NCCL_NET_DEVICE_HOST,
                net_device_version: 0,
            },
            "props",
        )
    }))
}

unsafe extern "C" fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    code(guard("listen", || {
        non_null(listen_comm, "listenComm")?;
        let t = ops::listen(dev, handle_buf(handle)?)?;
        put(listen_comm, as_ptr(t), "listenComm")
    }))
}

unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut NcclNetDeviceHandleV8,
) -> NcclResult {
    code(guard("connect", || {
        non_null(send_comm, "sendComm")?;
        if !dev_comm.is_null() {
            put(dev_comm, std::ptr::null_mut(), "sendDevComm")?;
        }
        let t = ops::connect(dev, handle_buf(handle)?)?;
        put(send_comm, as_ptr(t), "sendComm")
    }))
}

unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    dev_comm: *mut *mut NcclNetDeviceHandleV8,
) -> NcclResult {
    code(guard("accept", || {
        non_null(recv_comm, "recvComm")?;
        if !dev_comm.is_null() {
            put(dev_comm, std::ptr::null_mut(), "recvDevComm")?;
        }
        let t = ops::accept(token(listen_comm))?;
        put(recv_comm, as_ptr(t), "recvComm")
    }))
}

unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    code(guard("regMr", || {
        non_null(mhandle, "mhandle")?;
        let t = ops::reg_mr(token(comm), data as usize, size, ptr_type)?;
        put(mhandle, as_ptr(t), "mhandle")
    }))
}

unsafe extern "C" fn reg_mr_dma_buf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    _offset: u64,
    _fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    code(guard("regMrDmaBuf", || {
        non_null(mhandle, "mhandle")?;
        // The memory type decides: host memory needs no dma-buf; others are refused by
        // the device's ptrSupport check.
        let t = ops::reg_mr(token(comm), data as usize, size, ptr_type)?;
        put(mhandle, as_ptr(t), "mhandle")
    }))
}

unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    code(guard("deregMr", || {
        ops::dereg_mr(token(comm), token(mhandle))
    }))
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("isend", || {
        non_null(request, "request")?;
        let t = ops::isend(
            token(send_comm),
            data as usize,
            size as i64,
            tag,
            token(mhandle),
        )?;
        put(request, as_ptr(t), "request")
    }))
}

unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("irecv", || {
        non_null(request, "request")?;
        let n = count(n, "irecv count")?;
        if n == 0 || n > ops::MAX_RECVS_ADVERTISED as usize {
            return Err(ApiError::arg(format!(
                "irecv of {n} buffers (1..={} supported)",
                ops::MAX_RECVS_ADVERTISED
            )));
        }
        let data = array(data, n, "data")?;
        let sizes = array(sizes, n, "sizes")?;
        let tags = array(tags, n, "tags")?;
        let mhandles = array(mhandles, n, "mhandles")?;
        let bufs: Vec<RecvBuf> = (0..n)
            .map(|i| RecvBuf {
                addr: data[i] as usize,
                size: sizes[i] as i64,
                tag: tags[i],
                mr: token(mhandles[i]),
            })
            .collect();
        let t = ops::irecv(token(recv_comm), &bufs)?;
        put(request, as_ptr(t), "request")
    }))
}

unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("iflush", || {
        non_null(request, "request")?;
        let t = ops::iflush(token(recv_comm), n)?;
        put(request, as_ptr(t), "request")
    }))
}

unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    code(guard("test", || {
        non_null(done, "done")?;
        match ops::test(token(request))? {
            None => put(done, 0, "done"),
            Some(got) => {
                if !sizes.is_null() {
                    for (i, s) in got.iter().enumerate() {
                        // SAFETY: non-null; NCCL passes room for one size per buffer of the
                        // request it tests (`got` has exactly that many).
                        unsafe { sizes.add(i).write((*s).min(c_int::MAX as u64) as c_int) };
                    }
                }
                put(done, 1, "done")
            }
        }
    }))
}

unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
    code(guard("closeSend", || ops::close_send(token(comm))))
}

unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
    code(guard("closeRecv", || ops::close_recv(token(comm))))
}

unsafe extern "C" fn close_listen(comm: *mut c_void) -> NcclResult {
    code(guard("closeListen", || ops::close_listen(token(comm))))
}
