//! `mprov-control`: see `mprov_control::cli` for the subcommands. The logic lives
//! in the library so tests can drive it without a process.

#![warn(missing_docs)]

fn main() -> std::process::ExitCode {
    mprov_control::cli::main()
}
