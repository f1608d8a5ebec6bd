//! Reading Prometheus' text exposition, as the agent and the controller serve it.

/// The value of the exposition line for `series` (a metric name with its labels, as
/// exposed), if there is one.
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}
