//! The run's order, decided before anything runs: a pure function of the
//! [`ScriptPlan`].
//!
//! The rules:
//! - A script runs after every script it `depends_on`. Scripts go into
//!   **layers**: layer 0 holds the scripts that depend on nothing, layer
//!   *k* those whose dependencies are all in layers below *k*. A layer's
//!   scripts may run at the same time; within a layer they are listed by
//!   slug, so the same plan always gives the same order.
//! - The plan is **refused**, naming every script at fault, when a slug is
//!   listed twice, when a script depends on a slug that is neither in the
//!   plan nor disabled (a missing dependency), when it depends on a disabled
//!   script (`disable_scripts`: the seed's runner then runs nothing), or when
//!   scripts depend on each other in a cycle (each cycle named by its
//!   members, not by the scripts merely waiting behind it).
//! - A disabled slug that no script of the run depends on is only a
//!   **warning**: it may be a script the layers gathered and the admin
//!   switched off, or a typo; either way the run goes on without it.
//!
//! [`layers`] is the ordering rule alone, on bare slugs; the image builder's
//! recipes use it too (`mprov_image::recipe`), so there is one rule.

use std::collections::{BTreeMap, BTreeSet};

use mprov_api::scripts::{PlannedScript, ScriptPlan};

/// Why a plan cannot run; each names the scripts at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// Scripts depend on each other in a cycle (its members, by slug).
    #[error("scripts {} depend on each other in a cycle", .0.join(", "))]
    Cycle(Vec<String>),
    /// A script depends on one that `disable_scripts` switched off.
    #[error("script {slug} depends on {disabled}, which is disabled")]
    DependsOnDisabled {
        /// The script.
        slug: String,
        /// The disabled script.
        disabled: String,
    },
    /// Two scripts of the plan share a slug.
    #[error("script {0} is listed twice")]
    Duplicate(String),
    /// A script depends on a slug the plan does not have.
    #[error("script {slug} depends on {missing}, which is not in the plan")]
    MissingDependency {
        /// The script.
        slug: String,
        /// The slug it names.
        missing: String,
    },
}

/// A refused plan: every problem found, in a stable order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused before anything ran: {}", join(.0))]
pub struct Refusal(pub Vec<Problem>);

fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Refusal {
    /// The slugs of the scripts at fault, sorted, each once.
    pub fn slugs(&self) -> BTreeSet<&str> {
        let mut slugs = BTreeSet::new();
        for problem in &self.0 {
            match problem {
                Problem::Cycle(members) => slugs.extend(members.iter().map(String::as_str)),
                Problem::DependsOnDisabled { slug, .. }
                | Problem::MissingDependency { slug, .. } => {
                    slugs.insert(slug.as_str());
                }
                Problem::Duplicate(slug) => {
                    slugs.insert(slug.as_str());
                }
            }
        }
        slugs
    }
}

/// What the run will do: the layers, in order, and the warnings to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layers<'a> {
    /// Each layer's scripts, by slug.
    pub layers: Vec<Vec<&'a PlannedScript>>,
    /// For a person: disabled slugs no script of the run needs.
    pub warnings: Vec<String>,
}

impl Layers<'_> {
    /// Every script, layer by layer.
    pub fn scripts(&self) -> impl Iterator<Item = &PlannedScript> {
        self.layers.iter().flatten().copied()
    }
}

/// Orders `plan` into layers, or refuses it with every problem named.
pub fn plan(plan: &ScriptPlan) -> Result<Layers<'_>, Refusal> {
    let disabled: BTreeSet<&str> = plan.disabled.iter().map(String::as_str).collect();
    let mut problems = Vec::new();
    let mut by_slug: BTreeMap<&str, &PlannedScript> = BTreeMap::new();
    let mut duplicates = BTreeSet::new();
    for script in &plan.scripts {
        if by_slug.insert(&script.slug, script).is_some() {
            duplicates.insert(script.slug.as_str());
        }
    }
    problems.extend(duplicates.iter().map(|s| Problem::Duplicate(s.to_string())));
    let mut needed = BTreeSet::new();
    for script in by_slug.values() {
        for dep in dedup(&script.depends_on) {
            if by_slug.contains_key(dep) && !disabled.contains(dep) {
                continue;
            }
            needed.insert(dep);
            problems.push(if disabled.contains(dep) {
                Problem::DependsOnDisabled {
                    slug: script.slug.clone(),
                    disabled: dep.to_owned(),
                }
            } else {
                Problem::MissingDependency {
                    slug: script.slug.clone(),
                    missing: dep.to_owned(),
                }
            });
        }
    }
    // A script the plan lists although it is disabled does not run either.
    let runs: Vec<(&str, Vec<&str>)> = by_slug
        .iter()
        .filter(|(slug, _)| !disabled.contains(*slug))
        .map(|(slug, script)| {
            let deps = dedup(&script.depends_on)
                .filter(|d| by_slug.contains_key(d) && !disabled.contains(d))
                .collect();
            (*slug, deps)
        })
        .collect();
    let ordered = layers(&runs);
    if let Err(cycles) = &ordered {
        problems.extend(
            cycles
                .iter()
                .map(|c| Problem::Cycle(c.iter().map(|s| s.to_string()).collect())),
        );
    }
    match ordered {
        Ok(layers) if problems.is_empty() => Ok(Layers {
            layers: layers
                .into_iter()
                .map(|layer| layer.into_iter().map(|slug| by_slug[slug]).collect())
                .collect(),
            warnings: disabled
                .iter()
                .filter(|slug| !needed.contains(*slug))
                .map(|slug| format!("{slug} is disabled and not in the run"))
                .collect(),
        }),
        _ => Err(Refusal(problems)),
    }
}

fn dedup(deps: &[String]) -> impl Iterator<Item = &str> {
    deps.iter()
        .map(String::as_str)
        .collect::<BTreeSet<_>>()
        .into_iter()
}

/// The ordering rule on bare slugs: `nodes` are `(slug, dependencies)`, each
/// dependency one of the slugs. The layers (each sorted by slug), or, when
/// scripts depend on each other in cycles, the cycles' members (each sorted,
/// the cycles by their first member); scripts that only wait behind a cycle
/// are not named.
pub fn layers<'a>(
    nodes: &[(&'a str, Vec<&'a str>)],
) -> Result<Vec<Vec<&'a str>>, Vec<Vec<&'a str>>> {
    // Kahn's algorithm, a layer at a time.
    let mut waiting: BTreeMap<&str, BTreeSet<&str>> = nodes
        .iter()
        .map(|(slug, deps)| (*slug, deps.iter().copied().collect()))
        .collect();
    let mut out = Vec::new();
    loop {
        let ready: Vec<&str> = waiting
            .iter()
            .filter(|(_, deps)| deps.is_empty())
            .map(|(slug, _)| *slug)
            .collect();
        if ready.is_empty() {
            break;
        }
        for slug in &ready {
            waiting.remove(slug);
        }
        for deps in waiting.values_mut() {
            for slug in &ready {
                deps.remove(slug);
            }
        }
        out.push(ready);
    }
    if waiting.is_empty() {
        return Ok(out);
    }
    // What is left is on a cycle or behind one. A script is on a cycle when
    // it can reach itself; two are on the same one when each reaches the
    // other.
    let reach = |from: &str| -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = waiting[from].iter().copied().collect();
        while let Some(next) = stack.pop() {
            if seen.insert(next) {
                stack.extend(waiting[next].iter().copied());
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> =
        waiting.keys().map(|slug| (*slug, reach(slug))).collect();
    let mut cycles: Vec<Vec<&str>> = Vec::new();
    let mut placed = BTreeSet::new();
    for (slug, reached) in &reaches {
        if !reached.contains(slug) || placed.contains(slug) {
            continue;
        }
        let members: Vec<&str> = reached
            .iter()
            .copied()
            .filter(|other| reaches[other].contains(slug))
            .collect();
        placed.extend(members.iter().copied());
        cycles.push(members);
    }
    Err(cycles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mprov_api::scripts::ScriptMode;

    fn script(slug: &str, deps: &[&str]) -> PlannedScript {
        PlannedScript {
            slug: slug.to_owned(),
            version: 1,
            sha256: String::new(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            timeout_seconds: None,
            layer: "system".to_owned(),
        }
    }

    fn plan_of(scripts: &[(&str, &[&str])], disabled: &[&str]) -> ScriptPlan {
        ScriptPlan {
            mode: ScriptMode::PostBoot,
            host: Some("n01".into()),
            image: Some("compute".into()),
            groups: vec![],
            params: serde_json::Value::Null,
            scripts: scripts.iter().map(|(s, d)| script(s, d)).collect(),
            disabled: disabled.iter().map(|d| d.to_string()).collect(),
            run_request: 0,
        }
    }

    fn check(scripts: &[(&str, &[&str])], disabled: &[&str], want: &[&[&str]]) -> Vec<String> {
        let plan = plan_of(scripts, disabled);
        let got = plan_of_ok(&plan);
        let slugs: Vec<Vec<&str>> = got
            .layers
            .iter()
            .map(|l| l.iter().map(|s| s.slug.as_str()).collect())
            .collect();
        assert_eq!(slugs, want);
        got.warnings
    }

    fn plan_of_ok(plan: &ScriptPlan) -> Layers<'_> {
        super::plan(plan).expect("plans")
    }

    fn refused(scripts: &[(&str, &[&str])], disabled: &[&str]) -> Refusal {
        super::plan(&plan_of(scripts, disabled)).expect_err("refused")
    }

    #[test]
    fn layers_go_by_dependency_then_slug() {
        let warnings = check(
            &[
                ("c", &["z"]),
                ("a", &[]),
                ("z", &["b"]),
                ("b", &[]),
                ("y", &["a", "b", "a"]),
            ],
            &[],
            &[&["a", "b"], &["y", "z"], &["c"]],
        );
        assert!(warnings.is_empty());
        check(&[], &[], &[]);
    }

    #[test]
    fn a_missing_dependency_is_refused_naming_the_script() {
        let r = refused(&[("a", &["nope"]), ("b", &[])], &[]);
        assert_eq!(
            r.0,
            [Problem::MissingDependency {
                slug: "a".into(),
                missing: "nope".into()
            }]
        );
        assert_eq!(
            r.to_string(),
            "refused before anything ran: script a depends on nope, which is not in the plan"
        );
    }

    #[test]
    fn a_cycle_is_refused_naming_its_members_only() {
        // b and c loop; d waits behind them; e loops on itself.
        let r = refused(
            &[
                ("a", &[]),
                ("b", &["c"]),
                ("c", &["b", "a"]),
                ("d", &["c"]),
                ("e", &["e"]),
            ],
            &[],
        );
        assert_eq!(
            r.0,
            [
                Problem::Cycle(vec!["b".into(), "c".into()]),
                Problem::Cycle(vec!["e".into()])
            ]
        );
        assert_eq!(r.slugs().into_iter().collect::<Vec<_>>(), ["b", "c", "e"]);
    }

    #[test]
    fn depending_on_a_disabled_script_is_refused() {
        let r = refused(&[("a", &["off"]), ("b", &["a"])], &["off", "other"]);
        assert_eq!(
            r.0,
            [Problem::DependsOnDisabled {
                slug: "a".into(),
                disabled: "off".into()
            }]
        );
        // Listed and disabled both: it does not run, and its dependents are
        // refused the same way.
        let r = refused(&[("a", &[]), ("b", &["a"])], &["a"]);
        assert_eq!(
            r.0,
            [Problem::DependsOnDisabled {
                slug: "b".into(),
                disabled: "a".into()
            }]
        );
    }

    #[test]
    fn duplicates_are_refused() {
        let r = refused(&[("a", &[]), ("a", &[])], &[]);
        assert_eq!(r.0, [Problem::Duplicate("a".into())]);
    }

    #[test]
    fn disabled_slugs_nothing_needs_are_warnings() {
        let warnings = check(
            &[("a", &[]), ("b", &["a"])],
            &["postboot1", "typo"],
            &[&["a"], &["b"]],
        );
        assert_eq!(
            warnings,
            [
                "postboot1 is disabled and not in the run",
                "typo is disabled and not in the run"
            ]
        );
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let r = refused(&[("a", &["x"]), ("b", &["off"]), ("c", &["c"])], &["off"]);
        assert_eq!(r.slugs().into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(r.0.len(), 3);
    }
}
