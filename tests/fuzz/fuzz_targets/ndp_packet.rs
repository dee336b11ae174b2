//! libFuzzer target: see `mprov_dhcp::ra::fuzz_packet` (Router Solicitation
//! and Advertisement decode, `decode(encode(x)) == x`, the RFC 4861 checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_dhcp::ra::fuzz_packet(data));
