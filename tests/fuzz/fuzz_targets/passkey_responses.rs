//! libFuzzer target: see `mprov_control::fuzz::passkey_responses`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_control::fuzz::passkey_responses(data));
