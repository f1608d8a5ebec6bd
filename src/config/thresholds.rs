//! Threshold statements, parsed as the kubelet's `ParseThresholdConfig` parses them, with
//! its error texts, so an operator who knows the kubelet recognises every message.

use std::collections::BTreeMap;

use super::documents::ScalarMap;
use super::duration::GoDuration;
use super::model::{Threshold, ThresholdValue};
use crate::quantity::Quantity;
use crate::signal_names::Signal;

/// A validation failure tied to one configuration field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The camelCase field, e.g. `evictionHard`.
    pub field: &'static str,
    /// The map key, when the field is a map.
    pub key: Option<String>,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &'static str, key: Option<&str>, message: impl Into<String>) -> Self {
        FieldError {
            field,
            key: key.map(str::to_string),
            message: message.into(),
        }
    }
}

/// A value the kubelet accepts although it is surely a mistake: the agent behaves as the
/// kubelet does and says so, naming the field (`check-config --strict` refuses it).
pub type FieldWarning = FieldError;

pub struct ThresholdMaps<'a> {
    pub hard: &'a ScalarMap,
    pub soft: &'a ScalarMap,
    pub soft_grace_period: &'a ScalarMap,
    pub minimum_reclaim: &'a ScalarMap,
}

fn parse_signal(field: &'static str, key: &str) -> Result<Signal, FieldError> {
    key.parse()
        .map_err(|e: crate::signal_names::UnknownSignal| {
            FieldError::new(field, Some(key), e.to_string())
        })
}

/// Parse a percentage like the kubelet: trailing `%` trimmed, float32, divided by 100.
/// `Inf` and `NaN` parse, as Go's `ParseFloat` parses them; the callers' range checks
/// then refuse an infinity, and a NaN passes them as it passes the kubelet's.
fn parse_percentage(text: &str) -> Result<f32, String> {
    let number = text.trim_end_matches('%');
    let value: f32 = number
        .parse()
        .ok()
        // Go reads a sign before "Inf" but not before "NaN"; Rust reads both.
        .filter(|value: &f32| !(value.is_nan() && number.starts_with(['+', '-'])))
        .ok_or_else(|| format!("invalid percentage {text:?}: not a number"))?;
    Ok(value / 100.0)
}

const CAPPED: &str = "is 2^63-1 or more, where Kubernetes caps a quantity";

/// One `signal: value` statement of evictionHard/evictionSoft. `Ok(None)` is a threshold
/// disabled by the exact strings `0%` or `100%`.
fn parse_statement(
    field: &'static str,
    key: &str,
    text: &str,
    warnings: &mut Vec<FieldWarning>,
) -> Result<Option<(Signal, ThresholdValue)>, FieldError> {
    let signal = parse_signal(field, key)?;
    let err = |message: String| FieldError::new(field, Some(key), message);
    if text.ends_with('%') {
        if text == "0%" || text == "100%" {
            return Ok(None);
        }
        let fraction = parse_percentage(text).map_err(&err)?;
        if fraction.is_nan() {
            // The kubelet's range checks let NaN through, and its quantity (int64 of
            // NaN, see `ThresholdValue::resolve`) is below every availability.
            warnings.push(err(format!(
                "{text} is not a number; the kubelet accepts it and never meets this threshold"
            )));
        }
        if fraction < 0.0 {
            return Err(err(format!(
                "eviction percentage threshold {signal} must be >= 0%: {text}"
            )));
        }
        if fraction > 1.0 {
            return Err(err(format!(
                "eviction percentage threshold {signal} must be <= 100%: {text}"
            )));
        }
        return Ok(Some((signal, ThresholdValue::Percentage(fraction))));
    }
    let quantity = Quantity::parse(text).map_err(|e| err(format!("{text:?}: {e}")))?;
    if !quantity.is_positive() {
        return Err(err(format!(
            "eviction threshold {signal} must be positive: {text}"
        )));
    }
    if quantity.is_capped() {
        warnings.push(err(format!(
            "{text} {CAPPED}: the threshold is always met, so pods are evicted one after another"
        )));
    }
    Ok(Some((signal, ThresholdValue::Quantity(quantity))))
}

fn parse_minimum_reclaim(
    key: &str,
    text: &str,
    warnings: &mut Vec<FieldWarning>,
) -> Result<(Signal, ThresholdValue), FieldError> {
    const FIELD: &str = "evictionMinimumReclaim";
    let signal = parse_signal(FIELD, key)?;
    let err = |message: String| FieldError::new(FIELD, Some(key), message);
    const ALWAYS_HELD: &str = "once its threshold is crossed it stays met, so pods are evicted one after another until none is left";
    if text.ends_with('%') {
        let fraction = parse_percentage(text).map_err(&err)?;
        if fraction.is_nan() {
            // int64 of capacity × NaN is far below zero (`ThresholdValue::resolve`).
            warnings.push(err(format!(
                "{text} is not a number; the kubelet accepts it, and then wherever minimum reclaim is checked (holding a crossed threshold, re-checking after node-level reclaim) this threshold counts as relieved"
            )));
        }
        if fraction <= 0.0 {
            return Err(err(format!(
                "eviction percentage minimum reclaim {signal} must be positive: {text}"
            )));
        }
        if fraction > 1.0 {
            // The kubelet has no upper bound here (`parseMinimumReclaims`).
            warnings.push(err(format!(
                "{text} is more than the whole capacity; the kubelet accepts it, and {ALWAYS_HELD}"
            )));
        }
        return Ok((signal, ThresholdValue::Percentage(fraction)));
    }
    let quantity = Quantity::parse(text).map_err(|e| err(format!("{text:?}: {e}")))?;
    if quantity.is_negative() {
        return Err(err(format!(
            "negative eviction minimum reclaim specified for {signal}"
        )));
    }
    if quantity.is_capped() {
        warnings.push(err(format!("{text} {CAPPED}; {ALWAYS_HELD}")));
    }
    Ok((signal, ThresholdValue::Quantity(quantity)))
}

/// Build the threshold list from the four kubelet maps, with the warnings for values the
/// kubelet accepts but that are surely mistakes.
pub fn parse_thresholds(
    maps: &ThresholdMaps<'_>,
) -> Result<(Vec<Threshold>, Vec<FieldWarning>), FieldError> {
    let mut warnings = Vec::new();
    let mut grace_periods = BTreeMap::new();
    for (key, text) in maps.soft_grace_period {
        const FIELD: &str = "evictionSoftGracePeriod";
        let signal = parse_signal(FIELD, key)?;
        let period = GoDuration::parse(&text.0)
            .map_err(|e| FieldError::new(FIELD, Some(key), e.to_string()))?;
        if period.is_negative() {
            return Err(FieldError::new(
                FIELD,
                Some(key),
                format!(
                    "invalid eviction grace period specified: {}, must be a positive value",
                    text.0
                ),
            ));
        }
        grace_periods.insert(signal, period);
    }
    let mut minimum_reclaims = BTreeMap::new();
    for (key, text) in maps.minimum_reclaim {
        let (signal, value) = parse_minimum_reclaim(key, &text.0, &mut warnings)?;
        minimum_reclaims.insert(signal, value);
    }

    let mut thresholds = Vec::new();
    for (key, text) in maps.hard {
        if let Some((signal, value)) = parse_statement("evictionHard", key, &text.0, &mut warnings)?
        {
            thresholds.push(Threshold {
                signal,
                value,
                grace_period: GoDuration::ZERO,
                min_reclaim: minimum_reclaims.get(&signal).copied(),
            });
        }
    }
    for (key, text) in maps.soft {
        if let Some((signal, value)) = parse_statement("evictionSoft", key, &text.0, &mut warnings)?
        {
            let grace_period = grace_periods.get(&signal).copied().ok_or_else(|| {
                FieldError::new(
                    "evictionSoft",
                    Some(key),
                    format!(
                        "grace period must be specified for the soft eviction threshold {signal}"
                    ),
                )
            })?;
            thresholds.push(Threshold {
                signal,
                value,
                grace_period,
                min_reclaim: minimum_reclaims.get(&signal).copied(),
            });
        }
    }
    Ok((thresholds, warnings))
}

/// `addAllocatableThresholds`: every hard `memory.available` threshold also guards the
/// pods cgroup, with the same value and minimum reclaim.
pub fn add_allocatable_thresholds(thresholds: &mut Vec<Threshold>) {
    let copies: Vec<Threshold> = thresholds
        .iter()
        .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
        .map(|t| Threshold {
            signal: Signal::AllocatableMemoryAvailable,
            ..t.clone()
        })
        .collect();
    thresholds.extend(copies);
}

/// How images and container writable layers are laid out on disk, which decides what
/// the `containerfs.*` thresholds mirror, what each disk signal ranks pods by and what
/// node-level reclaim can relieve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FilesystemLayout {
    /// Everything on the node filesystem.
    SingleDisk,
    /// A dedicated image filesystem that also holds container writable layers.
    ImageFs,
    /// A dedicated image filesystem, with writable layers on another filesystem.
    SplitImageFs,
}

impl FilesystemLayout {
    /// The kubelet's two questions, asked of any way to tell filesystems apart (the
    /// agent compares devices, offline tools the configured paths): the image
    /// filesystem is dedicated when it is not the node filesystem
    /// (`HasDedicatedImageFs`), and split when the writable layers are not on it
    /// (`HasDedicatedContainerFs`). No image filesystem means the node filesystem's; no
    /// container filesystem means the image filesystem's. A split without a dedicated
    /// image filesystem is one disk to the kubelet (`buildSignalToRankFunc` and
    /// `UpdateContainerFsThresholds` both test the dedicated image filesystem first).
    pub fn of<F: PartialEq + ?Sized>(
        nodefs: &F,
        imagefs: Option<&F>,
        containerfs: Option<&F>,
    ) -> Self {
        let imagefs = imagefs.unwrap_or(nodefs);
        let containerfs = containerfs.unwrap_or(imagefs);
        match (imagefs != nodefs, containerfs != imagefs) {
            (false, _) => FilesystemLayout::SingleDisk,
            (true, false) => FilesystemLayout::ImageFs,
            (true, true) => FilesystemLayout::SplitImageFs,
        }
    }

    /// For people: `one filesystem`, `a dedicated image filesystem`, ...
    pub fn describe(self) -> &'static str {
        match self {
            FilesystemLayout::SingleDisk => {
                "one filesystem (nodefs holds images and writable layers)"
            }
            FilesystemLayout::ImageFs => {
                "a dedicated image filesystem (imagefs holds images and writable layers)"
            }
            FilesystemLayout::SplitImageFs => {
                "a split image filesystem (imagefs holds images, containerfs writable layers)"
            }
        }
    }
}

fn is_containerfs(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
    )
}

/// `UpdateContainerFsThresholds`: user `containerfs.*` thresholds are dropped (with a
/// warning) and replaced by copies of nodefs or imagefs thresholds, per layout. Copies of
/// absent thresholds are never met in the kubelet, so they are simply not created.
pub fn mirror_containerfs_thresholds(
    thresholds: &mut Vec<Threshold>,
    layout: FilesystemLayout,
    warnings: &mut Vec<String>,
) {
    for t in thresholds.iter().filter(|t| is_containerfs(t.signal)) {
        let kind = if t.is_hard() { "hard" } else { "soft" };
        warnings.push(format!("found {} for {kind} eviction. ignoring", t.signal));
    }
    derive_containerfs_thresholds(thresholds, layout);
}

/// The `containerfs.*` thresholds for `layout`, in place of any there: copies of the
/// nodefs thresholds, or of the imagefs ones where the image filesystem also holds the
/// writable layers. Applying it again for another layout (once the agent has compared
/// the devices) replaces the earlier copies.
pub fn derive_containerfs_thresholds(thresholds: &mut Vec<Threshold>, layout: FilesystemLayout) {
    thresholds.retain(|t| !is_containerfs(t.signal));
    let source = |s: Signal| match (layout, s) {
        (FilesystemLayout::ImageFs, Signal::ImageFsAvailable) => Some(Signal::ContainerFsAvailable),
        (FilesystemLayout::ImageFs, Signal::ImageFsInodesFree) => {
            Some(Signal::ContainerFsInodesFree)
        }
        (FilesystemLayout::ImageFs, _) => None,
        (_, Signal::NodeFsAvailable) => Some(Signal::ContainerFsAvailable),
        (_, Signal::NodeFsInodesFree) => Some(Signal::ContainerFsInodesFree),
        _ => None,
    };
    let copies: Vec<Threshold> = thresholds
        .iter()
        .filter_map(|t| {
            source(t.signal).map(|signal| Threshold {
                signal,
                ..t.clone()
            })
        })
        .collect();
    thresholds.extend(copies);
}

#[cfg(test)]
mod tests {
    use super::*;
    use FilesystemLayout::{ImageFs, SingleDisk, SplitImageFs};

    #[test]
    fn the_layout_asks_the_kubelets_two_questions_of_whatever_tells_filesystems_apart() {
        // HasDedicatedImageFs: imagefs device != root fs device. HasDedicatedContainerFs:
        // imagefs device != containerfs device. buildSignalToRankFunc and
        // UpdateContainerFsThresholds take "no dedicated imagefs" as one disk whatever
        // the container filesystem is.
        let (node, disk2, disk3) = ("sda1", "sdb1", "sdc1");
        let cases = [
            (None, None, SingleDisk),
            (Some(node), None, SingleDisk),
            (Some(disk2), None, ImageFs),
            (Some(disk2), Some(disk2), ImageFs),
            (Some(disk2), Some(node), SplitImageFs),
            (Some(disk2), Some(disk3), SplitImageFs),
            (Some(node), Some(disk2), SingleDisk),
            (None, Some(disk2), SingleDisk),
        ];
        for (imagefs, containerfs, expected) in cases {
            assert_eq!(
                FilesystemLayout::of(node, imagefs, containerfs),
                expected,
                "imagefs {imagefs:?}, containerfs {containerfs:?}"
            );
        }
    }

    #[test]
    fn deriving_again_for_another_layout_replaces_the_earlier_copies() {
        let hard = |signal, percent| Threshold {
            signal,
            value: ThresholdValue::Percentage(percent),
            grace_period: GoDuration::ZERO,
            min_reclaim: None,
        };
        let user = vec![
            hard(Signal::NodeFsAvailable, 0.10),
            hard(Signal::ImageFsAvailable, 0.15),
            hard(Signal::ContainerFsAvailable, 0.50),
        ];
        let containerfs = |thresholds: &[Threshold]| -> Vec<f32> {
            thresholds
                .iter()
                .filter(|t| t.signal == Signal::ContainerFsAvailable)
                .map(|t| match t.value {
                    ThresholdValue::Percentage(p) => p,
                    ThresholdValue::Quantity(_) => f32::NAN,
                })
                .collect()
        };
        let mut thresholds = user.clone();
        let mut warnings = Vec::new();
        mirror_containerfs_thresholds(&mut thresholds, ImageFs, &mut warnings);
        assert_eq!(
            warnings,
            ["found containerfs.available for hard eviction. ignoring"]
        );
        assert_eq!(containerfs(&thresholds), [0.15], "imagefs's copy");
        // The devices say one disk: nodefs's copy instead, and only one.
        derive_containerfs_thresholds(&mut thresholds, SingleDisk);
        assert_eq!(containerfs(&thresholds), [0.10]);
        derive_containerfs_thresholds(&mut thresholds, SplitImageFs);
        assert_eq!(containerfs(&thresholds), [0.10]);
        derive_containerfs_thresholds(&mut thresholds, ImageFs);
        assert_eq!(containerfs(&thresholds), [0.15]);
        assert_eq!(thresholds.len(), 3, "nodefs, imagefs and one copy");
    }
}
