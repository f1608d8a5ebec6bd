//! A stand-in for the Job controller and a kubelet, which the test API server does not
//! have (and nothing installable here provides): it runs the Jobs of one namespace the
//! way a cluster would, through the API like the real ones.
//!
//! For each new Job it sets the Job's `startTime`, creates its pod (the template's
//! labels and annotations, the `job-name` labels, an owner reference, bound to
//! `node`), writes each Secret volume's items under the volume's `mountPath`, runs the
//! container's `command` and `args` as a process on this host, and when it exits
//! records what a kubelet records: the pod's phase and the container's termination
//! state with the file at `terminationMessagePath` as its message (4096 bytes at most);
//! then the Job's `Complete` or `Failed` condition. `activeDeadlineSeconds` is enforced
//! (the process is killed, the Job fails with `DeadlineExceeded`), and a deleted Job's
//! process is killed. The image is not used: `command[0]` must be a program on this
//! host. There are no container roots, so every `mountPath` and `terminationMessagePath`
//! must lie inside the runner's sandbox directory (a pod that asks for anything else
//! fails), and two pods using the same termination message file run one after the
//! other.
//!
//! `hold` keeps the pods of matching Jobs Pending (unscheduled) until `release`, for
//! tests that act while a Job exists but has not run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// One pod the runner ran (or is running).
#[derive(Debug, Clone)]
pub struct PodRun {
    pub job: String,
    pub pod: String,
    /// The container's standard output and error.
    pub output: String,
    pub exit_code: Option<i32>,
    pub message: String,
    /// The pod's spec as the Job controller made it.
    pub spec: serde_json::Value,
}

#[derive(Default)]
struct Shared {
    /// Pods of Jobs with an annotation value containing this stay Pending.
    held: Option<String>,
    runs: Vec<PodRun>,
    /// Problems with a Job that a real cluster would have refused or failed.
    problems: Vec<String>,
}

struct Running {
    child: Child,
    output: PathBuf,
    message_path: PathBuf,
}

struct Tracked {
    pod: String,
    /// The node the Job fences (its `fencing.nodekeeper.io/node` annotation).
    node: Option<String>,
    spec: serde_json::Value,
    started: Option<Timestamp>,
    running: Option<Running>,
    done: bool,
}

pub struct JobRunner {
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
    /// PIDs of the processes the runner started and has not reaped, to kill on drop.
    pids: Arc<Mutex<Vec<u32>>>,
}

impl JobRunner {
    /// Runs the Jobs of `namespace` on (a pretend) `node`, with `sandbox` as the only
    /// place volumes and termination messages may be.
    pub fn start(client: kube::Client, namespace: &str, node: &str, sandbox: &Path) -> JobRunner {
        std::fs::create_dir_all(sandbox).expect("job runner sandbox");
        let shared = Arc::new(Mutex::new(Shared::default()));
        let pids = Arc::new(Mutex::new(Vec::new()));
        let mut state = Loop {
            jobs: Api::namespaced(client.clone(), namespace),
            pods: Api::namespaced(client.clone(), namespace),
            secrets: Api::namespaced(client, namespace),
            node: node.to_string(),
            sandbox: sandbox.to_path_buf(),
            shared: shared.clone(),
            pids: pids.clone(),
            tracked: HashMap::new(),
        };
        let task = tokio::spawn(async move {
            loop {
                state.tick().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        JobRunner { shared, task, pids }
    }

    /// The pods of Jobs with an annotation value containing `needle` stay Pending until
    /// [`release`](Self::release).
    pub fn hold(&self, needle: &str) {
        self.shared.lock().expect("runner state").held = Some(needle.to_string());
    }

    pub fn release(&self) {
        self.shared.lock().expect("runner state").held = None;
    }

    /// Every pod run so far.
    pub fn runs(&self) -> Vec<PodRun> {
        self.shared.lock().expect("runner state").runs.clone()
    }

    /// What a real cluster would have refused or failed.
    pub fn problems(&self) -> Vec<String> {
        self.shared.lock().expect("runner state").problems.clone()
    }
}

impl Drop for JobRunner {
    fn drop(&mut self) {
        self.task.abort();
        for pid in self.pids.lock().map(|p| p.clone()).unwrap_or_default() {
            // Only processes this runner started and has not reaped.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
    }
}

struct Loop {
    jobs: Api<Job>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    node: String,
    sandbox: PathBuf,
    shared: Arc<Mutex<Shared>>,
    pids: Arc<Mutex<Vec<u32>>>,
    tracked: HashMap<String, Tracked>,
}

impl Loop {
    fn problem(&self, text: String) {
        self.shared
            .lock()
            .expect("runner state")
            .problems
            .push(text);
    }

    fn held(&self, job: &Job) -> bool {
        let Some(needle) = self.shared.lock().expect("runner state").held.clone() else {
            return false;
        };
        job.annotations()
            .values()
            .any(|value| value.contains(&needle))
    }

    fn inside_sandbox(&self, path: &Path) -> bool {
        path.is_absolute()
            && path.starts_with(&self.sandbox)
            && !path
                .components()
                .any(|c| c == std::path::Component::ParentDir)
    }

    async fn tick(&mut self) {
        let Ok(jobs) = self.jobs.list(&ListParams::default()).await else {
            return;
        };
        let names: Vec<String> = jobs.items.iter().map(|job| job.name_any()).collect();
        // A deleted Job's process dies with it.
        let gone: Vec<String> = self
            .tracked
            .keys()
            .filter(|name| !names.contains(name))
            .cloned()
            .collect();
        for name in gone {
            if let Some(mut tracked) = self.tracked.remove(&name)
                && let Some(running) = tracked.running.as_mut()
            {
                let _ = running.child.kill();
                let _ = running.child.wait();
                self.forget_pid(running.child.id());
            }
        }
        for job in jobs.items {
            self.step(job).await;
        }
    }

    fn forget_pid(&self, pid: u32) {
        if let Ok(mut pids) = self.pids.lock() {
            pids.retain(|p| *p != pid);
        }
    }

    async fn step(&mut self, job: Job) {
        let name = job.name_any();
        if !self.tracked.contains_key(&name) {
            if job
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .is_some()
            {
                // Started by an earlier runner; not ours to run.
                return;
            }
            self.admit(&job).await;
            return;
        }
        let now = Timestamp::now();
        let deadline = job
            .spec
            .as_ref()
            .and_then(|spec| spec.active_deadline_seconds)
            .zip(job.status.as_ref().and_then(|s| s.start_time.as_ref()))
            .map(|(seconds, start)| start.0 + Duration::from_secs(seconds as u64));
        let Some(tracked) = self.tracked.get(&name) else {
            return;
        };
        if tracked.done {
            return;
        }
        if deadline.is_some_and(|deadline| now > deadline) {
            return self.fail_deadline(&name).await;
        }
        if tracked.running.is_none() {
            if !self.held(&job) && !self.message_file_busy(&name) {
                self.run(&name).await;
            }
            return;
        }
        self.collect(&name).await;
    }

    /// The Job controller's part: the start time and the pod.
    async fn admit(&mut self, job: &Job) {
        let name = job.name_any();
        // The fence controller runs one execution at a time per node: a Job for a node
        // whose previous Job has not ended is a bug it must never show.
        let fenced_node = job.annotations().get("fencing.nodekeeper.io/node").cloned();
        if let Some(node) = &fenced_node {
            for (other, tracked) in &self.tracked {
                if !tracked.done && tracked.node.as_ref() == Some(node) {
                    self.problem(format!(
                        "Job {name} for node {node} was created while Job {other} for the same node had not ended"
                    ));
                }
            }
        }
        let Some(template) = job.spec.as_ref().map(|spec| spec.template.clone()) else {
            return;
        };
        let meta = template.metadata.unwrap_or_default();
        let mut labels = meta.labels.unwrap_or_default();
        labels.insert("batch.kubernetes.io/job-name".into(), name.clone());
        labels.insert("job-name".into(), name.clone());
        let suffix: String = format!("{:x}", Timestamp::now().as_nanosecond())
            .chars()
            .rev()
            .take(5)
            .collect();
        let pod_name = format!("{name}-{suffix}");
        let mut spec = serde_json::to_value(template.spec.unwrap_or_default()).expect("pod spec");
        spec["nodeName"] = json!(self.node);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": pod_name,
                "labels": labels,
                "annotations": meta.annotations.unwrap_or_default(),
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": name,
                    "uid": job.uid().unwrap_or_default(),
                    "controller": true, "blockOwnerDeletion": true
                }]
            },
            "spec": spec.clone(),
        }))
        .expect("pod");
        let _ = self
            .jobs
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"startTime": Timestamp::now().to_string(), "active": 1}}),
                ),
            )
            .await;
        if let Err(error) = self.pods.create(&PostParams::default(), &pod).await {
            self.problem(format!("creating pod {pod_name}: {error}"));
            return;
        }
        self.tracked.insert(
            name,
            Tracked {
                pod: pod_name,
                node: fenced_node,
                spec,
                started: None,
                running: None,
                done: false,
            },
        );
    }

    /// Whether another running pod writes the same termination message file.
    fn message_file_busy(&self, name: &str) -> bool {
        let Some(path) = self.tracked.get(name).and_then(|t| message_path(&t.spec)) else {
            return false;
        };
        self.tracked.iter().any(|(other, tracked)| {
            other != name
                && !tracked.done
                && tracked
                    .running
                    .as_ref()
                    .is_some_and(|running| running.message_path == path)
        })
    }

    /// The kubelet's part: volumes, then the container's process.
    async fn run(&mut self, name: &str) {
        let Some(tracked) = self.tracked.get(name) else {
            return;
        };
        let spec = tracked.spec.clone();
        let pod_name = tracked.pod.clone();
        let container = &spec["containers"][0];
        let Some(message) = message_path(&spec) else {
            return self
                .fail_pod(name, "the container has no terminationMessagePath")
                .await;
        };
        if !self.inside_sandbox(&message) {
            return self
                .fail_pod(
                    name,
                    &format!(
                        "terminationMessagePath {} is outside the sandbox",
                        message.display()
                    ),
                )
                .await;
        }
        let _ = std::fs::remove_file(&message);
        // Secret volumes, each item a file under its mount path.
        let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
        for mount in container["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let mount_path = PathBuf::from(mount["mountPath"].as_str().unwrap_or(""));
            if !self.inside_sandbox(&mount_path) {
                return self
                    .fail_pod(
                        name,
                        &format!("mountPath {} is outside the sandbox", mount_path.display()),
                    )
                    .await;
            }
            let Some(volume) = volumes.iter().find(|v| v["name"] == mount["name"]) else {
                return self.fail_pod(name, "a volumeMount names no volume").await;
            };
            let secret_name = volume["secret"]["secretName"].as_str().unwrap_or("");
            let secret = match self.secrets.get(secret_name).await {
                Ok(secret) => secret,
                Err(error) => {
                    return self
                        .fail_pod(name, &format!("secret volume {secret_name}: {error}"))
                        .await;
                }
            };
            let data = secret.data.unwrap_or_default();
            std::fs::create_dir_all(&mount_path).expect("mount path");
            for item in volume["secret"]["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let key = item["key"].as_str().unwrap_or("");
                let Some(value) = data.get(key) else {
                    return self
                        .fail_pod(name, &format!("secret {secret_name} has no key {key}"))
                        .await;
                };
                let file = mount_path.join(item["path"].as_str().unwrap_or(key));
                std::fs::write(&file, &value.0).expect("secret file");
                let mode = volume["secret"]["defaultMode"].as_u64().unwrap_or(0o644) as u32;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
                    .expect("mode");
            }
        }
        let strings = |value: &serde_json::Value| -> Vec<String> {
            value
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|i| i.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let command = strings(&container["command"]);
        let args = strings(&container["args"]);
        let Some(program) = command.first() else {
            return self.fail_pod(name, "the container has no command").await;
        };
        let output = self.sandbox.join(format!("{pod_name}.log"));
        let log = std::fs::File::create(&output).expect("pod log");
        let mut process = Command::new(program);
        process
            .args(&command[1..])
            .args(&args)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        for variable in container["env"].as_array().cloned().unwrap_or_default() {
            if let (Some(key), Some(value)) =
                (variable["name"].as_str(), variable["value"].as_str())
            {
                process.env(key, value);
            }
        }
        let child = match process.spawn() {
            Ok(child) => child,
            Err(error) => {
                return self
                    .fail_pod(name, &format!("starting {program}: {error}"))
                    .await;
            }
        };
        self.pids.lock().expect("pids").push(child.id());
        let now = Timestamp::now();
        let _ = self
            .pods
            .patch_status(
                &pod_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running", "startTime": now.to_string(),
                    "containerStatuses": [container_status(container, json!({"running": {"startedAt": now.to_string()}}))]}})),
            )
            .await;
        if let Some(tracked) = self.tracked.get_mut(name) {
            tracked.started = Some(now);
            tracked.running = Some(Running {
                child,
                output,
                message_path: message,
            });
        }
    }

    /// A container that exited: the pod's and then the Job's final status.
    async fn collect(&mut self, name: &str) {
        let Some(tracked) = self.tracked.get_mut(name) else {
            return;
        };
        let Some(running) = tracked.running.as_mut() else {
            return;
        };
        let Ok(Some(status)) = running.child.try_wait() else {
            return;
        };
        let pid = running.child.id();
        let code = status.code().unwrap_or(128 + 9);
        let mut message = std::fs::read_to_string(&running.message_path).unwrap_or_default();
        message.truncate(4096);
        let output = std::fs::read_to_string(&running.output).unwrap_or_default();
        tracked.done = true;
        let pod = tracked.pod.clone();
        let spec = tracked.spec.clone();
        self.forget_pid(pid);
        self.finish(name, &pod, &spec, Some(code), &message, &output, None)
            .await;
    }

    async fn fail_deadline(&mut self, name: &str) {
        let Some(tracked) = self.tracked.get_mut(name) else {
            return;
        };
        let mut output = String::new();
        if let Some(running) = tracked.running.as_mut() {
            let _ = running.child.kill();
            let _ = running.child.wait();
            output = std::fs::read_to_string(&running.output).unwrap_or_default();
            let pid = running.child.id();
            tracked.done = true;
            let (pod, spec) = (tracked.pod.clone(), tracked.spec.clone());
            self.forget_pid(pid);
            return self
                .finish(
                    name,
                    &pod,
                    &spec,
                    Some(137),
                    "",
                    &output,
                    Some("DeadlineExceeded"),
                )
                .await;
        }
        tracked.done = true;
        let (pod, spec) = (tracked.pod.clone(), tracked.spec.clone());
        self.finish(
            name,
            &pod,
            &spec,
            None,
            "",
            &output,
            Some("DeadlineExceeded"),
        )
        .await;
    }

    async fn fail_pod(&mut self, name: &str, why: &str) {
        self.problem(format!("Job {name}: {why}"));
        let Some(tracked) = self.tracked.get_mut(name) else {
            return;
        };
        tracked.done = true;
        let (pod, spec) = (tracked.pod.clone(), tracked.spec.clone());
        self.finish(name, &pod, &spec, Some(128), why, "", None)
            .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &mut self,
        job: &str,
        pod: &str,
        spec: &serde_json::Value,
        code: Option<i32>,
        message: &str,
        output: &str,
        job_failure: Option<&str>,
    ) {
        let now = Timestamp::now().to_string();
        let succeeded = code == Some(0) && job_failure.is_none();
        let container = &spec["containers"][0];
        let state = match code {
            Some(code) => json!({"terminated": {
                "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                "message": message, "finishedAt": now}}),
            None => json!({"waiting": {"reason": "ContainerCreating"}}),
        };
        let _ = self
            .pods
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": if succeeded { "Succeeded" } else { "Failed" },
                    "containerStatuses": [container_status(container, state)]}})),
            )
            .await;
        if let Some(reason) = job_failure {
            // Kubernetes 1.31+: the Job controller marks the failure as its target first
            // and adds Failed once the pod has stopped.
            let target = json!({"status": {"conditions": [{
                "type": "FailureTarget", "status": "True", "reason": reason,
                "lastTransitionTime": now, "lastProbeTime": now}]}});
            let _ = self
                .jobs
                .patch_status(job, &PatchParams::default(), &Patch::Merge(target))
                .await;
        }
        let (condition, reason) = match job_failure {
            Some(reason) => ("Failed", reason),
            None if succeeded => ("Complete", "CompletionsReached"),
            None => ("Failed", "BackoffLimitExceeded"),
        };
        let mut status = json!({"active": 0, "conditions": [{
            "type": condition, "status": "True", "reason": reason,
            "lastTransitionTime": now, "lastProbeTime": now}]});
        if succeeded {
            status["succeeded"] = json!(1);
            status["completionTime"] = json!(now);
        } else {
            status["failed"] = json!(1);
        }
        // Recorded before the Job says it finished: a test that sees the controller act
        // on the finished Job then finds the run here.
        self.shared.lock().expect("runner state").runs.push(PodRun {
            job: job.to_string(),
            pod: pod.to_string(),
            output: output.to_string(),
            exit_code: code,
            message: message.to_string(),
            spec: spec.clone(),
        });
        let _ = self
            .jobs
            .patch_status(
                job,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await;
    }
}

fn message_path(spec: &serde_json::Value) -> Option<PathBuf> {
    spec["containers"][0]["terminationMessagePath"]
        .as_str()
        .map(PathBuf::from)
}

fn container_status(container: &serde_json::Value, state: serde_json::Value) -> serde_json::Value {
    json!({
        "name": container["name"], "image": container["image"], "imageID": "",
        "ready": false, "restartCount": 0, "state": state
    })
}
