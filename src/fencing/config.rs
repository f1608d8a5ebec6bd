//! The original node-fencing design's configuration, resolved into a plan for one node.
//!
//! - `fence-config-<node>` (key `config.properties`): `node_name` and the steps
//!   `isolation`, `power_management`, `recovery`, each a space-separated list of method
//!   names run in order, and the design's `kdump` (`true`: the node's kdump
//!   notifications release its pods and hold its power step back while it dumps). nodekeeper adds alternatives: `ipmi-off | pdu-a-off pdu-b-off`
//!   tries `ipmi-off`, and only if it fails `pdu-a-off` then `pdu-b-off`.
//! - `fence-method-<method>-<node>` (key `method.properties`): `template=<ConfigMap>` and
//!   per-node parameters. The design document also wrote a method inline, as the key
//!   `fence-method-<method>` of the node's `fence-config-<node>`; both forms are read.
//! - the template ConfigMap (key `template.properties`): `agent_name`, device address,
//!   credentials and agent options shared by many nodes.
//!
//! Per-node values override template values (the original code merged them the other way
//! round). `name`, `agent_name`, `template`, `must_sucess` (as the design spells it; also
//! `must_success`) and `action` belong to nodekeeper; every other key is an agent
//! parameter. `<option>_secret=<secret>/<key>` reads `<option>` from a Secret.
//!
//! Resolution is a pure function of the objects; `metadata.rs` then checks each method
//! against its agent's own description of its parameters.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::objects::FenceObjects;
use super::properties::{self, PropertiesError, Property};
use super::secret::{SecretValue, is_sensitive_option};

/// The data key of a node's fence configuration.
pub const CONFIG_KEY: &str = "config.properties";
/// The data key of a per-node method.
pub const METHOD_KEY: &str = "method.properties";
/// The data key of a method template.
pub const TEMPLATE_KEY: &str = "template.properties";

/// The ConfigMap that says how to fence `node`.
pub fn config_map_name(node: &str) -> String {
    format!("fence-config-{node}")
}

/// The ConfigMap holding `method`'s parameters for `node`.
pub fn method_config_map_name(method: &str, node: &str) -> String {
    format!("fence-method-{method}-{node}")
}

/// The key of a method written inline in the node's `fence-config-<node>`.
pub fn inline_method_key(method: &str) -> String {
    format!("fence-method-{method}")
}

/// The three steps of the original design, in the order a fence runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    Isolation,
    PowerManagement,
    Recovery,
}

impl Step {
    pub const ALL: [Step; 3] = [Step::Isolation, Step::PowerManagement, Step::Recovery];

    /// The step's key in `config.properties`.
    pub fn property(self) -> &'static str {
        match self {
            Step::Isolation => "isolation",
            Step::PowerManagement => "power_management",
            Step::Recovery => "recovery",
        }
    }

    /// The step's name on the command line and in output.
    pub fn name(self) -> &'static str {
        match self {
            Step::Isolation => "isolation",
            Step::PowerManagement => "power-management",
            Step::Recovery => "recovery",
        }
    }

    /// What a method does when neither it nor its template names an action: isolation
    /// and power management turn the node (or its storage port) off, recovery turns it on.
    pub fn default_action(self) -> FenceAction {
        match self {
            Step::Isolation | Step::PowerManagement => FenceAction::Off,
            Step::Recovery => FenceAction::On,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Step {
    type Err = String;

    fn from_str(text: &str) -> Result<Step, String> {
        let key = properties::normalize_key(text);
        Step::ALL
            .into_iter()
            .find(|step| step.property() == key)
            .ok_or_else(|| {
                format!("unknown step {text:?}: expected isolation, power-management or recovery")
            })
    }
}

/// The action a fence method takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceAction {
    Off,
    On,
    /// Carried out as a verified `off` followed by `on`, so that it counts as a fence
    /// only once `status` has seen the power off.
    Reboot,
}

impl FenceAction {
    pub fn as_str(self) -> &'static str {
        match self {
            FenceAction::Off => "off",
            FenceAction::On => "on",
            FenceAction::Reboot => "reboot",
        }
    }

    fn parse(text: &str) -> Option<FenceAction> {
        match text {
            "off" => Some(FenceAction::Off),
            "on" => Some(FenceAction::On),
            "reboot" => Some(FenceAction::Reboot),
            _ => None,
        }
    }
}

impl fmt::Display for FenceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a value was written: a ConfigMap and its data key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Source {
    pub config_map: String,
    pub key: String,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfigMap {}, key {}", self.config_map, self.key)
    }
}

/// Which layer a merged value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    Template,
    Node,
    /// Neither wrote it; nodekeeper's default for the step.
    Default,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Template => "template",
            Layer::Node => "node",
            Layer::Default => "default",
        })
    }
}

/// A `<secret>/<key>` reference.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct SecretRef {
    pub secret: String,
    pub key: String,
}

/// A parameter's value: plain text, or a credential that is never shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ParameterValue {
    Text(String),
    Sensitive(SecretValue),
}

impl ParameterValue {
    /// The value for the agent's standard input.
    pub fn expose(&self) -> &str {
        match self {
            ParameterValue::Text(text) => text,
            ParameterValue::Sensitive(secret) => secret.expose(),
        }
    }

    /// The value as printed: credentials masked.
    pub fn shown(&self) -> &str {
        match self {
            ParameterValue::Text(text) => text,
            ParameterValue::Sensitive(_) => super::secret::MASK,
        }
    }

    pub fn is_sensitive(&self) -> bool {
        matches!(self, ParameterValue::Sensitive(_))
    }
}

/// One agent parameter after merging.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Parameter {
    /// The name passed to the agent, in its `_` spelling.
    pub name: String,
    /// The key as written (`password_secret` for a value read from a Secret).
    pub written: String,
    pub value: ParameterValue,
    pub layer: Layer,
    pub source: Source,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretRef>,
}

/// One method, fully merged: what the runner executes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MethodPlan {
    pub name: String,
    /// Where the method's own properties are.
    pub source: Source,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub agent: String,
    pub action: FenceAction,
    pub action_layer: Layer,
    /// When false (`must_sucess=no`), a failure of this method does not fail its
    /// alternative, though an alternative still needs one method to succeed.
    pub must_succeed: bool,
    pub parameters: Vec<Parameter>,
}

impl MethodPlan {
    pub fn parameter(&self, name: &str) -> Option<&Parameter> {
        self.parameters.iter().find(|p| p.name == name)
    }

    /// Every credential value of this method, for redaction.
    pub fn sensitive_values(&self) -> Vec<&str> {
        self.parameters
            .iter()
            .filter(|p| p.value.is_sensitive())
            .map(|p| p.value.expose())
            .filter(|value| !value.is_empty())
            .collect()
    }
}

/// Methods that must all succeed, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alternative {
    pub methods: Vec<MethodPlan>,
}

/// A step: its alternatives, tried in order until one succeeds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepPlan {
    pub step: Step,
    pub alternatives: Vec<Alternative>,
}

/// Something legal but unwise in the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ConfigWarning {
    /// A credential written in a ConfigMap instead of a Secret.
    PlainTextCredential { source: Source, property: String },
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::PlainTextCredential { source, property } => write!(
                f,
                "{source}: {property} is written in plain text in a ConfigMap; \
                 put it in a Secret and write {property}_secret=<secret>/<key>"
            ),
        }
    }
}

/// How to fence one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FencePlan {
    pub node: String,
    pub config_map: String,
    pub steps: Vec<StepPlan>,
    /// `kdump=true`: the node sends the ClusterLabs kdump notification
    /// (`fence_kdump_send`) when it boots its crash kernel.
    pub kdump: bool,
    pub warnings: Vec<ConfigWarning>,
}

impl FencePlan {
    pub fn step(&self, step: Step) -> Option<&StepPlan> {
        self.steps.iter().find(|plan| plan.step == step)
    }

    /// Every method of every step, with its step.
    pub fn methods(&self) -> impl Iterator<Item = (Step, &MethodPlan)> {
        self.steps.iter().flat_map(|plan| {
            plan.alternatives.iter().flat_map(move |alternative| {
                alternative.methods.iter().map(move |m| (plan.step, m))
            })
        })
    }

    pub fn methods_mut(&mut self) -> impl Iterator<Item = (Step, &mut MethodPlan)> {
        self.steps.iter_mut().flat_map(|plan| {
            let step = plan.step;
            plan.alternatives
                .iter_mut()
                .flat_map(move |alternative| alternative.methods.iter_mut().map(move |m| (step, m)))
        })
    }
}

/// Where in the configuration an error is: node, method, ConfigMap and key, as known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub node: String,
    pub method: Option<String>,
    pub config_map: Option<String>,
    pub key: Option<String>,
}

impl Place {
    fn node(node: &str) -> Place {
        Place {
            node: node.to_string(),
            method: None,
            config_map: None,
            key: None,
        }
    }

    fn in_config_map(&self, config_map: &str, key: Option<&str>) -> Place {
        Place {
            config_map: Some(config_map.to_string()),
            key: key.map(str::to_string),
            ..self.clone()
        }
    }

    fn at(&self, source: &Source) -> Place {
        self.in_config_map(&source.config_map, Some(&source.key))
    }

    fn for_method(&self, method: &str) -> Place {
        Place {
            method: Some(method.to_string()),
            ..self.clone()
        }
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.node)?;
        if let Some(method) = &self.method {
            write!(f, ", method {method}")?;
        }
        if let Some(config_map) = &self.config_map {
            write!(f, ", ConfigMap {config_map}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ", key {key}")?;
        }
        Ok(())
    }
}

/// One thing wrong with a node's fence configuration, naming where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceConfigError {
    #[error("{at}: no ConfigMap {config_map}, which says how to fence the node")]
    NoNodeConfig { at: Place, config_map: String },
    #[error("{at}: the ConfigMap has no key {missing}")]
    MissingKey { at: Place, missing: String },
    #[error("{at}: {problem}")]
    Properties { at: Place, problem: PropertiesError },
    #[error(
        "{at}: unknown property {property} (expected node_name, isolation, power_management, recovery, kdump, or fence-method-<name> keys beside config.properties)"
    )]
    UnknownConfigProperty { at: Place, property: String },
    #[error("{at}: node_name is {found}, but this ConfigMap is for node {expected}")]
    NodeNameMismatch {
        at: Place,
        found: String,
        expected: String,
    },
    #[error(
        "{at}: step {step} names no method{detail}; remove the key if the node has no such step"
    )]
    EmptyStep {
        at: Place,
        step: Step,
        detail: String,
    },
    #[error(
        "{at}: method name {method:?} in step {step} may hold only lower-case letters, digits and '-'"
    )]
    BadMethodName {
        at: Place,
        step: Step,
        method: String,
    },
    #[error("{at}: no fencing step: set power_management or isolation (or both)")]
    NoFencingStep { at: Place },
    #[error(
        "{at}: method {method} of step {step} is not defined: no ConfigMap {config_map} (key method.properties) and no key {inline_key} in {node_config_map}"
    )]
    MissingMethod {
        at: Place,
        step: Step,
        method: String,
        config_map: String,
        inline_key: String,
        node_config_map: String,
    },
    #[error(
        "{at}: the method is defined twice, in ConfigMap {config_map} and as key {inline_key} of {node_config_map}"
    )]
    MethodDefinedTwice {
        at: Place,
        config_map: String,
        inline_key: String,
        node_config_map: String,
    },
    #[error("{at}: template {template} does not exist")]
    MissingTemplate { at: Place, template: String },
    #[error("{at}: a template cannot name another template ({template})")]
    NestedTemplate { at: Place, template: String },
    #[error("{at}: no agent_name, neither in the method nor in its template")]
    NoAgent { at: Place },
    #[error(
        "{at}: agent {agent:?} is not a ClusterLabs fence agent (the name must be fence_ followed by letters, digits or '_')"
    )]
    BadAgentName { at: Place, agent: String },
    #[error("{at}: action {action:?} is not an action a fence method takes (off, on or reboot)")]
    BadAction { at: Place, action: String },
    #[error("{at}: kdump is {value:?}; expected true or false")]
    BadKdump { at: Place, value: String },
    #[error("{at}: {property} is {value:?}; expected yes or no")]
    BadMustSucceed {
        at: Place,
        property: String,
        value: String,
    },
    #[error("{at}: {property} must be <secret>/<key>, found {value:?}")]
    BadSecretRef {
        at: Place,
        property: String,
        value: String,
    },
    #[error("{at}: {property} names Secret {secret}, which does not exist")]
    MissingSecret {
        at: Place,
        property: String,
        secret: String,
    },
    #[error("{at}: {property} names key {secret_key} of Secret {secret}, which has no such key")]
    MissingSecretKey {
        at: Place,
        property: String,
        secret: String,
        secret_key: String,
    },
    #[error("{at}: {parameter} is set twice, as {first} and as {second}")]
    SetTwice {
        at: Place,
        parameter: String,
        first: String,
        second: String,
    },
    #[error(
        "{at}: the value of {property} {problem}, which could pass further options or commands to the agent{hint}"
    )]
    UnsafeValue {
        at: Place,
        property: String,
        problem: String,
        hint: String,
    },
    #[error("{at}: nodekeeper does not pass {property} to agents: {reason}")]
    ForbiddenOption {
        at: Place,
        property: String,
        reason: String,
    },
    #[error("{at}: {property} names Secret {secret}, which cannot be used: {reason}")]
    UnusableSecret {
        at: Place,
        property: String,
        secret: String,
        reason: String,
    },
    #[error(
        "{at}: alternative {alternative} of step {step} has no method that turns anything off (action off or reboot), so it could never fence the node"
    )]
    NothingTurnedOff {
        at: Place,
        step: Step,
        alternative: usize,
    },
    #[error("{at}: agent {agent} has no parameter {property} (see {agent} -o metadata)")]
    UnknownParameter {
        at: Place,
        agent: String,
        property: String,
    },
    #[error("{at}: agent {agent} expects {expected} for {property}, found {value:?}")]
    BadParameterValue {
        at: Place,
        agent: String,
        property: String,
        value: String,
        expected: String,
    },
    #[error(
        "{at}: agent {agent} requires {parameter}, which neither the method nor its template sets"
    )]
    MissingRequired {
        at: Place,
        agent: String,
        parameter: String,
    },
    #[error("{at}: agent {agent} does not support the action {action}")]
    UnsupportedAction {
        at: Place,
        agent: String,
        action: String,
    },
    #[error(
        "{at}: agent {agent} has no status action, so nodekeeper cannot confirm that {action} worked"
    )]
    Unverifiable {
        at: Place,
        agent: String,
        action: String,
    },
}

/// Every error found in a node's configuration, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<FenceConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Keys that configure nodekeeper itself, never passed to an agent.
const OWNED_KEYS: [&str; 6] = [
    "name",
    "agent_name",
    "template",
    "must_sucess",
    "must_success",
    "action",
];

/// The Secrets `node`'s configuration references (`<option>_secret=<secret>/<key>` in its
/// methods and their templates): the only ones worth reading for it. Unreadable text
/// references none; resolving reports it.
pub fn referenced_secrets(objects: &FenceObjects, node: &str) -> BTreeSet<String> {
    let parsed = |text: &str| properties::parse(text).unwrap_or_default();
    let node_config_map = config_map_name(node);
    let mut texts: Vec<&str> = Vec::new();
    if let Some(data) = objects.config_map(&node_config_map) {
        texts.extend(
            data.iter()
                .filter(|(key, _)| key.starts_with("fence-method-"))
                .map(|(_, text)| text.as_str()),
        );
    }
    let suffix = format!("-{node}");
    for name in objects.config_map_names() {
        if name.starts_with("fence-method-")
            && name.ends_with(&suffix)
            && let Some(text) = objects.config_map(name).and_then(|d| d.get(METHOD_KEY))
        {
            texts.push(text);
        }
    }
    let templates: Vec<String> = texts
        .iter()
        .flat_map(|text| parsed(text))
        .filter(|p| p.key == "template")
        .map(|p| p.value)
        .collect();
    for template in &templates {
        if let Some(text) = objects
            .config_map(template)
            .and_then(|d| d.get(TEMPLATE_KEY))
        {
            texts.push(text);
        }
    }
    texts
        .iter()
        .flat_map(|text| parsed(text))
        .filter(|p| p.key.ends_with("_secret"))
        .filter_map(|p| {
            p.value
                .split_once('/')
                .map(|(secret, _)| secret.to_string())
        })
        .filter(|secret| !secret.is_empty())
        .collect()
}

/// What the operator, not a ConfigMap, allows beyond the safe defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvePolicy {
    /// Options (in their `_` spelling) passed although they name a file or program, such
    /// as fence_dummy's `status_file` on a test rig. Their values are not checked for
    /// shell characters either.
    pub allowed_options: BTreeSet<String>,
}

/// Resolves the fence plan for `node` from `objects` with the safe defaults, or every
/// error found on the way.
pub fn resolve(objects: &FenceObjects, node: &str) -> Result<FencePlan, ConfigErrors> {
    resolve_with(objects, node, &ResolvePolicy::default())
}

/// [`resolve`] with options the operator allowed.
pub fn resolve_with(
    objects: &FenceObjects,
    node: &str,
    policy: &ResolvePolicy,
) -> Result<FencePlan, ConfigErrors> {
    let mut errors = Vec::new();
    let plan = resolve_collecting(objects, node, policy, &mut errors);
    match plan {
        Some(plan) if errors.is_empty() => Ok(plan),
        _ => Err(ConfigErrors(errors)),
    }
}

fn resolve_collecting(
    objects: &FenceObjects,
    node: &str,
    policy: &ResolvePolicy,
    errors: &mut Vec<FenceConfigError>,
) -> Option<FencePlan> {
    let config_map = config_map_name(node);
    let place = Place::node(node);
    let Some(data) = objects.config_map(&config_map) else {
        errors.push(FenceConfigError::NoNodeConfig {
            at: place,
            config_map,
        });
        return None;
    };
    let config = read_layer(data, &config_map, CONFIG_KEY, Layer::Node, &place, errors)?;
    let at = place.at(&config.source);
    let mut steps: Vec<(Step, &Property)> = Vec::new();
    let mut kdump = false;
    for property in &config.properties {
        if property.key == "node_name" {
            if property.value != node {
                errors.push(FenceConfigError::NodeNameMismatch {
                    at: at.clone(),
                    found: property.value.clone(),
                    expected: node.to_string(),
                });
            }
        } else if property.key == "kdump" {
            match property.value.as_str() {
                "true" => kdump = true,
                "false" => kdump = false,
                _ => errors.push(FenceConfigError::BadKdump {
                    at: at.clone(),
                    value: property.value.clone(),
                }),
            }
        } else if let Some(step) = Step::ALL.into_iter().find(|s| s.property() == property.key) {
            steps.push((step, property));
        } else {
            errors.push(FenceConfigError::UnknownConfigProperty {
                at: at.clone(),
                property: property.written.clone(),
            });
        }
    }
    steps.sort_by_key(|(step, _)| *step);
    if !steps
        .iter()
        .any(|(step, _)| matches!(step, Step::Isolation | Step::PowerManagement))
    {
        errors.push(FenceConfigError::NoFencingStep { at: at.clone() });
    }

    let mut warnings = Vec::new();
    let mut step_plans = Vec::new();
    for (step, property) in steps {
        let Some(names) = parse_alternatives(step, &property.value, &at, errors) else {
            continue;
        };
        let mut alternatives = Vec::new();
        for (index, methods) in names.into_iter().enumerate() {
            let mut plans = Vec::new();
            let wanted = methods.len();
            for method in methods {
                if let Some(plan) =
                    resolve_method(objects, node, step, &method, policy, &mut warnings, errors)
                {
                    plans.push(plan);
                }
            }
            let turns_off = plans
                .iter()
                .any(|m| matches!(m.action, FenceAction::Off | FenceAction::Reboot));
            if plans.len() == wanted && step != Step::Recovery && !turns_off {
                errors.push(FenceConfigError::NothingTurnedOff {
                    at: at.clone(),
                    step,
                    alternative: index + 1,
                });
            }
            alternatives.push(Alternative { methods: plans });
        }
        step_plans.push(StepPlan { step, alternatives });
    }
    Some(FencePlan {
        node: node.to_string(),
        config_map,
        steps: step_plans,
        kdump,
        warnings,
    })
}

/// `a b | c` → `[[a, b], [c]]`, with every method name checked.
fn parse_alternatives(
    step: Step,
    value: &str,
    at: &Place,
    errors: &mut Vec<FenceConfigError>,
) -> Option<Vec<Vec<String>>> {
    let parts: Vec<&str> = value.split('|').collect();
    let several = parts.len() > 1;
    let mut alternatives = Vec::new();
    let mut valid = true;
    for (index, part) in parts.iter().enumerate() {
        let methods: Vec<String> = part.split_whitespace().map(str::to_string).collect();
        if methods.is_empty() {
            let detail = if several {
                format!(" in alternative {} of {:?}", index + 1, value)
            } else {
                String::new()
            };
            errors.push(FenceConfigError::EmptyStep {
                at: at.clone(),
                step,
                detail,
            });
            valid = false;
            continue;
        }
        for method in &methods {
            let good = method
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !method.starts_with('-')
                && !method.ends_with('-');
            if !good {
                errors.push(FenceConfigError::BadMethodName {
                    at: at.clone(),
                    step,
                    method: method.clone(),
                });
                valid = false;
            }
        }
        alternatives.push(methods);
    }
    valid.then_some(alternatives)
}

/// One layer of a method: the template's properties or the node's.
struct LayerProperties {
    layer: Layer,
    source: Source,
    properties: Vec<Property>,
}

impl LayerProperties {
    fn get(&self, key: &str) -> Option<&Property> {
        self.properties.iter().find(|p| p.key == key)
    }
}

fn resolve_method(
    objects: &FenceObjects,
    node: &str,
    step: Step,
    method: &str,
    policy: &ResolvePolicy,
    warnings: &mut Vec<ConfigWarning>,
    errors: &mut Vec<FenceConfigError>,
) -> Option<MethodPlan> {
    let place = Place::node(node).for_method(method);
    let node_config_map = config_map_name(node);
    let method_config_map = method_config_map_name(method, node);
    let inline_key = inline_method_key(method);
    let inline = objects
        .config_map(&node_config_map)
        .filter(|data| data.contains_key(&inline_key));
    let node_layer = match (objects.config_map(&method_config_map), inline) {
        (Some(_), Some(_)) => {
            errors.push(FenceConfigError::MethodDefinedTwice {
                at: place,
                config_map: method_config_map,
                inline_key,
                node_config_map,
            });
            return None;
        }
        (Some(data), None) => read_layer(
            data,
            &method_config_map,
            METHOD_KEY,
            Layer::Node,
            &place,
            errors,
        )?,
        (None, Some(data)) => read_layer(
            data,
            &node_config_map,
            &inline_key,
            Layer::Node,
            &place,
            errors,
        )?,
        (None, None) => {
            errors.push(FenceConfigError::MissingMethod {
                at: Place::node(node).in_config_map(&node_config_map, Some(CONFIG_KEY)),
                step,
                method: method.to_string(),
                config_map: method_config_map,
                inline_key,
                node_config_map,
            });
            return None;
        }
    };

    let mut layers = Vec::new();
    let mut template_name = None;
    if let Some(template) = node_layer.get("template") {
        let name = template.value.clone();
        let at = place.at(&node_layer.source);
        let Some(data) = objects.config_map(&name) else {
            errors.push(FenceConfigError::MissingTemplate { at, template: name });
            return None;
        };
        let template_layer =
            read_layer(data, &name, TEMPLATE_KEY, Layer::Template, &place, errors)?;
        if let Some(nested) = template_layer.get("template") {
            errors.push(FenceConfigError::NestedTemplate {
                at: place.at(&template_layer.source),
                template: nested.value.clone(),
            });
            return None;
        }
        layers.push(template_layer);
        template_name = Some(name);
    }
    layers.push(node_layer);

    // The node layer is last, so the last layer that sets a key wins.
    let owned = |key: &str| {
        layers
            .iter()
            .rev()
            .find_map(|layer| layer.get(key).map(|property| (layer, property)))
    };
    let error_count = errors.len();

    let agent = match owned("agent_name") {
        Some((layer, property)) => {
            let valid = property.value.strip_prefix("fence_").is_some_and(|rest| {
                !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if !valid {
                errors.push(FenceConfigError::BadAgentName {
                    at: place.at(&layer.source),
                    agent: property.value.clone(),
                });
            }
            property.value.clone()
        }
        None => {
            errors.push(FenceConfigError::NoAgent {
                at: place.at(&layers[layers.len() - 1].source),
            });
            String::new()
        }
    };

    let (action, action_layer) = match owned("action") {
        Some((layer, property)) => match FenceAction::parse(&property.value) {
            Some(action) => (action, layer.layer),
            None => {
                errors.push(FenceConfigError::BadAction {
                    at: place.at(&layer.source),
                    action: property.value.clone(),
                });
                (step.default_action(), Layer::Default)
            }
        },
        None => (step.default_action(), Layer::Default),
    };

    let must_succeed = match owned("must_sucess").or_else(|| owned("must_success")) {
        Some((layer, property)) => match parse_yes_no(&property.value) {
            Some(value) => value,
            None => {
                errors.push(FenceConfigError::BadMustSucceed {
                    at: place.at(&layer.source),
                    property: property.written.clone(),
                    value: property.value.clone(),
                });
                true
            }
        },
        None => true,
    };

    let mut parameters: Vec<Parameter> = Vec::new();
    for layer in &layers {
        let at = place.at(&layer.source);
        let mut in_this_layer: Vec<(String, String)> = Vec::new();
        for property in &layer.properties {
            if OWNED_KEYS.contains(&property.key.as_str()) {
                continue;
            }
            let Some(parameter) =
                layer_parameter(objects, layer, property, &at, policy, warnings, errors)
            else {
                continue;
            };
            if let Some((_, first)) = in_this_layer
                .iter()
                .find(|(name, _)| *name == parameter.name)
            {
                errors.push(FenceConfigError::SetTwice {
                    at: at.clone(),
                    parameter: parameter.name.clone(),
                    first: first.clone(),
                    second: property.written.clone(),
                });
                continue;
            }
            in_this_layer.push((parameter.name.clone(), property.written.clone()));
            match parameters.iter_mut().find(|p| p.name == parameter.name) {
                Some(existing) => *existing = parameter,
                None => parameters.push(parameter),
            }
        }
    }

    if errors.len() > error_count {
        return None;
    }
    let source = layers[layers.len() - 1].source.clone();
    Some(MethodPlan {
        name: method.to_string(),
        source,
        template: template_name,
        agent,
        action,
        action_layer,
        must_succeed,
        parameters,
    })
}

/// The properties under `key` of ConfigMap `config_map` (whose data is `data`) as one
/// layer, or the error that the key is missing or its text unreadable.
fn read_layer(
    data: &BTreeMap<String, String>,
    config_map: &str,
    key: &str,
    layer: Layer,
    place: &Place,
    errors: &mut Vec<FenceConfigError>,
) -> Option<LayerProperties> {
    let Some(text) = data.get(key) else {
        errors.push(FenceConfigError::MissingKey {
            at: place.in_config_map(config_map, None),
            missing: key.to_string(),
        });
        return None;
    };
    let source = Source {
        config_map: config_map.to_string(),
        key: key.to_string(),
    };
    match properties::parse(text) {
        Ok(properties) => Some(LayerProperties {
            layer,
            source,
            properties,
        }),
        Err(problem) => {
            errors.push(FenceConfigError::Properties {
                at: place.at(&source),
                problem,
            });
            None
        }
    }
}

/// One agent parameter of a layer: a plain value, or a credential read from a Secret.
fn layer_parameter(
    objects: &FenceObjects,
    layer: &LayerProperties,
    property: &Property,
    at: &Place,
    policy: &ResolvePolicy,
    warnings: &mut Vec<ConfigWarning>,
    errors: &mut Vec<FenceConfigError>,
) -> Option<Parameter> {
    let secret_option = property
        .key
        .strip_suffix("_secret")
        .filter(|name| !name.is_empty());
    let name = secret_option.unwrap_or(&property.key).to_string();
    let allowed = policy.allowed_options.contains(&name);
    if let Some(reason) = forbidden_option(&name).filter(|_| !allowed) {
        errors.push(FenceConfigError::ForbiddenOption {
            at: at.clone(),
            property: property.written.clone(),
            reason: reason.to_string(),
        });
        return None;
    }
    let (value, secret) = match secret_option {
        Some(_) => {
            let Some((secret, key)) = property.value.split_once('/').filter(|(secret, key)| {
                !secret.is_empty() && !key.is_empty() && !key.contains('/')
            }) else {
                errors.push(FenceConfigError::BadSecretRef {
                    at: at.clone(),
                    property: property.written.clone(),
                    value: property.value.clone(),
                });
                return None;
            };
            let Some(data) = objects.secret(secret) else {
                let error = match objects.secret_problem(secret) {
                    Some(reason) => FenceConfigError::UnusableSecret {
                        at: at.clone(),
                        property: property.written.clone(),
                        secret: secret.to_string(),
                        reason: reason.to_string(),
                    },
                    None => FenceConfigError::MissingSecret {
                        at: at.clone(),
                        property: property.written.clone(),
                        secret: secret.to_string(),
                    },
                };
                errors.push(error);
                return None;
            };
            let Some(value) = data.get(key) else {
                errors.push(FenceConfigError::MissingSecretKey {
                    at: at.clone(),
                    property: property.written.clone(),
                    secret: secret.to_string(),
                    secret_key: key.to_string(),
                });
                return None;
            };
            let reference = SecretRef {
                secret: secret.to_string(),
                key: key.to_string(),
            };
            (ParameterValue::Sensitive(value.clone()), Some(reference))
        }
        None if is_sensitive_option(&name) => {
            let warning = ConfigWarning::PlainTextCredential {
                source: layer.source.clone(),
                property: property.written.clone(),
            };
            if !warnings.contains(&warning) {
                warnings.push(warning);
            }
            let value = SecretValue::new(property.value.clone());
            (ParameterValue::Sensitive(value), None)
        }
        None => (ParameterValue::Text(property.value.clone()), None),
    };
    let problem = if value.expose().contains(['\n', '\r', '\0']) {
        Some("holds a line break or NUL byte")
    } else if value.is_sensitive() || allowed {
        // Credentials go to agents as they are; they come from Secrets or draw a warning.
        None
    } else {
        unsafe_text(value.expose())
    };
    if let Some(problem) = problem {
        let hint = if secret.is_some() && value.expose().ends_with('\n') {
            " (a Secret made with --from-file keeps the file's final newline; use --from-literal)"
        } else {
            ""
        };
        errors.push(FenceConfigError::UnsafeValue {
            at: at.clone(),
            property: property.written.clone(),
            problem: problem.to_string(),
            hint: hint.to_string(),
        });
        return None;
    }
    Some(Parameter {
        name,
        written: property.written.clone(),
        value,
        layer: layer.layer,
        source: layer.source.clone(),
        secret,
    })
}

/// Why an option is never passed to an agent from a ConfigMap, if it is one of those:
/// whoever may edit a ConfigMap must not get to run code or write files as the
/// controller, read the agents' traffic, or fake a confirmation.
fn forbidden_option(name: &str) -> Option<&'static str> {
    const RUNS_OR_WRITES: &str = "it makes the agent run a program, or read or write a file, chosen by a ConfigMap (an operator can allow it with --allow-option)";
    if name == "option" {
        Some("it is the old name of action; write action=")
    } else if name.ends_with("_script") && name.contains("passw") {
        Some("credentials come from Secrets: write password_secret=<secret>/<key>")
    } else if name.ends_with("_path")
        || name.ends_with("_script")
        || name.ends_with("_file")
        || matches!(
            name,
            "exec"
                | "runonfail"
                | "runonwarn"
                | "ssh_options"
                | "openrc"
                | "kubeconfig"
                | "logfile"
        )
    {
        Some(RUNS_OR_WRITES)
    } else if matches!(name, "debug" | "verbose" | "verbose_level" | "boto3_debug") {
        Some(
            "it makes the agent log its traffic, credentials included, where nodekeeper cannot redact it",
        )
    } else if name == "missing_as_off" {
        Some(
            "it makes status report OFF for a plug that does not exist, which would count as a confirmed fence",
        )
    } else {
        None
    }
}

/// What makes a plain value unsafe to hand an agent: several agents build shell-like
/// command lines from option values (ssh, telnet, gnutls-cli), so a value that could be
/// read as further arguments or commands is refused.
fn unsafe_text(value: &str) -> Option<&'static str> {
    if value.starts_with('-') {
        Some("starts with '-'")
    } else if value.chars().any(char::is_whitespace) {
        Some("holds whitespace")
    } else if value
        .chars()
        .any(|c| c.is_control() || "'\"`$;&|<>(){}\\*?!~".contains(c))
    {
        Some("holds a quote or shell character")
    } else {
        None
    }
}

fn parse_yes_no(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" | "on" => Some(true),
        "no" | "false" | "0" | "off" => Some(false),
        _ => None,
    }
}
