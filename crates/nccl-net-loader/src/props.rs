//! Device properties of any version, with the strings copied out, and the C argument
//! plumbing the adapters share (zeroed property structs, inline argument arrays).

use crate::call::{rc, Call};
use nccl_net_abi::common::NcclResult;
use nccl_net_abi::v9::NcclNetPropertiesV9;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::raw::c_char;

/// A device's properties (any version), with the strings copied out. Fields a version lacks
/// read as NCCL's adapter fills them for it (v8: `maxP2pBytes` 1 GiB, one physical device).
#[derive(Debug, Clone, PartialEq)]
pub struct Props {
    pub name: String,
    pub pci_path: Option<String>,
    pub guid: u64,
    pub ptr_support: i32,
    pub speed: i32,
    pub port: i32,
    pub latency: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub reg_is_global: i32,
    /// v9+: NCCL must flush every receive.
    pub force_flush: i32,
    /// v9+: the physical devices of this (virtual) device.
    pub vdevs: Vec<i32>,
    /// v9+: largest point-to-point transfer NCCL issues (v8: 1 GiB).
    pub max_p2p_bytes: usize,
    /// v9+: largest collective-offload transfer (v8: 512 MiB).
    pub max_coll_bytes: usize,
    /// v11+: requests per multi-request (before: 1).
    pub max_multi_request_size: i32,
    /// v12: the device's rail (before, and when unknown: -1, `NCCL_NET_ID_UNDEF`).
    pub rail_id: i16,
    /// v12: the device's network plane (before, and when unknown: -1).
    pub plane_id: i16,
}

impl Props {
    /// From v9's layout (v10's is the same; v11 and v12 add fields on top).
    pub(crate) fn from_v9(raw: &NcclNetPropertiesV9) -> Props {
        Props {
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
            vdevs: raw.v_props.devs[..(raw.v_props.ndevs.clamp(0, 4) as usize)].to_vec(),
            max_p2p_bytes: raw.max_p2p_bytes,
            max_coll_bytes: raw.max_coll_bytes,
            max_multi_request_size: 1,
            rail_id: -1,
            plane_id: -1,
        }
    }
}

/// Copies a plugin-owned C string (NULL gives `None`).
pub(crate) fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL strings handed out by a plugin (table name, property strings) are
    // NUL-terminated and live at least as long as the plugin is loaded; copied immediately.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Call a `getProperties` into a zeroed struct and return it.
pub(crate) fn read_props<T>(call: impl FnOnce(*mut T) -> NcclResult) -> Call<T> {
    let mut raw = MaybeUninit::<T>::zeroed();
    rc(call(raw.as_mut_ptr()))?;
    // SAFETY: every props type is plain data for which all-zero is a valid value (NULL
    // pointers, zero numbers), so the struct is initialised whether or not the plugin filled
    // every field.
    Ok(unsafe { raw.assume_init() })
}

/// Argument array for `irecv`/`iflush`: on the stack for the usual n <= 8.
pub(crate) enum ArgArray<T: Copy> {
    Inline([T; 8]),
    Heap(Vec<T>),
}

impl<T: Copy> ArgArray<T> {
    pub fn new(fill: T, items: impl ExactSizeIterator<Item = T>) -> Self {
        if items.len() <= 8 {
            let mut a = [fill; 8];
            for (slot, v) in a.iter_mut().zip(items) {
                *slot = v;
            }
            ArgArray::Inline(a)
        } else {
            ArgArray::Heap(items.collect())
        }
    }

    pub fn as_mut_ptr(&mut self) -> *mut T {
        match self {
            ArgArray::Inline(a) => a.as_mut_ptr(),
            ArgArray::Heap(v) => v.as_mut_ptr(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_array_inline_and_heap() {
        let mut small = ArgArray::new(0, [1, 2, 3].into_iter());
        assert!(matches!(small, ArgArray::Inline(_)));
        // SAFETY: the inline array holds 8 ints; the first three were set.
        let first3 = unsafe { std::slice::from_raw_parts(small.as_mut_ptr(), 3) };
        assert_eq!(first3, &[1, 2, 3]);
        let mut big = ArgArray::new(0, 0..20);
        assert!(matches!(big, ArgArray::Heap(ref v) if v.len() == 20));
        // SAFETY: the heap array holds 20 ints.
        let all = unsafe { std::slice::from_raw_parts(big.as_mut_ptr(), 20) };
        assert_eq!(all[19], 19);
    }
}
