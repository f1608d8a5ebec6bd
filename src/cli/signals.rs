//! `nodekeeper signals`: the operator's view of one collection, each signal with what is
//! left, out of how much, and the thresholds it is compared against.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config::{Threshold, ThresholdValue};
use nodekeeper::signals::{
    Collection, Host, NotificationSupport, PressureReading, PressureScope, Resource, Signal,
    SignalCollector, probe_host,
};
use serde_json::{Value, json};

use super::{EvictionFlags, OutputFormat};

#[derive(clap::Args)]
#[command(
    after_help = "Exit status is 1 when a signal could not be read (the output names the file), else 0.\n\nExamples:\n  nodekeeper signals\n  nodekeeper signals --config config/agent.yaml --output json\n  nodekeeper signals --eviction-hard='memory.available<1Gi,nodefs.available<10%'"
)]
pub struct Args {
    /// Configuration file (KubeletConfiguration and/or AgentConfiguration); built-in defaults
    /// when omitted.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How to print the result: `table` for people, `json` for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(args.config.as_deref(), &args.eviction.overrides())?;
    let host = Host::detect(&config.paths);
    // The containerfs thresholds follow the layout the devices make, as in the agent.
    config.eviction.use_fs_layout(host.fs_layout());
    let filesystems = match host.filesystems() {
        Ok(found) => found.describe(),
        Err(error) => format!(
            "{} (by the configured paths: {error})",
            host.fs_layout().describe()
        ),
    };
    let collector = SignalCollector::for_host(&host).hugepage_aware(config.eviction.hugepage_aware);
    let collection = collector.collect();
    let support = probe_host(&host);
    let rows = report_rows(&collection, &config.eviction.thresholds);
    let mut problems = collector.notes().to_vec();
    problems.extend(other_problems(&collection));
    let text = match args.output {
        OutputFormat::Table => {
            let hugepages = match collection.hugepages_subtracted {
                0 => String::new(),
                bytes => format!(
                    "huge pages: {} reserved, left out of memory.available (HugepageAwareEviction)\n",
                    human_bytes(i64::try_from(bytes).unwrap_or(i64::MAX))
                ),
            };
            format!(
                "cgroup layout: {}\nfilesystems: {filesystems}\n{hugepages}\n{}",
                collector.describe_layout(),
                render_table(&rows, &collection.pressure, &support, &problems)
            )
        }
        OutputFormat::Json => {
            let mut json = render_json(&rows, &collection.pressure, &support, &problems);
            json["cgroupLayout"] =
                serde_json::to_value(collector.layout()).context("rendering the cgroup layout")?;
            json["hugepagesSubtractedBytes"] = json!(collection.hugepages_subtracted);
            json["filesystemLayout"] = serde_json::to_value(host.fs_layout())
                .context("rendering the filesystem layout")?;
            json["filesystems"] = match host.filesystems() {
                Ok(found) => found
                    .devices
                    .iter()
                    .map(|(name, path, device)| {
                        json!({"filesystem": name, "path": path, "device": device.to_string()})
                    })
                    .collect(),
                Err(error) => json!({ "error": error }),
            };
            serde_json::to_string_pretty(&json).context("rendering the report")? + "\n"
        }
    };
    // A reader that stops early (`| head`) is not an error worth a panic.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(e).context("writing the report");
        }
        _ => {}
    }
    let signal_failed = collection.errors.iter().any(|e| e.signal().is_some());
    Ok(if signal_failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One signal's line in the report.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalRow {
    pub signal: Signal,
    pub available: Option<i64>,
    pub capacity: Option<i64>,
    /// `available / capacity` in percent, when both are known and capacity is positive.
    pub percent_available: Option<f64>,
    pub thresholds: Vec<ThresholdCell>,
    /// Why the signal has no observation.
    pub error: Option<String>,
}

/// A threshold as configured, and resolved against the observed capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct ThresholdCell {
    /// As configured: `100Mi` or `10%`.
    pub value: String,
    pub hard: bool,
    /// Go duration text; `None` for hard thresholds.
    pub grace_period: Option<String>,
    /// The threshold in the signal's unit; `None` when a percentage has no capacity to apply to.
    pub resolved: Option<i64>,
    /// `available < resolved`: the kubelet's "threshold met" (equality does not count).
    pub met: bool,
}

impl ThresholdCell {
    /// `<100Mi (hard)`, or `<10% = 2.3Gi (soft 1m30s)` for percentages.
    pub fn describe(&self, resource: Resource) -> String {
        let mut text = format!("<{}", self.value);
        if self.value.ends_with('%')
            && let Some(resolved) = self.resolved
        {
            let _ = write!(text, " = {}", human(resource, resolved));
        }
        match &self.grace_period {
            None => text.push_str(" (hard)"),
            Some(grace) => {
                let _ = write!(text, " (soft {grace})");
            }
        }
        if self.met {
            text.push_str(" MET");
        }
        text
    }
}

/// One row per signal that was observed, failed, or has a threshold, in signal order.
pub fn report_rows(collection: &Collection, thresholds: &[Threshold]) -> Vec<SignalRow> {
    Signal::ALL
        .into_iter()
        .filter_map(|signal| {
            let observation = collection.observations.get(&signal);
            let error = collection
                .errors
                .iter()
                .find(|e| e.signal() == Some(signal))
                .map(ToString::to_string);
            let configured: Vec<&Threshold> =
                thresholds.iter().filter(|t| t.signal == signal).collect();
            if observation.is_none() && error.is_none() && configured.is_empty() {
                return None;
            }
            let error = match (observation, error) {
                (None, None) => Some("not observed on this host".to_string()),
                (_, error) => error,
            };
            let cells = configured
                .into_iter()
                .map(|t| threshold_cell(t, observation.map(|o| (o.available, o.capacity))))
                .collect();
            Some(SignalRow {
                signal,
                available: observation.map(|o| o.available),
                capacity: observation.map(|o| o.capacity),
                percent_available: observation
                    .filter(|o| o.capacity > 0)
                    .map(|o| o.available as f64 * 100.0 / o.capacity as f64),
                thresholds: cells,
                error,
            })
        })
        .collect()
}

fn threshold_cell(threshold: &Threshold, observed: Option<(i64, i64)>) -> ThresholdCell {
    let resolved = match (threshold.value, observed) {
        (ThresholdValue::Quantity(q), _) => Some(q.value()),
        (ThresholdValue::Percentage(_), Some((_, capacity))) => {
            Some(threshold.value.resolve(capacity).value())
        }
        (ThresholdValue::Percentage(_), None) => None,
    };
    let met = match (resolved, observed) {
        (Some(limit), Some((available, _))) => limit > available,
        _ => false,
    };
    ThresholdCell {
        value: threshold.value.to_string(),
        hard: threshold.is_hard(),
        grace_period: (!threshold.is_hard()).then(|| threshold.grace_period.to_string()),
        resolved,
        met,
    }
}

/// Errors that are not about one eviction signal (pressure files), as lines to show.
pub fn other_problems(collection: &Collection) -> Vec<String> {
    collection
        .errors
        .iter()
        .filter(|e| e.signal().is_none())
        .map(ToString::to_string)
        .collect()
}

/// Aligned text tables for a terminal, sizes in binary units like `kubectl top`.
pub fn render_table(
    rows: &[SignalRow],
    pressure: &[PressureReading],
    support: &NotificationSupport,
    problems: &[String],
) -> String {
    let mut signal_table = vec![vec![
        "SIGNAL".to_string(),
        "AVAILABLE".to_string(),
        "CAPACITY".to_string(),
        "AVAILABLE%".to_string(),
        "THRESHOLDS".to_string(),
    ]];
    for row in rows {
        let resource = row.signal.resource();
        let or_dash = |value: Option<i64>| value.map_or("-".to_string(), |v| human(resource, v));
        let thresholds = if row.thresholds.is_empty() {
            "none".to_string()
        } else {
            row.thresholds
                .iter()
                .map(|cell| cell.describe(resource))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let thresholds = match &row.error {
            Some(error) => format!("{thresholds}  [error: {error}]"),
            None => thresholds,
        };
        signal_table.push(vec![
            row.signal.to_string(),
            or_dash(row.available),
            or_dash(row.capacity),
            row.percent_available
                .map_or("-".to_string(), |p| format!("{p:.1}%")),
            thresholds,
        ]);
    }
    let mut out = nodekeeper::text::aligned(&signal_table);

    out.push('\n');
    if pressure.is_empty() {
        out.push_str("Pressure stall information: none readable on this host\n");
    } else {
        let mut table = vec![
            [
                "RESOURCE", "SCOPE", "KIND", "AVG10", "AVG60", "AVG300", "TOTAL",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for reading in pressure {
            table.push(vec![
                reading.resource.to_string(),
                reading.scope.to_string(),
                reading.kind.to_string(),
                format!("{:.2}", reading.avg10),
                format!("{:.2}", reading.avg60),
                format!("{:.2}", reading.avg300),
                format!("{:.3}s", reading.total_microseconds as f64 / 1e6),
            ]);
        }
        out.push_str(&nodekeeper::text::aligned(&table));
    }

    out.push_str("\nNotification support:\n");
    for line in support.to_string().lines() {
        let _ = writeln!(out, "  {line}");
    }
    if !problems.is_empty() {
        out.push_str("\nProblems:\n");
        for problem in problems {
            let _ = writeln!(out, "  {problem}");
        }
    }
    out
}

/// The same report as JSON, numbers unformatted (bytes, counts, percent).
pub fn render_json(
    rows: &[SignalRow],
    pressure: &[PressureReading],
    support: &NotificationSupport,
    problems: &[String],
) -> Value {
    let signals: Vec<Value> = rows
        .iter()
        .map(|row| {
            json!({
                "signal": row.signal.as_str(),
                "resource": row.signal.resource().as_str(),
                "available": row.available,
                "capacity": row.capacity,
                "percentAvailable": row.percent_available,
                "thresholds": row.thresholds.iter().map(|cell| json!({
                    "value": cell.value,
                    "hard": cell.hard,
                    "gracePeriod": cell.grace_period,
                    "resolved": cell.resolved,
                    "met": cell.met,
                })).collect::<Vec<_>>(),
                "error": row.error,
            })
        })
        .collect();
    let pressure: Vec<Value> = pressure
        .iter()
        .map(|reading| {
            // `scope` is `node` or `cgroup`; a cgroup reading also names its cgroup.
            let cgroup = match &reading.scope {
                PressureScope::Node => None,
                PressureScope::Cgroup(path) => Some(path.display().to_string()),
            };
            let mut reading_json = json!({
                "resource": reading.resource.as_str(),
                "scope": if cgroup.is_some() { "cgroup" } else { "node" },
                "kind": reading.kind.to_string(),
                "avg10": reading.avg10,
                "avg60": reading.avg60,
                "avg300": reading.avg300,
                "totalMicroseconds": reading.total_microseconds,
            });
            if let Some(cgroup) = cgroup {
                reading_json["cgroup"] = json!(cgroup);
            }
            reading_json
        })
        .collect();
    json!({
        "signals": signals,
        "pressure": pressure,
        "notifications": {
            "psi": {"supported": support.psi, "detail": support.psi_detail},
            "memcgEventfdV1": {"supported": support.memcg_eventfd_v1, "detail": support.memcg_eventfd_v1_detail},
            "memoryEventsV2": {"supported": support.memory_events_v2, "detail": support.memory_events_v2_detail},
        },
        "problems": problems,
    })
}

/// Bytes in the largest binary unit that keeps the number at least 1 (`812Mi`, `22.4Gi`);
/// inode and PID counts stay plain numbers.
fn human(resource: Resource, value: i64) -> String {
    match resource {
        Resource::Memory | Resource::EphemeralStorage => human_bytes(value),
        Resource::Inodes | Resource::Pids => value.to_string(),
    }
}

pub fn human_bytes(value: i64) -> String {
    const UNITS: [(&str, i64); 5] = [
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    let magnitude = value.unsigned_abs();
    for (suffix, size) in UNITS {
        let size = size as u64;
        if magnitude >= size {
            let sign = if value < 0 { "-" } else { "" };
            return if magnitude.is_multiple_of(size) {
                format!("{sign}{}{suffix}", magnitude / size)
            } else if size >= 1 << 30 {
                format!("{sign}{:.1}{suffix}", magnitude as f64 / size as f64)
            } else {
                format!("{sign}{}{suffix}", magnitude / size)
            };
        }
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodekeeper::config::{GoDuration, Quantity};
    use nodekeeper::signals::{Observation, PressureKind, PressureResource, SignalError};

    fn collection() -> Collection {
        let mut collection = Collection::default();
        collection.observations.insert(
            Signal::MemoryAvailable,
            Observation {
                available: 50 << 20,
                capacity: 8 << 30,
                sampled_at_ms: None,
            },
        );
        collection.observations.insert(
            Signal::NodeFsAvailable,
            Observation {
                available: 40 << 30,
                capacity: 100 << 30,
                sampled_at_ms: None,
            },
        );
        collection.errors.push(SignalError {
            subject: nodekeeper::signals::ErrorSubject::Signal(Signal::PidAvailable),
            path: "/proc/loadavg".into(),
            problem: nodekeeper::signals::FileProblem::Malformed("fewer than 4 fields".into()),
        });
        collection
    }

    fn thresholds() -> Vec<Threshold> {
        vec![
            Threshold {
                signal: Signal::MemoryAvailable,
                value: ThresholdValue::Quantity(Quantity::from_value(100 << 20)),
                grace_period: GoDuration::ZERO,
                min_reclaim: None,
            },
            Threshold {
                signal: Signal::NodeFsAvailable,
                value: ThresholdValue::Percentage(0.10),
                grace_period: GoDuration::from_secs(90),
                min_reclaim: None,
            },
            Threshold {
                signal: Signal::ImageFsAvailable,
                value: ThresholdValue::Percentage(0.15),
                grace_period: GoDuration::ZERO,
                min_reclaim: None,
            },
        ]
    }

    #[test]
    fn rows_resolve_thresholds_and_mark_met_ones() {
        let rows = report_rows(&collection(), &thresholds());
        let signals: Vec<Signal> = rows.iter().map(|r| r.signal).collect();
        assert_eq!(
            signals,
            vec![
                Signal::MemoryAvailable,
                Signal::NodeFsAvailable,
                Signal::ImageFsAvailable,
                Signal::PidAvailable
            ]
        );
        let memory = &rows[0];
        assert_eq!(memory.thresholds[0].resolved, Some(100 << 20));
        assert!(memory.thresholds[0].met);
        assert_eq!(
            memory.thresholds[0].describe(Resource::Memory),
            "<100Mi (hard) MET"
        );
        let nodefs = &rows[1];
        assert_eq!(nodefs.percent_available, Some(40.0));
        assert_eq!(
            nodefs.thresholds[0].describe(Resource::EphemeralStorage),
            "<10% = 10.0Gi (soft 1m30s)"
        );
        assert!(!nodefs.thresholds[0].met);
        assert_eq!(rows[2].error.as_deref(), Some("not observed on this host"));
        assert_eq!(rows[2].thresholds[0].resolved, None);
        assert!(rows[3].error.as_deref().unwrap().contains("/proc/loadavg"));
    }

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(100 << 20), "100Mi");
        assert_eq!(human_bytes((22 << 30) + (400 << 20)), "22.4Gi");
        assert_eq!(human_bytes((812 << 20) + 5), "812Mi");
        assert_eq!(human_bytes(512), "512");
        assert_eq!(human_bytes(-(2 << 30)), "-2Gi");
    }

    #[test]
    fn table_and_json_carry_the_same_facts() {
        let collection = collection();
        let rows = report_rows(&collection, &thresholds());
        let pressure = vec![PressureReading {
            scope: PressureScope::Node,
            resource: PressureResource::Memory,
            kind: PressureKind::Some,
            avg10: 1.5,
            avg60: 0.5,
            avg300: 0.1,
            total_microseconds: 2_500_000,
        }];
        let support = NotificationSupport {
            psi: false,
            memcg_eventfd_v1: true,
            memory_events_v2: false,
            psi_detail: "disabled".into(),
            memcg_eventfd_v1_detail: "present".into(),
            memory_events_v2_detail: "v1".into(),
        };
        let problems = vec!["io pressure: /proc/pressure/io: malformed".to_string()];
        let table = render_table(&rows, &pressure, &support, &problems);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("SIGNAL"));
        // Columns are aligned: AVAILABLE starts at the same offset in header and rows.
        let column = lines[0].find("AVAILABLE").unwrap();
        assert_eq!(&lines[1][column..column + 4], "50Mi");
        assert!(lines[1].contains("8Gi"));
        assert!(lines[1].contains("0.6%"));
        assert!(table.contains("2.500s"));
        assert!(table.contains("memcg eventfd (v1):      yes"));
        assert!(table.contains("Problems:\n  io pressure"));

        let json = render_json(&rows, &pressure, &support, &problems);
        assert_eq!(json["signals"][0]["signal"], "memory.available");
        assert_eq!(json["signals"][0]["available"], 50 << 20);
        assert_eq!(json["signals"][0]["thresholds"][0]["met"], true);
        // 10% is a float32 fraction, as in the kubelet: 160 bytes more than 10Gi.
        assert_eq!(
            json["signals"][1]["thresholds"][0]["resolved"],
            10_737_418_400i64
        );
        assert_eq!(json["signals"][1]["thresholds"][0]["gracePeriod"], "1m30s");
        assert_eq!(json["pressure"][0]["totalMicroseconds"], 2_500_000);
        assert_eq!(json["pressure"][0]["scope"], "node");
        assert!(json["pressure"][0].get("cgroup").is_none());
        assert_eq!(json["notifications"]["memcgEventfdV1"]["supported"], true);
    }
}
