//! libFuzzer target: see `mprov_control::fuzz::systems_filter`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_control::fuzz::systems_filter(data));
