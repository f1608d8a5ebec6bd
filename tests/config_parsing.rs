//! Every threshold, duration and shutdown rule of the kubelet's config parsing
//! (reference §1.3–1.5, §5.9), plus nodekeeper's own document rules, as tables.

use nodekeeper::config::{
    self, AgentConfig, GoDuration, Overrides, Quantity, ThresholdValue, from_yaml_str,
};
use nodekeeper::signals::Signal;

const KUBELET: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
const AGENT: &str = "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n";

fn parse(body: &str) -> Result<AgentConfig, String> {
    from_yaml_str(
        &format!("{KUBELET}{body}"),
        "test.yaml",
        &Overrides::default(),
    )
    .map_err(|e| e.to_string())
}

/// The configured thresholds as sorted `signal<value/grace/reclaim` strings, easy to
/// compare in a table; the copies the kubelet derives (allocatable, containerfs) are
/// checked by their own tests.
fn summary(config: &AgentConfig) -> Vec<String> {
    let mut out: Vec<String> = config
        .eviction
        .thresholds
        .iter()
        .filter(|t| {
            !matches!(
                t.signal,
                Signal::ContainerFsAvailable
                    | Signal::ContainerFsInodesFree
                    | Signal::AllocatableMemoryAvailable
            )
        })
        .map(|t| {
            let mut s = t.describe();
            if !t.is_hard() {
                s.push_str(&format!(" grace={}", t.grace_period));
            }
            if let Some(r) = t.min_reclaim {
                s.push_str(&format!(" reclaim={r}"));
            }
            s
        })
        .collect();
    out.sort();
    out
}

#[test]
fn accepted_threshold_configurations() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "no evictionHard: the five Linux defaults",
            "",
            &[
                "imagefs.available<15%",
                "imagefs.inodesFree<5%",
                "memory.available<100Mi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%",
            ],
        ),
        (
            "one evictionHard key drops every other default",
            "evictionHard: {memory.available: 1Gi}",
            &["memory.available<1Gi"],
        ),
        (
            "mergeDefaultEvictionSettings keeps the other defaults, and the set key wins",
            "mergeDefaultEvictionSettings: true\nevictionHard: {memory.available: 1Gi}",
            &[
                "imagefs.available<15%",
                "imagefs.inodesFree<5%",
                "memory.available<1Gi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%",
            ],
        ),
        (
            "an empty evictionHard means no hard thresholds",
            "evictionHard: {}",
            &[],
        ),
        (
            "0% and 100% disable a threshold",
            "evictionHard: {memory.available: 0%, nodefs.available: 100%, pid.available: 5%}",
            &["pid.available<5%"],
        ),
        (
            "0.0% is accepted and never met",
            "evictionHard: {nodefs.available: 0.0%}",
            &["nodefs.available<0%"],
        ),
        (
            // Printed as `Quantity.String()` prints them: canonical, in the format
            // written. A bare YAML 1e5 is a number, 100000, so it prints as `100k`;
            // quoted it stays an exponent, brought to a multiple of three.
            "fractional quantities and exponents",
            "evictionHard: {memory.available: 1.5Gi, nodefs.inodesFree: 1e5, imagefs.inodesFree: \"1e5\", pid.available: 2k}",
            &[
                "imagefs.inodesFree<100e3",
                "memory.available<1536Mi",
                "nodefs.inodesFree<100k",
                "pid.available<2k",
            ],
        ),
        (
            "soft threshold with its grace period; minimum reclaim attaches to hard and soft",
            "evictionHard: {memory.available: 500Mi}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\nevictionMinimumReclaim: {memory.available: 200Mi}",
            &[
                "memory.available<1Gi grace=1m30s reclaim=200Mi",
                "memory.available<500Mi reclaim=200Mi",
            ],
        ),
        (
            "a grace period for a signal without a soft threshold is ignored",
            "evictionHard: {memory.available: 1Gi}\nevictionSoftGracePeriod: {nodefs.available: 1m}",
            &["memory.available<1Gi"],
        ),
        (
            "a soft threshold with a 0s grace period is a hard threshold",
            "evictionHard: {}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 0s}",
            &["memory.available<1Gi"],
        ),
        (
            "minimum reclaim of 0 is allowed; percentages are allowed",
            "evictionHard: {memory.available: 1Gi, nodefs.available: 10%}\nevictionMinimumReclaim: {memory.available: \"0\", nodefs.available: 5%}",
            &[
                "memory.available<1Gi reclaim=0",
                "nodefs.available<10% reclaim=5%",
            ],
        ),
    ];
    for (name, body, expected) in cases {
        let config = parse(body).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(summary(&config), *expected, "{name}");
    }
}

#[test]
fn rejected_threshold_configurations_name_field_value_and_rule() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "unknown signal",
            "evictionHard: {memory.free: 1Gi}",
            &[
                "evictionHard[\"memory.free\"]",
                "unsupported eviction signal memory.free",
            ],
        ),
        (
            "swap.available is not upstream",
            "evictionHard: {swap.available: 1Gi}",
            &["unsupported eviction signal swap.available"],
        ),
        (
            "malformed quantity",
            "evictionHard: {memory.available: 1GB}",
            &[
                "evictionHard[\"memory.available\"]",
                "\"1GB\"",
                "quantities must match",
            ],
        ),
        (
            "zero quantity",
            "evictionHard: {memory.available: \"0\"}",
            &["eviction threshold memory.available must be positive: 0"],
        ),
        (
            "negative quantity",
            "evictionHard: {memory.available: -1Gi}",
            &["eviction threshold memory.available must be positive: -1Gi"],
        ),
        (
            "negative percentage",
            "evictionHard: {nodefs.available: -5%}",
            &["eviction percentage threshold nodefs.available must be >= 0%: -5%"],
        ),
        (
            "percentage above 100",
            "evictionHard: {nodefs.available: 150%}",
            &["eviction percentage threshold nodefs.available must be <= 100%: 150%"],
        ),
        (
            "percentage that is not a number",
            "evictionHard: {nodefs.available: ten%}",
            &["evictionHard[\"nodefs.available\"]", "ten%"],
        ),
        (
            "soft threshold without a grace period",
            "evictionSoft: {memory.available: 1Gi}",
            &[
                "evictionSoft[\"memory.available\"]",
                "grace period must be specified for the soft eviction threshold memory.available",
            ],
        ),
        (
            "negative grace period",
            "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: -1m}",
            &[
                "evictionSoftGracePeriod[\"memory.available\"]",
                "invalid eviction grace period specified: -1m, must be a positive value",
            ],
        ),
        (
            "malformed grace period",
            "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 90}",
            &[
                "evictionSoftGracePeriod[\"memory.available\"]",
                "missing unit",
            ],
        ),
        (
            "grace period for an unknown signal",
            "evictionSoftGracePeriod: {memory.free: 1m}",
            &["unsupported eviction signal memory.free"],
        ),
        (
            "minimum reclaim percentage of zero",
            "evictionMinimumReclaim: {memory.available: 0%}",
            &["eviction percentage minimum reclaim memory.available must be positive: 0%"],
        ),
        (
            "negative minimum reclaim",
            "evictionMinimumReclaim: {memory.available: -1Mi}",
            &["negative eviction minimum reclaim specified for memory.available"],
        ),
        (
            "infinite percentage (Go's ParseFloat reads it; the range check refuses it)",
            "evictionHard: {nodefs.available: Inf%}",
            &["eviction percentage threshold nodefs.available must be <= 100%: Inf%"],
        ),
        (
            "NaN with a sign (Go's ParseFloat reads a sign only before Inf)",
            "evictionHard: {nodefs.available: -NaN%}",
            &[
                "evictionHard[\"nodefs.available\"]",
                "invalid percentage \"-NaN%\"",
            ],
        ),
        (
            "a NaN soft threshold still needs its grace period",
            "evictionSoft: {nodefs.available: NaN%}",
            &["grace period must be specified for the soft eviction threshold nodefs.available"],
        ),
        (
            "negative infinite percentage",
            "evictionHard: {nodefs.available: -inf%}",
            &["eviction percentage threshold nodefs.available must be >= 0%: -inf%"],
        ),
        (
            "shutdown periods with graceful shutdown turned off",
            "featureGates: {GracefulNodeShutdown: false}\nshutdownGracePeriod: 30s",
            &[
                "featureGates",
                "invalid configuration: specifying shutdownGracePeriod or shutdownGracePeriodCriticalPods requires feature gate GracefulNodeShutdown",
            ],
        ),
        (
            "phases by priority with their gate turned off",
            "featureGates: {GracefulNodeShutdownBasedOnPodPriority: false}\nshutdownGracePeriodByPodPriority: [{priority: 0, shutdownGracePeriodSeconds: 10}]",
            &[
                "invalid configuration: Specifying shutdownGracePeriodByPodPriority requires feature gate GracefulNodeShutdownBasedOnPodPriority",
            ],
        ),
        (
            "critical shutdown period above the total",
            "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s",
            &[
                "invalid configuration: shutdownGracePeriodCriticalPods 20s must be <= shutdownGracePeriod 10s",
            ],
        ),
        (
            "shutdown period below one second",
            "shutdownGracePeriod: 500ms",
            &[
                "invalid configuration: shutdownGracePeriod 500ms must be either zero or otherwise >= 1 sec",
            ],
        ),
        (
            "negative shutdown period",
            "shutdownGracePeriod: -10s",
            &[
                "invalid configuration: shutdownGracePeriod -10s must be either zero or otherwise >= 1 sec",
            ],
        ),
        (
            "negative critical shutdown period",
            "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: -1s",
            &[
                "invalid configuration: shutdownGracePeriodCriticalPods -1s must be either zero or otherwise >= 1 sec",
            ],
        ),
        (
            "both shutdown forms",
            "shutdownGracePeriod: 30s\nshutdownGracePeriodByPodPriority: [{priority: 0, shutdownGracePeriodSeconds: 10}]",
            &[
                "invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time",
            ],
        ),
    ];
    for (name, body, needles) in cases {
        let error = match parse(body) {
            Ok(_) => panic!("{name}: accepted {body:?}"),
            Err(e) => e,
        };
        assert!(
            error.starts_with("test.yaml document 1 (KubeletConfiguration): "),
            "{name}: {error}"
        );
        for needle in *needles {
            assert!(error.contains(needle), "{name}: {error:?} lacks {needle:?}");
        }
    }
}

#[test]
fn percentages_resolve_against_capacity_like_the_kubelet() {
    let config = parse("evictionHard: {nodefs.available: 10%}").unwrap();
    let value = config.eviction.thresholds[0].value;
    assert_eq!(value, ThresholdValue::Percentage(0.1));
    // int64(float64(capacity) * float64(float32(0.1))) truncates.
    assert_eq!(value.resolve(1000).value(), 100);
    assert_eq!(
        value.resolve(1_000_000_007).value(),
        (1_000_000_007f64 * f64::from(0.1f32)) as i64
    );
}

#[test]
fn defaults_for_durations_and_agent_settings() {
    let config = parse("").unwrap();
    assert_eq!(
        config.eviction.pressure_transition_period,
        GoDuration::from_secs(300)
    );
    assert_eq!(config.eviction.max_pod_grace_period_seconds, 0);
    assert_eq!(config.housekeeping_interval, GoDuration::from_secs(10));
    assert_eq!(config.shutdown.grace_period, GoDuration::ZERO);
    assert!(config.shutdown.by_pod_priority.is_empty());
    assert!(!config.dry_run);
    assert_eq!(config.paths.cgroup_root.to_str(), Some("/sys/fs/cgroup"));
}

#[test]
fn kubelet_document_ignores_fields_nodekeeper_does_not_use() {
    let config = parse(
        "address: 0.0.0.0\nauthentication: {anonymous: {enabled: false}}\ncgroupDriver: systemd\nevictionHard: {memory.available: 300Mi}",
    )
    .unwrap();
    assert_eq!(summary(&config), ["memory.available<300Mi"]);
}

#[test]
fn agent_document_rejects_unknown_fields_by_name() {
    let error = from_yaml_str(
        &format!("{AGENT}evictionHrad: {{memory.available: 1Gi}}\n"),
        "a.yaml",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("a.yaml document 1 (AgentConfiguration)"),
        "{error}"
    );
    assert!(error.contains("unknown field `evictionHrad`"), "{error}");
}

#[test]
fn agent_document_overrides_kubelet_document_field_by_field() {
    let text = format!(
        "{KUBELET}evictionHard: {{memory.available: 300Mi}}\nevictionPressureTransitionPeriod: 1m\n---\n{AGENT}evictionHard: {{memory.available: 2Gi}}\ndryRun: true\n"
    );
    let config = from_yaml_str(&text, "both.yaml", &Overrides::default()).unwrap();
    assert_eq!(summary(&config), ["memory.available<2Gi"]);
    assert_eq!(
        config.eviction.pressure_transition_period,
        GoDuration::from_secs(60)
    );
    assert!(config.dry_run);
}

#[test]
fn errors_name_the_document_a_field_came_from() {
    let text = format!(
        "{KUBELET}evictionHard: {{memory.available: 1Gi}}\n---\n{AGENT}evictionSoft: {{memory.available: 2Gi}}\n"
    );
    let error = from_yaml_str(&text, "both.yaml", &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("both.yaml document 2 (AgentConfiguration): evictionSoft"),
        "{error}"
    );
}

#[test]
fn kubelet_flags_override_the_file() {
    let overrides = Overrides {
        eviction_hard: Some("memory.available<1Gi,nodefs.available<10%".into()),
        eviction_soft: Some("memory.available<2Gi".into()),
        eviction_soft_grace_period: Some("memory.available=1m30s".into()),
        eviction_minimum_reclaim: Some("memory.available=100Mi".into()),
        eviction_pressure_transition_period: Some("30s".into()),
        eviction_max_pod_grace_period: Some(20),
        ..Overrides::default()
    };
    let text = format!("{KUBELET}evictionHard: {{memory.available: 300Mi}}\n");
    let config = from_yaml_str(&text, "k.yaml", &overrides).unwrap();
    assert_eq!(
        summary(&config),
        [
            "memory.available<1Gi reclaim=100Mi",
            "memory.available<2Gi grace=1m30s reclaim=100Mi",
            "nodefs.available<10%"
        ]
    );
    assert_eq!(
        config.eviction.pressure_transition_period,
        GoDuration::from_secs(30)
    );
    assert_eq!(config.eviction.max_pod_grace_period_seconds, 20);

    let bad = Overrides {
        eviction_hard: Some("memory.available=1Gi".into()),
        ..Overrides::default()
    };
    let error = from_yaml_str(&text, "k.yaml", &bad)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("flag --eviction-hard") && error.contains("malformed pair"),
        "{error}"
    );
    let bad = Overrides {
        eviction_soft: Some("memory.available<1Gi".into()),
        ..Overrides::default()
    };
    let error = from_yaml_str(&text, "k.yaml", &bad)
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("flag --eviction-soft: evictionSoft"),
        "{error}"
    );
}

#[test]
fn unsupported_documents_are_named() {
    let error = from_yaml_str(
        "apiVersion: v1\nkind: ConfigMap\n",
        "x.yaml",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("x.yaml document 1")
            && error.contains("unsupported document apiVersion \"v1\" kind \"ConfigMap\""),
        "{error}"
    );
    let error = from_yaml_str(
        &format!("{KUBELET}---\n{KUBELET}"),
        "x.yaml",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("document 2") && error.contains("at most one"),
        "{error}"
    );
    let error = from_yaml_str(
        &format!("{KUBELET}evictionHard: [1, 2]\n"),
        "x.yaml",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("document 1 (KubeletConfiguration)") && error.contains("evictionHard"),
        "{error}"
    );
}

/// `addAllocatableThresholds` (kubelet eviction helpers.go), called by
/// `ParseThresholdConfig` when `enforceNodeAllocatable` contains `pods`, whose v1beta1
/// default is `[pods]`: each hard `memory.available` threshold gets an
/// `allocatableMemory.available` copy with its value and minimum reclaim. Soft
/// thresholds get none, and the agent's podsCgroup option plays no part.
#[test]
fn enforce_node_allocatable_pods_adds_allocatable_copies_of_hard_memory_thresholds() {
    let allocatable = |config: &AgentConfig| -> Vec<String> {
        let mut out: Vec<String> = config
            .eviction
            .thresholds
            .iter()
            .filter(|t| t.signal == Signal::AllocatableMemoryAvailable)
            .map(|t| {
                let reclaim = t.min_reclaim.map(|r| format!(" reclaim={r}"));
                format!("{}{}", t.describe(), reclaim.unwrap_or_default())
            })
            .collect();
        out.sort();
        out
    };
    let thresholds = "evictionHard: {memory.available: 1Gi}\nevictionSoft: {memory.available: 2Gi}\nevictionSoftGracePeriod: {memory.available: 1m}\nevictionMinimumReclaim: {memory.available: 100Mi}\n";
    let copy = ["allocatableMemory.available<1Gi reclaim=100Mi"];
    for (name, extra, expected) in [
        ("the default", "", &copy[..]),
        (
            "pods listed",
            "enforceNodeAllocatable: [pods, system-reserved]\n",
            &copy[..],
        ),
        (
            "an explicit empty list",
            "enforceNodeAllocatable: []\n",
            &[][..],
        ),
        (
            "pods left out",
            "enforceNodeAllocatable: [kube-reserved]\n",
            &[][..],
        ),
        ("none", "enforceNodeAllocatable: [none]\n", &[][..]),
    ] {
        let config =
            parse(&format!("{thresholds}{extra}")).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(allocatable(&config), expected, "{name}");
    }
    // Without any file: the kubelet's default memory.available<100Mi is copied too.
    let defaults = config::load(None, &Overrides::default()).unwrap();
    assert_eq!(
        allocatable(&defaults),
        ["allocatableMemory.available<100Mi"]
    );
    // The agent document may set it as well, and it wins like any other field.
    let text = format!("{KUBELET}{thresholds}---\n{AGENT}enforceNodeAllocatable: []\n");
    let config = from_yaml_str(&text, "a.yaml", &Overrides::default()).unwrap();
    assert_eq!(allocatable(&config), Vec::<String>::new());
}

#[test]
fn values_the_kubelet_would_refuse_in_enforce_node_allocatable_are_warnings() {
    let text = format!("{KUBELET}enforceNodeAllocatable: [pods, everything, none]\n");
    let loaded =
        config::from_yaml_str_with_warnings(&text, "k.yaml", &Overrides::default()).unwrap();
    assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings[0]
            .starts_with("enforceNodeAllocatable: \"everything\" is not one of pods,"),
        "{:?}",
        loaded.warnings
    );
    assert!(loaded.warnings[1].contains("\"none\" may not be combined"));
    assert!(
        loaded
            .config
            .eviction
            .thresholds
            .iter()
            .any(|t| t.signal == Signal::AllocatableMemoryAvailable),
        "pods is still read"
    );
}

/// `localStorageCapacityIsolation` (v1beta1 default true): false turns off the
/// eviction manager's local-storage limit checks (`synchronize` step 16).
#[test]
fn local_storage_capacity_isolation_is_read_from_the_kubelet_configuration() {
    assert!(parse("").unwrap().eviction.local_storage_capacity_isolation);
    let off = parse("localStorageCapacityIsolation: false\n").unwrap();
    assert!(!off.eviction.local_storage_capacity_isolation);
}

/// An empty file, a file with an empty AgentConfiguration, no file at all, and the
/// built-in default all give one configuration: `replay`, `rank` and the agent start
/// from the same thresholds, derived copies included.
#[test]
fn no_file_an_empty_file_and_the_built_in_default_agree() {
    let none = config::load(None, &Overrides::default()).unwrap();
    assert_eq!(none, AgentConfig::default());
    for (name, text) in [
        ("empty", String::new()),
        ("agent", AGENT.to_string()),
        ("kubelet", KUBELET.to_string()),
    ] {
        let config = from_yaml_str(&text, "e.yaml", &Overrides::default()).unwrap();
        assert_eq!(config, none, "{name}");
    }
    let mut signals: Vec<&str> = none
        .eviction
        .thresholds
        .iter()
        .map(|t| t.signal.as_str())
        .collect();
    signals.sort();
    assert_eq!(
        signals,
        [
            "allocatableMemory.available",
            "containerfs.available",
            "containerfs.inodesFree",
            "imagefs.available",
            "imagefs.inodesFree",
            "memory.available",
            "nodefs.available",
            "nodefs.inodesFree",
        ]
    );
}

#[test]
fn containerfs_thresholds_mirror_the_filesystem_that_holds_writable_layers() {
    let count = |config: &AgentConfig, signal| {
        config
            .eviction
            .thresholds
            .iter()
            .filter(|t| t.signal == signal)
            .map(|t| t.value)
            .collect::<Vec<_>>()
    };
    let pct = ThresholdValue::Percentage;
    let single = config::load_with_warnings(None, &Overrides::default()).unwrap();
    assert_eq!(
        count(&single.config, Signal::ContainerFsAvailable),
        [pct(0.10)]
    );
    let text = format!(
        "{AGENT}imagefsPath: /var/lib/containerd\nevictionHard: {{nodefs.available: 10%, imagefs.available: 15%, containerfs.available: 1%}}\n"
    );
    let loaded =
        config::from_yaml_str_with_warnings(&text, "a.yaml", &Overrides::default()).unwrap();
    assert_eq!(
        count(&loaded.config, Signal::ContainerFsAvailable),
        [pct(0.15)]
    );
    assert_eq!(
        loaded.warnings,
        ["found containerfs.available for hard eviction. ignoring"]
    );
    let text = format!(
        "{AGENT}imagefsPath: /images\ncontainerfsPath: /containers\nevictionHard: {{nodefs.available: 10%, imagefs.available: 15%}}\n"
    );
    let config = from_yaml_str(&text, "a.yaml", &Overrides::default()).unwrap();
    assert_eq!(count(&config, Signal::ContainerFsAvailable), [pct(0.10)]);
}

#[test]
fn agent_settings_are_validated() {
    for (body, needle) in [
        (
            "housekeepingInterval: 0s",
            "housekeepingInterval: must be greater than zero",
        ),
        ("housekeepingInterval: soon", "housekeepingInterval"),
        (
            "cgroupRoot: sys/fs/cgroup",
            "cgroupRoot: \"sys/fs/cgroup\" must be an absolute path",
        ),
        (
            "metricsAddress: localhost",
            "metricsAddress: \"localhost\" is not an address",
        ),
        (
            "nodeName: Node_1",
            "nodeName: \"Node_1\" is not a valid Kubernetes node name",
        ),
        ("dryRun: maybe", "dryRun"),
        (
            "realtimePriority: 100",
            "realtimePriority: 100 is not a SCHED_FIFO priority: 1 to 99, or 0 for the normal scheduler",
        ),
        (
            "realtimePriority: -1",
            "realtimePriority: -1 is not a SCHED_FIFO priority",
        ),
        ("realtimePriority: high", "realtimePriority"),
        (
            "podStatsMaxAge: -1s",
            "podStatsMaxAge: -1s must not be negative",
        ),
        (
            "podStatsMaxAge: 2m1s",
            "podStatsMaxAge: 2m1s is longer than 2m0s: the kubelet's stats keep no sample longer",
        ),
        ("podStatsMaxAge: soon", "podStatsMaxAge"),
        // A key written twice: the kubelet's document tolerates it (see
        // values_the_kubelet_accepts_...), nodekeeper's own stays strict.
        (
            "dryRun: true\ndryRun: false",
            "a.yaml document 1 (AgentConfiguration): dryRun is given more than once",
        ),
    ] {
        let error = from_yaml_str(&format!("{AGENT}{body}\n"), "a.yaml", &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains(needle), "{body}: {error}");
    }
}

/// `podStatsMaxAge` is off unless set: 0 or unset reads every pod afresh in every cycle;
/// any Go duration up to two minutes is taken; check-config shows the default.
#[test]
fn pod_stats_max_age_is_off_unless_a_duration_is_given() {
    let max_age = |body: &str| {
        from_yaml_str(&format!("{AGENT}{body}\n"), "a.yaml", &Overrides::default())
            .unwrap()
            .pod_stats_max_age
            .map(|age| age.to_std())
    };
    assert_eq!(max_age(""), None);
    assert_eq!(max_age("podStatsMaxAge: 0s"), None);
    assert_eq!(max_age("podStatsMaxAge: \"0\""), None);
    assert_eq!(
        max_age("podStatsMaxAge: 10s"),
        Some(std::time::Duration::from_secs(10))
    );
    assert_eq!(
        max_age("podStatsMaxAge: 1m30s"),
        Some(std::time::Duration::from_secs(90))
    );
    assert_eq!(
        max_age("podStatsMaxAge: 2m"),
        Some(std::time::Duration::from_secs(120))
    );
    let loaded =
        config::from_yaml_str_with_warnings(AGENT, "a.yaml", &Overrides::default()).unwrap();
    assert_eq!(
        loaded.effective_document.pod_stats_max_age.as_deref(),
        Some("0s")
    );
    // Shown as Go prints a duration, as the other durations are.
    let loaded = config::from_yaml_str_with_warnings(
        &format!("{AGENT}podStatsMaxAge: 90s\n"),
        "a.yaml",
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        loaded.effective_document.pod_stats_max_age.as_deref(),
        Some("1m30s")
    );
}

/// `realtimePriority` is off unless set: 0 or unset keeps the normal scheduler, 1 to 99
/// (SCHED_FIFO's range) is taken as given; check-config shows the default.
#[test]
fn realtime_priority_is_off_unless_a_fifo_priority_is_given() {
    let priority = |body: &str| {
        from_yaml_str(&format!("{AGENT}{body}\n"), "a.yaml", &Overrides::default())
            .unwrap()
            .realtime_priority
    };
    assert_eq!(priority(""), None);
    assert_eq!(priority("realtimePriority: 0"), None);
    assert_eq!(priority("realtimePriority: 1"), Some(1));
    assert_eq!(priority("realtimePriority: 99"), Some(99));
    let loaded =
        config::from_yaml_str_with_warnings(AGENT, "a.yaml", &Overrides::default()).unwrap();
    assert_eq!(loaded.effective_document.realtime_priority, Some(0));
    // At or above the kernel's interrupt threads, taken with a warning naming the field.
    let warnings = |body: &str| {
        config::from_yaml_str_with_warnings(
            &format!("{AGENT}{body}\n"),
            "a.yaml",
            &Overrides::default(),
        )
        .unwrap()
        .warnings
    };
    assert_eq!(warnings("realtimePriority: 49"), Vec::<String>::new());
    assert_eq!(priority("realtimePriority: 50"), Some(50));
    for high in ["realtimePriority: 50", "realtimePriority: 99"] {
        let found = warnings(high);
        assert_eq!(found.len(), 1, "{high}: {found:?}");
        assert!(
            found[0].contains("realtimePriority") && found[0].contains("below 50"),
            "{high}: {found:?}"
        );
    }
}

/// Node-level reclaim goes through the container runtime by default, at the kubelet's
/// `containerRuntimeEndpoint` (its default, containerd's socket, when unset or empty as
/// kubeadm writes it) and `imageServiceEndpoint` (the runtime's own when unset), keeping
/// images for the kubelet's `imageMinimumGCAge` (2m when unset or zero, as the kubelet's
/// `SetDefaults_KubeletConfiguration` has it). Commands are the
/// method when given; a contradiction is an error naming the field.
#[test]
fn node_reclaim_uses_the_runtime_the_kubelet_names_unless_commands_are_given() {
    use nodekeeper::config::ReclaimMethod;
    let default = parse("").unwrap().node_reclaim;
    assert_eq!(default.method, ReclaimMethod::Cri);
    assert_eq!(
        default.runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(default.image_endpoint, default.runtime_endpoint);
    assert_eq!(default.image_minimum_gc_age, GoDuration::from_secs(120));
    assert_eq!(
        parse("containerRuntimeEndpoint: \"\"")
            .unwrap()
            .node_reclaim,
        default
    );

    let crio =
        parse("containerRuntimeEndpoint: unix:///var/run/crio/crio.sock\nimageMinimumGCAge: 10m\n")
            .unwrap()
            .node_reclaim;
    assert_eq!(crio.runtime_endpoint, "unix:///var/run/crio/crio.sock");
    assert_eq!(crio.image_endpoint, "unix:///var/run/crio/crio.sock");
    assert_eq!(crio.image_minimum_gc_age, GoDuration::from_secs(600));
    let split = parse("imageServiceEndpoint: /run/images.sock\n")
        .unwrap()
        .node_reclaim;
    assert_eq!(split.image_endpoint, "/run/images.sock");

    let agent = |body: &str| {
        from_yaml_str(&format!("{AGENT}{body}\n"), "a.yaml", &Overrides::default())
            .map(|c| c.node_reclaim)
            .map_err(|e| e.to_string())
    };
    let commands = agent("nodeReclaim:\n  commands: [\"crictl rmi --prune\"]").unwrap();
    assert_eq!(commands.method, ReclaimMethod::Commands);
    assert_eq!(
        agent("nodeReclaim:\n  method: none").unwrap().method,
        ReclaimMethod::None
    );
    for (body, needle) in [
        (
            "nodeReclaim:\n  method: images",
            "method: \"images\" is not one of cri, commands, none",
        ),
        (
            "nodeReclaim:\n  method: commands",
            "method: commands needs at least one command",
        ),
        (
            "nodeReclaim:\n  method: cri\n  commands: [\"true\"]",
            "commands are given but method is cri",
        ),
        (
            "containerRuntimeEndpoint: tcp://10.0.0.1:2375",
            "containerRuntimeEndpoint: \"tcp://10.0.0.1:2375\": scheme \"tcp\" is not supported",
        ),
        (
            "imageServiceEndpoint: run/images.sock",
            "imageServiceEndpoint",
        ),
        ("imageMinimumGCAge: soon", "imageMinimumGCAge"),
    ] {
        let error = agent(body).unwrap_err();
        assert!(error.contains(needle), "{body}: {error}");
    }
}

/// The PSI contention conditions of KEP-5394 are nodekeeper's own opt-in: thresholds
/// are fractions of time (the KEP's kubelet tests compare 0.05 against 4% and 6%), 0
/// turns a condition off, and nothing is on by default. With the kubelet's own
/// `PSINodeCondition` gate on, the kubelet writes these conditions, so the agent leaves
/// them alone and says so.
#[test]
fn contention_thresholds_are_fractions_off_by_default_and_yield_to_the_kubelets_gate() {
    use nodekeeper::signals::Contention;
    use std::collections::BTreeMap;
    let agent = |body: &str| {
        config::from_yaml_str_with_warnings(
            &format!("{AGENT}{body}\n"),
            "a.yaml",
            &Overrides::default(),
        )
    };
    let loaded = agent("").unwrap();
    assert!(loaded.config.contention_thresholds.is_empty());

    let loaded = agent(
        "systemMemoryContentionThreshold: 0.1\nsystemDiskContentionThreshold: 0\nkubepodsMemoryContentionThreshold: 0.25\nkubepodsDiskContentionThreshold: 1",
    )
    .unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(
        loaded.config.contention_thresholds,
        BTreeMap::from([
            (Contention::SystemMemory, 0.1),
            (Contention::KubepodsMemory, 0.25),
            (Contention::KubepodsDisk, 1.0),
        ])
    );
    assert_eq!(
        loaded.effective_document.system_memory_contention_threshold,
        Some(0.1)
    );

    for (body, needle) in [
        (
            "systemMemoryContentionThreshold: 10",
            "systemMemoryContentionThreshold: 10 is not a fraction of time from 0 to 1",
        ),
        (
            "kubepodsDiskContentionThreshold: -0.1",
            "kubepodsDiskContentionThreshold: -0.1 is not a fraction",
        ),
        (
            "systemDiskContentionThreshold: .nan",
            "systemDiskContentionThreshold: NaN is not a fraction",
        ),
        (
            "systemDiskContentionThreshold: high",
            "systemDiskContentionThreshold",
        ),
    ] {
        let error = agent(body).unwrap_err().to_string();
        assert!(error.contains(needle), "{body}: {error}");
    }

    let loaded =
        agent("featureGates: {PSINodeCondition: true}\nsystemMemoryContentionThreshold: 0.1")
            .unwrap();
    assert!(loaded.config.contention_thresholds.is_empty());
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings[0].contains("featureGates: PSINodeCondition is on, so the kubelet publishes the contention conditions itself"),
        "{:?}",
        loaded.warnings
    );
}

#[test]
fn shutdown_settings_both_forms() {
    let config = parse("shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s").unwrap();
    assert_eq!(config.shutdown.grace_period, GoDuration::from_secs(30));
    assert_eq!(
        config.shutdown.grace_period_critical_pods,
        GoDuration::from_secs(10)
    );
    let config = parse("shutdownGracePeriodByPodPriority:\n- {priority: 100000, shutdownGracePeriodSeconds: 20}\n- {priority: 0, shutdownGracePeriodSeconds: 60}").unwrap();
    assert_eq!(config.shutdown.by_pod_priority.len(), 2);
}

/// The first threshold on `signal`.
fn threshold_for(config: &AgentConfig, signal: Signal) -> &nodekeeper::config::Threshold {
    config
        .eviction
        .thresholds
        .iter()
        .find(|t| t.signal == signal)
        .unwrap_or_else(|| panic!("no {signal} threshold"))
}

/// Load `body` under a KubeletConfiguration header and return the config and warnings.
fn parse_warned(body: &str) -> (AgentConfig, Vec<String>) {
    let loaded = config::from_yaml_str_with_warnings(
        &format!("{KUBELET}{body}"),
        "test.yaml",
        &Overrides::default(),
    )
    .unwrap_or_else(|e| panic!("{body:?} refused: {e}"));
    (loaded.config, loaded.warnings)
}

/// Values the kubelet's parsing and `ValidateKubeletConfiguration` let through although
/// they are surely mistakes. An agent given the node's own config must start where the
/// kubelet starts, so each loads, behaves as in the kubelet, and draws one warning that
/// names the document and the field (`check-config --strict` refuses them).
#[test]
fn values_the_kubelet_accepts_load_with_a_warning_naming_the_field() {
    type Check = fn(&AgentConfig);
    let cases: &[(&str, &str, &[&str], Check)] = &[
        (
            "a key given twice (the kubelet falls back to lenient decoding: the last wins)",
            "evictionHard:\n  memory.available: 1Gi\n  memory.available: 2Gi\n",
            &[
                "evictionHard[\"memory.available\"] is given more than once",
                "the last value is used",
            ],
            |c| assert_eq!(summary(c), ["memory.available<2Gi"]),
        ),
        (
            "negative evictionMaxPodGracePeriod (not validated by the kubelet)",
            "evictionMaxPodGracePeriod: -1",
            &[
                "evictionMaxPodGracePeriod: -1 is negative",
                "1 s grace period",
            ],
            |c| assert_eq!(c.eviction.max_pod_grace_period_seconds, -1),
        ),
        (
            "minimum reclaim above 100% (parseMinimumReclaims has no upper bound)",
            "evictionMinimumReclaim: {memory.available: 150%}",
            &["evictionMinimumReclaim[\"memory.available\"]: 150% is more than the whole capacity"],
            |c| {
                let memory = threshold_for(c, Signal::MemoryAvailable);
                assert_eq!(memory.min_reclaim, Some(ThresholdValue::Percentage(1.5)));
            },
        ),
        (
            "threshold quantity beyond 2^63 (ParseQuantity caps it)",
            "evictionHard: {memory.available: 10Ei}",
            &[
                "evictionHard[\"memory.available\"]: 10Ei is 2^63-1 or more",
                "always met",
            ],
            |c| assert_eq!(summary(c), ["memory.available<9223372036854775807"]),
        ),
        (
            "minimum reclaim quantity beyond 2^63",
            "evictionMinimumReclaim: {memory.available: \"1e30\"}",
            &["evictionMinimumReclaim[\"memory.available\"]: 1e30 is 2^63-1 or more"],
            |c| {
                assert!(
                    c.eviction
                        .thresholds
                        .iter()
                        .any(|t| t.min_reclaim == Some(ThresholdValue::Quantity(Quantity::MAX)))
                )
            },
        ),
        (
            "NaN percentage threshold (passes both range checks; never met)",
            "evictionHard: {nodefs.available: NaN%, memory.available: 1Gi}",
            &[
                "evictionHard[\"nodefs.available\"]: NaN% is not a number",
                "never meets",
            ],
            |c| {
                assert_eq!(
                    summary(c),
                    ["memory.available<1Gi", "nodefs.available<NaN%"]
                );
                let nan = threshold_for(c, Signal::NodeFsAvailable);
                // int64(NaN) on amd64: below every availability.
                assert_eq!(nan.value.resolve(1 << 40).value(), i64::MIN);
            },
        ),
        (
            "NaN percentage minimum reclaim",
            "evictionMinimumReclaim: {memory.available: nan%}",
            &[
                "evictionMinimumReclaim[\"memory.available\"]: nan% is not a number",
                "counts as relieved",
            ],
            |c| {
                let memory = threshold_for(c, Signal::MemoryAvailable);
                assert_eq!(
                    memory.min_reclaim.map(|r| r.resolve(1 << 30).value()),
                    Some(i64::MIN)
                );
            },
        ),
        (
            "negative evictionPressureTransitionPeriod (nodeConditionsObservedSince: never a condition)",
            "evictionPressureTransitionPeriod: -5m",
            &[
                "evictionPressureTransitionPeriod: -5m0s is not positive",
                "no pressure condition",
            ],
            |c| assert!(c.eviction.pressure_transition_period.is_negative()),
        ),
        (
            "a priority listed twice",
            "shutdownGracePeriodByPodPriority:\n- {priority: 0, shutdownGracePeriodSeconds: 1}\n- {priority: 0, shutdownGracePeriodSeconds: 2}",
            &[
                "shutdownGracePeriodByPodPriority: priority 0 is listed more than once",
                "first of these entries",
            ],
            |c| assert_eq!(c.shutdown.by_pod_priority.len(), 2),
        ),
        (
            "a negative phase",
            "shutdownGracePeriodByPodPriority:\n- {priority: 0, shutdownGracePeriodSeconds: -10}\n- {priority: 1000, shutdownGracePeriodSeconds: 20}",
            &[
                "shutdownGracePeriodByPodPriority: priority 0: shutdownGracePeriodSeconds -10 is negative",
            ],
            |c| {
                assert_eq!(
                    c.shutdown.by_pod_priority[0].shutdown_grace_period_seconds,
                    -10
                )
            },
        ),
        (
            "phases by priority with graceful shutdown turned off (the kubelet's stub manager)",
            "featureGates: {GracefulNodeShutdown: false}\nshutdownGracePeriodByPodPriority: [{priority: 0, shutdownGracePeriodSeconds: 10}]",
            &[
                "featureGates: GracefulNodeShutdown is off, so shutdownGracePeriodByPodPriority is ignored",
            ],
            |c| assert_eq!(c.shutdown, Default::default()),
        ),
    ];
    for (name, body, needles, check) in cases {
        let (config, warnings) = parse_warned(body);
        assert_eq!(warnings.len(), 1, "{name}: {warnings:?}");
        assert!(
            warnings[0].starts_with("test.yaml document 1 (KubeletConfiguration): "),
            "{name}: {warnings:?}"
        );
        for needle in *needles {
            assert!(
                warnings[0].contains(needle),
                "{name}: {warnings:?} lacks {needle:?}"
            );
        }
        check(&config);
    }
}

/// The kubelet's v1beta1 defaulting (`SetDefaults_KubeletConfiguration`) turns a zero
/// `evictionPressureTransitionPeriod` in the file into 5m; the flag, applied after
/// defaulting, can make it zero, and then no pressure condition is ever reported.
#[test]
fn a_zero_transition_period_is_the_default_in_a_file_and_zero_from_the_flag() {
    let (config, warnings) = parse_warned("evictionPressureTransitionPeriod: 0s");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        config.eviction.pressure_transition_period,
        GoDuration::from_secs(300)
    );
    let flag = Overrides {
        eviction_pressure_transition_period: Some("0s".to_string()),
        ..Overrides::default()
    };
    let loaded = config::from_yaml_str_with_warnings(KUBELET, "k.yaml", &flag).unwrap();
    assert!(loaded.config.eviction.pressure_transition_period.is_zero());
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings[0].starts_with("flag --eviction-pressure-transition-period: evictionPressureTransitionPeriod: 0s is not positive"),
        "{:?}",
        loaded.warnings
    );
}

/// The kubelet feature gates that change eviction or shutdown, read from either document
/// and merged gate by gate; gates the agent does not know are the kubelet's business.
#[test]
fn feature_gates_are_read_merged_and_shown() {
    // Defaults: all four on, as in the kubelet from 1.37 (HugepageAwareEviction, PR
    // #138127, beta and on by default from then).
    let (config, warnings) = parse_warned("shutdownGracePeriod: 30s");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.shutdown.grace_period, GoDuration::from_secs(30));
    assert!(config.eviction.hugepage_aware);
    // Turned off in the kubelet's document, memory.available keeps the huge page pool
    // again, as a kubelet before 1.37 measures it.
    let (config, warnings) = parse_warned("featureGates: {HugepageAwareEviction: false}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(!config.eviction.hugepage_aware);

    // GracefulNodeShutdown off with no periods: the kubelet runs a stub, so no shutdown
    // handling at all; an unknown gate from another kubelet version is ignored.
    let (config, warnings) =
        parse_warned("featureGates: {GracefulNodeShutdown: false, SomeFutureGate: true}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.shutdown, Default::default());

    // The agent document changes only the gates it names.
    let text = format!(
        "{KUBELET}featureGates: {{GracefulNodeShutdownBasedOnPodPriority: false, KubeletSeparateDiskGC: false}}\n---\n{AGENT}featureGates: {{GracefulNodeShutdownBasedOnPodPriority: true}}\nshutdownGracePeriodByPodPriority: [{{priority: 0, shutdownGracePeriodSeconds: 10}}]\nimagefsPath: /var/lib/containerd\ncontainerfsPath: /var/lib/containers\n"
    );
    let loaded = config::from_yaml_str_with_warnings(&text, "k.yaml", &Overrides::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.config.shutdown.by_pod_priority.len(), 1);
    // KubeletSeparateDiskGC stayed off from the kubelet document: on a split image
    // filesystem the kubelet's eviction manager stops; the agent warns and goes on.
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings[0].contains("featureGates: KubeletSeparateDiskGC is off but containerfsPath is a separate filesystem"),
        "{:?}",
        loaded.warnings
    );
    let gates = loaded.effective_document.feature_gates.unwrap();
    assert_eq!(gates.get("GracefulNodeShutdown"), Some(&true));
    assert_eq!(
        gates.get("GracefulNodeShutdownBasedOnPodPriority"),
        Some(&true)
    );
    assert_eq!(gates.get("KubeletSeparateDiskGC"), Some(&false));
    assert_eq!(gates.get("HugepageAwareEviction"), Some(&true));
}

#[test]
fn inline_trace_config_needs_no_api_version() {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str("evictionHard: {memory.available: 1Gi}").unwrap();
    let config = config::parse_inline(&value, "trace.yaml").unwrap();
    assert_eq!(summary(&config), ["memory.available<1Gi"]);
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str("evictionHard: {memory.available: 1Gi}\nbogus: 1").unwrap();
    let error = config::parse_inline(&value, "trace.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("trace.yaml (inline AgentConfiguration)") && error.contains("bogus"),
        "{error}"
    );
}

#[test]
fn quantity_display_round_trips_through_the_parser() {
    for text in ["100Mi", "1536Mi", "100000", "500m", "2000"] {
        let q = Quantity::parse(text).unwrap();
        assert_eq!(Quantity::parse(&q.to_string()).unwrap(), q, "{text}");
    }
}

/// The agent's `report:` section: where it reports to the fence controller.
#[test]
fn the_report_section_is_read_with_defaults_and_checked() {
    let agent = |body: &str| {
        from_yaml_str(
            &format!("{AGENT}{body}"),
            "agent.yaml",
            &Overrides::default(),
        )
        .map_err(|e| e.to_string())
    };
    let config =
        agent("report: {controllerURL: \"http://controller.example:9849/\"}\n").expect("valid");
    let report = config.report.expect("reporting on");
    assert_eq!(report.controller_url, "http://controller.example:9849");
    assert_eq!(report.interval, GoDuration::from_secs(2));
    assert_eq!(report.timeout, GoDuration::from_secs(5));
    assert_eq!(
        report.token_file.as_deref(),
        Some(std::path::Path::new("/var/run/secrets/nodekeeper/token")),
        "the projected token a DaemonSet mounts"
    );
    let config = agent(
        "report: {controllerURL: \"http://10.0.0.5:9849\", interval: 500ms, timeout: 1s, tokenFile: \"\"}\n",
    )
    .expect("valid");
    let report = config.report.expect("reporting on");
    assert_eq!(
        report.interval.to_std(),
        std::time::Duration::from_millis(500)
    );
    assert_eq!(
        report.token_file, None,
        "an empty tokenFile sends no credential"
    );
    assert!(agent("").expect("valid").report.is_none(), "off by default");
    let config = agent(
        "report: {controllerURL: \"https://controller.example:9849\", caFile: /etc/nodekeeper/ca.crt}\n",
    )
    .expect("valid");
    let report = config.report.expect("reporting on");
    assert_eq!(report.controller_url, "https://controller.example:9849");
    assert_eq!(
        report.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/nodekeeper/ca.crt"))
    );
    let config = agent("report: {controllerURL: \"https://c:9849\"}\n").expect("valid");
    assert_eq!(
        config.report.expect("reporting on").ca_file,
        None,
        "https without caFile checks against the system's roots"
    );

    // Isolation on the controller's instruction: on, for kubelet.service, by default.
    let config_isolation = |body: &str| agent(body).expect("valid").report.expect("on").isolation;
    let isolation = config_isolation("report: {controllerURL: \"https://c:9849\"}\n");
    assert!(isolation.enabled);
    assert_eq!(isolation.kubelet_unit, "kubelet.service");
    assert_eq!(
        isolation.stop_timeout.to_std(),
        std::time::Duration::from_secs(20)
    );
    assert_eq!(
        isolation.state_file,
        std::path::Path::new("/run/nodekeeper/isolation.json")
    );
    let isolation = config_isolation(
        "report: {controllerURL: \"https://c:9849\", isolation: {enabled: false, kubeletUnit: k8s-kubelet@main.service, stopTimeout: 10s, stateFile: /run/nk/iso.json}}\n",
    );
    assert!(!isolation.enabled);
    assert_eq!(isolation.kubelet_unit, "k8s-kubelet@main.service");
    assert_eq!(
        isolation.stop_timeout.to_std(),
        std::time::Duration::from_secs(10)
    );
    assert_eq!(
        isolation.state_file,
        std::path::Path::new("/run/nk/iso.json")
    );
    assert_eq!(
        isolation.contact_file(),
        std::path::Path::new("/run/nk/contact.json")
    );

    // Self-isolation: off unless isolateAfter is given; the watchdog's defaults.
    // The shortest with the default reads (every 10 s) and reports (every 2 s): 36 s.
    assert!(
        agent("report: {controllerURL: \"https://c:9849\", isolation: {isolateAfter: 35s}}\n")
            .is_err()
    );
    assert!(
        agent("report: {controllerURL: \"https://c:9849\", isolation: {isolateAfter: 36s}}\n")
            .is_ok()
    );
    let isolation = config_isolation("report: {controllerURL: \"https://c:9849\"}\n");
    assert_eq!(isolation.isolate_after, None);
    assert_eq!(
        isolation.watchdog_device,
        std::path::Path::new("/dev/watchdog")
    );
    assert_eq!(
        isolation.watchdog_timeout.to_std(),
        std::time::Duration::from_secs(30)
    );
    let isolation = config_isolation(
        "report: {controllerURL: \"https://c:9849\", isolation: {isolateAfter: 2m, watchdogDevice: /dev/watchdog1, watchdogTimeout: 60s}}\n",
    );
    assert_eq!(
        isolation.isolate_after.map(|after| after.to_std()),
        Some(std::time::Duration::from_secs(120))
    );
    assert_eq!(
        isolation.watchdog_device,
        std::path::Path::new("/dev/watchdog1")
    );
    assert_eq!(
        config_isolation(
            "report: {controllerURL: \"https://c:9849\", isolation: {isolateAfter: 0s}}\n"
        )
        .isolate_after,
        None,
        "0s is off"
    );

    for (body, expected) in [
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {isolateAfter: 5s}}\n",
            "isolation.isolateAfter: 5s must be 0s (no self-isolation) or at least 30s",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {isolateAfter: 2h}}\n",
            "isolation.isolateAfter: 2h is longer than 1h0m0s",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", interval: 15s, isolation: {isolateAfter: 40s}}\n",
            "isolation.isolateAfter: 40s is shorter than three report intervals",
        ),
        (
            "kubernetes: {apiProbeInterval: 30s}\nreport: {controllerURL: \"https://c:9849\", isolation: {isolateAfter: 1m}}\n",
            "isolation.isolateAfter: 1m0s is shorter than three Lease reads (every 30s",
        ),
        (
            "report: {controllerURL: \"http://c:9849\", isolation: {isolateAfter: 1m}}\n",
            "isolation.isolateAfter: self-isolation needs an https controllerURL",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {enabled: false, isolateAfter: 1m}}\n",
            "isolation.isolateAfter: self-isolation needs isolation.enabled: true",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {watchdogDevice: watchdog}}\n",
            "isolation.watchdogDevice: \"watchdog\" must be an absolute path",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {watchdogTimeout: 1s}}\n",
            "isolation.watchdogTimeout: 1s must be at least 2s",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {watchdogTimeout: 2h}}\n",
            "isolation.watchdogTimeout: 2h is longer than 1h0m0s",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {watchdogTimeout: 2500ms}}\n",
            "isolation.watchdogTimeout: 2500ms must be whole seconds",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {kubeletUnit: kubelet}}\n",
            "isolation.kubeletUnit: \"kubelet\" is not a systemd service name",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {kubeletUnit: \"a b.service\"}}\n",
            "isolation.kubeletUnit",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {stopTimeout: 100ms}}\n",
            "isolation.stopTimeout: 100ms must be at least 1s",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {stateFile: run/x.json}}\n",
            "isolation.stateFile: \"run/x.json\" must be an absolute path",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", isolation: {kubelet: x}}\n",
            "unknown field `kubelet`",
        ),
        (
            "report: {interval: 2s}\n",
            "report: controllerURL is required",
        ),
        (
            "report: {controllerURL: \"http://c:9849\", caFile: /ca.crt}\n",
            "caFile: is for an https controllerURL",
        ),
        (
            "report: {controllerURL: \"https://c:9849\", caFile: ca.crt}\n",
            "caFile: \"ca.crt\" must be an absolute path",
        ),
        (
            "report: {controllerURL: \"ftp://c:9849\"}\n",
            "is not an address like https://host:9849",
        ),
        (
            "report: {controllerURL: \"http://c:9849/v1/reports\"}\n",
            "is not an address like https://host:9849",
        ),
        (
            "report: {controllerURL: \"c:9849\"}\n",
            "is not an address like",
        ),
        (
            "report: {controllerURL: \"http://c:9849\", interval: 10ms}\n",
            "interval: 10ms must be at least 100ms",
        ),
        (
            "report: {controllerURL: \"http://c:9849\", interval: 5m}\n",
            "interval: 5m0s is longer than 1m",
        ),
        (
            "report: {controllerURL: \"http://c:9849\", tokenFile: token}\n",
            "tokenFile: \"token\" must be an absolute path",
        ),
        (
            "report: {controllerUrl: \"http://c:9849\"}\n",
            "controllerUrl",
        ),
    ] {
        let error = agent(body).expect_err(body);
        assert!(error.contains(expected), "{body}: {error}");
    }
}
