//! libFuzzer target: see `mprov_lldp::fuzz::lldp_frame` (parse as a frame
//! and as an LLDPDU; what parses re-encodes and parses to the same value).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_lldp::fuzz::lldp_frame(data));
