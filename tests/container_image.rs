//! The container images (`Containerfile`), checked without a container engine, which
//! cannot run where nodekeeper is tested:
//!
//! - every file it copies from the build context is in the repository and let through by
//!   `.dockerignore`, which lets nothing else through; what cargo needs to build (the
//!   manifest, the lock file, the sources, every benchmark Cargo.toml declares) is copied;
//! - both runtime images run the one binary the build stage builds, at the path the
//!   manifests and the fence Jobs run it from, with a default command the binary accepts;
//!   the controller's has the fence agents and runs as the Deployment's user;
//! - `scripts/build-images` tags each image with the name and version the manifests run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_nodekeeper");
/// Where both images put the binary, and what the fence Jobs' `command` names.
const BINARY_IN_IMAGE: &str = "/usr/bin/nodekeeper";

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repository().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One instruction: its keyword (upper case) and the rest of the line, continuation
/// lines joined.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    rest: String,
}

#[derive(Debug)]
struct Stage {
    name: String,
    base: String,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter(|i| i.keyword == keyword)
            .map(|i| i.rest.as_str())
            .collect()
    }

    /// The last instruction with `keyword` (the one that counts for ENTRYPOINT, CMD, USER).
    fn last(&self, keyword: &str) -> Option<&str> {
        self.all(keyword).last().copied()
    }
}

/// The Containerfile's global ARGs and its stages.
fn containerfile() -> (BTreeMap<String, String>, Vec<Stage>) {
    let text = read("Containerfile");
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(continued) = trimmed.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let whole = std::mem::take(&mut pending);
        let (keyword, rest) = whole
            .split_once(char::is_whitespace)
            .expect("an instruction");
        instructions.push(Instruction {
            keyword: keyword.to_ascii_uppercase(),
            rest: rest.split_whitespace().collect::<Vec<_>>().join(" "),
        });
    }
    assert!(
        pending.is_empty(),
        "the Containerfile ends in a continuation"
    );

    let mut global_args = BTreeMap::new();
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions {
        if instruction.keyword == "FROM" {
            let words: Vec<&str> = instruction.rest.split(' ').collect();
            assert!(
                words.len() == 3 && words[1].eq_ignore_ascii_case("as"),
                "every stage is named: FROM {}",
                instruction.rest
            );
            stages.push(Stage {
                name: words[2].to_string(),
                base: words[0].to_string(),
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(instruction);
        } else {
            assert_eq!(instruction.keyword, "ARG", "before the first FROM");
            let (name, value) = instruction.rest.split_once('=').expect("ARG NAME=default");
            global_args.insert(name.to_string(), value.to_string());
        }
    }
    (global_args, stages)
}

fn stage<'a>(stages: &'a [Stage], name: &str) -> &'a Stage {
    stages
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no stage {name}"))
}

/// A COPY's flags (`--from=build`), sources and destination.
fn copy_parts(rest: &str) -> (Vec<&str>, Vec<&str>, &str) {
    let words: Vec<&str> = rest.split(' ').collect();
    let (flags, paths): (Vec<&str>, Vec<&str>) = words.iter().partition(|w| w.starts_with("--"));
    let (destination, sources) = paths.split_last().expect("COPY SOURCE... DEST");
    (flags, sources.to_vec(), destination)
}

/// An exec-form instruction (`["a", "b"]`) as its words.
fn exec_form(rest: &str) -> Vec<String> {
    serde_json::from_str(rest).unwrap_or_else(|e| panic!("not exec form: {rest}: {e}"))
}

/// `.dockerignore`: it must ignore everything (`*`) but the paths it lists with `!`.
fn context_paths() -> Vec<String> {
    let text = read(".dockerignore");
    let mut patterns = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'));
    assert_eq!(
        patterns.next(),
        Some("*"),
        ".dockerignore must start by ignoring everything, so target/ never enters the context"
    );
    patterns
        .map(|pattern| {
            let path = pattern
                .strip_prefix('!')
                .unwrap_or_else(|| panic!(".dockerignore: {pattern} is not an exception (!PATH)"));
            assert!(
                !path.contains(['*', '?', '[']),
                ".dockerignore: keep exceptions plain paths: {pattern}"
            );
            path.trim_end_matches('/').to_string()
        })
        .collect()
}

/// Whether `path` is `entry` or under it.
fn within(path: &str, entry: &str) -> bool {
    path == entry || path.starts_with(&format!("{entry}/"))
}

#[test]
fn every_file_the_containerfile_copies_is_in_the_build_context_and_nothing_else_is() {
    let (_, stages) = containerfile();
    let context = context_paths();
    let mut copied = Vec::new();
    for stage in &stages {
        for copy in stage.all("COPY") {
            let (flags, sources, _) = copy_parts(copy);
            if flags.iter().any(|f| f.starts_with("--from=")) {
                continue;
            }
            for source in sources {
                let source = source.trim_start_matches("./").trim_end_matches('/');
                assert!(
                    repository().join(source).exists(),
                    "stage {} copies {source}, which is not in the repository",
                    stage.name
                );
                assert!(
                    context.iter().any(|entry| within(source, entry)),
                    "stage {} copies {source}, which .dockerignore keeps out of the context",
                    stage.name
                );
                copied.push(source.to_string());
            }
        }
    }
    for entry in &context {
        assert!(
            repository().join(entry).exists(),
            ".dockerignore lets {entry} through, which does not exist"
        );
        assert!(
            copied.iter().any(|source| within(entry, source)),
            ".dockerignore lets {entry} through, which no COPY uses"
        );
    }

    // Everything cargo reads to build the binary: Cargo.toml declares benchmarks by name
    // (benches/<name>.rs), and cargo refuses a manifest whose targets are missing.
    let manifest: toml_like::Manifest = toml_like::parse(&read("Cargo.toml"));
    let mut needed = vec![
        "Cargo.toml".to_string(),
        "Cargo.lock".to_string(),
        "src/main.rs".to_string(),
        "src/lib.rs".to_string(),
    ];
    needed.extend(
        manifest
            .benches
            .iter()
            .map(|name| format!("benches/{name}.rs")),
    );
    assert!(manifest.benches.len() >= 5, "{:?}", manifest.benches);
    assert!(!repository().join("build.rs").exists(), "copy build.rs too");
    for path in needed {
        assert!(
            copied.iter().any(|source| within(&path, source)),
            "the build stage does not copy {path}, which cargo needs"
        );
    }
}

/// The few Cargo.toml facts these tests need, read line by line (no TOML parser among the
/// dependencies).
mod toml_like {
    pub struct Manifest {
        pub rust_version: String,
        pub benches: Vec<String>,
    }

    pub fn parse(text: &str) -> Manifest {
        let mut rust_version = String::new();
        let mut benches = Vec::new();
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"').to_string();
            match (section.as_str(), key.trim()) {
                ("[package]", "rust-version") => rust_version = value,
                ("[[bench]]", "name") => benches.push(value),
                _ => {}
            }
        }
        Manifest {
            rust_version,
            benches,
        }
    }
}

#[test]
fn both_images_run_the_binary_the_build_stage_builds_where_the_manifests_expect_it() {
    let (args, stages) = containerfile();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["build", "agent", "controller"]);

    // The build stage: Rust as old as Cargo.toml says suffices, one release build of the
    // binary, put where the runtime stages take it from.
    let manifest = toml_like::parse(&read("Cargo.toml"));
    assert_eq!(
        args.get("RUST_VERSION"),
        Some(&manifest.rust_version),
        "the build image's Rust is Cargo.toml's rust-version"
    );
    let build = stage(&stages, "build");
    assert!(build.base.contains("${RUST_VERSION}"), "{}", build.base);
    let builds: Vec<&str> = build
        .all("RUN")
        .into_iter()
        .filter(|run| run.contains("cargo build"))
        .collect();
    assert_eq!(builds.len(), 1, "one cargo build: {builds:?}");
    assert!(
        builds[0].contains("cargo build --release --locked --bin nodekeeper"),
        "{}",
        builds[0]
    );
    let output = builds[0]
        .split("target/release/nodekeeper ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .expect("the build installs target/release/nodekeeper somewhere");

    for name in ["agent", "controller"] {
        let runtime = stage(&stages, name);
        let binaries: Vec<(Vec<&str>, Vec<&str>, &str)> = runtime
            .all("COPY")
            .into_iter()
            .map(copy_parts)
            .filter(|(flags, _, _)| flags.contains(&"--from=build"))
            .collect();
        assert_eq!(binaries.len(), 1, "{name}: {binaries:?}");
        let (_, sources, destination) = &binaries[0];
        assert_eq!(sources, &[output], "{name} copies what the build made");
        assert_eq!(*destination, BINARY_IN_IMAGE, "{name}");
        let entrypoint = exec_form(runtime.last("ENTRYPOINT").expect("an ENTRYPOINT"));
        assert_eq!(entrypoint, [BINARY_IN_IMAGE], "{name}'s ENTRYPOINT");
        // Its default command is one the binary accepts, with the configuration the
        // stage puts in place.
        let command = exec_form(runtime.last("CMD").expect("a CMD"));
        assert_eq!(command[0], name, "{name} runs `nodekeeper {name}`");
        assert_accepted(&command, &format!("{name}'s CMD"));
        let config = command
            .iter()
            .skip_while(|word| *word != "--config")
            .nth(1)
            .expect("--config");
        let shipped = format!("config/{name}.yaml");
        assert!(
            runtime
                .all("COPY")
                .contains(&format!("{shipped} {config}").as_str()),
            "{name} does not put {shipped} at {config}"
        );
    }

    // The agent: distroless, root (the DaemonSet runs it privileged).
    let agent = stage(&stages, "agent");
    assert!(
        agent.base.starts_with("gcr.io/distroless/"),
        "{}",
        agent.base
    );
    assert_eq!(agent.last("USER"), None, "the agent runs as root");
    // The controller: the fence agents and what they call, as the Deployment's user.
    let controller = stage(&stages, "controller");
    let install = controller.all("RUN").join(" ");
    for package in [
        "fence-agents",
        "ipmitool",
        "snmp",
        "openssh-client",
        "telnet",
        "sg3-utils",
    ] {
        assert!(
            install.split(' ').any(|word| word == package),
            "the controller image does not install {package}"
        );
    }
    let user = controller.last("USER").expect("the controller's USER");
    let deployment = manifest_container("controller/deployment.yaml");
    let security = &deployment.pod["securityContext"];
    assert_eq!(
        user,
        format!(
            "{}:{}",
            security["runAsUser"].as_i64().unwrap(),
            security["runAsGroup"].as_i64().unwrap()
        ),
        "the image's user is the Deployment's"
    );
    let uid = user.split(':').next().unwrap();
    assert!(
        install.contains(&format!("--uid {uid}")),
        "the controller's user {uid} has no passwd entry (ssh-based agents need one)"
    );
}

/// A manifest's pod spec and its only container.
struct ManifestContainer {
    pod: serde_json::Value,
    container: serde_json::Value,
}

/// The one workload (DaemonSet or Deployment) among `file`'s documents.
fn manifest_container(file: &str) -> ManifestContainer {
    use serde::Deserialize;
    let text = read(&format!("packaging/kubernetes/{file}"));
    let workloads: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| serde_json::Value::deserialize(document).expect("a YAML document"))
        .filter(|value| matches!(value["kind"].as_str(), Some("DaemonSet" | "Deployment")))
        .collect();
    assert_eq!(workloads.len(), 1, "{file}: one workload");
    let pod = workloads[0]["spec"]["template"]["spec"].clone();
    let containers = pod["containers"].as_array().expect("containers").clone();
    assert_eq!(containers.len(), 1, "{file}");
    ManifestContainer {
        pod,
        container: containers[0].clone(),
    }
}

/// `nodekeeper WORDS --help` parses: the binary accepts that command line.
fn assert_accepted(words: &[String], what: &str) {
    let output = Command::new(BINARY)
        .args(words)
        .arg("--help")
        .output()
        .expect("run nodekeeper");
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("Usage:"),
        "{what}: `nodekeeper {}` is refused: {}",
        words.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_build_script_tags_the_images_the_manifests_run() {
    let output = Command::new(repository().join("scripts/build-images"))
        .arg("--dry-run")
        .env("ENGINE", "podman")
        .output()
        .expect("scripts/build-images");
    assert!(output.status.success(), "{output:?}");
    let mut tags = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            &words[..4],
            ["podman", "build", "--file", "Containerfile"],
            "{line}"
        );
        let after = |flag: &str| {
            let at = words.iter().position(|w| *w == flag).expect(flag);
            words[at + 1].to_string()
        };
        assert_eq!(
            words.last(),
            Some(&"."),
            "the repository is the context: {line}"
        );
        tags.insert(after("--target"), after("--tag"));
    }
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        tags,
        BTreeMap::from([
            (
                "agent".to_string(),
                format!("ghcr.io/nodekeeper/nodekeeper:{version}")
            ),
            (
                "controller".to_string(),
                format!("ghcr.io/nodekeeper/nodekeeper-controller:{version}")
            ),
        ])
    );

    // Each workload runs the image of its stage, and the binary accepts its arguments
    // after the image's ENTRYPOINT.
    for (file, target) in [
        ("agent/daemonset.yaml", "agent"),
        ("controller/deployment.yaml", "controller"),
    ] {
        let workload = manifest_container(file);
        assert_eq!(
            workload.container["image"].as_str(),
            Some(tags[target].as_str()),
            "{file} runs another image than `--target {target}`"
        );
        assert!(
            workload.container["command"].is_null(),
            "{file} replaces the image's ENTRYPOINT"
        );
        let args: Vec<String> =
            serde_json::from_value(workload.container["args"].clone()).expect("args");
        assert_eq!(args[0], target, "{file}");
        assert_accepted(&args, file);
    }

    // The fence Jobs' example in the shipped configuration names the controller's image
    // and the binary's path in it.
    let config = read("config/controller.yaml");
    assert!(
        config.contains(&format!("image: {}", tags["controller"])),
        "config/controller.yaml's Job example names another image"
    );
    assert!(config.contains(&format!("command: [{BINARY_IN_IMAGE}]")));
}

#[test]
fn the_build_script_refuses_what_it_does_not_know() {
    let output = Command::new(repository().join("scripts/build-images"))
        .arg("--regsitry")
        .env("ENGINE", "podman")
        .output()
        .expect("scripts/build-images");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("usage:"));
    assert!(output.stdout.is_empty(), "it ran something: {output:?}");
}
