//! Node-level reclaim through the container runtime, as the kubelet's eviction manager
//! runs it before evicting for disk pressure: its container GC (dead containers, then
//! the sandboxes left empty) and its image GC (unused images), each where what it frees
//! lives ([`reclaim_functions`]). The decisions are [`super::gc`]'s; this is the I/O.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::client::{CriClient, CriError, socket_path};
use super::gc::{
    ContainerState, GONE_POD_MINIMUM_AGE, ImageRecords, PodsKnown, RuntimeContainer, RuntimeImage,
    RuntimeSandbox, containers_to_remove, images_to_remove, sandboxes_to_remove,
};
use super::wire;
use crate::config::{FilesystemLayout, NodeReclaimConfig};
use crate::eviction::{NodeReclaimer, ReclaimError, ReclaimFailure, reclaim_functions};
use crate::signals::Signal;

/// How often the images are looked at between reclaims, as the kubelet's image manager
/// does (every 5 minutes from its start), so that an image's age counts from when it was
/// first seen, not from the first disk pressure.
pub const IMAGE_DETECTION_PERIOD: Duration = Duration::from_secs(300);

/// What one reclaim removed (or, in a dry run, would have).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    pub containers: Vec<String>,
    pub sandboxes: Vec<String>,
    pub images: Vec<String>,
    pub image_bytes: u64,
}

impl Removed {
    pub fn describe(&self) -> String {
        format!(
            "{} containers, {} pod sandboxes, {} images ({} bytes)",
            self.containers.len(),
            self.sandboxes.len(),
            self.images.len(),
            self.image_bytes
        )
    }
}

#[derive(Debug, Clone)]
pub struct CriReclaimer {
    runtime_socket: PathBuf,
    image_socket: PathBuf,
    timeout: Duration,
    image_minimum_age: Duration,
    layout: FilesystemLayout,
    dry_run: bool,
    records: Arc<Mutex<ImageRecords>>,
    pods: PodsKnown,
    gone_pod_minimum_age: Duration,
    last: Removed,
}

impl CriReclaimer {
    /// A reclaimer for the configured endpoints (already checked when the config
    /// loaded). `layout` decides which functions each signal runs.
    pub fn new(
        config: &NodeReclaimConfig,
        layout: FilesystemLayout,
        dry_run: bool,
    ) -> Result<CriReclaimer, CriError> {
        Ok(CriReclaimer {
            runtime_socket: socket_path(&config.runtime_endpoint)?,
            image_socket: socket_path(&config.image_endpoint)?,
            timeout: config.timeout.to_std(),
            image_minimum_age: config.image_minimum_gc_age.to_std(),
            layout,
            dry_run,
            records: Arc::new(Mutex::new(ImageRecords::default())),
            pods: PodsKnown::Unknown,
            gone_pod_minimum_age: GONE_POD_MINIMUM_AGE,
            last: Removed::default(),
        })
    }

    /// What the node's pods are now, for the next reclaim: a pod no longer among them
    /// (and with no ready sandbox) loses all its dead containers.
    pub fn set_pods(&mut self, pods: PodsKnown) {
        self.pods = pods;
    }

    /// How long a pod's newest sandbox must exist before the pod may count as gone
    /// ([`GONE_POD_MINIMUM_AGE`] unless changed here).
    pub fn set_gone_pod_minimum_age(&mut self, age: Duration) {
        self.gone_pod_minimum_age = age;
    }

    /// What the last reclaim removed (or would have, in a dry run).
    pub fn last_removed(&self) -> &Removed {
        &self.last
    }

    /// Look at the images every [`IMAGE_DETECTION_PERIOD`], from now until `stop`, as
    /// the kubelet's image manager does; an unreachable runtime is logged once per
    /// failure streak and tried again next period.
    pub async fn track_images(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(IMAGE_DETECTION_PERIOD);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return,
                _ = ticker.tick() => {}
            }
            match self.detect_images().await {
                Ok(count) => {
                    failing = false;
                    tracing::debug!(images = count, "looked at the container runtime's images");
                }
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(%error, "cannot list the container runtime's images; images found later count as new");
                }
                Err(error) => tracing::debug!(%error, "still cannot list the images"),
            }
        }
    }

    async fn detect_images(&self) -> Result<usize, CriError> {
        let look = self.look_at_images().await?;
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records.detect(&look.images, &look.containers, Instant::now());
        Ok(records.len())
    }

    /// The images and every container (which say which images are in use), with the
    /// connections they came on.
    async fn look_at_images(&self) -> Result<ImageLook, CriError> {
        let mut image_service = CriClient::connect(&self.image_socket, self.timeout).await?;
        let mut runtime = CriClient::connect(&self.runtime_socket, self.timeout).await?;
        let images = list_images(&mut image_service).await?;
        let containers = list_containers(&mut runtime).await?;
        Ok(ImageLook {
            image_service,
            runtime,
            images,
            containers,
        })
    }

    async fn collect_containers(&self, removed: &mut Removed) -> Result<(), Vec<ReclaimFailure>> {
        let mut runtime = CriClient::connect(&self.runtime_socket, self.timeout)
            .await
            .map_err(one)?;
        let mut containers = list_containers(&mut runtime).await.map_err(one)?;
        let sandboxes = list_sandboxes(&mut runtime).await.map_err(one)?;
        fill_pod_uids(&mut containers, &sandboxes);
        let pods = self.pods.clone().with_recent_pods(
            &sandboxes,
            unix_nanos_now(),
            self.gone_pod_minimum_age,
        );
        let mut failures = Vec::new();
        let doomed = containers_to_remove(&containers, &sandboxes, &pods);
        for container in &doomed {
            if !self.dry_run {
                let request = wire::RemoveContainerRequest {
                    container_id: container.id.clone(),
                };
                if let Err(error) = remove(&mut runtime, wire::REMOVE_CONTAINER, &request).await {
                    failures.push(ReclaimFailure::Runtime(format!(
                        "container {} of pod {}: {error}",
                        container.id, container.pod_uid
                    )));
                    continue;
                }
            }
            removed.containers.push(container.id.clone());
        }
        // The sandboxes left empty, from a fresh list as the kubelet takes one; in a
        // dry run, from the lists as if the containers were gone.
        let (containers, sandboxes) = if self.dry_run {
            let gone: BTreeSet<&str> = doomed.iter().map(|c| c.id.as_str()).collect();
            let left: Vec<RuntimeContainer> = containers
                .iter()
                .filter(|c| !gone.contains(c.id.as_str()))
                .cloned()
                .collect();
            (left, sandboxes)
        } else {
            let mut containers = list_containers(&mut runtime).await.map_err(one)?;
            let sandboxes = list_sandboxes(&mut runtime).await.map_err(one)?;
            fill_pod_uids(&mut containers, &sandboxes);
            (containers, sandboxes)
        };
        for sandbox in sandboxes_to_remove(&containers, &sandboxes, &pods) {
            if !self.dry_run {
                // Stopped first, as the kubelet's `removeSandbox` does (the network is
                // torn down, the address freed); a sandbox that will not stop stays.
                let request = wire::RemovePodSandboxRequest {
                    pod_sandbox_id: sandbox.id.clone(),
                };
                let stopped = remove(&mut runtime, wire::STOP_POD_SANDBOX, &request).await;
                let result = match stopped {
                    Ok(()) => remove(&mut runtime, wire::REMOVE_POD_SANDBOX, &request).await,
                    Err(error) => Err(error),
                };
                if let Err(error) = result {
                    failures.push(ReclaimFailure::Runtime(format!(
                        "pod sandbox {} of pod {}: {error}",
                        sandbox.id, sandbox.pod_uid
                    )));
                    continue;
                }
            }
            removed.sandboxes.push(sandbox.id.clone());
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }

    async fn collect_images(&self, removed: &mut Removed) -> Result<(), Vec<ReclaimFailure>> {
        let ImageLook {
            image_service: mut images,
            mut runtime,
            images: listed,
            containers,
        } = self.look_at_images().await.map_err(one)?;
        let protected = sandbox_images(&mut runtime).await;
        let now = Instant::now();
        let doomed: Vec<RuntimeImage> = {
            let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
            records.detect(&listed, &containers, now);
            images_to_remove(
                &listed,
                &containers,
                &records,
                &protected,
                self.image_minimum_age,
                now,
            )
            .into_iter()
            .cloned()
            .collect()
        };
        let mut failures = Vec::new();
        for image in doomed {
            if !self.dry_run {
                let request = wire::RemoveImageRequest {
                    image: Some(wire::ImageSpec {
                        image: image.id.clone(),
                        ..Default::default()
                    }),
                };
                if let Err(error) = remove(&mut images, wire::REMOVE_IMAGE, &request).await {
                    failures.push(ReclaimFailure::Runtime(format!(
                        "image {}: {error}",
                        image.id
                    )));
                    continue;
                }
                self.records
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .forget(&image.id);
            }
            removed.image_bytes = removed.image_bytes.saturating_add(image.size);
            removed.images.push(image.id);
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }
}

/// Now on the runtime's clock (`created_at` is nanoseconds since the epoch).
pub fn unix_nanos_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A container without the kubelet's pod label belongs to its sandbox's pod.
fn fill_pod_uids(containers: &mut [RuntimeContainer], sandboxes: &[RuntimeSandbox]) {
    for container in containers.iter_mut().filter(|c| c.pod_uid.is_empty()) {
        if let Some(sandbox) = sandboxes.iter().find(|s| s.id == container.sandbox_id) {
            container.pod_uid = sandbox.pod_uid.clone();
        }
    }
}

struct ImageLook {
    image_service: CriClient,
    runtime: CriClient,
    images: Vec<RuntimeImage>,
    containers: Vec<RuntimeContainer>,
}

fn one(error: CriError) -> Vec<ReclaimFailure> {
    vec![ReclaimFailure::Runtime(error.to_string())]
}

impl NodeReclaimer for CriReclaimer {
    /// The container GC, then the image GC, as the kubelet orders them; a failing part
    /// does not stop the next, and every failure is reported together.
    async fn reclaim(&mut self, signal: Signal) -> Result<(), ReclaimError> {
        let functions = reclaim_functions(signal, self.layout);
        let mut removed = Removed::default();
        let mut failures = Vec::new();
        let budget = self.timeout;
        let work = async {
            if functions.containers
                && let Err(mut failed) = self.collect_containers(&mut removed).await
            {
                failures.append(&mut failed);
            }
            if functions.images
                && let Err(mut failed) = self.collect_images(&mut removed).await
            {
                failures.append(&mut failed);
            }
        };
        if tokio::time::timeout(budget, work).await.is_err() {
            failures.push(ReclaimFailure::Runtime(format!(
                "the reclaim did not finish within {budget:?} (nodeReclaim.timeout)"
            )));
        }
        if self.dry_run {
            tracing::warn!(%signal, "dry run: node-level reclaim would remove {}", removed.describe());
        } else {
            tracing::info!(%signal, "node-level reclaim removed {}", removed.describe());
        }
        self.last = removed;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ReclaimError { signal, failures })
        }
    }
}

/// A removal (or a stop); one already gone (NOT_FOUND) is done.
async fn remove<Request: prost::Message>(
    client: &mut CriClient,
    method: &'static str,
    request: &Request,
) -> Result<(), CriError> {
    match client.call::<_, wire::Empty>(method, request).await {
        Err(error) if error.is_not_found() => Ok(()),
        other => other.map(|_| ()),
    }
}

async fn list_images(client: &mut CriClient) -> Result<Vec<RuntimeImage>, CriError> {
    let answer: wire::ListImagesResponse = client
        .call(wire::LIST_IMAGES, &wire::ListImagesRequest::default())
        .await?;
    Ok(answer
        .images
        .into_iter()
        .filter(|image| !image.id.is_empty())
        .map(|image| RuntimeImage {
            id: image.id,
            tags: image.repo_tags,
            digests: image.repo_digests,
            size: image.size,
            pinned: image.pinned,
        })
        .collect())
}

async fn list_containers(client: &mut CriClient) -> Result<Vec<RuntimeContainer>, CriError> {
    let answer: wire::ListContainersResponse = client
        .call(
            wire::LIST_CONTAINERS,
            &wire::ListContainersRequest::default(),
        )
        .await?;
    Ok(answer
        .containers
        .into_iter()
        .map(runtime_container)
        .collect())
}

fn runtime_container(container: wire::Container) -> RuntimeContainer {
    let state = match container.state {
        wire::container_state::CREATED => ContainerState::Created,
        wire::container_state::RUNNING => ContainerState::Running,
        wire::container_state::EXITED => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    let mut image_refs = vec![container.image_ref, container.image_id];
    if let Some(spec) = container.image {
        image_refs.push(spec.image);
    }
    image_refs.retain(|r| !r.is_empty());
    RuntimeContainer {
        pod_uid: container
            .labels
            .get(wire::POD_UID_LABEL)
            .cloned()
            .unwrap_or_default(),
        name: container.metadata.map(|m| m.name).unwrap_or_default(),
        id: container.id,
        sandbox_id: container.pod_sandbox_id,
        state,
        created_at: container.created_at,
        image_refs,
    }
}

async fn list_sandboxes(client: &mut CriClient) -> Result<Vec<RuntimeSandbox>, CriError> {
    let answer: wire::ListPodSandboxResponse = client
        .call(
            wire::LIST_POD_SANDBOX,
            &wire::ListPodSandboxRequest::default(),
        )
        .await?;
    Ok(answer
        .items
        .into_iter()
        .map(|sandbox| RuntimeSandbox {
            pod_uid: sandbox.metadata.map(|m| m.uid).unwrap_or_default(),
            ready: sandbox.state == wire::sandbox_state::READY,
            id: sandbox.id,
            created_at: sandbox.created_at,
        })
        .collect())
}

/// The sandbox image the runtime starts every pod from, from its verbose status
/// (containerd's `config.sandboxImage`); none when the runtime does not say. Kept by the
/// image GC: a node that lost it cannot start a pod until it pulls it again.
async fn sandbox_images(client: &mut CriClient) -> BTreeSet<String> {
    let answer: Result<wire::StatusResponse, _> = client
        .call(wire::STATUS, &wire::StatusRequest { verbose: true })
        .await;
    let mut names = BTreeSet::new();
    if let Some(image) = answer
        .ok()
        .and_then(|answer| answer.info.get("config").cloned())
        .and_then(|config| serde_json::from_str::<serde_json::Value>(&config).ok())
        .and_then(|config| config.get("sandboxImage")?.as_str().map(str::to_string))
    {
        names.insert(normalized_image_name(&image));
        names.insert(image);
    }
    names
}

/// An image reference as the runtime lists its tags: a name without a registry is
/// Docker Hub's (`pause:3.9` is `docker.io/library/pause:3.9`), one without a tag or
/// digest is `:latest`.
pub fn normalized_image_name(name: &str) -> String {
    let (first, _) = name.split_once('/').unwrap_or(("", name));
    let has_registry = first.contains('.') || first.contains(':') || first == "localhost";
    let mut full = match (name.contains('/'), has_registry) {
        (_, true) => name.to_string(),
        (true, false) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    let last = full.rsplit('/').next().unwrap_or_default();
    if !last.contains(':') && !last.contains('@') {
        full.push_str(":latest");
    }
    full
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_normalized_as_the_runtime_lists_tags() {
        for (name, full) in [
            ("pause:3.9", "docker.io/library/pause:3.9"),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
            ("example/pause", "docker.io/example/pause:latest"),
            ("localhost:5000/pause", "localhost:5000/pause:latest"),
            ("localhost/pause@sha256:ab", "localhost/pause@sha256:ab"),
        ] {
            assert_eq!(normalized_image_name(name), full, "{name}");
        }
    }
}
