#![no_main]
//! libFuzzer entry of the `connect_handle` target (body: `nccl_net_ha::fuzzing::connect_handle`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_net_ha::fuzzing::connect_handle(data));
