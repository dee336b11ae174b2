//! The `image-update` job module: builds the current version of an image
//! from the inventory with the `mprov-image` library and publishes it.
//!
//! The job's parameters are `{"image": slug}`, optionally with
//! `"version": n` (the version the rebuild request made; a job whose version
//! is no longer the image's current one is superseded and fails saying so).
//!
//! # What is built
//!
//! [`plan`] turns the inventory into a [`Recipe`], a pure function of the
//! image's row, its distro's and the scripts':
//!
//! - **The root.** An `image_source` key in the image's `config_params`, else
//!   in its distro's, is a [`Source`] as a recipe writes it
//!   (`{dir: /srv/roots/compute}`, `{oci: {path: …, ref: …}}` or
//!   `{bootstrap: {tool: mmdebstrap, suite: bookworm, …}}`), so a site can
//!   build from a root it prepared, or bootstrap from its own mirror.
//!   Without one, the distro's vendor and version pick a bootstrap
//!   ([`bootstrap_for`]): Debian and Ubuntu with mmdebstrap (the version's
//!   codename: 12 → bookworm, 24.04 → noble; a codename is taken as it is),
//!   Rocky, Alma, RHEL, CentOS, Oracle and Fedora with dnf (the release as
//!   `--releasever`). A bootstrap runs for the job server's own
//!   architecture; a distro of another is refused.
//! - **The image-gen scripts:** the image's image-gen plan from the control
//!   service (its distro's and its own, less `disable_scripts`: the control
//!   service's one layering rule), each script's content checked against the
//!   plan's checksum, run through the script-runner's planner and executor
//!   (`mprov_agent::scripts`: dependency layers, refusals naming the scripts
//!   before anything runs, timeouts) inside the root. The run's results go
//!   to the control service whether the build went on or not.
//! - **The kernel:** the newest `/boot/vmlinuz-*` of the root, unless an
//!   `image_kernel` key says `none` or gives a file.
//! - **The agent**, from the module's `agent` setting
//!   ([`DEFAULT_AGENT`]): installed in the root and, with the kernel's NIC
//!   modules, as the image's `initramfs.img`.
//!
//! # Publishing
//!
//! [`build_version`] builds into `<export>/images/<slug>/<version>/` on a
//! blocking thread, the build's steps forwarded as progress lines. The
//! builder works in a temporary folder beside the version and renames it into
//! place only when complete, so a failed build (a full disk among the
//! reasons, [`mprov_image::BuildError::NoSpace`]) leaves no files and every
//! earlier version as it was. [`publish`] then tells the control service
//! that this job server hosts the version, with the manifest's files: the
//! control service records their checksums, which nodes and other job
//! servers verify against. A version folder already complete (a retried job
//! whose publishing failed) is verified against its manifest and published
//! as it is; versions are never overwritten.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use mprov_api::client::Client;
use mprov_api::jobs::{HostedFile, Hosting};
use mprov_api::scripts::{RunReport, ScriptMode};
use mprov_image::{
    Bootstrap, BootstrapTool, BuildOptions, ImageGenRun, KernelChoice, Manifest, PackOptions,
    Recipe, Source, Steps,
};
use serde::Deserialize;
use serde_json::Value;

/// Where the agent binary is unless the module's `agent` setting says.
pub const DEFAULT_AGENT: &str = "/usr/lib/mprov/mprov-agent";

/// What the module needs from the job server.
#[derive(Debug, Clone)]
pub struct UpdateContext {
    /// The export folder the image server serves: versions are built into
    /// `<export>/images/<slug>/<version>/`.
    pub export: PathBuf,
    /// The agent binary every image carries (the `agent` setting); `None`
    /// builds images without it, which cannot netboot (tests).
    pub agent: Option<PathBuf>,
    /// How to pack the root.
    pub pack: PackOptions,
}

impl UpdateContext {
    /// Defaults for `export`: the agent at [`DEFAULT_AGENT`].
    pub fn new(export: impl Into<PathBuf>) -> UpdateContext {
        UpdateContext {
            export: export.into(),
            agent: Some(PathBuf::from(DEFAULT_AGENT)),
            pack: PackOptions::default(),
        }
    }

    /// The folder holding every image's versions.
    pub fn images_dir(&self) -> PathBuf {
        self.export.join(mprov_api::boot::IMAGES_DIR)
    }
}

/// An `image-update` job's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateParams {
    /// The image's slug.
    pub image: String,
    /// The version the rebuild request made, if the job says.
    #[serde(default)]
    pub version: Option<i64>,
}

/// What [`plan`] reads: the image's and its distro's rows, and the image's
/// image-gen scripts as the control service planned them (its layering and
/// `disable_scripts` rule), with their contents.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// The image's row.
    pub image: Value,
    /// Its distro's row, if it has one.
    pub distro: Option<Value>,
    /// The image-gen plan and its scripts' contents.
    pub scripts: ImageGenRun,
}

/// What to build: one version of one image.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The root (the recipe lists no scripts: they are in `scripts`).
    pub recipe: Recipe,
    /// The image-gen scripts, run by the script-runner's rule.
    pub scripts: ImageGenRun,
    /// The kernel.
    pub kernel: KernelChoice,
    /// The version number (the image's current one).
    pub version: u64,
}

/// Why the inventory does not say what to build.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The distro's architecture is not the job server's.
    #[error(
        "distro {distro} is for {arch}, this job server is {host}: build it on a job server of that architecture, or give an image_source"
    )]
    Arch {
        /// The distro's slug.
        distro: String,
        /// Its architecture.
        arch: String,
        /// The job server's.
        host: String,
    },
    /// A layer's `config_params` cannot be read.
    #[error("the config_params of {layer}: {reason}")]
    ConfigParams {
        /// `image compute` or `distro debian-12`.
        layer: String,
        /// What is wrong.
        reason: String,
    },
    /// A row lacks a field or has it of the wrong type.
    #[error("the {kind} row has no valid {field}")]
    Field {
        /// The kind.
        kind: &'static str,
        /// The field.
        field: &'static str,
    },
    /// Neither an `image_source` nor a distro says where the root comes
    /// from.
    #[error(
        "image {image} has no distro and no image_source in its config_params: nothing says what to build"
    )]
    NoSource {
        /// The image's slug.
        image: String,
    },
    /// The vendor or version has no known bootstrap.
    #[error(
        "no bootstrap is known for distro {distro} ({vendor} {version}): give one as image_source in its config_params"
    )]
    Vendor {
        /// The distro's slug.
        distro: String,
        /// Its vendor.
        vendor: String,
        /// Its version.
        version: String,
    },
}

/// The build keys of a layer's `config_params`; other keys are other
/// modules' business.
#[derive(Debug, Default, Deserialize)]
struct BuildParams {
    #[serde(default)]
    image_source: Option<Source>,
    #[serde(default)]
    image_kernel: Option<String>,
}

fn build_params(row: &Value, layer: String) -> Result<BuildParams, PlanError> {
    let text = row
        .get("config_params")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if text.trim().is_empty() {
        return Ok(BuildParams::default());
    }
    serde_saphyr::from_str(text).map_err(|err| PlanError::ConfigParams {
        layer,
        reason: err.to_string(),
    })
}

fn text<'a>(row: &'a Value, kind: &'static str, field: &'static str) -> Result<&'a str, PlanError> {
    row.get(field)
        .and_then(Value::as_str)
        .ok_or(PlanError::Field { kind, field })
}

/// The job server's architecture as the inventory names them
/// (`control/src/db/kinds.rs` `ARCHES`).
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        other => other,
    }
}

/// What to build for `inventory`, on a job server of architecture `host`.
pub fn plan(inventory: &Inventory, host: &str) -> Result<Plan, PlanError> {
    let image = &inventory.image;
    let slug = text(image, "image", "slug")?.to_string();
    let version = image
        .get("version")
        .and_then(Value::as_u64)
        .filter(|v| *v >= 1)
        .ok_or(PlanError::Field {
            kind: "image",
            field: "version",
        })?;
    let image_params = build_params(image, format!("image {slug}"))?;
    let distro_params = match &inventory.distro {
        Some(d) => build_params(d, format!("distro {}", text(d, "distro", "slug")?))?,
        None => BuildParams::default(),
    };

    let source = match (&image_params.image_source, &distro_params.image_source) {
        (Some(source), _) | (None, Some(source)) => source.clone(),
        (None, None) => {
            let Some(distro) = &inventory.distro else {
                return Err(PlanError::NoSource { image: slug });
            };
            Source::Bootstrap(distro_bootstrap(distro, host)?)
        }
    };
    let kernel = match image_params
        .image_kernel
        .as_deref()
        .or(distro_params.image_kernel.as_deref())
    {
        None | Some("") | Some("root") => KernelChoice::FromRoot,
        Some("none") => KernelChoice::Without,
        Some(path) => KernelChoice::File(PathBuf::from(path)),
    };

    Ok(Plan {
        recipe: Recipe {
            slug,
            source,
            scripts: Vec::new(),
        },
        scripts: inventory.scripts.clone(),
        kernel,
        version,
    })
}

/// The bootstrap for a distro row, on a job server of architecture `host`.
fn distro_bootstrap(distro: &Value, host: &str) -> Result<Bootstrap, PlanError> {
    let slug = text(distro, "distro", "slug")?;
    let arch = distro
        .get("arch")
        .and_then(Value::as_str)
        .unwrap_or("x86_64");
    if arch != host {
        return Err(PlanError::Arch {
            distro: slug.to_string(),
            arch: arch.to_string(),
            host: host.to_string(),
        });
    }
    let vendor = text(distro, "distro", "vendor")?;
    let version = text(distro, "distro", "version")?;
    bootstrap_for(vendor, version, arch).ok_or_else(|| PlanError::Vendor {
        distro: slug.to_string(),
        vendor: vendor.to_string(),
        version: version.to_string(),
    })
}

/// The bootstrap of a distro by its vendor and version (its release number
/// or codename) for `arch`, or `None` when neither is known.
pub fn bootstrap_for(vendor: &str, version: &str, arch: &str) -> Option<Bootstrap> {
    let vendor = vendor.trim().to_ascii_lowercase();
    let version = version.trim();
    if version.is_empty() {
        return None;
    }
    let codename = |table: &[(&str, &str)], key: &str| -> Option<String> {
        if version.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Some(version.to_ascii_lowercase());
        }
        table
            .iter()
            .find(|(v, _)| *v == key)
            .map(|(_, name)| name.to_string())
    };
    let major = version.split('.').next().unwrap_or(version);
    let major_minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let mmdebstrap = |suite: String, include: &[&str]| Bootstrap {
        tool: BootstrapTool::Mmdebstrap,
        suite,
        variant: None,
        include: include.iter().map(|s| s.to_string()).collect(),
        mirrors: Vec::new(),
    };
    if vendor.contains("debian") {
        let suite = codename(DEBIAN, major)?;
        let kernel = format!("linux-image-{}", debian_arch(arch)?);
        return Some(mmdebstrap(
            suite,
            &["systemd-sysv", "udev", "kmod", "iproute2", &kernel],
        ));
    }
    if vendor.contains("ubuntu") {
        let suite = codename(UBUNTU, &major_minor)?;
        return Some(mmdebstrap(
            suite,
            &[
                "systemd-sysv",
                "udev",
                "kmod",
                "iproute2",
                "linux-image-generic",
            ],
        ));
    }
    let rebuild = ["rocky", "alma", "rhel", "red hat", "centos", "oracle"];
    let suite = if rebuild.iter().any(|v| vendor.contains(v)) {
        // Their repositories are laid out by major release ($releasever).
        major
    } else if vendor.contains("fedora") {
        version
    } else {
        return None;
    };
    if !suite.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Bootstrap {
        tool: BootstrapTool::Dnf,
        suite: suite.to_string(),
        variant: None,
        include: vec!["@core".into(), "kernel".into()],
        mirrors: Vec::new(),
    })
}

/// Debian's releases by number.
const DEBIAN: &[(&str, &str)] = &[
    ("10", "buster"),
    ("11", "bullseye"),
    ("12", "bookworm"),
    ("13", "trixie"),
    ("14", "forky"),
    ("15", "duke"),
];

/// Ubuntu's releases by number.
const UBUNTU: &[(&str, &str)] = &[
    ("20.04", "focal"),
    ("22.04", "jammy"),
    ("24.04", "noble"),
    ("24.10", "oracular"),
    ("25.04", "plucky"),
    ("25.10", "questing"),
];

/// Debian's name of an architecture (its kernel package's suffix).
fn debian_arch(arch: &str) -> Option<&'static str> {
    Some(match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "ppc64le" => "ppc64el",
        "s390x" => "s390x",
        _ => return None,
    })
}

/// Reads what [`plan`] needs from the control service: the image, its
/// distro, and its image-gen plan with each script's content.
pub async fn read_inventory(client: &Client, slug: &str) -> Result<Inventory> {
    let image = client
        .get("images", slug)
        .await
        .with_context(|| format!("reading image {slug}"))?;
    let distro = match image.get("distro").and_then(Value::as_i64) {
        Some(id) => Some(
            client
                .get("distros", &id.to_string())
                .await
                .with_context(|| format!("reading distro {id} of image {slug}"))?,
        ),
        None => None,
    };
    let plan = client
        .script_plan(ScriptMode::ImageGen, Some(slug))
        .await
        .with_context(|| format!("reading the image-gen scripts of image {slug}"))?;
    let mut contents = BTreeMap::new();
    for script in &plan.scripts {
        let bytes = client
            .script_content(&script.slug)
            .await
            .with_context(|| format!("reading script {}", script.slug))?;
        contents.insert(script.slug.clone(), bytes);
    }
    Ok(Inventory {
        image,
        distro,
        scripts: ImageGenRun { plan, contents },
    })
}

/// Runs an `image-update` job: reads the image, builds its current version
/// and publishes it. Progress lines go to `progress`.
pub async fn image_update(
    ctx: &UpdateContext,
    client: &Client,
    params: &Value,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<()> {
    let params: UpdateParams = serde_json::from_value(params.clone())
        .context("the job's parameters: want {\"image\": slug, \"version\": n}")?;
    let inventory = read_inventory(client, &params.image).await?;
    let plan = plan(&inventory, host_arch())?;
    if let Some(asked) = params.version
        && u64::try_from(asked).ok() != Some(plan.version)
    {
        bail!(
            "this job builds version {asked} of image {}, which is now at version {}: superseded by a newer rebuild",
            params.image,
            plan.version
        );
    }
    let built = build_version(ctx, &plan, progress).await;
    // The scripts' results go to the control service whether the build
    // went on or not (a refusal or a failure is a result too).
    let report = match &built {
        Ok((_, report)) => report.clone(),
        Err(err) => err.chain().find_map(|cause| match cause.downcast_ref() {
            Some(mprov_image::BuildError::Script { report, .. }) => Some((**report).clone()),
            _ => None,
        }),
    };
    if let Some(report) = report
        && let Err(err) = client.report_scripts(&report).await
    {
        progress(&format!(
            "warning: the image-gen scripts' results were not recorded: {err:#}"
        ));
    }
    let (manifest, _) = built?;
    publish(client, &manifest).await?;
    progress(&format!(
        "recorded: this job server hosts {} version {}",
        manifest.slug, manifest.version
    ));
    Ok(())
}

/// Builds `plan` into `<export>/images/<slug>/<version>/` and returns its
/// manifest and the image-gen scripts' results (if any ran); a complete
/// folder of that version already there is verified and returned instead.
/// Needs no control service.
pub async fn build_version(
    ctx: &UpdateContext,
    plan: &Plan,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<(Manifest, Option<RunReport>)> {
    if let Some(agent) = &ctx.agent
        && !agent.is_file()
    {
        bail!(
            "the agent binary {} is missing: every image carries it (install it there, or set `agent:` in the image-update module's settings)",
            agent.display()
        );
    }
    let images = ctx.images_dir();
    let dir = images
        .join(&plan.recipe.slug)
        .join(plan.version.to_string());
    if std::fs::symlink_metadata(&dir).is_ok() {
        progress(&format!(
            "{} exists: verifying it against its manifest",
            dir.display()
        ));
        let check = dir.clone();
        let manifest = tokio::task::spawn_blocking(move || mprov_image::verify(&check))
            .await
            .context("the verifying thread")?
            .with_context(|| {
                format!(
                    "{} exists but is not a good build; versions are never overwritten: remove it to rebuild",
                    dir.display()
                )
            })?;
        return Ok((manifest, None));
    }

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let options = BuildOptions {
        out: images,
        version: Some(plan.version),
        kernel: plan.kernel.clone(),
        agent: ctx.agent.clone(),
        pack: ctx.pack.clone(),
        steps: Some(Steps::new(move |line| {
            // The receiver lives until the build ends.
            let _ = tx.send(line.to_string());
        })),
        scripts: Some(plan.scripts.clone()),
    };
    let recipe = plan.recipe.clone();
    let mut build = tokio::task::spawn_blocking(move || mprov_image::build(&recipe, &options));
    // Forward the build's lines while it runs; the sender goes with the
    // options when the build returns, which ends the loop after the last.
    let result = loop {
        tokio::select! {
            Some(line) = rx.recv() => progress(&line),
            result = &mut build => break result,
        }
    };
    while let Ok(line) = rx.try_recv() {
        progress(&line);
    }
    let built = result
        .context("the build thread")?
        .with_context(|| format!("building {} version {}", plan.recipe.slug, plan.version))?;
    for path in &built.skipped {
        progress(&format!("left out (a socket): {}", path.display()));
    }
    Ok((built.manifest, built.scripts))
}

/// The files of a built version as the control service records them.
pub fn hosted_files(manifest: &Manifest) -> Vec<HostedFile> {
    manifest
        .artifacts
        .iter()
        .map(|a| HostedFile {
            name: a.name.clone(),
            size: a.size,
            sha256: a.sha256.clone(),
        })
        .collect()
}

/// Tells the control service this job server hosts the version `manifest`
/// describes, with its files.
pub async fn publish(client: &Client, manifest: &Manifest) -> Result<()> {
    let version = i64::try_from(manifest.version).context("the version number")?;
    client
        .record_hosting(&Hosting {
            image: manifest.slug.clone(),
            version,
            files: Some(hosted_files(manifest)),
        })
        .await
        .with_context(|| {
            format!(
                "recording that this job server hosts {} version {version}",
                manifest.slug
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn suite(vendor: &str, version: &str) -> Option<(BootstrapTool, String, Vec<String>)> {
        bootstrap_for(vendor, version, "x86_64").map(|b| (b.tool, b.suite, b.include))
    }

    #[test]
    fn vendors_and_versions_pick_a_bootstrap() {
        use BootstrapTool::{Dnf, Mmdebstrap};
        type Row<'a> = (&'a str, &'a str, Option<(BootstrapTool, &'a str)>);
        let table: &[Row] = &[
            ("Debian", "12", Some((Mmdebstrap, "bookworm"))),
            ("debian", "12.7", Some((Mmdebstrap, "bookworm"))),
            ("Debian", "13", Some((Mmdebstrap, "trixie"))),
            ("Debian", "trixie", Some((Mmdebstrap, "trixie"))),
            ("Debian", "sid", Some((Mmdebstrap, "sid"))),
            ("Debian", "99", None),
            ("Ubuntu", "24.04", Some((Mmdebstrap, "noble"))),
            ("Ubuntu", "22.04.4", Some((Mmdebstrap, "jammy"))),
            ("Ubuntu", "24", None),
            ("Rocky", "9.4", Some((Dnf, "9"))),
            ("AlmaLinux", "8", Some((Dnf, "8"))),
            ("Red Hat", "9.2", Some((Dnf, "9"))),
            ("RHEL", "10", Some((Dnf, "10"))),
            ("Fedora", "41", Some((Dnf, "41"))),
            ("Rocky", "nine", None),
            ("Gentoo", "1", None),
            ("Debian", "", None),
        ];
        for (vendor, version, want) in table {
            let got = suite(vendor, version).map(|(t, s, _)| (t, s));
            let want = want.map(|(t, s)| (t, s.to_string()));
            assert_eq!(got, want, "{vendor} {version}");
        }
        let (_, _, debian) = suite("Debian", "12").unwrap();
        assert!(debian.contains(&"linux-image-amd64".to_string()));
        let arm = bootstrap_for("Debian", "12", "aarch64").unwrap();
        assert!(arm.include.contains(&"linux-image-arm64".to_string()));
        let (_, _, rocky) = suite("Rocky", "9").unwrap();
        assert_eq!(rocky, ["@core", "kernel"]);
    }

    /// An image-gen plan of `scripts` (slug, dependencies) with their
    /// contents, as the control service would give it.
    fn scripts(scripts: &[(&str, &[&str])]) -> ImageGenRun {
        let plan: mprov_api::scripts::ScriptPlan = serde_json::from_value(json!({
            "mode": "image-gen",
            "image": "compute",
            "scripts": scripts.iter().map(|(slug, deps)| json!({
                "slug": slug, "version": 1, "sha256": "", "depends_on": deps,
            })).collect::<Vec<_>>(),
        }))
        .unwrap();
        let contents = scripts
            .iter()
            .map(|(slug, _)| (slug.to_string(), format!("echo {slug}").into_bytes()))
            .collect();
        ImageGenRun { plan, contents }
    }

    fn debian() -> Value {
        json!({"id": 1, "slug": "debian-12", "vendor": "Debian", "version": "12", "arch": "x86_64", "config_params": "", "scripts": [10]})
    }

    #[test]
    fn the_inventory_becomes_a_recipe_and_the_plan_its_scripts() {
        let inventory = Inventory {
            image: json!({"slug": "compute", "version": 3, "distro": 1, "config_params": "", "scripts": [12, 11]}),
            distro: Some(debian()),
            scripts: scripts(&[("base", &[]), ("tune", &["base"])]),
        };
        let plan = plan(&inventory, "x86_64").unwrap();
        assert_eq!(plan.version, 3);
        assert_eq!(plan.kernel, KernelChoice::FromRoot);
        assert_eq!(plan.recipe.slug, "compute");
        let Source::Bootstrap(b) = &plan.recipe.source else {
            panic!("{:?}", plan.recipe.source);
        };
        assert_eq!(
            (b.tool, b.suite.as_str()),
            (BootstrapTool::Mmdebstrap, "bookworm")
        );
        // The scripts are the control service's plan, run as it is (the
        // script-runner orders and checks them), never the recipe's.
        assert!(plan.recipe.scripts.is_empty());
        assert_eq!(plan.scripts.plan, inventory.scripts.plan);
        assert_eq!(plan.scripts.contents["tune"], b"echo tune");
    }

    #[test]
    fn config_params_override_the_source_kernel_and_scripts() {
        let mut distro = debian();
        distro["config_params"] =
            json!("image_source:\n  dir: /srv/roots/deb\nimage_kernel: none\nother: [1, 2]\n");
        // disable_scripts is the control service's business (its plan),
        // in either of the forms it takes.
        let image = json!({"slug": "compute", "version": 1, "distro": 1, "scripts": [11],
            "config_params": "disable_scripts: base\nimage_kernel: /boot/vmlinuz-6.1\n"});
        let inventory = Inventory {
            image: image.clone(),
            distro: Some(distro.clone()),
            scripts: scripts(&[("tune", &[])]),
        };
        let p = plan(&inventory, "x86_64").unwrap();
        assert_eq!(p.recipe.source, Source::Dir("/srv/roots/deb".into()));
        // The image's layer wins over the distro's.
        assert_eq!(p.kernel, KernelChoice::File("/boot/vmlinuz-6.1".into()));

        // The image's own source wins; a bootstrap is written as a recipe's.
        let mut inv = inventory.clone();
        inv.image["config_params"] =
            json!("image_source:\n  bootstrap:\n    tool: dnf\n    suite: '9'\n");
        let p = plan(&inv, "x86_64").unwrap();
        let Source::Bootstrap(b) = p.recipe.source else {
            panic!()
        };
        assert_eq!((b.tool, b.suite.as_str()), (BootstrapTool::Dnf, "9"));
        assert_eq!(p.kernel, KernelChoice::Without, "the distro's image_kernel");

        // An override makes the architecture no matter.
        assert!(plan(&inventory, "aarch64").is_ok());
    }

    #[test]
    fn what_cannot_be_planned_says_why() {
        let no_distro = Inventory {
            image: json!({"slug": "bare", "version": 1, "distro": null, "scripts": []}),
            distro: None,
            scripts: scripts(&[]),
        };
        assert_eq!(
            plan(&no_distro, "x86_64").unwrap_err().to_string(),
            "image bare has no distro and no image_source in its config_params: nothing says what to build"
        );
        let mut inv = Inventory {
            image: json!({"slug": "compute", "version": 1, "distro": 1, "scripts": []}),
            distro: Some(debian()),
            scripts: scripts(&[("base", &[])]),
        };
        assert!(
            plan(&inv, "aarch64")
                .unwrap_err()
                .to_string()
                .starts_with("distro debian-12 is for x86_64, this job server is aarch64")
        );
        inv.image["config_params"] = json!("image_source: [not, a, source]");
        assert!(
            plan(&inv, "x86_64")
                .unwrap_err()
                .to_string()
                .starts_with("the config_params of image compute: ")
        );
        inv.image["config_params"] = json!("");
        inv.distro.as_mut().unwrap()["vendor"] = json!("Slackware");
        assert_eq!(
            plan(&inv, "x86_64").unwrap_err().to_string(),
            "no bootstrap is known for distro debian-12 (Slackware 12): give one as image_source in its config_params"
        );
    }

    #[test]
    fn job_parameters_parse() {
        let p: UpdateParams = serde_json::from_value(json!({"image": "compute"})).unwrap();
        assert_eq!(p.version, None);
        let p: UpdateParams =
            serde_json::from_value(json!({"image": "compute", "version": 4})).unwrap();
        assert_eq!(p.version, Some(4));
        assert!(serde_json::from_value::<UpdateParams>(json!({"img": "x"})).is_err());
    }
}
