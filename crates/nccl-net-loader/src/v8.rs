//! The v8 adapter (NCCL 2.20–2.23): `int` message sizes, one `init` per process, no context,
//! no traffic class, v8's properties (NCCL fills `maxP2pBytes` 1 GiB and one physical device).

use crate::abi::Abi;
use crate::call::{entry, rc, Call};
use crate::entries::{common_of, Common, RawTable, Size, Versioned};
use crate::props::{c_string, read_props, ArgArray, Props};
use crate::NetCtx;
use nccl_net_abi::common::NcclDebugLogger;
use nccl_net_abi::v8::{NcclNetDeviceHandleV8, NcclNetPropertiesV8, NcclNetV8};
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

pub(crate) struct V8(pub &'static NcclNetV8);

impl Versioned for V8 {
    fn abi(&self) -> Abi {
        Abi::V8
    }
    fn name(&self) -> *const c_char {
        self.0.name
    }
    fn common(&self) -> Common {
        common_of!(self.0)
    }
    fn raw(&self) -> RawTable {
        RawTable::V8(self.0)
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
        // SAFETY: `init` takes a nullable logger; the caller's (NULL or a valid C logger).
        rc(unsafe { f(logger) })?;
        Ok(ptr::null_mut())
    }
    fn properties(&self, dev: c_int) -> Call<Props> {
        let f = entry(self.0.get_properties, "getProperties")?;
        // SAFETY: `p` is a writable, aligned, zeroed props struct for the call.
        let raw: NcclNetPropertiesV8 = read_props(|p| unsafe { f(dev, p) })?;
        Ok(Props {
            name: c_string(raw.name).unwrap_or_default(),
            pci_path: c_string(raw.pci_path),
            guid: raw.guid,
            ptr_support: raw.ptr_support,
            speed: raw.speed,
            port: raw.port,
            latency: raw.latency,
            max_comms: raw.max_comms,
            max_recvs: raw.max_recvs,
            reg_is_global: raw.reg_is_global,
            force_flush: 0,
            vdevs: vec![dev],
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 512 << 20,
            max_multi_request_size: 1,
            rail_id: -1,
            plane_id: -1,
        })
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
        _ctx: &NetCtx,
        dev: c_int,
        handle: *mut c_void,
        comm: *mut *mut c_void,
        dev_comm: *mut *mut NcclNetDeviceHandleV8,
    ) -> Call<()> {
        let f = entry(self.0.connect, "connect")?;
        // SAFETY: the trait's contract.
        rc(unsafe { f(dev, handle, comm, dev_comm) })
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
        let size = size.as_int()?;
        // SAFETY: the trait's contract.
        rc(unsafe { f(comm, data, size, tag, mr, req) })
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
        let ints: Vec<c_int> = sizes.iter().map(|s| s.as_int()).collect::<Call<_>>()?;
        let mut sz = ArgArray::new(0, ints.into_iter());
        // NCCL's v8 adapter never passes the optional-completion hint.
        // SAFETY: `req` is writable (the trait's contract).
        unsafe { req.write(ptr::null_mut()) };
        // SAFETY: the trait's contract; `sz` holds `n` ints and outlives the call.
        rc(unsafe { f(comm, n, data, sz.as_mut_ptr(), tags, mrs, req) })
    }
}

/// The names whose flag is set.
pub(crate) fn missing_of(entries: &[(&'static str, bool)]) -> Vec<&'static str> {
    entries
        .iter()
        .filter_map(|&(name, missing)| missing.then_some(name))
        .collect()
}
