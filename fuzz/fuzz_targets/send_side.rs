#![no_main]
//! libFuzzer entry of the `send_side` target (body: `nccl_net_ha::fuzzing::send_side`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_net_ha::fuzzing::send_side(data));
