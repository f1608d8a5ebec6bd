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
        assert_eq!(
            reread.to_string(),
            printed,
            "{text:?}: printing is not stable"
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
            assert!(!error.to_string().is_empty());
        }
    }
}

/// A configuration file: the agent's loader (KubeletConfiguration and AgentConfiguration
/// documents) and the controller's policy, on the same text.
pub fn config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match nodekeeper::config::from_yaml_str_with_warnings(text, "fuzz.yaml", &Overrides::default())
    {
        Ok(loaded) => {
            let _ = nodekeeper::config::unset_settings(&loaded.config);
            // Loading is a function of the text: the same file must give the same config.
            let again = nodekeeper::config::from_yaml_str(text, "fuzz.yaml", &Overrides::default())
                .unwrap_or_else(|e| panic!("loaded once, then refused: {e}"));
            assert_eq!(format!("{again:?}"), format!("{:?}", loaded.config));
        }
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
    use nodekeeper::signals::{PressureResource, PressureScope, parse_mountinfo, parse_pressure};
    let Some(text) = text(data) else { return };
    let _ = parse::single_u64(text);
    let _ = parse::memory_limit(text);
    let _ = parse::meminfo(text);
    let _ = parse::loadavg_process_count(text);
    let lines = text.lines().count() as u64;
    if let Ok(entries) = parse::count_lines(text) {
        assert!(entries <= lines);
    }
    for key in ["inactive_file", "total_inactive_file", "file", "anon"] {
        if let Ok(value) = parse::flat_keyed_u64(text, key) {
            // The value is a number written after the key, never made up.
            assert!(text.contains(&value.to_string()) || value == 0 || text.contains('+'));
        }
    }
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
    let mut readings = Vec::new();
    match parse_pressure(
        text,
        PressureResource::Memory,
        &PressureScope::Node,
        &mut readings,
    ) {
        Ok(()) => assert!(!readings.is_empty() && readings.len() as u64 <= lines),
        // A malformed file adds nothing: no half-read pressure.
        Err(_) => assert!(readings.is_empty()),
    }
    assert!(parse_mountinfo(text).len() as u64 <= lines);
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
            let pod = step
                .pods
                .iter()
                .find(|pod| pod.namespace == order.namespace && pod.name == order.name)
                .unwrap_or_else(|| {
                    panic!(
                        "evicted {}/{}, not a listed pod",
                        order.namespace, order.name
                    )
                });
            assert!(
                !pod.is_critical(),
                "evicted critical pod {}/{}",
                pod.namespace,
                pod.name
            );
        }
        state = decision.state;
    }
}

/// ConfigMaps and Secrets of the original node-fencing design: the properties parser, then
/// the objects read from YAML and resolved into a plan for every node they name.
pub fn fence_config(data: &[u8]) {
    use nodekeeper::fencing::config::resolve;
    use nodekeeper::fencing::objects::FenceObjects;
    use nodekeeper::fencing::properties;
    let Some(text) = text(data) else { return };
    if let Ok(parsed) = properties::parse(text) {
        for property in &parsed {
            assert_eq!(properties::normalize_key(&property.key), property.key);
            assert!(property.line >= 1 && property.line <= text.lines().count().max(1));
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
        let _ = nodekeeper::fencing::config::referenced_secrets(&objects, &node);
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
    match parse_metadata("fence_fuzz", text) {
        Ok(metadata) => {
            let _ = metadata.probe_action();
            for parameter in &metadata.parameters {
                let found = metadata.lookup(parameter.option());
                assert!(
                    found.is_some(),
                    "parameter {} not found by its own name",
                    parameter.option()
                );
            }
        }
        Err(error) => assert!(error.to_string().contains("fence_fuzz"), "{error}"),
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

/// What reaches the report server and the agent over HTTP: a report, the controller's
/// acknowledgement and refusal, and a bearer token's claims.
pub fn report_protocol(data: &[u8]) {
    use nodekeeper::report::protocol::{Acknowledgement, Refusal, decode_report, parse_version};
    if let Ok(report) = decode_report(data) {
        assert!(nodekeeper::report::protocol::is_node_name(&report.node));
        let written = serde_json::to_vec(&report).expect("a decoded report encodes");
        let reread = decode_report(&written)
            .unwrap_or_else(|e| panic!("re-encoded as {}: {e}", String::from_utf8_lossy(&written)));
        assert_eq!(
            serde_json::to_vec(&reread).expect("a decoded report encodes"),
            written
        );
    }
    if let Ok(answer) = serde_json::from_slice::<Acknowledgement>(data) {
        let (known, unknown) = answer.known_instructions();
        assert_eq!(known.len() + unknown, answer.instructions.len());
    }
    let _ = serde_json::from_slice::<Refusal>(data);
    if let Some(text) = text(data) {
        let _ = parse_version(text);
        let _ = nodekeeper::report::auth::token_expiry(text);
    }
}

/// A fence_kdump notification datagram.
pub fn kdump(data: &[u8]) {
    let decoded = nodekeeper::controller::kdump::decode(data);
    if decoded.is_ok() {
        assert_eq!(data.len(), 8);
    }
}

/// Every file under `dir`, sorted, for the stable test's walk over seeds and regressions.
pub fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
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
