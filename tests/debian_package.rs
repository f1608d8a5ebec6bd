//! The Debian package, as `scripts/package-deb` builds it (`scripts/test` builds it from
//! the tests' own build and names it in `NODEKEEPER_DEB`):
//!
//! - lintian reports neither errors nor warnings, and the package holds what an operator
//!   looks for: the binary in `/usr/bin`, both units, both configurations as conffiles,
//!   a manual page for every command and bash, zsh and fish completions, each equal to
//!   what the binary under test generates (a package built from another tree fails);
//! - installed with `dpkg -i` on a Debian node booted with systemd-nspawn (real systemd,
//!   its own network namespace), the agent's service is enabled, started and READY
//!   (`Type=notify`), serves metrics from the shipped dry-run configuration, and the
//!   controller's is installed but neither enabled nor started; `dpkg --verify` finds
//!   every file as packaged, then a changed one; an upgrade restarts the agent, puts the
//!   changed file back and keeps the operator's edit of its conffile; `dpkg --remove` stops it and
//!   keeps the configuration, `dpkg --purge` removes the configuration and the agent's state.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::netns::{NETNS, Netns};
use support::nspawn::{BootOptions, Booted, Container, NSPAWN};

/// What these tests need, for `require!`.
const PACKAGE: &str = "the Debian package built by scripts/package-deb";

const BINARY: &str = env!("CARGO_BIN_EXE_nodekeeper");

/// The package `NODEKEEPER_DEB` names.
fn package() -> Result<PathBuf, String> {
    let path = std::env::var_os("NODEKEEPER_DEB")
        .map(PathBuf::from)
        .ok_or(
            "NODEKEEPER_DEB is not set (scripts/test sets it to the .deb that \
         `scripts/package-deb --test-build` writes)",
        )?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("NODEKEEPER_DEB={} is not a file", path.display()))
    }
}

fn run(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn stdout_of(program: &str, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(output.status.success(), "{program} {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `gzip -dc`, since the package compresses its manual pages.
fn gunzip(path: &Path) -> Vec<u8> {
    let output = run("gzip", &["-dc", &path.display().to_string()]);
    assert!(output.status.success(), "gzip -dc {}", path.display());
    output.stdout
}

#[test]
fn lintian_accepts_the_package_and_it_holds_what_an_operator_looks_for() {
    let deb = require!(PACKAGE, package());
    require!("lintian", support::real::program("lintian", "lintian"));
    let deb_arg = deb.display().to_string();

    let lintian = run(
        "lintian",
        &["--fail-on", "error,warning", "--display-info", &deb_arg],
    );
    let report = String::from_utf8_lossy(&lintian.stdout);
    println!("lintian:\n{report}");
    assert!(
        lintian.status.success(),
        "lintian found errors or warnings ({}):\n{report}{}",
        lintian.status,
        String::from_utf8_lossy(&lintian.stderr)
    );

    let control = stdout_of("dpkg-deb", &["--field", &deb_arg]);
    for field in [
        "Package: nodekeeper",
        &format!("Version: {}-1", env!("CARGO_PKG_VERSION")),
        "Section: admin",
        "Depends: libc6",
        "libgcc-s1",
        "Suggests: fence-agents",
    ] {
        assert!(control.contains(field), "no {field:?} in:\n{control}");
    }
    let conffiles = stdout_of("dpkg-deb", &["--info", &deb_arg, "conffiles"]);
    let mut conffiles: Vec<&str> = conffiles.lines().collect();
    conffiles.sort_unstable();
    assert_eq!(
        conffiles,
        [
            "/etc/nodekeeper/agent.yaml",
            "/etc/nodekeeper/controller.yaml"
        ]
    );

    let tree = tempfile::tempdir().expect("a temporary directory");
    let unpacked = run(
        "dpkg-deb",
        &["-x", &deb_arg, &tree.path().display().to_string()],
    );
    assert!(unpacked.status.success(), "{unpacked:?}");
    let root = tree.path();
    for (path, text) in [
        (
            "usr/lib/systemd/system/nodekeeper-agent.service",
            include_str!("../systemd/nodekeeper-agent.service"),
        ),
        (
            "usr/lib/systemd/system/nodekeeper-controller.service",
            include_str!("../systemd/nodekeeper-controller.service"),
        ),
        (
            "etc/nodekeeper/agent.yaml",
            include_str!("../config/agent.yaml"),
        ),
        (
            "etc/nodekeeper/controller.yaml",
            include_str!("../config/controller.yaml"),
        ),
        (
            "usr/share/doc/nodekeeper/README.md",
            include_str!("../README.md"),
        ),
        (
            "usr/share/nodekeeper/prometheus/rules.yaml",
            include_str!("../packaging/prometheus/rules.yaml"),
        ),
        (
            "usr/share/doc/nodekeeper/copyright",
            include_str!("../packaging/debian/copyright"),
        ),
    ] {
        let packaged = std::fs::read_to_string(root.join(path))
            .unwrap_or_else(|e| panic!("{path} in the package: {e}"));
        assert_eq!(packaged, text, "{path} differs from the tree's");
    }
    // What the units' Documentation= names is in the package.
    for unit in ["nodekeeper-agent.service", "nodekeeper-controller.service"] {
        let text = std::fs::read_to_string(root.join("usr/lib/systemd/system").join(unit))
            .expect("the unit");
        let documentation: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("Documentation="))
            .flat_map(str::split_whitespace)
            .collect();
        assert!(
            documentation.iter().any(|d| d.starts_with("man:")),
            "{unit} names no manual page: {documentation:?}"
        );
        for reference in documentation {
            let path = if let Some(page) = reference.strip_prefix("man:") {
                let (name, section) = page
                    .trim_end_matches(')')
                    .split_once('(')
                    .unwrap_or_else(|| panic!("{unit}: {reference}"));
                format!("usr/share/man/man{section}/{name}.{section}.gz")
            } else if let Some(file) = reference.strip_prefix("file:///") {
                file.to_string()
            } else {
                continue;
            };
            assert!(
                root.join(&path).is_file(),
                "{unit}'s Documentation={reference} is not in the package ({path})"
            );
        }
    }

    let version = Command::new(root.join("usr/bin/nodekeeper"))
        .arg("--version")
        .output()
        .expect("the packaged binary runs");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("nodekeeper {}", env!("CARGO_PKG_VERSION"))
    );

    // A manual page for every command the binary under test has, and no other, each the
    // page that binary writes: the package was built from this tree's command line.
    let expected = tempfile::tempdir().expect("a temporary directory");
    let written = stdout_of(
        BINARY,
        &["manpages", &expected.path().display().to_string()],
    );
    let mut expected_pages: Vec<String> = written
        .lines()
        .map(|line| {
            format!(
                "{}.gz",
                Path::new(line).file_name().unwrap().to_string_lossy()
            )
        })
        .collect();
    expected_pages.sort();
    let man_dir = root.join("usr/share/man/man1");
    let mut packaged_pages: Vec<String> = std::fs::read_dir(&man_dir)
        .expect("usr/share/man/man1 in the package")
        .map(|entry| {
            entry
                .expect("a manual page")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    packaged_pages.sort();
    assert_eq!(packaged_pages, expected_pages);
    for command in ["", "agent", "controller", "controller-status", "fence-run"] {
        assert!(
            expected_pages.contains(&format!(
                "nodekeeper{}{command}.1.gz",
                if command.is_empty() { "" } else { "-" }
            )),
            "no manual page for {command:?}: {expected_pages:?}"
        );
    }
    for page in &expected_pages {
        let plain = page.trim_end_matches(".gz");
        assert_eq!(
            gunzip(&man_dir.join(page)),
            std::fs::read(expected.path().join(plain)).expect("the expected page"),
            "{page} is not the page the binary under test writes"
        );
    }
    let agent_page = String::from_utf8(gunzip(&man_dir.join("nodekeeper-agent.1.gz"))).unwrap();
    assert!(agent_page.contains(".SH OPTIONS") && agent_page.contains("dry\\-run"));

    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/nodekeeper"),
        ("zsh", "usr/share/zsh/vendor-completions/_nodekeeper"),
        (
            "fish",
            "usr/share/fish/vendor_completions.d/nodekeeper.fish",
        ),
    ] {
        let packaged = std::fs::read_to_string(root.join(path))
            .unwrap_or_else(|e| panic!("{path} in the package: {e}"));
        assert_eq!(
            packaged,
            stdout_of(BINARY, &["completions", shell]),
            "the {shell} completions in the package"
        );
        assert!(
            packaged.contains("check-config"),
            "{shell}: {packaged:.200}"
        );
    }
}

/// What `dpkg --verify` finds changed in the installed package, one line a file (it exits
/// non-zero when it finds any), `??5?????? c /etc/...` for a conffile; sorted, since
/// dpkg lists them in the order of its sums.
fn verify(container: &Container) -> Vec<String> {
    let output = container.exec("dpkg --verify nodekeeper");
    assert!(
        output.stderr.is_empty(),
        "dpkg --verify: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut changed: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    changed.sort();
    changed
}

/// `command` in the container with `sh -c`; fails with its output unless it succeeds.
fn must(container: &Container, command: &str) -> String {
    let output = container.exec(command);
    assert!(
        output.status.success(),
        "`{command}` failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The agent's journal, for a failure message.
fn agent_journal(container: &Container) -> String {
    container.stdout("journalctl --no-pager -n 60 -u nodekeeper-agent.service")
}

/// An HTTP GET of `path` on the container's loopback port `port`, with bash's /dev/tcp
/// (the minimal tree has no HTTP client): the status line and body, or "" if nothing
/// answers.
fn http_get(container: &Container, port: u16, path: &str) -> String {
    container.stdout(&format!(
        "exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && \
             printf \"GET {path} HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n\" >&3 && \
             timeout 5 cat <&3' 2>/dev/null"
    ))
}

/// Waits up to 20 s for the agent's /metrics on `port` to answer 200 with `needle`.
fn wait_for_metrics(container: &Container, port: u16, needle: &str) -> String {
    support::poll::Wait::for_(
        &format!("/metrics with {needle:?} on port {port}"),
        Duration::from_secs(20),
    )
    .every(Duration::from_millis(200))
    .showing(|| {
        format!(
            "last answer:\n{:.400}\njournal:\n{}",
            http_get(container, port, "/metrics"),
            agent_journal(container)
        )
    })
    .until(|| {
        let response = http_get(container, port, "/metrics");
        (response.starts_with("HTTP/1.") && response.contains(" 200 ") && response.contains(needle))
            .then_some(response)
    })
}

/// A unit that says the container has booted (the test's `ready_line`), since no agent
/// runs before the package is installed.
const BOOTED_UNIT: &str = "[Unit]\nDescription=tell the test the node has booted\n\n\
    [Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo node booted >> /shared/agent.log'\n\n\
    [Install]\nWantedBy=multi-user.target\n";

/// The port of the shipped configuration's metricsAddress, and the one the operator's
/// edit moves it to.
const SHIPPED_PORT: u16 = 9847;
const EDITED_PORT: u16 = 9848;

#[test]
fn installs_starts_the_agent_upgrades_keeping_its_configuration_and_purges() {
    let deb = require!(PACKAGE, package());
    let netns = require!(NETNS, Netns::create("deb"));
    let mut bytes = Vec::new();
    std::fs::File::open(&deb)
        .and_then(|mut file| file.read_to_end(&mut bytes))
        .expect("reading the package");
    let options = BootOptions {
        unified: true,
        netns: Some(netns.path()),
        without_test_binary: true,
        ..BootOptions::default()
    };
    let booted: Booted = require!(
        NSPAWN,
        support::nspawn::boot_with(
            &[("booted.service", BOOTED_UNIT.to_string())],
            &[("nodekeeper.deb", bytes)],
            "node booted",
            options,
        )
    );
    let node = &booted.container;
    assert!(
        !booted.root.join("usr/bin/nodekeeper").exists(),
        "the tree must not hold a nodekeeper before the package installs it"
    );
    // Installed on a node that has finished booting, as an operator would.
    let _ = node.exec("systemctl is-system-running --wait");

    let installed = must(node, "dpkg -i /shared/nodekeeper.deb 2>&1");
    println!("dpkg -i:\n{installed}");
    assert_eq!(
        node.stdout("systemctl is-enabled nodekeeper-agent"),
        "enabled"
    );
    // Type=notify: `active` only once the agent said READY=1, and postinst's start waited
    // for it.
    assert_eq!(
        node.stdout("systemctl is-active nodekeeper-agent"),
        "active",
        "journal:\n{}",
        agent_journal(node)
    );
    let status = node.unit_property("nodekeeper-agent.service", "StatusText");
    assert!(
        status.starts_with("dry run"),
        "the Status line: {status:?}; journal:\n{}",
        agent_journal(node)
    );
    // The package's unit (`/lib` is `/usr/lib` on a merged-/usr system), not one in /etc.
    let fragment = node.unit_property("nodekeeper-agent.service", "FragmentPath");
    assert!(
        ["/usr/lib", "/lib"]
            .iter()
            .any(|dir| fragment == format!("{dir}/systemd/system/nodekeeper-agent.service")),
        "the agent's unit is {fragment}"
    );
    let metrics = wait_for_metrics(node, SHIPPED_PORT, "nodekeeper_dry_run 1");
    assert!(
        metrics.contains("nodekeeper_signal_available{"),
        "{metrics:.2000}"
    );
    assert!(http_get(node, SHIPPED_PORT, "/healthz").contains(" 200 "));
    // The controller needs a cluster: installed, but neither enabled nor running.
    assert_eq!(
        node.stdout("systemctl is-enabled nodekeeper-controller"),
        "disabled"
    );
    assert_eq!(
        node.stdout("systemctl is-active nodekeeper-controller"),
        "inactive"
    );
    // The binary, its manual and completions where a shell finds them.
    assert_eq!(
        must(node, "nodekeeper --version"),
        format!("nodekeeper {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(must(node, "ls /usr/share/man/man1").contains("nodekeeper-agent.1.gz"));
    assert!(
        must(
            node,
            "bash -c '. /usr/share/bash-completion/completions/nodekeeper && complete -p nodekeeper'"
        )
        .contains("nodekeeper"),
    );
    let conffiles = must(node, "dpkg-query -W -f='${Conffiles}' nodekeeper");
    assert!(
        conffiles.contains("/etc/nodekeeper/agent.yaml"),
        "{conffiles}"
    );
    // Every installed file can be checked against the package (`dpkg --verify`, debsums;
    // dpkg sums the files as it unpacks them, cargo-deb ships no md5sums): nothing the
    // maintainer scripts ran changed one.
    assert_eq!(
        verify(node),
        Vec::<String>::new(),
        "a fresh installation as packaged"
    );

    // An upgrade (the same package again goes through the same maintainer scripts) keeps
    // the operator's edit of the conffile and restarts the agent, which reads it.
    let first_pid = node.unit_property("nodekeeper-agent.service", "MainPID");
    must(
        node,
        &format!("sed -i 's/:{SHIPPED_PORT}/:{EDITED_PORT}/' /etc/nodekeeper/agent.yaml"),
    );
    // A packaged file changed behind dpkg's back is told from the operator's edit.
    let completion = "/usr/share/bash-completion/completions/nodekeeper";
    must(node, &format!("echo '# changed' >> {completion}"));
    assert_eq!(
        verify(node),
        [
            format!("??5??????   {completion}"),
            "??5?????? c /etc/nodekeeper/agent.yaml".to_string(),
        ]
    );
    let upgraded = must(node, "dpkg -i /shared/nodekeeper.deb 2>&1");
    println!("dpkg -i again:\n{upgraded}");
    assert!(
        must(node, "cat /etc/nodekeeper/agent.yaml").contains(&format!(":{EDITED_PORT}")),
        "the upgrade replaced the operator's configuration"
    );
    assert_eq!(
        verify(node),
        ["??5?????? c /etc/nodekeeper/agent.yaml"],
        "the upgrade put the packaged file back and kept the edit"
    );
    assert_eq!(
        node.stdout("systemctl is-active nodekeeper-agent"),
        "active"
    );
    let second_pid = node.unit_property("nodekeeper-agent.service", "MainPID");
    assert_ne!(
        second_pid, first_pid,
        "the upgrade did not restart the agent"
    );
    wait_for_metrics(node, EDITED_PORT, "nodekeeper_dry_run 1");

    // Removed: stopped, the binary gone, the configuration kept.
    must(node, "dpkg --remove nodekeeper 2>&1");
    assert_eq!(
        node.stdout("systemctl is-active nodekeeper-agent"),
        "inactive"
    );
    assert!(!booted.root.join("usr/bin/nodekeeper").exists());
    assert!(booted.root.join("etc/nodekeeper/agent.yaml").exists());
    assert_eq!(http_get(node, EDITED_PORT, "/healthz"), "");

    // Purged: the configuration and what the agent wrote are gone too.
    must(
        node,
        "mkdir -p /var/lib/nodekeeper && touch /var/lib/nodekeeper/graceful_shutdown_state.json",
    );
    must(node, "dpkg --purge nodekeeper 2>&1");
    for gone in ["etc/nodekeeper", "var/lib/nodekeeper"] {
        assert!(
            !booted.root.join(gone).exists(),
            "{gone} is still there after --purge"
        );
    }
    let state =
        node.stdout("dpkg-query -W -f='${Status}' nodekeeper 2>/dev/null || echo unknown to dpkg");
    assert!(
        state == "unknown to dpkg" || state.ends_with(" not-installed"),
        "dpkg's record after --purge: {state:?}"
    );
}
