//! The fuzz targets' checks (fuzz/src/lib.rs) on stable Rust: every seed the fuzzers start
//! from and every input a fuzzer ever crashed on (fuzz/regressions/<target>/) goes through
//! its target's checks here, in every test run, so a crash once found stays fixed.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod checks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// fuzz/seeds.txt: each target's seed files and directories.
fn seed_manifest() -> BTreeMap<String, Vec<PathBuf>> {
    let path = repository().join("fuzz/seeds.txt");
    let text = std::fs::read_to_string(&path).expect("fuzz/seeds.txt is readable");
    let mut manifest = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let mut fields = line.split_whitespace();
        let target = fields
            .next()
            .expect("a non-empty line has a target")
            .to_string();
        let sources: Vec<PathBuf> = fields.map(|source| repository().join(source)).collect();
        assert!(!sources.is_empty(), "fuzz/seeds.txt: {target} has no seeds");
        assert!(
            manifest.insert(target.clone(), sources).is_none(),
            "fuzz/seeds.txt names {target} twice"
        );
    }
    manifest
}

fn check_of(target: &str) -> checks::Check {
    checks::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, check)| *check)
        .unwrap_or_else(|| panic!("no check for fuzz target {target}"))
}

fn run_all(target: &str, files: &[PathBuf]) {
    let check = check_of(target);
    for file in files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "fuzz target {target} fails on {} (see the panic above)",
            file.display()
        );
    }
}

#[test]
fn every_target_has_a_binary_a_check_and_seeds() {
    let manifest = seed_manifest();
    let cargo_toml = std::fs::read_to_string(repository().join("fuzz/Cargo.toml"))
        .expect("fuzz/Cargo.toml is readable");
    let listed: Vec<&str> = manifest.keys().map(String::as_str).collect();
    let checked: Vec<&str> = {
        let mut names: Vec<&str> = checks::TARGETS.iter().map(|(name, _)| *name).collect();
        names.sort();
        names
    };
    assert_eq!(
        listed, checked,
        "fuzz/seeds.txt and TARGETS name other targets"
    );
    for (target, sources) in &manifest {
        let binary = repository().join(format!("fuzz/fuzz_targets/{target}.rs"));
        let source = std::fs::read_to_string(&binary)
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        assert!(
            source.contains(&format!("nodekeeper_fuzz::{target}(")),
            "{} does not run the {target} check",
            binary.display()
        );
        assert!(
            cargo_toml.contains(&format!("name = \"{target}\"")),
            "fuzz/Cargo.toml has no [[bin]] {target}"
        );
        for source in sources {
            assert!(
                !checks::files_under(source).is_empty(),
                "fuzz/seeds.txt: {target}'s seed {} holds no file",
                source.display()
            );
        }
    }
}

#[test]
fn every_seed_passes_its_target() {
    for (target, sources) in seed_manifest() {
        let files: Vec<PathBuf> = sources
            .iter()
            .flat_map(|source| checks::files_under(source))
            .collect();
        run_all(&target, &files);
    }
}

#[test]
fn every_input_a_fuzzer_crashed_on_passes_now() {
    let regressions = repository().join("fuzz/regressions");
    for (target, _) in checks::TARGETS {
        run_all(target, &checks::files_under(&regressions.join(target)));
    }
    // Each regression sits under a target's name, where this test finds it.
    for file in checks::files_under(&regressions) {
        let relative = file
            .strip_prefix(&regressions)
            .expect("under the directory");
        let target = relative
            .components()
            .next()
            .expect("a file has a first component");
        let target = target.as_os_str().to_string_lossy();
        assert!(
            checks::TARGETS.iter().any(|(name, _)| *name == target),
            "fuzz/regressions/{}: {target} is no fuzz target",
            relative.display()
        );
        assert!(
            relative.components().count() == 2,
            "{}: nest nothing deeper",
            relative.display()
        );
    }
}
