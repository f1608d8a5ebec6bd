//! What each fuzz target checks, one function per target. A function takes any bytes and
//! panics only when nodekeeper misbehaves on them: a panic inside a parser, or a broken
//! promise such as a value that does not survive its own round trip. Rejecting the input
//! with an error is the right answer to garbage and passes.
//!
//! The same functions run on stable Rust in `tests/fuzz_regressions.rs`, over every seed
//! and every input a fuzzer ever crashed on (`fuzz/regressions/<target>/`), so a crash
//! once found stays fixed without the nightly toolchain.

use std::collections::BTreeSet;
use std::path::Path;

use nodekeeper::config::{GoDuration, Overrides, Quantity};

/// What a target checks of one input: it returns when nodekeeper behaved.
pub type Check = fn(&[u8]);

/// The fuzz targets, by the name of their binary and seed directory.
pub const TARGETS: &[(&str, Check)] = &[
    ("quantity", quantity),
    ("config", config),
    ("kernel_files", kernel_files),
    ("trace", trace),
    ("fence_config", fence_config),
    ("fence_metadata", fence_metadata),
    ("fence_job", fence_job),
    ("report_protocol", report_protocol),
    ("kdump", kdump),
];

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// Quantities, Go durations and threshold statements in the kubelet's flag syntax.
pub fn quantity(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(parsed) = Quantity::parse(text) {
        // The canonical form is what messages and annotations print; reading it back must
        // give the same amount, or an eviction message would misstate a threshold.
        let printed = parsed.to_string();
        let reread = Quantity::parse(&printed)
            .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which reads as {e}"));
        assert_eq!(
            reread.nanos(),
            parsed.nanos(),
            "{text:?} printed as {printed:?}"
        );
        // The printed text may read back in another format (a binary 2000 prints as
        // `2000`, which reads as decimal and prints as `2k`, as in Kubernetes), but from
        // there printing is settled.
        let settled = reread.to_string();
        let again = Quantity::parse(&settled).expect("a printed quantity reads back");
        assert_eq!(
            again.to_string(),
            settled,
            "{text:?}: printing does not settle"
        );
        let _ = parsed.value();
    }
    if let Ok(parsed) = GoDuration::parse(text) {
        let printed = parsed.to_string();
        let reread = GoDuration::parse(&printed)
            .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which reads as {e}"));
        assert_eq!(reread, parsed, "{text:?} printed as {printed:?}");
        let _ = (parsed.whole_seconds(), parsed.to_std());
    }
    // The same text as each threshold flag of the kubelet (`--eviction-hard` and friends).
    let flags: [fn(&mut Overrides, String); 5] = [
        |o, t| o.eviction_hard = Some(t),
        |o, t| o.eviction_soft = Some(t),
        |o, t| o.eviction_soft_grace_period = Some(t),
        |o, t| o.eviction_minimum_reclaim = Some(t),
        |o, t| o.eviction_pressure_transition_period = Some(t),
    ];
    for set in flags {
        let mut overrides = Overrides::default();
        set(&mut overrides, text.to_string());
        if let Err(error) = nodekeeper::config::from_yaml_str("", "fuzz", &overrides) {
            // An operator told "bad value" must be told which flag holds it.
            assert!(error.to_string().starts_with("flag --eviction-"), "{error}");
        }
    }
}

/// A configuration file: the agent's loader (KubeletConfiguration and AgentConfiguration
/// documents) and the controller's policy, on the same text.
pub fn config(data: &[u8]) {
    use nodekeeper::config::{from_yaml_str, from_yaml_str_with_warnings, unset_settings};
    let Some(text) = text(data) else { return };
    match from_yaml_str_with_warnings(text, "fuzz.yaml", &Overrides::default()) {
        Ok(loaded) => {
            let _ = unset_settings(&loaded.config);
            // Loading is a function of the text: the same file must give the same config.
            let again = from_yaml_str(text, "fuzz.yaml", &Overrides::default())
                .unwrap_or_else(|e| panic!("loaded once, then refused: {e}"));
            assert_eq!(format!("{again:?}"), format!("{:?}", loaded.config));
        }
        // A refusal names the file it refuses.
        Err(error) => assert!(error.to_string().contains("fuzz.yaml"), "{error}"),
    }
    let _ = nodekeeper::controller::policy::is_controller_configuration(text);
    if let Ok(policy) = nodekeeper::controller::policy::parse(text, "fuzz.yaml") {
        let _ = policy.effective_document();
        let _ = policy.agents.runner_settings();
        for retry in [0, 1, 10, u32::MAX] {
            let _ = policy.fence.backoff(retry);
        }
    }
}

/// The kernel files the collector and the cgroup killer read: every parser on the same
/// text, as a corrupt or truncated file could reach any of them.
pub fn kernel_files(data: &[u8]) {
    use nodekeeper::signals::parse;
    use nodekeeper::signals::{FileProblem, PressureResource, PressureScope};
    use nodekeeper::signals::{parse_mountinfo, parse_pressure};
    let Some(text) = text(data) else { return };
    let _ = parse::meminfo(text);
    // A file read cut short anywhere gives the figure of the whole file, or an error:
    // never the first digits of a larger figure, nor a reading the whole file lacks.
    fn prefixes_agree<T: std::fmt::Debug>(
        text: &str,
        parse: impl Fn(&str) -> Result<T, FileProblem>,
        agree: impl Fn(&T, &T) -> bool,
    ) {
        // Every prefix is parsed: keep it quadratic in a short text only.
        if text.len() > 512 {
            return;
        }
        let Ok(whole) = parse(text) else { return };
        for (end, _) in text.char_indices() {
            if let Ok(part) = parse(&text[..end]) {
                assert!(
                    agree(&part, &whole),
                    "{:?} read as {part:?}, the whole {text:?} as {whole:?}",
                    &text[..end]
                );
            }
        }
    }
    fn equal<T: PartialEq>(part: &T, whole: &T) -> bool {
        part == whole
    }
    prefixes_agree(text, parse::single_u64, equal);
    prefixes_agree(text, parse::memory_limit, equal);
    prefixes_agree(text, parse::loadavg_process_count, equal);
    for key in ["inactive_file", "total_inactive_file", "anon"] {
        prefixes_agree(text, |text| parse::flat_keyed_u64(text, key), equal);
    }
    prefixes_agree(
        text,
        |text| {
            let mut readings = Vec::new();
            parse_pressure(
                text,
                PressureResource::Io,
                &PressureScope::Node,
                &mut readings,
            )
            .map(|()| readings)
        },
        |part, whole| whole.starts_with(part),
    );
    let _ = nodekeeper::notify::MemoryEventCounts::parse(text);

    // Whatever a cgroup.procs file holds, the one cgroup killer signals no process group,
    // no task outside the agent's PID namespace, not init and not the agent itself.
    let own = i32::try_from(std::process::id()).expect("a pid fits in i32");
    for line in text.lines() {
        if let Some(pid) = nodekeeper::act::signalable(line) {
            let raw = pid.as_raw();
            assert!(
                raw > 1 && raw != own,
                "cgroup.procs line {line:?} would signal {raw}"
            );
        }
    }
    // ... and never a pid cut short: what it signals from the text, it still signals with
    // more digits after it (`77` of `779` is another process).
    let signalled: Vec<_> = nodekeeper::act::signalable_members(text).collect();
    let longer: Vec<_> = nodekeeper::act::signalable_members(&format!("{text}9\n")).collect();
    for pid in &signalled {
        assert!(
            longer.contains(pid),
            "{pid} signalled from {text:?}, cut short"
        );
    }
    // A process added to cgroup.procs is counted once more, whatever came before it.
    let entries = parse::count_lines(text).expect("counting lines cannot fail");
    let grown = parse::count_lines(&format!("{text}\n4242\n")).expect("cannot fail");
    assert_eq!(grown, entries + 1, "{text:?}");

    // memory.stat: a `key value` line of its own is what counts, wherever it stands; a line
    // that only ends in the key (`total_inactive_file` for `inactive_file`) does not.
    for key in ["inactive_file", "total_inactive_file", "file", "anon"] {
        let first = parse::flat_keyed_u64(&format!("{key} 12345\n{text}"), key);
        assert_eq!(first.ok(), Some(12345), "{key} first, then {text:?}");
        let appended = parse::flat_keyed_u64(&format!("{text}\n{key} 777\n"), key);
        // The text's last line, completed by the newline, is whole.
        match parse::flat_keyed_u64(&format!("{text}\n"), key) {
            Err(FileProblem::MissingKey(_)) => {
                assert_eq!(appended.ok(), Some(777), "{key} after {text:?}")
            }
            found => assert_eq!(
                appended.map_err(|e| e.to_string()),
                found.map_err(|e| e.to_string()),
                "{key} after {text:?}"
            ),
        }
    }

    let mut readings = Vec::new();
    match parse_pressure(
        text,
        PressureResource::Memory,
        &PressureScope::Node,
        &mut readings,
    ) {
        Ok(()) => assert!(!readings.is_empty()),
        // A malformed file adds nothing: no half-read pressure.
        Err(_) => assert!(readings.is_empty()),
    }

    // A mount line the kernel wrote well is read, whatever garbage came before it.
    // (The text's last line completed: a line without its newline is left out.)
    let mounts = parse_mountinfo(&format!("{text}\n"));
    let line = "36 35 98:7 / /var/lib/kubelet rw,noatime shared:1 - ext4 /dev/sdb1 rw";
    let more = parse_mountinfo(&format!("{text}\n{line}\n"));
    assert_eq!(more.len(), mounts.len() + 1, "{text:?}");
    let last = more.last().expect("one more mount than none");
    assert_eq!(
        (
            last.major,
            last.minor,
            last.mount_point.as_path(),
            last.fs_type.as_str()
        ),
        (98, 7, Path::new("/var/lib/kubelet"), "ext4")
    );
}

/// A trace for `nodekeeper replay`: read, parsed and replayed through the eviction core,
/// as the replay command does.
pub fn trace(data: &[u8]) {
    use nodekeeper::eviction::{EvictionState, Millis, SyncOptions, synchronize};
    use nodekeeper::trace::TraceFile;
    let Some(text) = text(data) else { return };
    let Ok(trace) = TraceFile::from_str(text, "fuzz.yaml") else {
        return;
    };
    let config = match &trace.config {
        Some(inline) => nodekeeper::config::parse_inline(inline, "fuzz.yaml"),
        None => nodekeeper::config::load(None, &Overrides::default()),
    };
    let (Ok(config), Ok(steps)) = (config, trace.parsed_steps("fuzz.yaml")) else {
        return;
    };
    if steps.windows(2).any(|pair| pair[1].at < pair[0].at) {
        return; // replay refuses steps out of time order
    }
    let options = SyncOptions::for_paths(&config.paths, false);
    let mut state = EvictionState::default();
    for step in &steps {
        let now = Millis::from_duration(step.at);
        let decision = synchronize(
            &config.eviction,
            &state,
            &step.observations,
            &step.pods,
            now,
            &options,
        );
        for order in &decision.evictions {
            // Trace steps list each namespace/name once, so the order names one pod.
            let pod = step
                .pods
                .iter()
                .find(|pod| pod.namespace == order.namespace && pod.name == order.name)
                .expect("an eviction names a listed pod");
            // The kubelet never evicts a critical pod for node pressure.
            assert!(
                !pod.is_critical(),
                "evicted critical pod {}/{}",
                pod.namespace,
                pod.name
            );
            // The pod worker never kills with less than a second.
            assert!(order.grace_period_seconds >= 1, "{order:?}");
        }
        state = decision.state;
    }
}

/// ConfigMaps and Secrets of the original node-fencing design: the properties parser, then
/// the objects read from YAML and resolved into a plan for every node they name.
pub fn fence_config(data: &[u8]) {
    use nodekeeper::fencing::config::{referenced_secrets, resolve};
    use nodekeeper::fencing::objects::FenceObjects;
    use nodekeeper::fencing::properties;
    let Some(text) = text(data) else { return };
    if let Ok(parsed) = properties::parse(text) {
        // Each property, written back as `key=value`, reads as itself: what a ConfigMap
        // says is what the fence agent gets.
        for property in &parsed {
            let line = format!("{}={}", property.written, property.value);
            let reread = properties::parse(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            assert_eq!(reread.len(), 1, "{line:?}");
            assert_eq!(
                (&reread[0].key, &reread[0].value),
                (&property.key, &property.value),
                "{line:?}"
            );
        }
    }
    let mut objects = FenceObjects::new();
    if objects.add_yaml(text, Path::new("fuzz.yaml")).is_err() {
        return;
    }
    let nodes: BTreeSet<String> = objects
        .config_map_names()
        .filter_map(|name| name.strip_prefix("fence-config-"))
        .map(str::to_string)
        .collect();
    for node in nodes {
        let _ = referenced_secrets(&objects, &node);
        if let Ok(plan) = resolve(&objects, &node) {
            for (_, method) in plan.methods() {
                let _ = method.sensitive_values();
            }
        }
    }
}

/// A fence agent's `-o metadata` XML.
pub fn fence_metadata(data: &[u8]) {
    use nodekeeper::fencing::metadata::parse_metadata;
    let Some(text) = text(data) else { return };
    if let Ok(metadata) = parse_metadata("fence_fuzz", text) {
        let _ = metadata.probe_action();
        for parameter in &metadata.parameters {
            let _ = metadata.lookup(parameter.option());
        }
    }
}

/// What a fence Job reads (its execution document) and what the controller reads back
/// (the Job's termination message, which the Job's pod writes).
pub fn fence_job(data: &[u8]) {
    use nodekeeper::fencing::job::{JobExecution, decode_result, encode_result};
    let Some(text) = text(data) else { return };
    if let Ok(execution) = JobExecution::parse(text) {
        let _ = execution.secrets();
    }
    if let Ok(result) = decode_result(text) {
        // Whatever the controller accepts, it can write again and read back the same way.
        let written = encode_result(&result);
        let reread = decode_result(&written)
            .unwrap_or_else(|e| panic!("{text:?} re-encoded as {written:?}: {e}"));
        assert_eq!(encode_result(&reread), written);
    }
}

/// What reaches the report server and the agent over HTTP: a request's head and chunked
/// body, a report, the controller's acknowledgement and refusal, and a bearer token's
/// claims.
pub fn report_protocol(data: &[u8]) {
    use nodekeeper::report::http1::{ChunkedDecoder, parse_head};
    use nodekeeper::report::protocol::{Acknowledgement, Refusal, decode_report, parse_version};
    if let Ok(Some((_, length))) = parse_head(data, 16 * 1024) {
        assert!(length <= data.len());
    }
    let mut input = data.to_vec();
    let mut body = Vec::new();
    let _ = ChunkedDecoder::default().decode(&mut input, &mut body, 4096);
    assert!(
        body.len() <= 4096,
        "a chunked body past its limit: {} bytes",
        body.len()
    );
    assert!(input.len() <= data.len());
    if let Ok(report) = decode_report(data) {
        // What the controller accepted, an agent could have sent: the report encodes and
        // decodes to itself.
        let written = serde_json::to_vec(&report).expect("a decoded report encodes");
        let reread = decode_report(&written)
            .unwrap_or_else(|e| panic!("re-encoded as {}: {e}", String::from_utf8_lossy(&written)));
        assert_eq!(reread, report);
    }
    if let Ok(answer) = serde_json::from_slice::<Acknowledgement>(data) {
        let _ = answer.known_instructions();
    }
    let _ = serde_json::from_slice::<Refusal>(data);
    if let Some(text) = text(data) {
        let _ = parse_version(text);
        let _ = nodekeeper::report::auth::token_expiry(text);
    }
}

/// A fence_kdump notification datagram.
pub fn kdump(data: &[u8]) {
    use nodekeeper::controller::kdump::decode;
    let decoded = decode(data);
    // A big-endian node's notification counts as a little-endian one's does: the same
    // words in the other byte order get the same answer.
    if let Ok(words) = <[u8; 8]>::try_from(data) {
        let mut swapped = words;
        swapped[..4].reverse();
        swapped[4..].reverse();
        assert_eq!(decode(&swapped).is_ok(), decoded.is_ok(), "{words:02x?}");
    }
}

/// Every file under `source`, sorted (`source` itself when it is a file; nothing when it
/// does not exist), for the stable test's walk over seeds and regressions.
pub fn files_under(source: &Path) -> Vec<std::path::PathBuf> {
    if source.is_file() {
        return vec![source.to_path_buf()];
    }
    let mut files = Vec::new();
    let mut pending = vec![source.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}
