//! A fence agent's own description of itself (`<agent> -o metadata`, OCF-style XML):
//! its parameters with their command-line spellings, which are required, and its
//! actions. A method's parameters are checked against it, as the agent would check them,
//! but before an incident instead of during one.

use super::config::{FenceAction, FenceConfigError, Layer, MethodPlan, Place};

/// One parameter the agent accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterSpec {
    /// The metadata name (`ipaddr`, `snmp_priv_prot`).
    pub name: String,
    /// The long option in its `_` spelling (`ip` for both `ip` and `ipaddr`), when it has one.
    pub long_option: Option<String>,
    pub required: bool,
    pub deprecated: bool,
    /// `boolean`, `integer`, `string`, `select`, `second`, as the metadata says.
    pub content_type: String,
}

impl ParameterSpec {
    /// What identifies the option to the agent: parameters sharing a long option (a name
    /// and its deprecated alias) are one option.
    pub fn option(&self) -> &str {
        self.long_option.as_deref().unwrap_or(&self.name)
    }
}

/// What `<agent> -o metadata` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentMetadata {
    pub agent: String,
    pub parameters: Vec<ParameterSpec>,
    pub actions: Vec<String>,
}

/// Why an agent's metadata could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata of {agent}: {reason}")]
pub struct MetadataError {
    pub agent: String,
    pub reason: String,
}

/// Parses the metadata XML `agent` printed.
pub fn parse_metadata(agent: &str, xml: &str) -> Result<AgentMetadata, MetadataError> {
    let error = |reason: String| MetadataError {
        agent: agent.to_string(),
        reason,
    };
    // Agents print Python warnings before the XML on some systems; start at the document.
    let start = xml
        .find("<?xml")
        .or_else(|| xml.find("<resource-agent"))
        .ok_or_else(|| error("no <resource-agent> document in the output".to_string()))?;
    let document = roxmltree::Document::parse(&xml[start..])
        .map_err(|e| error(format!("invalid XML: {e}")))?;
    let root = document.root_element();
    if root.tag_name().name() != "resource-agent" {
        return Err(error(format!(
            "the document is <{}>, not <resource-agent>",
            root.tag_name().name()
        )));
    }
    let mut parameters = Vec::new();
    if let Some(list) = child(root, "parameters") {
        for parameter in list
            .children()
            .filter(|c| c.is_element() && c.tag_name().name() == "parameter")
        {
            let Some(name) = parameter.attribute("name") else {
                return Err(error("a <parameter> without a name".to_string()));
            };
            let long_option = child(parameter, "getopt")
                .and_then(|getopt| getopt.attribute("mixed"))
                .and_then(long_option);
            let content_type = child(parameter, "content")
                .and_then(|content| content.attribute("type"))
                .unwrap_or("string")
                .to_string();
            parameters.push(ParameterSpec {
                name: name.replace('-', "_"),
                long_option,
                required: parameter.attribute("required") == Some("1"),
                deprecated: parameter.attribute("deprecated") == Some("1"),
                content_type,
            });
        }
    }
    let actions = child(root, "actions")
        .map(|list| {
            list.children()
                .filter(|c| c.is_element() && c.tag_name().name() == "action")
                .filter_map(|action| action.attribute("name").map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Ok(AgentMetadata {
        agent: root.attribute("name").unwrap_or(agent).to_string(),
        parameters,
        actions,
    })
}

/// The first child element of `node` named `name`.
fn child<'a, 'input>(
    node: roxmltree::Node<'a, 'input>,
    name: &str,
) -> Option<roxmltree::Node<'a, 'input>> {
    node.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

/// `-o, --action=[action]` → `action`; `--ssl-insecure` → `ssl_insecure`.
fn long_option(mixed: &str) -> Option<String> {
    mixed
        .split([',', ' '])
        .map(str::trim)
        .find_map(|token| token.strip_prefix("--"))
        .map(|option| {
            option
                .split(['=', '['])
                .next()
                .unwrap_or(option)
                .replace('-', "_")
        })
        .filter(|option| !option.is_empty())
}

impl AgentMetadata {
    /// The parameter a key names: its metadata name first, else its long option.
    pub fn lookup(&self, key: &str) -> Option<&ParameterSpec> {
        let key = key.replace('-', "_");
        self.parameters
            .iter()
            .find(|spec| spec.name == key)
            .or_else(|| {
                self.parameters
                    .iter()
                    .find(|spec| spec.long_option.as_deref() == Some(key.as_str()))
            })
    }

    pub fn supports(&self, action: &str) -> bool {
        self.actions.iter().any(|a| a == action)
    }

    /// The action the fire drill uses: `status`, or `monitor` where there is no status.
    pub fn probe_action(&self) -> Option<&'static str> {
        if self.supports("status") {
            Some("status")
        } else if self.supports("monitor") {
            Some("monitor")
        } else {
            None
        }
    }
}

/// Checks `method` against its agent's metadata and settles aliases: where the template
/// and the node set the same option under different names (`ipaddr` and `ip`), the node's
/// value is kept; a boolean option set to false is dropped, since some agents treat any
/// value, even `0`, as set (fence_redfish's `ssl_insecure`).
pub fn check_method(
    method: &mut MethodPlan,
    metadata: &AgentMetadata,
    node: &str,
) -> Vec<FenceConfigError> {
    let place = Place {
        node: node.to_string(),
        method: Some(method.name.clone()),
        config_map: None,
        key: None,
    };
    let at = |source: &super::config::Source| Place {
        config_map: Some(source.config_map.clone()),
        key: Some(source.key.clone()),
        ..place.clone()
    };
    let mut errors = Vec::new();
    let mut kept: Vec<(String, usize)> = Vec::new();
    let mut drop = vec![false; method.parameters.len()];
    for (index, parameter) in method.parameters.iter().enumerate() {
        let Some(spec) = metadata.lookup(&parameter.name) else {
            errors.push(FenceConfigError::UnknownParameter {
                at: at(&parameter.source),
                agent: metadata.agent.clone(),
                property: parameter.written.clone(),
            });
            continue;
        };
        if let Some(expected) = value_problem(spec, parameter.value.expose()) {
            errors.push(FenceConfigError::BadParameterValue {
                at: at(&parameter.source),
                agent: metadata.agent.clone(),
                property: parameter.written.clone(),
                value: parameter.value.shown().to_string(),
                expected,
            });
            continue;
        }
        if spec.content_type == "boolean" && is_false(parameter.value.expose()) {
            drop[index] = true;
            continue;
        }
        let option = spec.option().to_string();
        match kept.iter().find(|(kept_option, _)| *kept_option == option) {
            Some(&(_, first)) => {
                let earlier = &method.parameters[first];
                if earlier.layer == parameter.layer {
                    errors.push(FenceConfigError::SetTwice {
                        at: at(&parameter.source),
                        parameter: option,
                        first: earlier.written.clone(),
                        second: parameter.written.clone(),
                    });
                } else if parameter.layer == Layer::Node {
                    drop[first] = true;
                    kept.retain(|(kept_option, _)| *kept_option != option);
                    kept.push((option, index));
                } else {
                    drop[index] = true;
                }
            }
            None => kept.push((option, index)),
        }
    }
    let mut index = 0;
    method.parameters.retain(|_| {
        let keep = !drop[index];
        index += 1;
        keep
    });

    let mut required: Vec<&ParameterSpec> = Vec::new();
    for spec in metadata
        .parameters
        .iter()
        .filter(|s| s.required && s.name != "action")
    {
        if !required.iter().any(|r| r.option() == spec.option()) {
            required.push(spec);
        }
    }
    for spec in required {
        let set = method.parameters.iter().any(|parameter| {
            metadata
                .lookup(&parameter.name)
                .is_some_and(|found| found.option() == spec.option())
        });
        if !set {
            // Name the current spelling, not the deprecated alias.
            let name = metadata
                .parameters
                .iter()
                .find(|s| s.option() == spec.option() && !s.deprecated)
                .unwrap_or(spec);
            errors.push(FenceConfigError::MissingRequired {
                at: at(&method.source),
                agent: metadata.agent.clone(),
                parameter: name.name.clone(),
            });
        }
    }

    let needed: &[&str] = match method.action {
        FenceAction::Off => &["off"],
        FenceAction::On => &["on"],
        FenceAction::Reboot => &["reboot", "off", "on"],
    };
    for action in needed {
        if !metadata.supports(action) {
            errors.push(FenceConfigError::UnsupportedAction {
                at: at(&method.source),
                agent: metadata.agent.clone(),
                action: (*action).to_string(),
            });
            break;
        }
    }
    if matches!(method.action, FenceAction::Off | FenceAction::Reboot)
        && !metadata.supports("status")
    {
        errors.push(FenceConfigError::Unverifiable {
            at: at(&method.source),
            agent: metadata.agent.clone(),
            action: method.action.to_string(),
        });
    }
    errors
}

fn is_false(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "0" | "no" | "off" | "false"
    )
}

/// What a value of this type must look like, when `value` does not.
fn value_problem(spec: &ParameterSpec, value: &str) -> Option<String> {
    match spec.content_type.as_str() {
        "boolean" => {
            let valid = matches!(
                value.to_ascii_lowercase().as_str(),
                "1" | "0" | "yes" | "no" | "on" | "off" | "true" | "false"
            );
            (!valid).then(|| "a boolean (1, 0, yes, no, on, off, true or false)".to_string())
        }
        "integer" => {
            let valid = !value.is_empty()
                && value
                    .strip_prefix('-')
                    .unwrap_or(value)
                    .chars()
                    .all(|c| c.is_ascii_digit());
            (!valid).then(|| "an integer".to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::config::{Parameter, ParameterValue, Source};
    use crate::fencing::secret::SecretValue;

    /// A made-up agent in the metadata format of ClusterLabs fence-agents 4.x: a PDU with
    /// an address under two names, a required plug, a boolean and an integer option.
    const PDU: &str = r#"<?xml version="1.0" ?>
<resource-agent name="fence_testpdu" shortdesc="A test PDU">
<parameters>
  <parameter name="action" unique="0" required="1">
    <getopt mixed="-o, --action=[action]" /><content type="string" default="reboot" />
  </parameter>
  <parameter name="ip" unique="0" required="1" obsoletes="ipaddr">
    <getopt mixed="-a, --ip=[ip]" /><content type="string" />
  </parameter>
  <parameter name="ipaddr" unique="0" required="1" deprecated="1">
    <getopt mixed="-a, --ip=[ip]" /><content type="string" />
  </parameter>
  <parameter name="plug" unique="0" required="1" obsoletes="port">
    <getopt mixed="-n, --plug=[id]" /><content type="string" />
  </parameter>
  <parameter name="port" unique="0" required="1" deprecated="1">
    <getopt mixed="-n, --plug=[id]" /><content type="string" />
  </parameter>
  <parameter name="password" unique="0" required="0">
    <getopt mixed="-p, --password=[password]" /><content type="string" />
  </parameter>
  <parameter name="snmp_priv_prot" unique="0" required="0">
    <getopt mixed="-R, --snmp-priv-prot=[prot]" /><content type="select" />
  </parameter>
  <parameter name="ssl_insecure" unique="0" required="0">
    <getopt mixed="--ssl-insecure" /><content type="boolean" />
  </parameter>
  <parameter name="ipport" unique="0" required="0">
    <getopt mixed="-u, --ipport=[port]" /><content type="integer" default="161" />
  </parameter>
</parameters>
<actions>
  <action name="on" automatic="0"/><action name="off" /><action name="status" />
  <action name="monitor" /><action name="metadata" />
</actions>
</resource-agent>"#;

    fn pdu() -> AgentMetadata {
        parse_metadata("fence_testpdu", PDU).expect("valid metadata")
    }

    fn parameter(name: &str, value: &str, layer: Layer) -> Parameter {
        let config_map = match layer {
            Layer::Template => "t",
            _ => "fence-method-m-n1",
        };
        Parameter {
            name: name.replace('-', "_"),
            written: name.to_string(),
            value: if name == "password" {
                ParameterValue::Sensitive(SecretValue::new(value))
            } else {
                ParameterValue::Text(value.to_string())
            },
            layer,
            source: Source {
                config_map: config_map.to_string(),
                key: "method.properties".to_string(),
            },
            secret: None,
        }
    }

    fn method(action: FenceAction, parameters: Vec<Parameter>) -> MethodPlan {
        MethodPlan {
            name: "m".to_string(),
            source: Source {
                config_map: "fence-method-m-n1".to_string(),
                key: "method.properties".to_string(),
            },
            template: Some("t".to_string()),
            agent: "fence_testpdu".to_string(),
            action,
            action_layer: Layer::Node,
            must_succeed: true,
            parameters,
        }
    }

    fn messages(errors: Vec<FenceConfigError>) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn reads_names_long_options_requirements_and_actions() {
        let metadata = pdu();
        assert_eq!(metadata.agent, "fence_testpdu");
        let ipaddr = metadata.lookup("ipaddr").expect("ipaddr");
        assert_eq!(ipaddr.option(), "ip");
        assert!(ipaddr.deprecated && ipaddr.required);
        assert_eq!(
            metadata.lookup("snmp-priv-prot").map(|s| s.name.as_str()),
            Some("snmp_priv_prot")
        );
        assert_eq!(
            metadata
                .lookup("ssl-insecure")
                .map(|s| s.content_type.as_str()),
            Some("boolean")
        );
        assert!(metadata.supports("off") && !metadata.supports("reboot"));
        assert_eq!(metadata.probe_action(), Some("status"));
    }

    #[test]
    fn skips_warnings_printed_before_the_document() {
        let noisy = format!("/usr/sbin/fence_x:5: DeprecationWarning: 'pipes'\n{PDU}");
        assert_eq!(parse_metadata("fence_testpdu", &noisy), Ok(pdu()));
        let error =
            parse_metadata("fence_x", "Traceback (most recent call last):").expect_err("no XML");
        assert_eq!(
            error.to_string(),
            "metadata of fence_x: no <resource-agent> document in the output"
        );
        assert!(parse_metadata("fence_x", "<resource-agent><parameters>").is_err());
    }

    #[test]
    fn a_valid_method_passes_and_keeps_its_parameters() {
        let mut plan = method(
            FenceAction::Off,
            vec![
                parameter("ip", "10.0.0.1", Layer::Template),
                parameter("plug", "3", Layer::Node),
                parameter("ipport", "1161", Layer::Node),
            ],
        );
        assert_eq!(check_method(&mut plan, &pdu(), "n1"), []);
        assert_eq!(plan.parameters.len(), 3);
    }

    #[test]
    fn the_nodes_alias_of_an_option_beats_the_templates() {
        let mut plan = method(
            FenceAction::Off,
            vec![
                parameter("ipaddr", "10.0.0.1", Layer::Template),
                parameter("plug", "3", Layer::Node),
                parameter("ip", "10.0.0.2", Layer::Node),
            ],
        );
        assert_eq!(check_method(&mut plan, &pdu(), "n1"), []);
        let addresses: Vec<(&str, &str)> = plan
            .parameters
            .iter()
            .filter(|p| p.name == "ip" || p.name == "ipaddr")
            .map(|p| (p.name.as_str(), p.value.expose()))
            .collect();
        assert_eq!(addresses, [("ip", "10.0.0.2")]);
    }

    #[test]
    fn both_aliases_in_one_layer_are_an_error() {
        let mut plan = method(
            FenceAction::Off,
            vec![
                parameter("ipaddr", "10.0.0.1", Layer::Node),
                parameter("ip", "10.0.0.2", Layer::Node),
                parameter("plug", "3", Layer::Node),
            ],
        );
        let errors = messages(check_method(&mut plan, &pdu(), "n1"));
        assert_eq!(
            errors,
            [
                "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: ip is set twice, as ipaddr and as ip"
            ]
        );
    }

    #[test]
    fn a_false_boolean_is_dropped_because_agents_test_presence() {
        let mut plan = method(
            FenceAction::Off,
            vec![
                parameter("ip", "10.0.0.1", Layer::Node),
                parameter("plug", "3", Layer::Node),
                parameter("ssl-insecure", "0", Layer::Node),
            ],
        );
        assert_eq!(check_method(&mut plan, &pdu(), "n1"), []);
        assert!(plan.parameter("ssl_insecure").is_none());
    }

    #[test]
    fn unknown_missing_mistyped_and_unsupported_are_each_named() {
        let mut plan = method(
            FenceAction::Reboot,
            vec![
                parameter("ip", "10.0.0.1", Layer::Template),
                parameter("inet4-only", "true", Layer::Template),
                parameter("ipport", "161x", Layer::Node),
                parameter("password", "hunter2", Layer::Node),
            ],
        );
        let errors = messages(check_method(&mut plan, &pdu(), "n1"));
        assert_eq!(
            errors,
            [
                "node n1, method m, ConfigMap t, key method.properties: agent fence_testpdu has no parameter inet4-only (see fence_testpdu -o metadata)",
                "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: agent fence_testpdu expects an integer for ipport, found \"161x\"",
                "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: agent fence_testpdu requires plug, which neither the method nor its template sets",
                "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: agent fence_testpdu does not support the action reboot",
            ]
        );
        assert!(!errors.concat().contains("hunter2"));
    }

    #[test]
    fn an_off_the_agent_cannot_confirm_is_an_error() {
        let no_status = PDU.replace(r#"<action name="status" />"#, "");
        let metadata = parse_metadata("fence_testpdu", &no_status).expect("valid");
        assert_eq!(metadata.probe_action(), Some("monitor"));
        let mut plan = method(
            FenceAction::Off,
            vec![
                parameter("ip", "10.0.0.1", Layer::Node),
                parameter("plug", "3", Layer::Node),
            ],
        );
        let errors = messages(check_method(&mut plan, &metadata, "n1"));
        assert_eq!(
            errors,
            [
                "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: agent fence_testpdu has no status action, so nodekeeper cannot confirm that off worked"
            ]
        );
    }
}
