//! `mprov-jobserver`: see `mprov_boot::cli`.

#![warn(missing_docs)]

fn main() -> std::process::ExitCode {
    mprov_boot::cli::main()
}
