//! The v12 adapter (NCCL 2.30): v11's table and calls with the v12 properties (8 devices per
//! virtual NIC, `railId` and `planeId`).

use crate::abi::Abi;
use crate::call::{entry, rc, Call};
use crate::entries::{common_of, Common, RawTable, Size, Versioned};
use crate::props::{c_string, read_props, ArgArray, Props};
use crate::v11::context_entries;
use crate::v8::missing_of;
use crate::v9::sized;
use crate::NetCtx;
use nccl_net_abi::common::NcclDebugLogger;
use nccl_net_abi::v11::NcclNetAttrV11;
use nccl_net_abi::v12::{NcclNetPropertiesV12, NcclNetV12};
use nccl_net_abi::v8::NcclNetDeviceHandleV8;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

pub(crate) struct V12(pub &'static NcclNetV12);

impl Versioned for V12 {
    fn abi(&self) -> Abi {
        Abi::V12
    }
    fn name(&self) -> *const c_char {
        self.0.name
    }
    fn common(&self) -> Common {
        common_of!(self.0)
    }
    fn raw(&self) -> RawTable {
        RawTable::V12(self.0)
    }
    context_entries!();

    fn properties(&self, dev: c_int) -> Call<Props> {
        let f = entry(self.0.get_properties, "getProperties")?;
        // SAFETY: `p` is a writable, aligned, zeroed props struct for the call.
        let raw: NcclNetPropertiesV12 = read_props(|p| unsafe { f(dev, p) })?;
        let n = raw.v_props.ndevs.clamp(0, raw.v_props.devs.len() as i32) as usize;
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
            force_flush: raw.force_flush,
            vdevs: raw.v_props.devs[..n].to_vec(),
            max_p2p_bytes: raw.max_p2p_bytes,
            max_coll_bytes: raw.max_coll_bytes,
            max_multi_request_size: raw.max_multi_request_size,
            rail_id: raw.rail_id,
            plane_id: raw.plane_id,
        })
    }
}
