#![no_main]
//! libFuzzer entry of the `handshake_connector` target (body: `ha_fuzz::handshake_connector`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::handshake_connector(data));
