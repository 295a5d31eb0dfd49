#![no_main]
//! libFuzzer entry of the `data_layout` target (body: `nccl_net_ha::fuzzing::data_layout`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_net_ha::fuzzing::data_layout(data));
