//! libFuzzer target: see `mprov_agent::fuzz::agent_dhcp`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_agent::fuzz::agent_dhcp(data));
