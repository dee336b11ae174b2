//! libFuzzer target: see `mprov_control::fuzz::request_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_control::fuzz::request_body(data));
