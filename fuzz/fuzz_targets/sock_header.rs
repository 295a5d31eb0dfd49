#![no_main]
//! libFuzzer entry of the `sock_header` target (body: `ha_fuzz::sock_header`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::sock_header(data));
