//! `cargo xtask bench [NAME] [--smoke]`: run the benchmarks.
//!
//! A benchmark is either a script `tests/bench/<name>.sh` or a Rust function
//! registered in [`RUST_BENCHES`]; `tests/bench/README.md` says how to add one.
//! `--smoke` asks each benchmark for a short run that only proves it works, so
//! tests can run them too.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::{run, step, workspace_root};

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone, Default)]
pub struct BenchOptions {
    /// Run only the benchmark of this name.
    pub name: Option<String>,
    /// A short run that only proves the benchmark works.
    pub smoke: bool,
}

/// A benchmark written in Rust.
#[derive(Debug)]
pub struct RustBench {
    /// The name that `cargo xtask bench NAME` selects.
    pub name: &'static str,
    /// Runs the benchmark; the argument is `--smoke`.
    pub run: fn(smoke: bool) -> Result<()>,
}

/// The Rust benchmarks.
pub const RUST_BENCHES: &[RustBench] = &[
    RustBench {
        name: "backup",
        run: crate::backup_bench::run,
    },
    RustBench {
        name: "inventory",
        run: crate::inventory_bench::run,
    },
    RustBench {
        name: "enroll",
        run: crate::enroll_bench::run,
    },
    RustBench {
        name: "netboot",
        run: crate::netboot_bench::run,
    },
    RustBench {
        name: "pages",
        run: crate::pages_bench::run,
    },
    RustBench {
        name: "storm",
        run: crate::storm::bench,
    },
];

/// One benchmark found.
#[derive(Debug)]
enum Bench {
    Rust(&'static RustBench),
    Script { name: String, path: PathBuf },
}

impl Bench {
    fn name(&self) -> &str {
        match self {
            Bench::Rust(bench) => bench.name,
            Bench::Script { name, .. } => name,
        }
    }
}

/// Runs the selected benchmarks, all of them even if one fails.
pub fn bench(options: &BenchOptions) -> Result<()> {
    let root = workspace_root();
    let folder = root.join("tests").join("bench");
    let benches = discover(&folder, RUST_BENCHES)?;
    let selected: Vec<&Bench> = match &options.name {
        None => benches.iter().collect(),
        Some(name) => {
            let found: Vec<&Bench> = benches.iter().filter(|b| b.name() == name).collect();
            if found.is_empty() {
                let names: Vec<&str> = benches.iter().map(Bench::name).collect();
                bail!(
                    "no benchmark {name}; there are: {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                );
            }
            found
        }
    };
    if selected.is_empty() {
        eprintln!(
            "no benchmarks yet: see {} for how to add one",
            folder.join("README.md").display()
        );
        return Ok(());
    }

    let mut failed = Vec::new();
    for bench in selected {
        step(&format!("bench: {}", bench.name()));
        let result = match bench {
            Bench::Rust(bench) => (bench.run)(options.smoke),
            Bench::Script { path, .. } => run(Command::new("bash")
                .arg(path)
                .current_dir(&root)
                .env("MPROV_BENCH_SMOKE", if options.smoke { "1" } else { "0" })
                .env("MPROV_WORKSPACE", &root)),
        };
        if let Err(err) = result {
            eprintln!("bench {}: FAILED: {err:#}", bench.name());
            failed.push(bench.name());
        }
    }
    if !failed.is_empty() {
        bail!("failed benchmarks: {}", failed.join(", "));
    }
    Ok(())
}

/// The scripts `folder/*.sh` and the Rust benchmarks, sorted by name. Names
/// must be unique.
fn discover(folder: &Path, rust: &'static [RustBench]) -> Result<Vec<Bench>> {
    let mut benches: Vec<Bench> = rust.iter().map(Bench::Rust).collect();
    let entries = fs::read_dir(folder).with_context(|| format!("listing {}", folder.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", folder.display()))?
            .path();
        if path.extension().is_some_and(|e| e == "sh") && path.is_file() {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .with_context(|| format!("{} has no UTF-8 name", path.display()))?
                .to_string();
            benches.push(Bench::Script { name, path });
        }
    }
    benches.sort_by(|a, b| a.name().cmp(b.name()));
    if let Some(pair) = benches.windows(2).find(|w| w[0].name() == w[1].name()) {
        bail!("two benchmarks are named {}", pair[0].name());
    }
    Ok(benches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_smoke: bool) -> Result<()> {
        Ok(())
    }

    static RUST: &[RustBench] = &[RustBench {
        name: "b_rust",
        run: ok,
    }];

    #[test]
    fn discover_finds_scripts_and_rust_benches() -> Result<()> {
        let dir = tempfile::tempdir()?;
        for file in ["c.sh", "a.sh", "README.md", "notes.txt"] {
            fs::write(dir.path().join(file), "")?;
        }
        fs::create_dir(dir.path().join("d.sh"))?;
        let names: Vec<String> = discover(dir.path(), RUST)?
            .iter()
            .map(|b| b.name().to_string())
            .collect();
        assert_eq!(names, ["a", "b_rust", "c"]);
        Ok(())
    }

    #[test]
    fn discover_rejects_duplicate_names() -> Result<()> {
        let dir = tempfile::tempdir()?;
        fs::write(dir.path().join("b_rust.sh"), "")?;
        let err = discover(dir.path(), RUST).expect_err("duplicate");
        assert!(format!("{err:#}").contains("b_rust"), "{err:#}");
        Ok(())
    }
}
