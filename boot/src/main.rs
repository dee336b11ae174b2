//! `mprov-jobserver`: see `mprov_boot::cli`.

fn main() -> std::process::ExitCode {
    mprov_boot::cli::main()
}
