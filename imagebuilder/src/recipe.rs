//! The build recipe: where the root comes from and which image-gen scripts run
//! in it. Written by hand as YAML (`mprov-image build --recipe FILE`) or put
//! together from the command line's flags.
//!
//! ```yaml
//! slug: compute
//! source:
//!   bootstrap:
//!     tool: mmdebstrap          # or dnf
//!     suite: bookworm           # dnf: the release version
//!     variant: minbase
//!     include: [systemd-sysv, linux-image-amd64]
//!     mirrors: [/etc/apt/sources.list.d/debian.sources]
//! scripts:
//!   - slug: serial-console
//!     file: serial-console.sh   # relative to the recipe
//!   - slug: tune
//!     content: "echo tuned > /etc/tuned"
//!     depends_on: [serial-console]
//! ```
//!
//! Scripts mirror the control service's `scripts` kind (slug, content,
//! `depends_on`); [`Recipe::script_order`] sorts them so each runs after what
//! it depends on, by the script-runner's rule (`mprov_agent::scripts::plan`:
//! dependency layers, each by slug), so the order is stable and the same as
//! an inventory image's.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The image's slug.
    pub slug: String,
    /// Where the root comes from.
    pub source: Source,
    /// Image-gen scripts, run in the root in dependency order.
    #[serde(default)]
    pub scripts: Vec<Script>,
}

/// Where the root comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Source {
    /// A distro bootstrap.
    Bootstrap(Bootstrap),
    /// A root directory, copied (or packed in place when nothing changes it).
    Dir(PathBuf),
    /// An OCI image layout or a `docker save` archive.
    Oci {
        /// The layout directory or archive file.
        path: PathBuf,
        /// The image's name, when the source holds several.
        #[serde(default, rename = "ref")]
        reference: Option<String>,
    },
}

/// A distro bootstrap.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bootstrap {
    /// The tool.
    pub tool: BootstrapTool,
    /// mmdebstrap: the suite (`bookworm`); dnf: the release version (`9`).
    pub suite: String,
    /// mmdebstrap's variant (default `minbase`); not used by dnf.
    #[serde(default)]
    pub variant: Option<String>,
    /// Extra packages (dnf: the packages; default `@core`).
    #[serde(default)]
    pub include: Vec<String>,
    /// mmdebstrap's MIRROR arguments (URLs, `deb ...` lines, or a sources
    /// file such as the host's); none means mmdebstrap's default. dnf uses the
    /// host's repositories.
    #[serde(default)]
    pub mirrors: Vec<String>,
}

/// The bootstrap tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootstrapTool {
    /// `dnf --installroot`, for Fedora, RHEL and their rebuilds.
    Dnf,
    /// mmdebstrap, for Debian and Ubuntu.
    Mmdebstrap,
}

/// An image-gen script.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Its unique name.
    pub slug: String,
    /// The script itself (a `#!` line picks the interpreter, else `/bin/sh`).
    #[serde(default)]
    pub content: Option<String>,
    /// A file holding it, relative to the recipe.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Scripts that must run before this one.
    #[serde(default)]
    pub depends_on: Vec<String>,
}

/// Why a recipe is unusable.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// The scripts' dependencies form a cycle.
    #[error("script dependencies form a cycle through: {}", slugs.join(", "))]
    Cycle {
        /// The scripts on a cycle.
        slugs: Vec<String>,
    },
    /// Two scripts share a slug.
    #[error("two scripts are called {slug}")]
    Duplicate {
        /// The slug.
        slug: String,
    },
    /// A script has both or neither of `content` and `file`.
    #[error("script {slug}: give exactly one of content and file")]
    NoContent {
        /// The script.
        slug: String,
    },
    /// The recipe file cannot be read or parsed.
    #[error("reading the recipe {path}")]
    Read {
        /// The recipe.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// A script depends on one that is not in the recipe.
    #[error("script {slug} depends on {missing}, which the recipe does not have")]
    UnknownDependency {
        /// The script.
        slug: String,
        /// The missing dependency.
        missing: String,
    },
}

impl Recipe {
    /// Reads a YAML recipe; relative paths in it (a `dir` or `oci` source,
    /// script files) are taken relative to the recipe's folder and script
    /// files are read into `content`.
    pub fn read(path: &Path) -> Result<Recipe, RecipeError> {
        let read_err = |err| RecipeError::Read {
            path: path.to_path_buf(),
            err,
        };
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        let mut recipe = Self::from_yaml(&text).map_err(read_err)?;
        let base = path.parent().unwrap_or(Path::new("."));
        match &mut recipe.source {
            Source::Dir(p) | Source::Oci { path: p, .. } => *p = base.join(&*p),
            Source::Bootstrap(_) => {}
        }
        for script in &mut recipe.scripts {
            if let (None, Some(file)) = (&script.content, &script.file) {
                let file = base.join(file);
                let content = std::fs::read_to_string(&file).map_err(|err| RecipeError::Read {
                    path: file.clone(),
                    err,
                })?;
                script.content = Some(content);
                script.file = None;
            }
        }
        Ok(recipe)
    }

    /// Parses a recipe from YAML, paths as written.
    pub fn from_yaml(text: &str) -> io::Result<Recipe> {
        serde_saphyr::from_str(text).map_err(|err| io::Error::other(err.to_string()))
    }

    /// The scripts in the order to run them: each after its dependencies,
    /// otherwise by slug. Checks every script has content, that dependencies
    /// exist, and that they do not loop.
    pub fn script_order(&self) -> Result<Vec<&Script>, RecipeError> {
        let mut by_slug: BTreeMap<&str, &Script> = BTreeMap::new();
        for script in &self.scripts {
            if script.content.is_some() == script.file.is_some() {
                return Err(RecipeError::NoContent {
                    slug: script.slug.clone(),
                });
            }
            if by_slug.insert(&script.slug, script).is_some() {
                return Err(RecipeError::Duplicate {
                    slug: script.slug.clone(),
                });
            }
        }
        for script in &self.scripts {
            if let Some(missing) = script
                .depends_on
                .iter()
                .find(|d| !by_slug.contains_key(d.as_str()))
            {
                return Err(RecipeError::UnknownDependency {
                    slug: script.slug.clone(),
                    missing: missing.clone(),
                });
            }
        }
        // The script-runner's rule (one rule for recipes and plans): by
        // dependency layers, each layer by slug.
        let nodes: Vec<(&str, Vec<&str>)> = by_slug
            .iter()
            .map(|(slug, s)| (*slug, s.depends_on.iter().map(String::as_str).collect()))
            .collect();
        let order = mprov_agent::scripts::plan::layers(&nodes)
            .map_err(|cycles| RecipeError::Cycle {
                slugs: cycles.concat().iter().map(|s| s.to_string()).collect(),
            })?
            .concat()
            .into_iter()
            .map(|slug| by_slug[slug])
            .collect();
        Ok(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(scripts: &[(&str, &[&str])]) -> Recipe {
        Recipe {
            slug: "t".into(),
            source: Source::Dir("/".into()),
            scripts: scripts
                .iter()
                .map(|(slug, deps)| Script {
                    slug: slug.to_string(),
                    content: Some("true".into()),
                    file: None,
                    depends_on: deps.iter().map(|d| d.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn order(r: &Recipe) -> Vec<&str> {
        r.script_order()
            .expect("orderable")
            .iter()
            .map(|s| s.slug.as_str())
            .collect()
    }

    #[test]
    fn scripts_run_after_their_dependencies_ties_by_slug() {
        let r = recipe(&[("c", &["z"]), ("a", &[]), ("z", &["b"]), ("b", &[])]);
        assert_eq!(order(&r), ["a", "b", "z", "c"]);
    }

    #[test]
    fn cycles_and_unknown_dependencies_are_errors() {
        let r = recipe(&[("a", &["b"]), ("b", &["a"]), ("c", &[])]);
        let err = r.script_order().expect_err("cycle");
        assert_eq!(
            err.to_string(),
            "script dependencies form a cycle through: a, b"
        );
        let r = recipe(&[("a", &["nope"])]);
        let err = r.script_order().expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "script a depends on nope, which the recipe does not have"
        );
    }

    #[test]
    fn yaml_recipe_parses() -> io::Result<()> {
        let r = Recipe::from_yaml(
            "slug: compute\n\
             source:\n  bootstrap:\n    tool: mmdebstrap\n    suite: bookworm\n    include: [systemd-sysv]\n\
             scripts:\n  - slug: a\n    content: echo hi\n    depends_on: [b]\n  - slug: b\n    file: b.sh\n",
        )?;
        assert_eq!(r.slug, "compute");
        assert_eq!(
            r.source,
            Source::Bootstrap(Bootstrap {
                tool: BootstrapTool::Mmdebstrap,
                suite: "bookworm".into(),
                variant: None,
                include: vec!["systemd-sysv".into()],
                mirrors: vec![],
            })
        );
        assert_eq!(r.scripts[0].depends_on, ["b"]);
        assert_eq!(r.scripts[1].file, Some(PathBuf::from("b.sh")));
        let oci = Recipe::from_yaml("slug: x\nsource:\n  oci:\n    path: img.tar\n    ref: v1\n")?;
        assert_eq!(
            oci.source,
            Source::Oci {
                path: "img.tar".into(),
                reference: Some("v1".into())
            }
        );
        assert!(Recipe::from_yaml("slug: x\nsource:\n  dir: /r\nextra: 1\n").is_err());
        Ok(())
    }
}
