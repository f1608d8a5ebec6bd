//! End to end with a real systemd-logind: a Debian bookworm tree booted with
//! systemd-nspawn runs `nodekeeper shutdown-manager` as a service next to workloads in
//! priority tiers; `systemctl poweroff` inside must wait for the agent's phases.
//!
//! Needs root, systemd-nspawn (package systemd-container) and debootstrap; the tree is
//! cached in /var/cache/nodekeeper-test/bookworm (override with NODEKEEPER_NSPAWN_TREE;
//! the mirror is apt's own, or NODEKEEPER_DEBIAN_MIRROR). Fails under `CI=true` when any
//! of that is unavailable, skips with a message otherwise.

mod support {
    pub mod debian;
    #[allow(dead_code)]
    pub mod nspawn;
    #[allow(dead_code)]
    pub mod poll;
    pub mod real;
}

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nodekeeper::shutdown::state::{PhaseStatus, ShutdownOutcome, ShutdownState, StateStore};
use support::nspawn::{Booted, NSPAWN};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nspawn")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Boots the container with the standalone shutdown manager and the workloads, and waits
/// until the manager holds its lock.
fn boot() -> Result<Booted, String> {
    let units: Vec<(&str, String)> = ["nodekeeper-shutdown.service", "workloads.service"]
        .into_iter()
        .map(|unit| (unit, fixture(unit)))
        .collect();
    let files: Vec<(&str, Vec<u8>)> = [
        "config.yaml",
        "pods.yaml",
        "workload.sh",
        "start-workloads.sh",
    ]
    .into_iter()
    .map(|name| (name, fixture(name).into_bytes()))
    .collect();
    support::nspawn::boot(&units, &files, "logind delay lock held")
}

/// (seconds since epoch, workload id, event) from the workloads' log.
fn events(shared: &Path) -> Vec<(f64, String, String)> {
    std::fs::read_to_string(shared.join("events.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some((
                parts.next()?.parse().ok()?,
                parts.next()?.to_string(),
                parts.next()?.to_string(),
            ))
        })
        .collect()
}

/// Until the container's four workloads have started (30 s at most).
fn wait_for_workloads(shared: &Path) {
    support::poll::Wait::for_("the workloads to start", Duration::from_secs(30))
        .every(Duration::from_millis(50))
        .showing(|| format!("{:?}", events(shared)))
        .until_true(|| events(shared).iter().filter(|e| e.2 == "START").count() >= 4);
}

#[test]
fn real_logind_waits_for_the_phases_and_the_container_powers_off() {
    let mut booted: Booted = require!(NSPAWN, boot());
    let (root, shared) = (booted.root.clone(), booted.shared.clone());
    let container = &mut booted.container;
    let agent_log = shared.join("agent.log");
    // The lock is visible to logind, and logind honours the raised limit.
    let inhibitors = container.exec("systemd-inhibit --list --no-pager");
    let inhibitors = String::from_utf8_lossy(&inhibitors.stdout);
    assert!(
        inhibitors
            .lines()
            .any(|l| l.contains("nodekeeper") && l.contains("shutdown") && l.contains("delay")),
        "{inhibitors}"
    );
    let delay = container.exec(
        "busctl get-property org.freedesktop.login1 /org/freedesktop/login1 \
         org.freedesktop.login1.Manager InhibitDelayMaxUSec",
    );
    assert_eq!(String::from_utf8_lossy(&delay.stdout).trim(), "t 9000000");
    let dropin =
        std::fs::read_to_string(root.join("etc/systemd/logind.conf.d/99-nodekeeper.conf")).unwrap();
    assert!(dropin.contains("InhibitDelayMaxSec=9"), "{dropin}");

    wait_for_workloads(&shared);

    let gone_after = container.power_off();

    let log = std::fs::read_to_string(&agent_log).unwrap();
    assert!(log.contains("PrepareForShutdown(true)"), "{log}");
    assert!(log.contains("delay lock released"), "{log}");
    let state: ShutdownState = StateStore::new(shared.join("state.json"))
        .load()
        .unwrap()
        .expect("state file");
    assert_eq!(state.outcome, ShutdownOutcome::Finished);
    assert!(state.about_to_power_off);
    let priorities: Vec<i32> = state.phases.iter().map(|p| p.priority).collect();
    assert_eq!(priorities, vec![0, 1000, 2_000_000_000]);
    let mut previous_end = 0;
    for phase in &state.phases {
        let (start, end) = (
            phase.started_unix_ms.unwrap(),
            phase.finished_unix_ms.unwrap(),
        );
        assert!(start >= previous_end, "phases overlap: {state:?}");
        previous_end = end;
        let overshoot = (end - start) as i64 - phase.seconds * 1000;
        println!(
            "phase {} ({:?}): took {} ms of its {} s budget (overshoot {} ms)",
            phase.priority,
            phase.status,
            end - start,
            phase.seconds,
            overshoot
        );
        assert!(
            overshoot <= 500,
            "phase {} overran its budget",
            phase.priority
        );
    }
    assert_eq!(
        state.phases[0].status,
        PhaseStatus::TimedOut,
        "batch ignores SIGTERM"
    );
    assert_eq!(state.phases[1].status, PhaseStatus::Completed);

    let term_at = |id: &str| {
        events(&shared)
            .iter()
            .find(|e| e.1 == id && e.2 == "TERM")
            .map(|e| e.0)
            .unwrap_or_else(|| panic!("{id} never got SIGTERM: {:?}", events(&shared)))
    };
    let (web, batch) = (term_at("default/web"), term_at("default/batch"));
    let (postgres, dns) = (term_at("db/postgres"), term_at("kube-system/dns"));
    assert!(
        web.max(batch) < postgres && postgres < dns,
        "{:?}",
        events(&shared)
    );
    println!(
        "poweroff to container gone: {gone_after:?} (logind's default limit is 5 s; budget 9 s)"
    );
    assert!(
        gone_after > Duration::from_secs(5),
        "the drain took longer than 5 s, so logind must have honoured the raised limit"
    );
}

/// Killing the agent mid-shutdown: systemd restarts it and it finishes the remaining
/// phases. Killing closes the agent's lock, so a second delay lock (as another component
/// on a real node might hold) keeps logind waiting meanwhile, up to the raised 9 s limit.
#[test]
fn an_agent_killed_mid_shutdown_resumes_the_remaining_phases() {
    let mut booted: Booted = require!(NSPAWN, boot());
    let shared = booted.shared.clone();
    let container = &mut booted.container;
    wait_for_workloads(&shared);
    let other = container.exec(
        "systemd-run --unit=other-delay-lock systemd-inhibit --what=shutdown --mode=delay \
         --who=other --why=test sleep 60",
    );
    assert!(other.status.success(), "{other:?}");
    // systemd-run returns once the unit started, not once its lock is taken: without
    // the lock, killing the agent would leave logind nothing to wait for.
    let inhibitors = || {
        String::from_utf8_lossy(&container.exec("systemd-inhibit --list --no-pager").stdout)
            .into_owned()
    };
    support::poll::Wait::for_("the second delay lock to be taken", Duration::from_secs(10))
        .every(Duration::from_millis(50))
        .showing(inhibitors)
        .until_true(|| {
            inhibitors()
                .lines()
                .any(|line| line.contains("other") && line.contains("delay"))
        });
    let poweroff = container.exec("systemctl poweroff");
    assert!(poweroff.status.success(), "{poweroff:?}");
    support::poll::Wait::for_("phase 0 to start", Duration::from_secs(10))
        .every(Duration::from_millis(10))
        .showing(|| format!("{:?}", events(&shared)))
        .until_true(|| {
            events(&shared)
                .iter()
                .any(|e| e.1 == "default/web" && e.2 == "TERM")
        });
    let killed = container.exec("systemctl kill --signal=SIGKILL nodekeeper-shutdown.service");
    assert!(killed.status.success(), "{killed:?}");
    let killed_at = Instant::now();
    let powered_off = container.exited_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(shared.join("agent.log")).unwrap_or_default();
    assert!(
        powered_off,
        "the container did not power off within 60 s of the kill (at {:.3} s since the epoch)\nworkload events: {:?}\nagent log:\n{log}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |now| now.as_secs_f64()
                - killed_at.elapsed().as_secs_f64()),
        events(&shared)
    );
    assert!(
        log.contains("resuming a shutdown interrupted by an agent restart"),
        "{log}"
    );
    let state: ShutdownState = StateStore::new(shared.join("state.json"))
        .load()
        .unwrap()
        .expect("state file");
    assert_eq!(state.outcome, ShutdownOutcome::Finished, "{state:?}");
    for phase in &state.phases {
        println!(
            "resumed run: phase {} {:?} in {:?} ms",
            phase.priority,
            phase.status,
            phase.duration_ms()
        );
    }
    for id in ["db/postgres", "kube-system/dns"] {
        assert!(
            events(&shared).iter().any(|e| e.1 == id && e.2 == "TERM"),
            "{id} was not drained after the restart: {:?}",
            events(&shared)
        );
    }
}

// ------------------------------------------------------- the mirror debootstrap uses

/// This machine's own sources file: the mirror is in `URIs:`, and a snapshot address sits
/// in a comment just above it.
const DEB822_WITH_COMMENTED_SNAPSHOT: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

#[test]
fn the_mirror_comes_from_the_uris_field_not_from_a_comment() {
    let sources = support::debian::parse_deb822(DEB822_WITH_COMMENTED_SNAPSHOT);
    assert_eq!(
        support::debian::choose_mirror(&sources, "bookworm").as_deref(),
        Some("http://deb.debian.org/debian")
    );
}

#[test]
fn deb822_continuation_lines_disabled_paragraphs_and_source_only_entries() {
    let text = "\
Types: deb-src
URIs: http://source-only.example/debian
Suites: bookworm

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: bookworm

# A comment paragraph of its own.

types: deb deb-src
uris:
 http://first.example/debian/
 http://second.example/debian
suites: trixie bookworm
";
    let sources = support::debian::parse_deb822(text);
    assert_eq!(sources.len(), 1, "{sources:?}");
    assert_eq!(
        sources[0].uris,
        [
            "http://first.example/debian/",
            "http://second.example/debian"
        ]
    );
    assert_eq!(
        support::debian::choose_mirror(&sources, "bookworm").as_deref(),
        Some("http://first.example/debian")
    );
}

#[test]
fn one_line_sources_skip_comments_deb_src_and_options() {
    let text = "\
# deb http://commented.example/debian bookworm main
deb-src http://source.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://security.debian.org/debian-security bookworm-security main
deb [ arch=amd64 ] http://mirror.example/debian bookworm main # the main archive
";
    let sources = support::debian::parse_one_line(text);
    assert_eq!(sources.len(), 2, "{sources:?}");
    assert_eq!(
        support::debian::choose_mirror(&sources, "bookworm").as_deref(),
        Some("http://mirror.example/debian")
    );
}

#[test]
fn a_mirror_without_the_suite_falls_back_to_the_first_main_archive() {
    let sources = support::debian::parse_one_line(
        "deb http://updates.example/debian trixie-updates main\n\
         deb cdrom:[Debian]/ trixie main\n\
         deb https://main.example/debian trixie main\n",
    );
    assert_eq!(
        support::debian::choose_mirror(&sources, "bookworm").as_deref(),
        Some("https://main.example/debian")
    );
    assert_eq!(support::debian::choose_mirror(&[], "bookworm"), None);
}
