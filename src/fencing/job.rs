//! What the fence controller hands a Kubernetes Job, and what the Job hands back.
//!
//! A Job runs `nodekeeper fence execute --execution <JSON>`: the [`JobExecution`] names
//! the method, its agent and action, and every parameter. A plain value travels in the
//! JSON (it is already readable in a ConfigMap); a credential travels only as a
//! reference, `<secret>/<key>`, to a file of the Secret volume mounted into the Job, so
//! no credential is ever in the Job's arguments, environment or object. The wrapper reads
//! those files and gives the agent every value on its standard input, like any other run
//! of the fencing runner.
//!
//! The outcome comes back as the container's termination message: an [`ExecutionResult`]
//! in a versioned JSON document that fits the 4096 bytes Kubernetes keeps.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::jiff;
use serde::{Deserialize, Serialize};

use super::config::{FenceAction, Layer, MethodPlan, Parameter, ParameterValue, SecretRef, Source};
use super::execution::{ExecutionMode, ExecutionResult};
use super::runner::RunnerSettings;
use super::secret::SecretValue;

/// The version of the execution document and of the result; a wrapper refuses others.
pub const JOB_FORMAT_VERSION: u32 = 1;

/// The most Kubernetes keeps of a termination message.
pub const RESULT_LIMIT: usize = 4096;

/// One execution, as a Job receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobExecution {
    pub version: u32,
    /// The node being fenced (for messages; the device is named by the parameters).
    pub node: String,
    pub method: String,
    /// Where the method is configured, for messages.
    pub config_map: String,
    pub agent: String,
    pub action: FenceAction,
    pub mode: ExecutionMode,
    pub parameters: Vec<JobParameter>,
    /// The deadline of one agent call, in seconds.
    pub call_timeout_seconds: u64,
    /// How long `status` may take to confirm an `off` or `on`, in seconds.
    pub verify_timeout_seconds: u64,
    /// No agent is started after this time (RFC 3339): a pod that was scheduled late,
    /// or whose node lost the API server and never heard the Job was given up, runs
    /// nothing. With the calls' own deadlines this bounds when any agent of the Job can
    /// still run: [`JobExecution::ends_by`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_deadline: Option<String>,
}

/// One agent parameter: its value, or where the Secret volume holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobParameter {
    pub name: String,
    /// The key as written in the ConfigMap, for messages.
    pub written: String,
    pub config_map: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretRef>,
}

/// Why an execution document cannot be built or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobFormatError {
    #[error(
        "node {node}, method {method}: {property} is a credential written in plain text in {written_in}; \
         a Job receives credentials only from Secrets: write {property}_secret=<secret>/<key>"
    )]
    PlainTextCredential {
        node: String,
        method: String,
        property: String,
        written_in: Source,
    },
    #[error("the execution document is not valid JSON for this version of nodekeeper: {0}")]
    Malformed(String),
    #[error(
        "the execution document has version {found}; this nodekeeper reads version {JOB_FORMAT_VERSION} \
         (the Job image and the controller must be the same release)"
    )]
    Version { found: u32 },
    #[error("parameter {parameter} has neither a value nor a Secret reference")]
    NoValue { parameter: String },
    #[error("cannot read parameter {parameter} from {}: {reason}", path.display())]
    SecretFile {
        parameter: String,
        path: PathBuf,
        reason: String,
    },
}

impl JobExecution {
    /// The document for one execution of `method`. Fails for a credential that is not
    /// read from a Secret: it could reach the Job only in its spec.
    pub fn new(
        node: &str,
        method: &MethodPlan,
        mode: ExecutionMode,
        call_timeout: Duration,
        verify_timeout: Duration,
    ) -> Result<JobExecution, JobFormatError> {
        let parameters = method
            .parameters
            .iter()
            .map(|parameter| {
                let (value, secret) = match (&parameter.value, &parameter.secret) {
                    (_, Some(secret)) => (None, Some(secret.clone())),
                    (ParameterValue::Text(text), None) => (Some(text.clone()), None),
                    (ParameterValue::Sensitive(_), None) => {
                        return Err(JobFormatError::PlainTextCredential {
                            node: node.to_string(),
                            method: method.name.clone(),
                            property: parameter.written.clone(),
                            written_in: parameter.source.clone(),
                        });
                    }
                };
                Ok(JobParameter {
                    name: parameter.name.clone(),
                    written: parameter.written.clone(),
                    config_map: parameter.source.config_map.clone(),
                    key: parameter.source.key.clone(),
                    value,
                    secret,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(JobExecution {
            version: JOB_FORMAT_VERSION,
            node: node.to_string(),
            method: method.name.clone(),
            config_map: method.source.config_map.clone(),
            agent: method.agent.clone(),
            action: method.action,
            mode,
            parameters,
            call_timeout_seconds: call_timeout.as_secs().max(1),
            verify_timeout_seconds: verify_timeout.as_secs(),
            start_deadline: None,
        })
    }

    /// The same execution, to be started by `deadline` or not at all.
    pub fn starting_by(self, deadline: jiff::Timestamp) -> JobExecution {
        JobExecution {
            start_deadline: Some(deadline.to_string()),
            ..self
        }
    }

    /// How the wrapper's runner calls agents for this execution.
    pub fn runner_settings(&self, agents_dir: &Path) -> RunnerSettings {
        RunnerSettings {
            agents_dir: agents_dir.to_path_buf(),
            call_timeout: Duration::from_secs(self.call_timeout_seconds),
            verify_timeout: Duration::from_secs(self.verify_timeout_seconds),
            ..RunnerSettings::default()
        }
    }

    /// The start deadline, if the document has a readable one.
    pub fn start_deadline(&self) -> Option<jiff::Timestamp> {
        self.start_deadline.as_deref()?.parse().ok()
    }

    /// When every agent this execution may start has ended: the start deadline plus the
    /// budget, plus a little for the process itself.
    pub fn ends_by(&self) -> Option<jiff::Timestamp> {
        let end = self.start_deadline()? + self.budget() + Duration::from_secs(10);
        Some(end)
    }

    /// Refuses to start past the start deadline (`now` from the wrapper's clock).
    pub fn check_start(&self, now: jiff::Timestamp) -> Result<(), String> {
        match (&self.start_deadline, self.start_deadline()) {
            (None, _) => Ok(()),
            (Some(text), None) => Err(format!("the start deadline {text:?} is not a time")),
            (Some(_), Some(deadline)) if now > deadline => Err(format!(
                "not started: the execution had to start by {deadline} and it is {now}; \
                 the pod was scheduled or started too late, so nothing was run"
            )),
            (Some(_), Some(_)) => Ok(()),
        }
    }

    /// Reads a document, refusing other versions with a message that says so.
    pub fn parse(text: &str) -> Result<JobExecution, JobFormatError> {
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let versioned: Versioned = serde_json::from_str(text)
            .map_err(|error| JobFormatError::Malformed(error.to_string()))?;
        if versioned.version != JOB_FORMAT_VERSION {
            return Err(JobFormatError::Version {
                found: versioned.version,
            });
        }
        serde_json::from_str(text).map_err(|error| JobFormatError::Malformed(error.to_string()))
    }

    /// The Secrets the Job must mount, with the keys it reads from each.
    pub fn secrets(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut secrets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for reference in self.parameters.iter().filter_map(|p| p.secret.as_ref()) {
            secrets
                .entry(reference.secret.clone())
                .or_default()
                .insert(reference.key.clone());
        }
        secrets
    }

    /// The agent calls this execution makes at most: the action's (`off` and `on` for a
    /// reboot) with their confirmation, or one `status`; and one `metadata` call first.
    pub fn budget(&self) -> Duration {
        let call = Duration::from_secs(self.call_timeout_seconds);
        let verify = Duration::from_secs(self.verify_timeout_seconds);
        let actions = match (self.mode, self.action) {
            (ExecutionMode::Verify, _) => return call * 2,
            (ExecutionMode::Act, FenceAction::Reboot) => 2,
            (ExecutionMode::Act, _) => 1,
        };
        // Each action: the call, then status calls until the verify deadline, the last of
        // which may itself run up to a call's deadline.
        call + (call * 2 + verify) * actions
    }

    /// The method as the runner executes it, credentials read from the Secret volume
    /// mounted at `secrets_dir` (one directory per Secret, one file per key).
    pub fn method_plan(&self, secrets_dir: &Path) -> Result<MethodPlan, JobFormatError> {
        let parameters = self
            .parameters
            .iter()
            .map(|parameter| {
                let value = match (&parameter.value, &parameter.secret) {
                    (_, Some(reference)) => {
                        let path = secret_path(secrets_dir, reference);
                        let text = std::fs::read(&path)
                            .map_err(|error| error.to_string())
                            .and_then(|bytes| {
                                String::from_utf8(bytes)
                                    .map_err(|_| "the value is not UTF-8 text".to_string())
                            })
                            .map_err(|reason| JobFormatError::SecretFile {
                                parameter: parameter.written.clone(),
                                path: path.clone(),
                                reason,
                            })?;
                        ParameterValue::Sensitive(SecretValue::new(text))
                    }
                    (Some(text), None) => ParameterValue::Text(text.clone()),
                    (None, None) => {
                        return Err(JobFormatError::NoValue {
                            parameter: parameter.written.clone(),
                        });
                    }
                };
                Ok(Parameter {
                    name: parameter.name.clone(),
                    written: parameter.written.clone(),
                    value,
                    layer: Layer::Node,
                    source: Source {
                        config_map: parameter.config_map.clone(),
                        key: parameter.key.clone(),
                    },
                    secret: parameter.secret.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MethodPlan {
            name: self.method.clone(),
            source: Source {
                config_map: self.config_map.clone(),
                key: String::new(),
            },
            template: None,
            agent: self.agent.clone(),
            action: self.action,
            action_layer: Layer::Node,
            must_succeed: true,
            parameters,
        })
    }
}

/// Where the Secret volume holds `reference`: `<dir>/<secret>/<key>`.
pub fn secret_path(secrets_dir: &Path, reference: &SecretRef) -> PathBuf {
    secrets_dir.join(&reference.secret).join(&reference.key)
}

/// The result document: the version, then the result.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultDocument {
    version: u32,
    #[serde(flatten)]
    result: ExecutionResult,
}

/// The result as the termination message: JSON within [`RESULT_LIMIT`] bytes, the
/// detail shortened (at a character boundary) when it would not fit.
pub fn encode_result(result: &ExecutionResult) -> String {
    let mut document = ResultDocument {
        version: JOB_FORMAT_VERSION,
        result: result.clone(),
    };
    loop {
        // Serializing plain data cannot fail.
        let text = serde_json::to_string(&document).unwrap_or_default();
        let Some(detail) = document.result.detail.as_mut() else {
            return text;
        };
        if text.len() <= RESULT_LIMIT {
            return text;
        }
        let over = text.len() - RESULT_LIMIT + "...".len();
        let mut keep = detail.len().saturating_sub(over);
        while !detail.is_char_boundary(keep) {
            keep -= 1;
        }
        detail.truncate(keep);
        detail.push_str("...");
        if keep == 0 {
            document.result.detail = None;
        }
    }
}

/// Reads a termination message written by [`encode_result`].
pub fn decode_result(text: &str) -> Result<ExecutionResult, String> {
    let document: ResultDocument = serde_json::from_str(text.trim())
        .map_err(|error| format!("the Job's result is not readable: {error}"))?;
    if document.version != JOB_FORMAT_VERSION {
        return Err(format!(
            "the Job's result has version {}; this controller reads version {JOB_FORMAT_VERSION}",
            document.version
        ));
    }
    Ok(document.result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::PowerState;

    fn parameter(name: &str, value: ParameterValue, secret: Option<SecretRef>) -> Parameter {
        Parameter {
            name: name.to_string(),
            written: match &secret {
                Some(_) => format!("{name}_secret"),
                None => name.to_string(),
            },
            value,
            layer: Layer::Template,
            source: Source {
                config_map: "fence-method-template-ipmi".to_string(),
                key: "template.properties".to_string(),
            },
            secret,
        }
    }

    fn ipmi(password: Parameter) -> MethodPlan {
        MethodPlan {
            name: "ipmi-off".to_string(),
            source: Source {
                config_map: "fence-method-ipmi-off-worker-1".to_string(),
                key: "method.properties".to_string(),
            },
            template: Some("fence-method-template-ipmi".to_string()),
            agent: "fence_ipmilan".to_string(),
            action: FenceAction::Off,
            action_layer: Layer::Node,
            must_succeed: true,
            parameters: vec![
                parameter("ip", ParameterValue::Text("10.0.0.9".into()), None),
                password,
            ],
        }
    }

    fn from_secret() -> Parameter {
        parameter(
            "password",
            ParameterValue::Sensitive(SecretValue::new("hunter2")),
            Some(SecretRef {
                secret: "bmc".to_string(),
                key: "password".to_string(),
            }),
        )
    }

    fn document() -> JobExecution {
        JobExecution::new(
            "worker-1",
            &ipmi(from_secret()),
            ExecutionMode::Act,
            Duration::from_secs(60),
            Duration::from_secs(30),
        )
        .expect("a document")
    }

    #[test]
    fn a_credential_travels_as_a_secret_reference_never_as_its_value() {
        let text = serde_json::to_string(&document()).expect("serializes");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains(r#""secret":{"secret":"bmc","key":"password"}"#),
            "{text}"
        );
        assert!(text.contains(r#""value":"10.0.0.9""#), "{text}");
        assert_eq!(
            document().secrets(),
            BTreeMap::from([("bmc".to_string(), BTreeSet::from(["password".to_string()]))])
        );
    }

    #[test]
    fn a_credential_written_in_a_config_map_cannot_go_to_a_job() {
        let plain = parameter(
            "password",
            ParameterValue::Sensitive(SecretValue::new("hunter2")),
            None,
        );
        let error = JobExecution::new(
            "worker-1",
            &ipmi(plain),
            ExecutionMode::Act,
            Duration::from_secs(60),
            Duration::from_secs(30),
        )
        .expect_err("refused");
        let message = error.to_string();
        assert!(
            message.contains("node worker-1, method ipmi-off: password"),
            "{message}"
        );
        assert!(message.contains("fence-method-template-ipmi"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn the_wrapper_reads_the_credential_from_the_mounted_secret() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("bmc")).expect("secret dir");
        std::fs::write(dir.path().join("bmc/password"), "hunter2").expect("key file");
        let text = serde_json::to_string(&document()).expect("serializes");
        let plan = JobExecution::parse(&text)
            .expect("parses")
            .method_plan(dir.path())
            .expect("plan");
        let password = plan.parameter("password").expect("password");
        assert_eq!(password.value.expose(), "hunter2");
        assert!(password.value.is_sensitive());
        assert_eq!(plan.parameter("ip").expect("ip").value.expose(), "10.0.0.9");
        assert_eq!(plan.action, FenceAction::Off);
    }

    #[test]
    fn a_missing_secret_file_is_named_and_nothing_else_is_said() {
        let dir = tempfile::tempdir().expect("temp dir");
        let error = document().method_plan(dir.path()).expect_err("no file");
        let message = error.to_string();
        assert!(message.contains("password_secret"), "{message}");
        assert!(message.contains("bmc/password"), "{message}");
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let mut value = serde_json::to_value(document()).expect("value");
        value["version"] = 2.into();
        let error = JobExecution::parse(&value.to_string()).expect_err("refused");
        assert!(error.to_string().contains("version 2"), "{error}");
        assert!(matches!(
            JobExecution::parse("{\"version\": 1, \"node\": 3}"),
            Err(JobFormatError::Malformed(_))
        ));
    }

    #[test]
    fn nothing_starts_after_the_start_deadline() {
        let at: jiff::Timestamp = "2026-11-24T03:00:00Z".parse().expect("time");
        let document = document().starting_by(at);
        assert!(document.check_start(at).is_ok());
        let late = document
            .check_start(at + Duration::from_secs(1))
            .expect_err("too late");
        assert!(
            late.contains("had to start by 2026-11-24T03:00:00Z"),
            "{late}"
        );
        // off 60 s, then status until 30 s (the last one up to 60 s), metadata 60 s.
        assert_eq!(
            document.ends_by(),
            Some(at + Duration::from_secs(60 + 60 * 2 + 30 + 10))
        );
        let text = serde_json::to_string(&document).expect("serializes");
        assert_eq!(JobExecution::parse(&text).expect("parses"), document);
        let mut garbled = document;
        garbled.start_deadline = Some("soon".into());
        assert!(garbled.check_start(at).is_err());
        assert!(
            JobExecution::new(
                "n",
                &ipmi(from_secret()),
                ExecutionMode::Verify,
                Duration::from_secs(1),
                Duration::from_secs(1)
            )
            .expect("document")
            .check_start(at)
            .is_ok()
        );
    }

    #[test]
    fn the_budget_covers_every_call_a_reboot_makes() {
        let mut reboot = document();
        reboot.action = FenceAction::Reboot;
        // metadata 60 + 2 x (off 60 + status until 30 s, the last up to 60 s)
        assert_eq!(reboot.budget(), Duration::from_secs(60 + 2 * (60 * 2 + 30)));
        let mut verify = document();
        verify.mode = ExecutionMode::Verify;
        assert_eq!(verify.budget(), Duration::from_secs(120));
    }

    #[test]
    fn a_result_fits_the_termination_message_however_long_its_detail() {
        let long = ExecutionResult {
            succeeded: false,
            timed_out: true,
            off_confirmed: false,
            power: Some(PowerState::On),
            detail: Some("é".repeat(5000)),
        };
        let text = encode_result(&long);
        assert!(text.len() <= RESULT_LIMIT, "{}", text.len());
        let back = decode_result(&text).expect("decodes");
        assert!(back.timed_out);
        assert_eq!(back.power, Some(PowerState::On));
        assert!(back.detail.expect("detail").ends_with("..."));
        let short = ExecutionResult {
            detail: Some("status reports OFF".into()),
            ..long
        };
        assert_eq!(decode_result(&encode_result(&short)), Ok(short));
        assert!(decode_result("{\"version\": 7, \"succeeded\": true}").is_err());
        assert!(decode_result("Error: exec format error").is_err());
    }
}
