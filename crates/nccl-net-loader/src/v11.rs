//! The v11 adapter (NCCL 2.28): `init` once per communicator returns a context (communicator
//! id and traffic class in the config) that `listen` and `connect` take; `finalize(ctx)`,
//! `setNetAttr(ctx, attr)`; `maxMultiRequestSize` in the properties.

use crate::abi::Abi;
use crate::call::{entry, rc, Call};
use crate::entries::{common_of, Common, RawTable, Size, Versioned};
use crate::props::{read_props, ArgArray, Props};
use crate::v8::missing_of;
use crate::v9::sized;
use crate::NetCtx;
use nccl_net_abi::common::NcclDebugLogger;
use nccl_net_abi::v11::{NcclNetAttrV11, NcclNetPropertiesV11, NcclNetV11};
use nccl_net_abi::v8::NcclNetDeviceHandleV8;
use nccl_net_abi::v9::NcclNetPropertiesV9;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

pub(crate) struct V11(pub &'static NcclNetV11);

impl Versioned for V11 {
    fn abi(&self) -> Abi {
        Abi::V11
    }
    fn name(&self) -> *const c_char {
        self.0.name
    }
    fn common(&self) -> Common {
        common_of!(self.0)
    }
    fn raw(&self) -> RawTable {
        RawTable::V11(self.0)
    }
    context_entries!();

    fn properties(&self, dev: c_int) -> Call<Props> {
        let f = entry(self.0.get_properties, "getProperties")?;
        // SAFETY: `p` is a writable, aligned, zeroed props struct for the call.
        let raw: NcclNetPropertiesV11 = read_props(|p| unsafe { f(dev, p) })?;
        let as_v9 = NcclNetPropertiesV9 {
            name: raw.name,
            pci_path: raw.pci_path,
            guid: raw.guid,
            ptr_support: raw.ptr_support,
            reg_is_global: raw.reg_is_global,
            force_flush: raw.force_flush,
            speed: raw.speed,
            port: raw.port,
            latency: raw.latency,
            max_comms: raw.max_comms,
            max_recvs: raw.max_recvs,
            net_device_type: raw.net_device_type,
            net_device_version: raw.net_device_version,
            v_props: raw.v_props,
            max_p2p_bytes: raw.max_p2p_bytes,
            max_coll_bytes: raw.max_coll_bytes,
        };
        Ok(Props {
            max_multi_request_size: raw.max_multi_request_size,
            ..Props::from_v9(&as_v9)
        })
    }
}

/// The entries v11 and v12 declare alike (all but the properties): `init` per communicator
/// returning a context, `finalize`, `setNetAttr`, `listen`/`connect` in a context, `size_t`
/// sends and receives with profiler handles. Expanded inside each adapter's `impl`.
macro_rules! context_entries {
    () => {
        fn missing(&self) -> Vec<&'static str> {
            let t = self.0;
            missing_of(&[
                ("init", t.init.is_none()),
                ("getProperties", t.get_properties.is_none()),
                ("listen", t.listen.is_none()),
                ("connect", t.connect.is_none()),
                ("isend", t.isend.is_none()),
                ("irecv", t.irecv.is_none()),
                ("finalize", t.finalize.is_none()),
            ])
        }
        fn init(
            &self,
            comm_id: u64,
            traffic_class: c_int,
            logger: NcclDebugLogger,
        ) -> Call<*mut c_void> {
            let f = entry(self.0.init, "init")?;
            let mut ctx: *mut c_void = ptr::null_mut();
            let mut config = nccl_net_abi::v10::NcclNetCommConfigV10 { traffic_class };
            // SAFETY: `ctx` and `config` are live locals for the call (plugins copy the config);
            // logger and profiler callback are nullable: the caller's logger, NULL profiler.
            rc(unsafe { f(&mut ctx, comm_id, &mut config, logger, None) })?;
            Ok(ctx)
        }
        fn finalize(&self, ctx: *mut c_void) -> Call<()> {
            let f = entry(self.0.finalize, "finalize")?;
            // SAFETY: `ctx` came from this plugin's `init` and the caller finalizes it once.
            rc(unsafe { f(ctx) })
        }
        fn set_net_attr(&self, ctx: *mut c_void, attr: &NcclNetAttrV11) -> Call<bool> {
            let Some(f) = self.0.set_net_attr else {
                return Ok(false);
            };
            let mut a = *attr;
            // SAFETY: live context of this plugin; `a` is a live local copy for the call.
            rc(unsafe { f(ctx, &mut a) })?;
            Ok(true)
        }
        unsafe fn listen(
            &self,
            ctx: &NetCtx,
            dev: c_int,
            handle: *mut c_void,
            comm: *mut *mut c_void,
        ) -> Call<()> {
            let f = entry(self.0.listen, "listen")?;
            // SAFETY: the trait's contract; `ctx` is a live context of this plugin.
            rc(unsafe { f(ctx.as_ptr(), dev, handle, comm) })
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
            // SAFETY: the trait's contract; `ctx` is a live context of this plugin.
            rc(unsafe { f(ctx.as_ptr(), dev, handle, comm, dev_comm) })
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
    };
}
pub(crate) use context_entries;
