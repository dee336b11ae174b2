//! libFuzzer target: see `mprov_dhcp::fuzz_packet` (decode, handle, encode).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_dhcp::fuzz_packet(data));
