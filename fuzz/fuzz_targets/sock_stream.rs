#![no_main]
//! libFuzzer entry of the `sock_stream` target (body: `ha_fuzz::sock_stream`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::sock_stream(data));
