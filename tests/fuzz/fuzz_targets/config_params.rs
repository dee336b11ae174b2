//! libFuzzer target: see `mprov_control::fuzz::config_params`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_control::fuzz::config_params(data));
