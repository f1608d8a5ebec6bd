//! A minimal Debian tree for systemd-nspawn tests, built once with debootstrap from the
//! mirror this machine's apt already uses.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The release the nspawn fixtures are written for.
pub const SUITE: &str = "bookworm";
const FALLBACK_MIRROR: &str = "http://deb.debian.org/debian";

/// One `deb` source: its URIs and suites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub uris: Vec<String>,
    pub suites: Vec<String>,
}

/// The `deb` (binary) sources of a deb822 `.sources` file (sources.list(5)): paragraphs
/// separated by blank lines; `#` lines are comments, even inside a paragraph; a field
/// continues on lines that start with white space; `Enabled: no` turns a paragraph off.
pub fn parse_deb822(text: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    for paragraph in paragraphs(text) {
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in paragraph {
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = fields.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
            } else if let Some((key, value)) = line.split_once(':') {
                fields.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let field = |name: &str| -> Vec<String> {
            fields
                .iter()
                .filter(|(key, _)| key == name)
                .flat_map(|(_, value)| value.split_whitespace().map(str::to_string))
                .collect()
        };
        let enabled = field("enabled").first().is_none_or(|v| v != "no");
        if enabled && field("types").iter().any(|t| t == "deb") {
            sources.push(Source {
                uris: field("uris"),
                suites: field("suites"),
            });
        }
    }
    sources
}

/// Paragraphs of non-comment lines.
fn paragraphs(text: &str) -> Vec<Vec<&str>> {
    let mut paragraphs = vec![Vec::new()];
    for line in text.lines() {
        if line.trim().is_empty() {
            if paragraphs.last().is_some_and(|p| !p.is_empty()) {
                paragraphs.push(Vec::new());
            }
        } else if !line.trim_start().starts_with('#')
            && let Some(paragraph) = paragraphs.last_mut()
        {
            paragraph.push(line);
        }
    }
    paragraphs.retain(|p| !p.is_empty());
    paragraphs
}

/// The `deb` lines of a one-line-style `sources.list`: `deb [options] uri suite
/// [component...]`, with `#` starting a comment anywhere on a line.
pub fn parse_one_line(text: &str) -> Vec<Source> {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or_default();
            let rest = line.trim().strip_prefix("deb")?;
            if !rest.starts_with([' ', '\t']) {
                return None; // deb-src, or not a source line
            }
            let mut rest = rest.trim_start();
            if let Some(options) = rest.strip_prefix('[') {
                rest = options.split_once(']')?.1;
            }
            let mut words = rest.split_whitespace();
            let uri = words.next()?;
            let suite = words.next()?;
            Some(Source {
                uris: vec![uri.to_string()],
                suites: vec![suite.to_string()],
            })
        })
        .collect()
}

/// The mirror to bootstrap `suite` from: a source carrying `suite` itself, else the first
/// main archive (a suite without `-security`, `-updates` or another pocket); only URIs
/// debootstrap can fetch from (http, https, file).
pub fn choose_mirror(sources: &[Source], suite: &str) -> Option<String> {
    let usable = |uri: &&String| {
        ["http://", "https://", "file:"]
            .iter()
            .any(|scheme| uri.starts_with(scheme))
            && !uri.contains("security")
    };
    let first_uri = |wanted: &dyn Fn(&str) -> bool| {
        sources
            .iter()
            .filter(|source| source.suites.iter().any(|s| wanted(s)))
            .flat_map(|source| source.uris.iter().filter(usable))
            .next()
            .cloned()
    };
    first_uri(&|s| s == suite)
        .or_else(|| first_uri(&|s| !s.contains('-') && !s.contains('/')))
        .map(|uri| uri.trim_end_matches('/').to_string())
}

/// The Debian mirror for debootstrap: `NODEKEEPER_DEBIAN_MIRROR`, else the one this
/// machine's apt uses (`/etc/apt/sources.list.d/*.sources` and `*.list`,
/// `/etc/apt/sources.list`), else deb.debian.org.
pub fn mirror() -> String {
    if let Ok(mirror) = std::env::var("NODEKEEPER_DEBIAN_MIRROR") {
        return mirror;
    }
    let mut sources = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.insert(0, PathBuf::from("/etc/apt/sources.list"));
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        match file.extension().and_then(|e| e.to_str()) {
            Some("sources") => sources.extend(parse_deb822(&text)),
            Some("list") => sources.extend(parse_one_line(&text)),
            _ => {}
        }
    }
    choose_mirror(&sources, SUITE).unwrap_or_else(|| FALLBACK_MIRROR.to_string())
}

/// The cached minimal tree with systemd and dbus, built once with debootstrap (in
/// `/var/cache/nodekeeper-test/bookworm`, or `NODEKEEPER_NSPAWN_TREE`). `Err` says why it
/// cannot be had here. Tests of several binaries ask for it at once (the nspawn
/// containers, the virtual machines): a lock beside it lets one build it while the others
/// wait. A tree that is there is used as it is (it appears whole, by a rename), without
/// the lock, so a read-only one given by `NODEKEEPER_NSPAWN_TREE` does.
pub fn cached_tree() -> Result<PathBuf, String> {
    let tree = std::env::var("NODEKEEPER_NSPAWN_TREE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new("/var/cache/nodekeeper-test").join(SUITE));
    let built = |tree: &Path| tree.join("usr/lib/systemd/systemd").exists();
    if built(&tree) {
        return Ok(tree);
    }
    if let Some(parent) = tree.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let lock_path = tree.with_extension("lock");
    let lock =
        std::fs::File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let _building = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| format!("locking {}: {errno}", lock_path.display()))?;
    if built(&tree) {
        // Another test built it while this one waited for the lock.
        return Ok(tree);
    }
    super::real::program("debootstrap", "debootstrap")?;
    let partial = tree.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    let mirror = mirror();
    // A fresh machine's first lookups of the mirror can fail for a moment (CI once saw
    // "unable to resolve host address" from three tests that started together, then
    // every later debootstrap succeed): a failure is tried again, from scratch, twice.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let _ = std::fs::remove_dir_all(&partial);
        let output = Command::new("debootstrap")
            .args([
                "--variant=minbase",
                "--include=systemd,systemd-sysv,dbus",
                SUITE,
            ])
            .arg(&partial)
            .arg(&mirror)
            .output()
            .map_err(|e| format!("debootstrap: {e}"))?;
        if output.status.success() {
            break;
        }
        let log = std::fs::read_to_string(partial.join("debootstrap/debootstrap.log"))
            .unwrap_or_default();
        let tail = |text: &str| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        let failure = format!(
            "debootstrap {SUITE} from {mirror} failed ({}, attempt {attempts} of 3):\n{}\n{}",
            output.status,
            tail(&String::from_utf8_lossy(&output.stderr)),
            tail(&log)
        );
        if attempts == 3 {
            return Err(failure);
        }
        eprintln!("{failure}\ntrying again in 10 s");
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
    std::fs::rename(&partial, &tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    Ok(tree)
}
