//! The original node-fencing design's ConfigMaps resolved into a node's fence plan: its own
//! examples, the precedence of per-node values over templates, alternatives, credentials
//! from Secrets, and a precise error for each broken variant.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use nodekeeper::fencing::config::{
    Layer, ParameterValue, ResolvePolicy, referenced_secrets, resolve_with,
};
use nodekeeper::fencing::{
    FenceAction, FenceObjects, FencePlan, ObjectOrigin, SecretValue, Step, resolve,
};

const ORIGINAL: &str = "tests/fixtures/fencing/original-design";

fn original() -> FenceObjects {
    FenceObjects::from_dir(Path::new(ORIGINAL)).expect("the original examples load")
}

/// A ConfigMap's name, one data key and its properties text.
type ConfigMapText = (&'static str, &'static str, &'static str);

/// Objects from `(ConfigMap, data key, properties)` triples.
fn objects(config_maps: &[ConfigMapText]) -> FenceObjects {
    let mut objects = FenceObjects::new();
    let mut grouped: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for (name, key, text) in config_maps {
        grouped
            .entry(name)
            .or_default()
            .insert((*key).to_string(), (*text).to_string());
    }
    for (name, data) in grouped {
        objects
            .insert_config_map(name, data, ObjectOrigin::Cluster)
            .expect("unique names");
    }
    objects
}

fn with_secret(mut objects: FenceObjects, name: &str, key: &str, value: &str) -> FenceObjects {
    let data = BTreeMap::from([(key.to_string(), SecretValue::new(value))]);
    objects
        .insert_secret(name, data, ObjectOrigin::Cluster)
        .expect("unique secret");
    objects
}

/// The one error resolving `node` must give.
fn error_of(objects: &FenceObjects, node: &str) -> String {
    match resolve(objects, node) {
        Ok(plan) => panic!("expected an error, resolved {plan:#?}"),
        Err(errors) => errors.to_string(),
    }
}

fn value<'a>(plan: &'a FencePlan, method: &str, name: &str) -> (&'a str, Layer) {
    let (_, method) = plan
        .methods()
        .find(|(_, m)| m.name == method)
        .unwrap_or_else(|| panic!("no method {method}"));
    let parameter = method
        .parameter(name)
        .unwrap_or_else(|| panic!("method {} has no {name}", method.name));
    (parameter.value.shown(), parameter.layer)
}

const TEMPLATE: ConfigMapText = (
    "fence-method-template-ipmi",
    "template.properties",
    "agent_name=fence_ipmilan\nip=10.0.0.1\nusername=admin\npassword_secret=bmc/password",
);

#[test]
fn the_original_designs_second_node_merges_templates_under_its_own_values() {
    let plan = resolve(&original(), "lago-kube-host1").expect("valid plan");
    let steps: Vec<Step> = plan.steps.iter().map(|s| s.step).collect();
    assert_eq!(
        steps,
        [Step::Isolation, Step::PowerManagement, Step::Recovery]
    );
    let power = plan.step(Step::PowerManagement).expect("power step");
    assert_eq!(power.alternatives.len(), 1, "no '|': one alternative");
    let names: Vec<&str> = power.alternatives[0]
        .methods
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(names, ["eaton-off", "eaton-on"], "run in the order written");

    let eaton_off = &power.alternatives[0].methods[0];
    assert_eq!(eaton_off.agent, "fence_eaton_snmp");
    assert_eq!(eaton_off.action, FenceAction::Off);
    assert_eq!(eaton_off.action_layer, Layer::Node);
    assert_eq!(
        eaton_off.source.config_map,
        "fence-method-eaton-off-lago-kube-host1"
    );
    assert_eq!(
        eaton_off.template.as_deref(),
        Some("fence-method-template-eaton-pdu")
    );
    assert!(eaton_off.must_succeed);
    assert_eq!(value(&plan, "eaton-off", "plug"), ("2", Layer::Node));
    assert_eq!(
        value(&plan, "eaton-off", "ipaddr"),
        ("192.168.1.4", Layer::Template)
    );
    // Both spellings of an option are one key, passed in its `_` form.
    assert_eq!(
        value(&plan, "eaton-off", "snmp_priv_prot"),
        ("AES", Layer::Template)
    );
    // Credentials are masked wherever they are shown.
    assert_eq!(
        value(&plan, "eaton-off", "password"),
        ("***", Layer::Template)
    );
    assert_eq!(
        value(&plan, "eaton-off", "snmp_priv_passwd"),
        ("***", Layer::Template)
    );
    // nodekeeper's own keys never reach the agent.
    for owned in ["name", "agent_name", "template", "must_sucess", "action"] {
        assert!(
            plan.methods().all(|(_, m)| m.parameter(owned).is_none()),
            "{owned} is passed to an agent"
        );
    }
    // The brocade methods name no action: isolation turns the port off, recovery on.
    let fc_off = &plan.step(Step::Isolation).expect("isolation").alternatives[0].methods[0];
    assert_eq!(
        (fc_off.action, fc_off.action_layer),
        (FenceAction::Off, Layer::Default)
    );
    let fc_on = &plan.step(Step::Recovery).expect("recovery").alternatives[0].methods[0];
    assert_eq!(
        (fc_on.action, fc_on.action_layer),
        (FenceAction::On, Layer::Default)
    );
}

#[test]
fn the_original_designs_inline_methods_resolve_like_method_config_maps() {
    let plan = resolve(&original(), "lago-kube-host0").expect("valid plan");
    let (_, fc_off) = plan
        .methods()
        .find(|(_, m)| m.name == "fc-off")
        .expect("fc-off");
    assert_eq!(fc_off.source.config_map, "fence-config-lago-kube-host0");
    assert_eq!(fc_off.source.key, "fence-method-fc-off");
    assert_eq!(fc_off.agent, "fence_brocade");
    assert_eq!(value(&plan, "fc-off", "plug"), ("1", Layer::Node));
    assert_eq!(
        value(&plan, "fc-off", "username"),
        ("brocade_admin", Layer::Template)
    );
}

#[test]
fn plain_text_credentials_in_config_maps_draw_one_warning_each() {
    let plan = resolve(&original(), "lago-kube-host1").expect("valid plan");
    let warnings: Vec<String> = plan.warnings.iter().map(ToString::to_string).collect();
    // In the order the steps first use them: the isolation step's switch, then the PDU.
    assert_eq!(
        warnings,
        [
            "ConfigMap fence-method-template-fc-switch-brocade, key template.properties: password is written in plain text in a ConfigMap; put it in a Secret and write password_secret=<secret>/<key>",
            "ConfigMap fence-method-template-eaton-pdu, key template.properties: password is written in plain text in a ConfigMap; put it in a Secret and write password_secret=<secret>/<key>",
            "ConfigMap fence-method-template-eaton-pdu, key template.properties: snmp-priv-passwd is written in plain text in a ConfigMap; put it in a Secret and write snmp-priv-passwd_secret=<secret>/<key>",
        ]
    );
}

#[test]
fn a_per_node_value_overrides_the_template_in_either_spelling() {
    let objects = with_secret(
        objects(&[
            (
                "fence-config-n1",
                "config.properties",
                "power_management=ipmi",
            ),
            (
                "fence-method-ipmi-n1",
                "method.properties",
                "template=fence-method-template-ipmi\nip=10.0.0.99\nuser-name=ignored-spelling-test",
            ),
            TEMPLATE,
        ]),
        "bmc",
        "password",
        "s3cret",
    );
    let plan = resolve(&objects, "n1").expect("valid");
    assert_eq!(value(&plan, "ipmi", "ip"), ("10.0.0.99", Layer::Node));
    assert_eq!(value(&plan, "ipmi", "username"), ("admin", Layer::Template));
    assert_eq!(
        value(&plan, "ipmi", "user_name"),
        ("ignored-spelling-test", Layer::Node)
    );
    let (_, method) = plan.methods().next().expect("one method");
    let password = method
        .parameter("password")
        .expect("password from the Secret");
    assert_eq!(
        password.value,
        ParameterValue::Sensitive(SecretValue::new("s3cret"))
    );
    assert_eq!(password.written, "password_secret");
    let secret = password.secret.as_ref().expect("secret reference");
    assert_eq!(
        (secret.secret.as_str(), secret.key.as_str()),
        ("bmc", "password")
    );
    assert!(plan.warnings.is_empty(), "a Secret draws no warning");
    assert_eq!(method.sensitive_values(), ["s3cret"]);
}

#[test]
fn a_node_secret_overrides_a_template_plain_password_and_the_reverse() {
    let objects = with_secret(
        objects(&[
            (
                "fence-config-n1",
                "config.properties",
                "power_management=a\nrecovery=b",
            ),
            (
                "fence-method-a-n1",
                "method.properties",
                "template=t\npassword_secret=bmc/password",
            ),
            (
                "fence-method-b-n1",
                "method.properties",
                "template=t2\npassword=node-plain",
            ),
            (
                "t",
                "template.properties",
                "agent_name=fence_ipmilan\npassword=template-plain",
            ),
            (
                "t2",
                "template.properties",
                "agent_name=fence_ipmilan\npassword_secret=bmc/password",
            ),
        ]),
        "bmc",
        "password",
        "from-secret",
    );
    let plan = resolve(&objects, "n1").expect("valid");
    let exposed = |method: &str| {
        let (_, m) = plan
            .methods()
            .find(|(_, m)| m.name == method)
            .expect("method");
        m.parameter("password")
            .expect("password")
            .value
            .expose()
            .to_string()
    };
    assert_eq!(exposed("a"), "from-secret");
    assert_eq!(exposed("b"), "node-plain");
}

#[test]
fn alternatives_split_a_step_at_each_bar() {
    let objects = objects(&[
        (
            "fence-config-n1",
            "config.properties",
            "node_name=n1\npower_management=ipmi-off | pdu-a-off pdu-b-off",
        ),
        (
            "fence-method-ipmi-off-n1",
            "method.properties",
            "agent_name=fence_ipmilan\nip=10.0.0.1",
        ),
        (
            "fence-method-pdu-a-off-n1",
            "method.properties",
            "agent_name=fence_apc_snmp\nplug=1",
        ),
        (
            "fence-method-pdu-b-off-n1",
            "method.properties",
            "agent_name=fence_apc_snmp\nplug=2\nmust_success=no",
        ),
    ]);
    let plan = resolve(&objects, "n1").expect("valid");
    let step = plan.step(Step::PowerManagement).expect("power");
    let shape: Vec<Vec<&str>> = step
        .alternatives
        .iter()
        .map(|a| a.methods.iter().map(|m| m.name.as_str()).collect())
        .collect();
    assert_eq!(shape, [vec!["ipmi-off"], vec!["pdu-a-off", "pdu-b-off"]]);
    assert!(!step.alternatives[1].methods[1].must_succeed);
}

#[test]
fn kdump_is_off_unless_the_node_config_turns_it_on() {
    let method = (
        "fence-method-ipmi-off-n1",
        "method.properties",
        "agent_name=fence_ipmilan\nip=10.0.0.1",
    );
    let with =
        |config: &'static str| objects(&[("fence-config-n1", "config.properties", config), method]);
    let off = resolve(&with("node_name=n1\npower_management=ipmi-off"), "n1").expect("valid");
    assert!(!off.kdump);
    let on = resolve(
        &with("node_name=n1\npower_management=ipmi-off\nkdump=true"),
        "n1",
    )
    .expect("valid");
    assert!(on.kdump);
    assert!(
        nodekeeper::fencing::report::render_plan(&on, None).contains("\nkdump: on."),
        "fence-config check shows it"
    );
    assert!(!nodekeeper::fencing::report::render_plan(&off, None).contains("kdump"));
    let spelled_off = resolve(
        &with("node_name=n1\npower_management=ipmi-off\nkdump=false"),
        "n1",
    )
    .expect("valid");
    assert!(!spelled_off.kdump);
    assert_eq!(
        error_of(
            &with("node_name=n1\npower_management=ipmi-off\nkdump=on"),
            "n1"
        ),
        "node n1, ConfigMap fence-config-n1, key config.properties: kdump is \"on\"; expected true or false"
    );
}

#[test]
fn each_broken_configuration_gets_a_precise_error() {
    let ok_method = (
        "fence-method-m-n1",
        "method.properties",
        "agent_name=fence_ipmilan\nip=10.0.0.1",
    );
    let cases: Vec<(Vec<ConfigMapText>, &str)> = vec![
        (
            vec![ok_method],
            "node n1: no ConfigMap fence-config-n1, which says how to fence the node",
        ),
        (
            vec![
                ("fence-config-n1", "config", "power_management=m"),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1: the ConfigMap has no key config.properties",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=x"),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: method x of step power-management is not defined: no ConfigMap fence-method-x-n1 (key method.properties) and no key fence-method-x in fence-config-n1",
        ),
        (
            vec![
                (
                    "fence-config-n1",
                    "config.properties",
                    "power_management=m\nrecovery=",
                ),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: step recovery names no method; remove the key if the node has no such step",
        ),
        (
            vec![
                (
                    "fence-config-n1",
                    "config.properties",
                    "power_management=m |",
                ),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: step power-management names no method in alternative 2 of \"m |\"; remove the key if the node has no such step",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "recovery=m"),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: no fencing step: set power_management or isolation (or both)",
        ),
        (
            vec![
                (
                    "fence-config-n1",
                    "config.properties",
                    "node_name=n2\npower_management=m",
                ),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: node_name is n2, but this ConfigMap is for node n1",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power-managment=m"),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: unknown property power-managment (expected node_name, isolation, power_management, recovery, kdump, or fence-method-<name> keys beside config.properties)\nnode n1, ConfigMap fence-config-n1, key config.properties: no fencing step: set power_management or isolation (or both)",
        ),
        (
            vec![
                (
                    "fence-config-n1",
                    "config.properties",
                    "power_management=m\npower_management=m",
                ),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: line 2: power_management is already set on line 1 ('-' and '_' are the same in keys)",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "template=fence-method-template-gone\nplug=1",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: template fence-method-template-gone does not exist",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                ("fence-method-m-n1", "method.properties", "template=t"),
                ("t", "method.properties", "agent_name=fence_ipmilan"),
            ],
            "node n1, method m, ConfigMap t: the ConfigMap has no key template.properties",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                ("fence-method-m-n1", "method.properties", "plug=1"),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: no agent_name, neither in the method nor in its template",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                ("fence-method-m-n1", "method.properties", "agent_name=ssh"),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: agent \"ssh\" is not a ClusterLabs fence agent (the name must be fence_ followed by letters, digits or '_')",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "agent_name=fence_ipmilan\naction=status",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: action \"status\" is not an action a fence method takes (off, on or reboot)",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "agent_name=fence_ipmilan\npassword_secret=bmc",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: password_secret must be <secret>/<key>, found \"bmc\"",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "agent_name=fence_ipmilan\npassword_secret=bmc/password",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: password_secret names Secret bmc, which does not exist",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "agent_name=fence_ipmilan\npassword_script=/tmp/x",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: nodekeeper does not pass password_script to agents: credentials come from Secrets: write password_secret=<secret>/<key>",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "agent_name=fence_ipmilan\nipmitool-path=/tmp/evil",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: nodekeeper does not pass ipmitool-path to agents: it makes the agent run a program, or read or write a file, chosen by a ConfigMap (an operator can allow it with --allow-option)",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "agent_name=fence_ipmilan\nmust_sucess=maybe",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: must_sucess is \"maybe\"; expected yes or no",
        ),
        (
            vec![
                (
                    "fence-config-n1",
                    "config.properties",
                    "power_management=m\nfence-method-m=agent_name=fence_ipmilan",
                ),
                ok_method,
            ],
            "node n1, ConfigMap fence-config-n1, key config.properties: unknown property fence-method-m (expected node_name, isolation, power_management, recovery, kdump, or fence-method-<name> keys beside config.properties)",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-config-n1",
                    "fence-method-m",
                    "agent_name=fence_ipmilan",
                ),
                ok_method,
            ],
            "node n1, method m: the method is defined twice, in ConfigMap fence-method-m-n1 and as key fence-method-m of fence-config-n1",
        ),
        (
            vec![(
                "fence-config-n1",
                "config.properties",
                "power_management=M_1",
            )],
            "node n1, ConfigMap fence-config-n1, key config.properties: method name \"M_1\" in step power-management may hold only lower-case letters, digits and '-'",
        ),
        (
            vec![
                ("fence-config-n1", "config.properties", "power_management=m"),
                (
                    "fence-method-m-n1",
                    "method.properties",
                    "agent_name fence_ipmilan",
                ),
            ],
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: line 1: expected key=value, found \"agent_name fence_ipmilan\"",
        ),
    ];
    let mut wrong = Vec::new();
    for (config_maps, expected) in cases {
        let found = error_of(&objects(&config_maps), "n1");
        if found != expected {
            wrong.push(format!(
                "for {config_maps:?}\n  expected: {expected}\n  found:    {found}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn secrets_that_are_missing_or_unsafe_are_errors_that_never_show_the_value() {
    let base = [
        ("fence-config-n1", "config.properties", "power_management=m"),
        (
            "fence-method-m-n1",
            "method.properties",
            "agent_name=fence_ipmilan\npassword_secret=bmc/password",
        ),
    ];
    let missing_key = with_secret(objects(&base), "bmc", "user", "admin");
    assert_eq!(
        error_of(&missing_key, "n1"),
        "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: password_secret names key password of Secret bmc, which has no such key"
    );
    let twice = with_secret(
        objects(&[
            base[0],
            (
                "fence-method-m-n1",
                "method.properties",
                "agent_name=fence_ipmilan\npassword=a\npassword_secret=bmc/password",
            ),
        ]),
        "bmc",
        "password",
        "b",
    );
    assert_eq!(
        error_of(&twice, "n1"),
        "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: password is set twice, as password and as password_secret"
    );
    let with_newline = with_secret(objects(&base), "bmc", "password", "hunter2\n");
    let error = error_of(&with_newline, "n1");
    assert_eq!(
        error,
        "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: the value of password_secret holds a line break or NUL byte, which could pass further options or commands to the agent (a Secret made with --from-file keeps the file's final newline; use --from-literal)"
    );
    assert!(!error.contains("hunter2"));
}

#[test]
fn resolving_reports_every_broken_method_at_once() {
    let objects = objects(&[
        (
            "fence-config-n1",
            "config.properties",
            "isolation=a\npower_management=b | c",
        ),
        ("fence-method-a-n1", "method.properties", "plug=1"),
        (
            "fence-method-c-n1",
            "method.properties",
            "agent_name=fence_x\naction=cycle",
        ),
    ]);
    let errors = error_of(&objects, "n1");
    let lines: Vec<&str> = errors.lines().collect();
    assert_eq!(lines.len(), 3, "{errors}");
    assert!(lines[0].contains("method a") && lines[0].contains("no agent_name"));
    assert!(lines[1].contains("method b of step power-management is not defined"));
    assert!(lines[2].contains("method c") && lines[2].contains("\"cycle\""));
}

#[test]
fn the_plan_as_json_masks_every_credential() {
    let objects = with_secret(
        objects(&[
            ("fence-config-n1", "config.properties", "power_management=m"),
            (
                "fence-method-m-n1",
                "method.properties",
                "template=fence-method-template-ipmi\ncommunity=public-but-secret",
            ),
            TEMPLATE,
        ]),
        "bmc",
        "password",
        "s3cret-from-secret",
    );
    let plan = resolve(&objects, "n1").expect("valid");
    let json = serde_json::to_string(&plan).expect("serializes");
    assert!(!json.contains("s3cret-from-secret"), "{json}");
    assert!(!json.contains("public-but-secret"), "{json}");
    assert!(json.contains("\"***\""), "{json}");
    assert!(
        json.contains("\"secret\":\"bmc\""),
        "names the Secret: {json}"
    );
}

/// The error, if any, of node n1's one method `m` (agent `fence_x`) with `properties`
/// added, resolved under `policy`.
fn method_error(properties: &str, policy: &ResolvePolicy) -> Option<String> {
    let mut objects = objects(&[("fence-config-n1", "config.properties", "power_management=m")]);
    let text = format!("agent_name=fence_x\n{properties}");
    objects
        .insert_config_map(
            "fence-method-m-n1",
            BTreeMap::from([("method.properties".to_string(), text)]),
            ObjectOrigin::Cluster,
        )
        .expect("insert");
    resolve_with(&objects, "n1", policy)
        .err()
        .map(|e| e.to_string())
}

#[test]
fn a_config_map_cannot_make_an_agent_run_programs_write_files_or_fake_an_off() {
    let safe = ResolvePolicy::default();
    for (option, reason) in [
        (
            "ssh_options=-oProxyCommand=touch${IFS}/tmp/x",
            "it makes the agent run a program, or read or write a file, chosen by a ConfigMap (an operator can allow it with --allow-option)",
        ),
        (
            "runonfail=touch /tmp/x",
            "it makes the agent run a program, or read or write a file, chosen by a ConfigMap (an operator can allow it with --allow-option)",
        ),
        (
            "exec=/bin/sh",
            "it makes the agent run a program, or read or write a file, chosen by a ConfigMap (an operator can allow it with --allow-option)",
        ),
        (
            "identity-file=/root/.ssh/id_rsa",
            "it makes the agent run a program, or read or write a file, chosen by a ConfigMap (an operator can allow it with --allow-option)",
        ),
        (
            "status_file=/etc/passwd",
            "it makes the agent run a program, or read or write a file, chosen by a ConfigMap (an operator can allow it with --allow-option)",
        ),
        (
            "verbose=1",
            "it makes the agent log its traffic, credentials included, where nodekeeper cannot redact it",
        ),
        (
            "missing_as_off=1",
            "it makes status report OFF for a plug that does not exist, which would count as a confirmed fence",
        ),
        (
            "option=reboot",
            "it is the old name of action; write action=",
        ),
    ] {
        let key = option.split('=').next().unwrap_or_default();
        assert_eq!(
            method_error(option, &safe),
            Some(format!(
                "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: nodekeeper does not pass {key} to agents: {reason}"
            )),
            "{option}"
        );
    }
    let rig = ResolvePolicy {
        allowed_options: ["status_file".to_string()].into(),
    };
    assert_eq!(method_error("status_file=/tmp/dummy.status", &rig), None);
}

#[test]
fn plain_values_that_could_become_arguments_or_commands_are_refused() {
    let safe = ResolvePolicy::default();
    for (value, problem) in [
        ("ip=127.0.0.1 -oProxyCommand=x", "holds whitespace"),
        ("ip=-oProxyCommand=x", "starts with '-'"),
        ("plug=1;reboot", "holds a quote or shell character"),
        ("systems_uri=$(id)", "holds a quote or shell character"),
        ("username=a'b", "holds a quote or shell character"),
    ] {
        let key = value.split('=').next().unwrap_or_default();
        assert_eq!(
            method_error(value, &safe),
            Some(format!(
                "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: the value of {key} {problem}, which could pass further options or commands to the agent"
            )),
            "{value}"
        );
    }
    // Credentials are passed as they are: a password may hold anything but a line break.
    assert_eq!(method_error("password=p a$s'w;rd", &safe), None);
    assert_eq!(
        method_error(
            "systems_uri=/redfish/v1/Systems/1\nplug=node-1.rack_2",
            &safe
        ),
        None
    );
}

#[test]
fn a_fencing_alternative_must_turn_something_off() {
    let objects = objects(&[
        (
            "fence-config-n1",
            "config.properties",
            "power_management=ipmi-off | pdu-on\nrecovery=pdu-on",
        ),
        (
            "fence-method-ipmi-off-n1",
            "method.properties",
            "agent_name=fence_ipmilan",
        ),
        (
            "fence-method-pdu-on-n1",
            "method.properties",
            "agent_name=fence_apc_snmp\naction=on",
        ),
    ]);
    assert_eq!(
        error_of(&objects, "n1"),
        "node n1, ConfigMap fence-config-n1, key config.properties: alternative 2 of step power-management has no method that turns anything off (action off or reboot), so it could never fence the node"
    );
}

#[test]
fn only_secrets_marked_as_fence_credentials_are_used() {
    let yaml = "apiVersion: v1\nkind: Secret\nmetadata: {name: kube-admin}\nstringData: {token: x}\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: bmc\n  labels: {fencing.nodekeeper.io/credentials: \"true\"}\nstringData: {password: pw}\n";
    let mut objects = objects(&[
        (
            "fence-config-n1",
            "config.properties",
            "power_management=a | b",
        ),
        (
            "fence-method-a-n1",
            "method.properties",
            "agent_name=fence_ipmilan\npassword_secret=kube-admin/token",
        ),
        (
            "fence-method-b-n1",
            "method.properties",
            "agent_name=fence_ipmilan\npassword_secret=bmc/password",
        ),
    ]);
    objects
        .add_yaml(yaml, Path::new("secrets.yaml"))
        .expect("secrets load");
    assert_eq!(
        error_of(&objects, "n1"),
        "node n1, method a, ConfigMap fence-method-a-n1, key method.properties: password_secret names Secret kube-admin, which cannot be used: it lacks the label fencing.nodekeeper.io/credentials=true, which marks the Secrets fence agents may receive"
    );
}

#[test]
fn only_the_nodes_own_methods_and_templates_name_the_secrets_to_read() {
    let objects = objects(&[
        (
            "fence-config-n1",
            "config.properties",
            "power_management=a\nrecovery=b",
        ),
        ("fence-config-n1", "fence-method-b", "template=t\nplug=1"),
        (
            "fence-method-a-n1",
            "method.properties",
            "agent_name=fence_ipmilan\npassword_secret=bmc-n1/password",
        ),
        (
            "t",
            "template.properties",
            "agent_name=fence_apc_snmp\ncommunity_secret=pdu/community",
        ),
        (
            "fence-method-a-n2",
            "method.properties",
            "agent_name=fence_ipmilan\npassword_secret=bmc-n2/password",
        ),
        (
            "unused-template",
            "template.properties",
            "password_secret=elsewhere/password",
        ),
    ]);
    let names: Vec<String> = referenced_secrets(&objects, "n1").into_iter().collect();
    assert_eq!(names, ["bmc-n1", "pdu"]);
}
