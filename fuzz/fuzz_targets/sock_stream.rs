#![no_main]
//! libFuzzer entry of the `sock_stream` target (body: `nccl_net_ha::fuzzing::sock_stream`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_net_ha::fuzzing::sock_stream(data));
