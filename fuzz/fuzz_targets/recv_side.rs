#![no_main]
//! libFuzzer entry of the `recv_side` target (body: `nccl_net_ha::fuzzing::recv_side`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_net_ha::fuzzing::recv_side(data));
