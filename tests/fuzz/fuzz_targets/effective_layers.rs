//! libFuzzer target: see `mprov_control::fuzz::effective_layers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_control::fuzz::effective_layers(data));
