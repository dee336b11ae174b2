//! libFuzzer target: see `mprov_dns::fuzz_query` (request bytes over UDP
//! and TCP through the whole handler; every response well formed, and the
//! fast path's answers the same as hickory's catalog).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_dns::fuzz_query(data));
