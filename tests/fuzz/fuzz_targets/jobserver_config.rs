//! libFuzzer target: see `mprov_boot::config::fuzz::fuzz_config` (up to
//! four config files, NUL-separated, loaded from memory with their
//! includes; errors name a file and line, a loaded config lists only this
//! release's modules, and the environment-rendered file loads back to the
//! values it was rendered from).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_boot::config::fuzz::fuzz_config(data));
