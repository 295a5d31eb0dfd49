#![no_main]
//! libFuzzer entry of the `recv_side` target (body: `ha_fuzz::recv_side`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::recv_side(data));
