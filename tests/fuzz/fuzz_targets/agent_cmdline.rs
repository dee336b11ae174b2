//! libFuzzer target: see `mprov_agent::fuzz::agent_cmdline` (the kernel
//! command line split as the kernel does, the `mprov_*` parameters written
//! out and read back, the nonce never shown whole).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_agent::fuzz::agent_cmdline(data));
