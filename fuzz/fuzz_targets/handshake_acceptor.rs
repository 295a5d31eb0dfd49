#![no_main]
//! libFuzzer entry of the `handshake_acceptor` target (body: `ha_fuzz::handshake_acceptor`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::handshake_acceptor(data));
