//! The v10 adapter (NCCL 2.26–2.27): v9 plus the communicator's traffic class passed to
//! `connect` in a config struct, and a profiler callback / per-request profiler handles
//! (NULL here).

use crate::abi::Abi;
use crate::call::{entry, rc, Call};
use crate::entries::{common_of, Common, RawTable, Size, Versioned};
use crate::props::{read_props, ArgArray, Props};
use crate::v8::missing_of;
use crate::v9::sized;
use crate::NetCtx;
use nccl_net_abi::common::NcclDebugLogger;
use nccl_net_abi::v10::{NcclNetCommConfigV10, NcclNetV10};
use nccl_net_abi::v8::NcclNetDeviceHandleV8;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

pub(crate) struct V10(pub &'static NcclNetV10);

impl Versioned for V10 {
    fn abi(&self) -> Abi {
        Abi::V10
    }
    fn name(&self) -> *const c_char {
        self.0.name
    }
    fn common(&self) -> Common {
        common_of!(self.0)
    }
    fn raw(&self) -> RawTable {
        RawTable::V10(self.0)
    }
    fn missing(&self) -> Vec<&'static str> {
        let t = self.0;
        missing_of(&[
            ("init", t.init.is_none()),
            ("getProperties", t.get_properties.is_none()),
            ("listen", t.listen.is_none()),
            ("connect", t.connect.is_none()),
            ("isend", t.isend.is_none()),
            ("irecv", t.irecv.is_none()),
        ])
    }
    fn init(
        &self,
        _comm_id: u64,
        _traffic_class: c_int,
        logger: NcclDebugLogger,
    ) -> Call<*mut c_void> {
        let f = entry(self.0.init, "init")?;
        // SAFETY: nullable logger and profiler callback: the caller's logger (NULL or a valid
        // C logger), NULL for the profiler.
        rc(unsafe { f(logger, None) })?;
        Ok(ptr::null_mut())
    }
    fn properties(&self, dev: c_int) -> Call<Props> {
        let f = entry(self.0.get_properties, "getProperties")?;
        // SAFETY: `p` is a writable, aligned, zeroed props struct for the call.
        let raw = read_props(|p| unsafe { f(dev, p) })?;
        Ok(Props::from_v9(&raw))
    }
    unsafe fn listen(
        &self,
        _ctx: &NetCtx,
        dev: c_int,
        handle: *mut c_void,
        comm: *mut *mut c_void,
    ) -> Call<()> {
        let f = entry(self.0.listen, "listen")?;
        // SAFETY: the trait's contract.
        rc(unsafe { f(dev, handle, comm) })
    }
    unsafe fn connect(
        &self,
        ctx: &NetCtx,
        dev: c_int,
        handle: *mut c_void,
        comm: *mut *mut c_void,
        dev_comm: *mut *mut NcclNetDeviceHandleV8,
    ) -> Call<()> {
        let f = entry(self.0.connect, "connect")?;
        let mut config = NcclNetCommConfigV10 {
            traffic_class: ctx.traffic_class(),
        };
        // SAFETY: the trait's contract; `config` is a live local (plugins copy it).
        rc(unsafe { f(dev, &mut config, handle, comm, dev_comm) })
    }
    unsafe fn isend(
        &self,
        comm: *mut c_void,
        data: *mut c_void,
        size: Size,
        tag: c_int,
        mr: *mut c_void,
        req: *mut *mut c_void,
    ) -> Call<()> {
        let f = entry(self.0.isend, "isend")?;
        let size = size.as_sized()?;
        // SAFETY: the trait's contract; the profiler handle is nullable and NULL.
        rc(unsafe { f(comm, data, size, tag, mr, ptr::null_mut(), req) })
    }
    unsafe fn irecv(
        &self,
        comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: &[Size],
        tags: *mut c_int,
        mrs: *mut *mut c_void,
        req: *mut *mut c_void,
    ) -> Call<()> {
        let f = entry(self.0.irecv, "irecv")?;
        let mut sz = sized(sizes)?;
        let mut ph = ArgArray::new(
            ptr::null_mut::<c_void>(),
            sizes.iter().map(|_| ptr::null_mut()),
        );
        // SAFETY: the trait's contract; `sz` and `ph` hold `n` elements (the profiler handles
        // are NULL) and outlive the call.
        rc(unsafe {
            f(
                comm,
                n,
                data,
                sz.as_mut_ptr(),
                tags,
                mrs,
                ph.as_mut_ptr(),
                req,
            )
        })
    }
}
