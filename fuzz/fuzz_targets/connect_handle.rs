#![no_main]
//! libFuzzer entry of the `connect_handle` target (body: `ha_fuzz::connect_handle`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::connect_handle(data));
