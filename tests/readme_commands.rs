//! The command lines a new user copies from README.md and docs/ are accepted as written:
//! each example in a shell block parses (checked with `--help` appended, so nothing runs
//! against this host or a cluster), and each option the README's command table names
//! exists on that command.

mod support {
    pub mod documents;
}

use std::path::Path;
use std::process::{Command, Output};

use support::documents::{documents, repository};

const BINARY: &str = env!("CARGO_BIN_EXE_nodekeeper");

/// A command line found in a document, with where it was found.
struct Example {
    place: String,
    /// The arguments after `nodekeeper` (or `cargo run --release --`), as shell text.
    arguments: String,
}

/// The nodekeeper command lines of a document's shell blocks: continuation lines
/// joined, comments, pipelines and output redirections after the command cut off.
fn examples(document: &Path) -> Vec<Example> {
    let text = std::fs::read_to_string(document).expect("read a document");
    let name = document
        .strip_prefix(repository())
        .unwrap_or(document)
        .display()
        .to_string();
    let mut examples = Vec::new();
    let mut in_shell_block = false;
    let mut pending = String::new();
    let mut first_line = 0;
    for (index, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        if fence.starts_with("```") {
            in_shell_block = !in_shell_block
                && ["```sh", "```bash", "```shell", "```console"].contains(&fence.trim_end());
            continue;
        }
        if !in_shell_block {
            continue;
        }
        if pending.is_empty() {
            first_line = index + 1;
        }
        let line = line.trim();
        if let Some(continued) = line.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let whole = std::mem::take(&mut pending);
        let command =
            without_assignments(whole.trim_start_matches("$ ").trim_start_matches("sudo "))
                .split(" # ")
                .next()
                .unwrap_or_default()
                .split(" | ")
                .next()
                .unwrap_or_default()
                // A redirection goes too: `--help` appended after it would otherwise be
                // written wherever the example writes (`> /etc/...`).
                .split(" >")
                .next()
                .unwrap_or_default()
                .trim();
        let arguments = command
            .strip_prefix("nodekeeper ")
            .or_else(|| command.strip_prefix("cargo run --release -- "))
            .or_else(|| command.strip_prefix("cargo run -- "));
        if let Some(arguments) = arguments {
            examples.push(Example {
                place: format!("{name}:{first_line}"),
                arguments: arguments.to_string(),
            });
        }
    }
    examples
}

/// `command` without the variable assignments before it (`RUST_LOG=debug nodekeeper ...`).
fn without_assignments(command: &str) -> &str {
    let mut rest = command.trim_start();
    while let Some((word, after)) = rest.split_once(' ') {
        let is_assignment = word.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
        });
        if !is_assignment {
            break;
        }
        rest = after.trim_start();
    }
    rest
}

/// `nodekeeper ARGUMENTS --help` through the shell, so the example's quoting and `~`
/// mean what they mean when a user pastes it. It runs in an empty directory of its own:
/// with `--help` nothing is read, and a redirection of input reads nothing here.
fn help_after(arguments: &str) -> Output {
    let scratch = tempfile::tempdir().expect("a scratch directory");
    Command::new("sh")
        .arg("-c")
        .arg(format!("exec \"$NODEKEEPER\" {arguments} --help"))
        .env("NODEKEEPER", BINARY)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .current_dir(scratch.path())
        .output()
        .expect("run sh")
}

/// The long options a `--help` text lists, as whole words.
fn long_options(help: &str) -> Vec<String> {
    help.split_whitespace()
        .map(|word| word.trim_end_matches(','))
        .filter(|word| word.starts_with("--"))
        .map(|word| word.split('=').next().unwrap_or(word).to_string())
        .collect()
}

#[test]
fn every_documented_command_line_parses_as_written() {
    let examples: Vec<Example> = documents().iter().flat_map(|doc| examples(doc)).collect();
    // The README's quick start and its examples are among them.
    assert!(
        examples.iter().any(|e| e.place.starts_with("README.md")
            && e.arguments == "agent --config config/agent.yaml"),
        "the quick start's agent line was not found"
    );
    assert!(
        examples.len() >= 15,
        "only {} examples found",
        examples.len()
    );
    let mut refused = Vec::new();
    for example in &examples {
        let output = help_after(&example.arguments);
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() || !stdout.contains("Usage: nodekeeper") {
            refused.push(format!(
                "{}: nodekeeper {}\n  {}",
                example.place,
                example.arguments,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
    }
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}

#[test]
fn every_option_in_the_readme_command_table_exists() {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let synopses: Vec<&str> = readme
        .lines()
        .filter_map(|line| line.strip_prefix("| `nodekeeper "))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    assert!(synopses.len() >= 10, "{synopses:?}");
    let mut missing = Vec::new();
    for synopsis in synopses {
        let words: Vec<&str> = synopsis
            .split_whitespace()
            .take_while(|word| word.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            .take_while(|word| !word.starts_with('-'))
            .collect();
        let help = Command::new(BINARY)
            .args(&words)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            help.status.success(),
            "nodekeeper {} --help",
            words.join(" ")
        );
        let known = long_options(&String::from_utf8_lossy(&help.stdout));
        for option in synopsis
            .split(|c: char| c.is_whitespace() || c == '[' || c == ']')
            .filter(|token| token.starts_with("--"))
        {
            if !known.iter().any(|known| known == option) {
                missing.push(format!("nodekeeper {}: {option}", words.join(" ")));
            }
        }
    }
    assert!(missing.is_empty(), "not accepted: {missing:?}");
}

#[test]
fn the_commands_the_readme_says_take_the_kubelets_eviction_flags_do() {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let claim = "The agent, `signals` and `check-config` also take";
    assert!(
        readme.contains(claim),
        "the README no longer says {claim:?}"
    );
    for command in ["agent", "signals", "check-config"] {
        let help = Command::new(BINARY)
            .args([command, "--help"])
            .output()
            .unwrap();
        let known = long_options(&String::from_utf8_lossy(&help.stdout));
        for flag in [
            "--eviction-hard",
            "--eviction-soft",
            "--eviction-soft-grace-period",
            "--eviction-minimum-reclaim",
            "--eviction-pressure-transition-period",
            "--eviction-max-pod-grace-period",
        ] {
            assert!(
                known.iter().any(|known| known == flag),
                "{command} lacks {flag}"
            );
        }
    }
}
