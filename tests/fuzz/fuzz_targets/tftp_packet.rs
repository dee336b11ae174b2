//! libFuzzer target: see `mprov_tftp::fuzz_packet` (parse, then the
//! encode/parse round trip and option negotiation must hold).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_tftp::fuzz_packet(data));
