//! The two exposition formats `/metrics` speaks. Metrics are encoded once, in
//! OpenMetrics; a scraper that does not ask for OpenMetrics in its `Accept` header (curl,
//! `promtool check metrics`, older collectors) gets the Prometheus text format 0.0.4,
//! as the Prometheus client libraries negotiate it. The two differ only in a few
//! places: 0.0.4 has no `# EOF`, `# UNIT` or `info` type, names a counter's family by
//! its `_total` sample, and escapes only `\\` and `\n` in help text.

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    PrometheusText,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS,
            Format::PrometheusText => PROMETHEUS_TEXT,
        }
    }

    /// The format for a request's `Accept` header (all its values, joined by commas):
    /// OpenMetrics when the client names it and prefers it at least as much as the text
    /// format, else 0.0.4.
    /// Prometheus asks `application/openmetrics-text;version=1.0.0,...,text/plain;
    /// version=0.0.4;q=0.5,*/*;q=0.1`; a client that sends nothing gets 0.0.4.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::PrometheusText;
        };
        let mut openmetrics = 0.0_f64;
        let mut others = 0.0_f64;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let quality = parts
                .filter_map(|parameter| parameter.split_once('='))
                .find(|(key, _)| key.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, value)| value.trim().parse::<f64>().unwrap_or(0.0));
            // Only what this server can send competes: a type it cannot serve (protobuf,
            // which a Prometheus with native histograms asks for first) is skipped.
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => others = others.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= others {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }

    /// `openmetrics` (an exposition from prometheus-client) in this format.
    pub fn render(self, openmetrics: String) -> String {
        match self {
            Format::OpenMetrics => openmetrics,
            Format::PrometheusText => to_prometheus_text(&openmetrics),
        }
    }
}

/// Rewrites an OpenMetrics exposition in the Prometheus text format 0.0.4.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // prometheus-client writes HELP before TYPE; the help's name depends on the type.
    let mut pending_help: Option<(String, String)> = None;
    // The creation-time sample name (`<family>_created`) of the family whose samples
    // follow, built once per family rather than once per sample.
    let mut created: Option<String> = None;
    for line in openmetrics.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.splitn(3, ' ');
            let keyword = words.next().unwrap_or_default();
            let name = words.next().unwrap_or_default();
            let rest = words.next().unwrap_or_default();
            match keyword {
                "HELP" => pending_help = Some((name.to_string(), rest.to_string())),
                "TYPE" => {
                    let (renamed, kind) = match rest {
                        "counter" => (format!("{name}_total"), "counter"),
                        "info" => (format!("{name}_info"), "gauge"),
                        "gauge" | "histogram" | "summary" => (name.to_string(), rest),
                        _ => (name.to_string(), "untyped"),
                    };
                    if let Some((help_name, help)) = pending_help.take()
                        && help_name == name
                    {
                        out.push_str(&format!("# HELP {renamed} {}\n", help_text(&help)));
                    }
                    out.push_str(&format!("# TYPE {renamed} {kind}\n"));
                    created = Some(format!("{name}_created"));
                }
                // EOF and UNIT have no 0.0.4 form.
                _ => {}
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        // A creation time (of a counter, a histogram or a summary) is a separate sample
        // in OpenMetrics only.
        if let Some(created) = &created
            && line.starts_with(created.as_str())
        {
            continue;
        }
        out.push_str(without_exemplar(line));
        out.push('\n');
    }
    out
}

/// Help text as 0.0.4 escapes it: OpenMetrics's `\"` becomes a plain quote.
fn help_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut chars = openmetrics.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('"') => out.push('"'),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push_str("\\\\"),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A sample line without its exemplar (` # {...} value`), which 0.0.4 cannot carry.
/// A `#` inside a quoted label value is not an exemplar.
fn without_exemplar(line: &str) -> &str {
    let mut in_quotes = false;
    let mut escaped = false;
    for (at, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '#' if !in_quotes => return line[..at].trim_end(),
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_the_text_format() {
        assert_eq!(
            Format::negotiate(Some(PROMETHEUS_ACCEPT)),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text")),
            Format::OpenMetrics
        );
        // Protobuf first (native histograms): OpenMetrics still beats the text format.
        assert_eq!(
            Format::negotiate(Some(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        for accept in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0"),
            Some("application/openmetrics-text;q=0.2, text/plain"),
            Some("application/openmetrics-text;q=junk"),
            Some(
                "application/vnd.google.protobuf;q=0.6, text/plain;q=0.7, application/openmetrics-text;q=0.5",
            ),
        ] {
            assert_eq!(
                Format::negotiate(accept),
                Format::PrometheusText,
                "{accept:?}"
            );
        }
    }

    #[test]
    fn families_are_renamed_and_openmetrics_only_lines_dropped() {
        let openmetrics = "# HELP nodekeeper_evictions Pods \\\"evicted\\\" \\\\ by signal.\n\
# TYPE nodekeeper_evictions counter\n\
nodekeeper_evictions_total{signal=\"a#b\"} 3 # {trace_id=\"x\"} 1\n\
nodekeeper_evictions_created{signal=\"a#b\"} 1700000000\n\
# HELP nodekeeper_build nodekeeper build information.\n\
# TYPE nodekeeper_build info\n\
nodekeeper_build_info{version=\"0.1.0\"} 1\n\
# HELP nodekeeper_cycle_seconds Cycle time.\n\
# TYPE nodekeeper_cycle_seconds histogram\n\
# UNIT nodekeeper_cycle_seconds seconds\n\
nodekeeper_cycle_seconds_sum 0.5\n\
nodekeeper_cycle_seconds_count 2\n\
nodekeeper_cycle_seconds_bucket{le=\"+Inf\"} 2\n\
nodekeeper_cycle_seconds_created 1700000000\n\
# TYPE nodekeeper_odd stateset\n\
nodekeeper_odd{nodekeeper_odd=\"a\"} 1\n\
# EOF\n";
        assert_eq!(
            to_prometheus_text(openmetrics),
            "# HELP nodekeeper_evictions_total Pods \"evicted\" \\\\ by signal.\n\
# TYPE nodekeeper_evictions_total counter\n\
nodekeeper_evictions_total{signal=\"a#b\"} 3\n\
# HELP nodekeeper_build_info nodekeeper build information.\n\
# TYPE nodekeeper_build_info gauge\n\
nodekeeper_build_info{version=\"0.1.0\"} 1\n\
# HELP nodekeeper_cycle_seconds Cycle time.\n\
# TYPE nodekeeper_cycle_seconds histogram\n\
nodekeeper_cycle_seconds_sum 0.5\n\
nodekeeper_cycle_seconds_count 2\n\
nodekeeper_cycle_seconds_bucket{le=\"+Inf\"} 2\n\
# TYPE nodekeeper_odd untyped\n\
nodekeeper_odd{nodekeeper_odd=\"a\"} 1\n"
        );
    }

    /// Every sample of the agent's real exposition belongs to the family its 0.0.4 TYPE
    /// line names, as the text parser requires.
    #[test]
    fn the_agents_exposition_parses_family_by_family() {
        let metrics = crate::metrics::Metrics::new();
        metrics.start_signal_series(["memory.available"]);
        metrics.start_report_series(&["accepted"]);
        let text = to_prometheus_text(&metrics.encode());
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        let mut family: Option<(String, String)> = None;
        let mut samples = 0;
        for line in text.lines() {
            if let Some(typed) = line.strip_prefix("# TYPE ") {
                let (name, kind) = typed.split_once(' ').expect("TYPE line");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
                family = Some((name.to_string(), kind.to_string()));
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (name, kind) = family.as_ref().expect("a sample before any TYPE");
            let sample = line.split(['{', ' ']).next().unwrap_or_default();
            let belongs = match kind.as_str() {
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| sample == format!("{name}{suffix}")),
                _ => sample == name,
            };
            assert!(belongs, "{line:?} is not in family {name}");
            samples += 1;
        }
        assert!(samples > 20, "{text}");
        assert!(
            text.contains("# TYPE nodekeeper_build_info gauge\n"),
            "{text}"
        );
    }
}
