#![no_main]
//! libFuzzer entry of the `data_layout` target (body: `ha_fuzz::data_layout`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ha_fuzz::data_layout(data));
