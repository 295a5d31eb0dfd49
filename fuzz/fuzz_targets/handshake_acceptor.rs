#![no_main]
//! libFuzzer entry of the `handshake_acceptor` target (body: `nccl_net_ha::fuzzing::handshake_acceptor`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_net_ha::fuzzing::handshake_acceptor(data));
