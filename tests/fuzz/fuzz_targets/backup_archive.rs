//! libFuzzer target: see `mprov_control::fuzz::backup_archive`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_control::fuzz::backup_archive(data));
