//! `mprov-agent`: `/init` when the kernel starts it as PID 1, a small CLI
//! otherwise. Everything lives in the library; see its module docs.

#![warn(missing_docs)]

use std::process::ExitCode;

/// mimalloc rather than libc's allocator: the static agent links musl,
/// whose allocator serialises every thread of the stream on one lock and
/// unmaps freed memory, so each file's buffer page-faults afresh
/// (`tests/bench/RESULTS.md`, "agent").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // As PID 1 the kernel hands us the command line's leftovers as arguments
    // and environment, which are not ours to parse: PID 1 is always `/init`,
    // and `/init` is never run any other way (it powers the machine off).
    if std::process::id() == 1 {
        mprov_agent::init::run()
    }
    mprov_agent::cli::run()
}
