//! Tests that need a real part of this machine (root, cgroup hierarchies, a dbus-daemon,
//! systemd-nspawn, a tmpfs, a device emulator) either run it or say loudly why not; they
//! never return early and count as passed on a machine that is supposed to run them.
//!
//! A test obtains each real part through [`require!`](crate::require):
//!
//! ```ignore
//! let bus = require!("dbus-daemon", PrivateBus::start(dir.path()));
//! ```
//!
//! - When the part is there, the test goes on with it.
//! - When it is not, the test **panics** if `CI` is set (to anything but `false` or `0`),
//!   as every CI system sets it; on a developer's machine it prints `SKIPPED ...` and
//!   returns.
//!
//! Either way a line goes to the file named by `NODEKEEPER_REAL_TESTS_LOG` (when set):
//! `ran<TAB>part<TAB>test`, or `skipped` (`failed` under CI) `<TAB>part<TAB>test<TAB>reason`. `scripts/test`
//! prints both lists after the run, since the test runner hides a passing test's output.

use std::fmt::Display;
use std::io::Write;

/// The environment variable naming the file that collects the real-component tests run.
pub const LOG_ENV: &str = "NODEKEEPER_REAL_TESTS_LOG";

/// Whether this is a CI run, where a real-component test that cannot run is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !matches!(value.trim(), "" | "0" | "false" | "FALSE"))
}

/// The test running on this thread, as `binary::test`: libtest (and nextest, through it)
/// names the thread after the test.
pub fn current_test() -> String {
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(str::to_string)
        .or_else(|| {
            // nextest runs one test per process and passes its name as the filter.
            std::env::args().skip(1).find(|arg| !arg.starts_with('-'))
        })
        .unwrap_or_else(|| "<unknown test>".to_string());
    format!("{}::{test}", env!("CARGO_CRATE_NAME"))
}

/// The test could not get `component`: fail under CI, otherwise say so on stderr. The
/// caller returns afterwards.
#[track_caller]
pub fn unavailable(component: &str, reason: &dyn Display) {
    let test = current_test();
    let ci = in_ci();
    let logged_reason = reason.to_string().replace(['\t', '\n'], " ");
    let status = if ci { "failed" } else { "skipped" };
    log_line(&format!("{status}\t{component}\t{test}\t{logged_reason}"));
    if ci {
        panic!(
            "{test}: needs {component}, which is not available here: {reason} \
             (CI is set, so a real-component test may not skip)"
        );
    }
    eprintln!("SKIPPED {test}: needs {component}: {reason}");
}

/// The test has `component` and runs with it: note it for CI's list.
pub fn record(component: &str) {
    log_line(&format!("ran\t{component}\t{}", current_test()));
}

fn log_line(line: &str) {
    let Some(path) = std::env::var_os(LOG_ENV) else {
        return;
    };
    let line = format!("{line}\n");
    // One short O_APPEND write per line, so parallel test processes do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = written {
        panic!("{LOG_ENV}={}: {error}", path.to_string_lossy());
    }
}

/// `require!(component, prerequisite)`: the `Ok` value of `prerequisite` (a
/// `Result<T, impl Display>`), recorded as a real-component run; on `Err`, a failure under
/// CI and a `SKIPPED` line otherwise, after which the calling test returns.
/// `require!(component, prerequisite, else value)` returns `value` instead, from a helper
/// that sets a test up (its caller then returns).
#[macro_export]
macro_rules! require {
    ($component:expr, $prerequisite:expr, else $fallback:expr) => {
        match $prerequisite {
            Ok(value) => {
                $crate::support::real::record($component);
                value
            }
            Err(reason) => {
                $crate::support::real::unavailable($component, &reason);
                return $fallback;
            }
        }
    };
    ($component:expr, $prerequisite:expr) => {
        $crate::require!($component, $prerequisite, else ())
    };
}

/// Root, which real cgroups, nsenter and systemd-nspawn need.
pub fn root() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err("not running as root".to_string())
    }
}

/// A program on `PATH`, with the Debian package that provides it named in the error.
pub fn program(name: &str, package: &str) -> Result<(), String> {
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(dir.join(name))
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
    });
    if found {
        Ok(())
    } else {
        Err(format!(
            "{name} is not installed (apt-get install -y {package})"
        ))
    }
}

// Some test binaries include this file alone, without the kubectl test.
#[allow(dead_code)]
/// Where `scripts/test` unpacks Debian's kubectl (package kubernetes-client); another
/// kubectl package may own `/usr/bin/kubectl`, so it is not installed there.
pub const KUBECTL_DEFAULT: &str = "/var/cache/nodekeeper-test/kubernetes-client/usr/bin/kubectl";

/// Debian's kubectl: `NODEKEEPER_KUBECTL`, else where `scripts/test` unpacks it.
#[allow(dead_code)]
pub fn debian_kubectl() -> Result<std::path::PathBuf, String> {
    unpacked_program(
        path_from_env("NODEKEEPER_KUBECTL", KUBECTL_DEFAULT),
        "scripts/test unpacks package kubernetes-client there; or set NODEKEEPER_KUBECTL",
    )
}

/// Where `scripts/test` unpacks Debian's package prometheus (installing it would start a
/// Prometheus service).
#[allow(dead_code)]
pub const PROMETHEUS_ROOT_DEFAULT: &str = "/var/cache/nodekeeper-test/prometheus";

/// `program` (`prometheus` or `promtool`) from Debian's package prometheus, under
/// `NODEKEEPER_PROMETHEUS_ROOT`, else where `scripts/test` unpacks it.
#[allow(dead_code)]
pub fn debian_prometheus(program: &str) -> Result<std::path::PathBuf, String> {
    unpacked_program(
        path_from_env("NODEKEEPER_PROMETHEUS_ROOT", PROMETHEUS_ROOT_DEFAULT)
            .join("usr/bin")
            .join(program),
        "scripts/test unpacks package prometheus there; or set NODEKEEPER_PROMETHEUS_ROOT",
    )
}

/// The path in environment variable `variable` if set and not empty, else `default`.
fn path_from_env(variable: &str, default: &str) -> std::path::PathBuf {
    std::env::var_os(variable)
        .filter(|value| !value.is_empty())
        .map_or_else(|| default.into(), std::path::PathBuf::from)
}

/// `path` if it is an executable file, else an error naming it and `hint`.
fn unpacked_program(path: std::path::PathBuf, hint: &str) -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => Ok(path),
        _ => Err(format!("{} is not there ({hint})", path.display())),
    }
}

/// A fresh directory on a tmpfs (under `/dev/shm`) that is another filesystem than
/// `apart_from`: a second device for tests of what lives on which filesystem. Removed
/// when dropped.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn tmpfs_dir_apart_from(apart_from: &std::path::Path) -> Result<tempfile::TempDir, String> {
    use std::os::unix::fs::MetadataExt;
    let shm = std::path::Path::new("/dev/shm");
    let device = |path: &std::path::Path| {
        std::fs::metadata(path)
            .map(|meta| meta.dev())
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    if device(shm)? == device(apart_from)? {
        return Err(format!(
            "{} is on the same filesystem as {}",
            shm.display(),
            apart_from.display()
        ));
    }
    tempfile::tempdir_in(shm).map_err(|e| format!("a directory in {}: {e}", shm.display()))
}
