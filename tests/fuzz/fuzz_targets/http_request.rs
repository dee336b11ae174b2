//! libFuzzer target: see `mprov_fileserver::fuzz_request` (request heads,
//! pipelined, through parsing, path resolution and reply planning; paths stay
//! in their folder, ranges inside the file, reply heads parse back).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mprov_fileserver::fuzz_request(data));
