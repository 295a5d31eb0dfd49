#![no_main]
//! libFuzzer entry of the `send_side` target (body: `ha_fuzz::send_side`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::send_side(data));
