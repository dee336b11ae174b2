//! libFuzzer target: see `mprov_agent::fuzz::agent_script_plan`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_agent::fuzz::agent_script_plan(data));
