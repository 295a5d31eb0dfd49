#![no_main]
//! libFuzzer entry of the `sock_header` target (body: `nccl_net_ha::fuzzing::sock_header`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_net_ha::fuzzing::sock_header(data));
