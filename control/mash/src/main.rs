//! The `mash` binary: parse the command line, run it, print errors with their
//! causes. Everything else is in the library, so tests drive the same code.

#![warn(missing_docs)]

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = mash::Cli::parse();
    let mut stdout = std::io::stdout().lock();
    let result = mash::run(cli, &mut stdout).and_then(|()| Ok(stdout.flush()?));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `mash systems list | head` closing the pipe early is not an error.
        Err(err)
            if err
                .chain()
                .filter_map(|e| e.downcast_ref::<std::io::Error>())
                .any(|e| e.kind() == ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("mash: {err:#}");
            ExitCode::FAILURE
        }
    }
}
