//! libFuzzer target: see `mprov_agent::fuzz::agent_manifest`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_agent::fuzz::agent_manifest(data));
