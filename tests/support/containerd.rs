//! A real containerd (Debian's, unpacked by `scripts/test` into
//! `NODEKEEPER_CONTAINERD_ROOT`, default `/var/cache/nodekeeper-test/containerd`) with its
//! CRI plugin, run by the test as root in a directory of its own: its own socket, root
//! and state directories, no CNI (pods use the host network), runc containers in a
//! cgroup parent the test owns. Images are built here from Debian's static busybox and
//! imported with `ctr`; nothing is pulled.
//!
//! Dropping it kills what it started, by PID: the container processes (every process in
//! its cgroup parent), the runc shims it spawned, then containerd; unmounts what is
//! still mounted under its directory and removes its cgroups.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodekeeper::cri::CriClient;
use nodekeeper::cri::wire;

pub const ROOT_ENV: &str = "NODEKEEPER_CONTAINERD_ROOT";
const DEFAULT_ROOT: &str = "/var/cache/nodekeeper-test/containerd";
/// The image every sandbox starts from (containerd's `sandbox_image`).
pub const SANDBOX_IMAGE: &str = "nodekeeper.test/pause:1";

pub struct Containerd {
    dir: PathBuf,
    root: PathBuf,
    socket: PathBuf,
    process: Child,
    /// The cgroup parent, relative to each hierarchy root, holding every container.
    pub cgroup_parent: String,
}

fn program(root: &Path, relative: &str) -> Result<PathBuf, String> {
    let path = root.join(relative);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing (scripts/test unpacks Debian's containerd, runc and busybox-static into {}; set {ROOT_ENV} to use another place)",
            path.display(),
            root.display()
        ))
    }
}

impl Containerd {
    /// Start containerd in `dir` (which the test owns). `Err` says why it cannot run.
    pub fn start(dir: &Path) -> Result<Containerd, String> {
        Containerd::start_storing_in(dir, None)
    }

    /// [`Containerd::start`] with its images and snapshots (its root directory) in
    /// `store`, a filesystem the test measures.
    pub fn start_storing_in(dir: &Path, store: Option<&Path>) -> Result<Containerd, String> {
        super::real::root()?;
        let root =
            PathBuf::from(std::env::var(ROOT_ENV).unwrap_or_else(|_| DEFAULT_ROOT.to_string()));
        let containerd = program(&root, "usr/bin/containerd")?;
        program(&root, "usr/bin/containerd-shim-runc-v2")?;
        let runc = program(&root, "usr/sbin/runc")?;
        program(&root, "bin/busybox")?;
        let dir = dir.join("containerd");
        for sub in ["root", "state", "cni-bin", "cni-conf"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let socket = dir.join("containerd.sock");
        let store = store.map_or_else(|| dir.join("root"), Path::to_path_buf);
        let cgroup_parent = format!("nodekeeper-cri-test-{}", std::process::id());
        let config = format!(
            r#"version = 2
root = "{store}"
state = "{dir}/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # The sandbox's -998 needs CAP_SYS_RESOURCE, which this machine may not grant.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{dir}/cni-bin"
    conf_dir = "{dir}/cni-conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
"#,
            dir = dir.display(),
            socket = socket.display(),
            store = store.display(),
            runc = runc.display(),
        );
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("containerd.log")).map_err(|e| e.to_string())?;
        let path = format!(
            "{}:{}:{}",
            root.join("usr/bin").display(),
            root.join("usr/sbin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let process = Command::new(&containerd)
            .arg("--config")
            .arg(&config_path)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", containerd.display()))?;
        let mut started = Containerd {
            dir,
            root,
            socket,
            process,
            cgroup_parent,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !started.socket.exists() {
            if let Ok(Some(status)) = started.process.try_wait() {
                return Err(format!(
                    "containerd exited with {status}: {}",
                    started.log()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "containerd made no socket in 30 s: {}",
                    started.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(started)
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// Build an image from busybox whose command is `command` (a different command is a
    /// different image), tagged `name`, and import it into the CRI's namespace.
    pub fn import_image(&self, name: &str, command: &[&str]) {
        self.import_image_with_ballast(name, command, 0);
    }

    /// [`Containerd::import_image`] with a file of `ballast` bytes in the image, so that
    /// removing it frees that much twice over (the layer and its unpacked snapshot).
    pub fn import_image_with_ballast(&self, name: &str, command: &[&str], ballast: usize) {
        let work = self
            .dir
            .join(format!("image-{}", name.replace(['/', ':'], "_")));
        let rootfs = work.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy(self.root.join("bin/busybox"), rootfs.join("bin/busybox")).unwrap();
        for applet in ["sh", "sleep", "true"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        if ballast > 0 {
            std::fs::write(rootfs.join("ballast"), vec![0x5a_u8; ballast]).unwrap();
        }
        run(Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(work.join("layer.tar"))
            .arg("."));
        let layer = std::fs::read(work.join("layer.tar")).unwrap();
        let diff_id = sha256_hex(&layer);
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": command},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        });
        std::fs::write(work.join("config.json"), config.to_string()).unwrap();
        let manifest = serde_json::json!([{
            "Config": "config.json",
            "RepoTags": [name],
            "Layers": ["layer.tar"],
        }]);
        std::fs::write(work.join("manifest.json"), manifest.to_string()).unwrap();
        let archive = work.join("image.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(&work)
            .arg("-cf")
            .arg(&archive)
            .args(["manifest.json", "config.json", "layer.tar"]));
        run(Command::new(self.root.join("usr/bin/ctr"))
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(&archive));
    }

    /// A CRI client for the test's own calls.
    pub async fn client(&self) -> CriClient {
        CriClient::connect(&self.socket, Duration::from_secs(30))
            .await
            .expect("connect to containerd")
    }

    /// A pod sandbox on the host network, in the test's cgroup parent.
    pub async fn run_sandbox(&self, client: &mut CriClient, name: &str, uid: &str) -> String {
        let answer: RunPodSandboxResponse = client
            .call(
                "/runtime.v1.RuntimeService/RunPodSandbox",
                &RunPodSandboxRequest {
                    config: Some(self.sandbox_config(name, uid)),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", self.log()));
        answer.pod_sandbox_id
    }

    fn sandbox_config(&self, name: &str, uid: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(wire::PodSandboxMetadata {
                name: name.to_string(),
                uid: uid.to_string(),
                namespace: "default".to_string(),
                attempt: 0,
            }),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/{}/{uid}", self.cgroup_parent),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NAMESPACE_NODE,
                    }),
                }),
            }),
        }
    }

    /// A container of `image` in the sandbox, labelled as the kubelet labels them,
    /// started and waited for until it has exited. Returns its ID.
    pub async fn run_to_exit(
        &self,
        client: &mut CriClient,
        sandbox: &str,
        pod: (&str, &str),
        name: &str,
        attempt: u32,
        image: &str,
    ) -> String {
        let (pod_name, uid) = pod;
        let created: CreateContainerResponse = client
            .call(
                "/runtime.v1.RuntimeService/CreateContainer",
                &CreateContainerRequest {
                    pod_sandbox_id: sandbox.to_string(),
                    config: Some(ContainerConfig {
                        metadata: Some(wire::ContainerMetadata {
                            name: name.to_string(),
                            attempt,
                        }),
                        image: Some(wire::ImageSpec {
                            image: image.to_string(),
                            ..Default::default()
                        }),
                        command: vec!["/bin/true".to_string()],
                        labels: HashMap::from([
                            (wire::POD_UID_LABEL.to_string(), uid.to_string()),
                            ("io.kubernetes.container.name".to_string(), name.to_string()),
                        ]),
                    }),
                    sandbox_config: Some(self.sandbox_config(pod_name, uid)),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", self.log()));
        let id = created.container_id;
        let _: wire::Empty = client
            .call(
                "/runtime.v1.RuntimeService/StartContainer",
                &IdRequest { id: id.clone() },
            )
            .await
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", self.log()));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let state = list_containers(client)
                .await
                .into_iter()
                .find(|c| c.id == id)
                .map(|c| c.state);
            if state == Some(wire::container_state::EXITED) {
                return id;
            }
            assert!(
                Instant::now() < deadline,
                "container {name} did not exit: {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stop_sandbox(&self, client: &mut CriClient, sandbox: &str) {
        let _: wire::Empty = client
            .call(
                "/runtime.v1.RuntimeService/StopPodSandbox",
                &IdRequest {
                    id: sandbox.to_string(),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", self.log()));
    }

    /// Every process in the test's cgroup parent, in any hierarchy.
    fn container_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for mount in cgroup_mount_points() {
            let parent = mount.join(&self.cgroup_parent);
            for dir in dirs_below(&parent) {
                for file in ["cgroup.procs", "tasks"] {
                    if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
                        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                    }
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// The runc shims this containerd started: their command line names its socket.
    fn shim_pids(&self) -> Vec<i32> {
        let socket = self.socket.display().to_string();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains("containerd-shim") && cmdline.contains(&socket) {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let kill = |pid: i32| {
            // SAFETY: kill has no memory preconditions; these PIDs are this test's.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        };
        for _ in 0..3 {
            self.container_pids().into_iter().for_each(kill);
            std::thread::sleep(Duration::from_millis(100));
        }
        let shims = self.shim_pids();
        shims.iter().copied().for_each(kill);
        let _ = self.process.kill();
        let _ = self.process.wait();
        // The shims are not our children (they daemonize): wait until they are gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while shims
            .iter()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Mounts left under the directory (container root filesystems, sandbox /dev/shm),
        // deepest first.
        let dir = self.dir.display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .map(super::cgroups::unescape_mount_point)
            .filter(|point| point.starts_with(&dir))
            .collect();
        mounts.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in mounts {
            if let Ok(point) = std::ffi::CString::new(point) {
                // SAFETY: a valid C string; MNT_DETACH cannot hurt mounts outside ours.
                unsafe { libc::umount2(point.as_ptr(), libc::MNT_DETACH) };
            }
        }
        for mount in cgroup_mount_points() {
            let mut below = dirs_below(&mount.join(&self.cgroup_parent));
            below.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for dir in below {
                let _ = std::fs::remove_dir(&dir);
            }
        }
    }
}

fn cgroup_mount_points() -> Vec<PathBuf> {
    super::cgroups::this_process_mounts()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.point)
        .collect()
}

/// `dir` and every directory below it, when it exists.
fn dirs_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        found.push(next);
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            }
        }
    }
    found
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub async fn list_containers(client: &mut CriClient) -> Vec<wire::Container> {
    let answer: wire::ListContainersResponse = client
        .call(
            wire::LIST_CONTAINERS,
            &wire::ListContainersRequest::default(),
        )
        .await
        .expect("ListContainers");
    answer.containers
}

pub async fn list_sandboxes(client: &mut CriClient) -> Vec<wire::PodSandbox> {
    let answer: wire::ListPodSandboxResponse = client
        .call(
            wire::LIST_POD_SANDBOX,
            &wire::ListPodSandboxRequest::default(),
        )
        .await
        .expect("ListPodSandbox");
    answer.items
}

/// Every image's tags (an untagged image by its ID).
pub async fn image_names(client: &mut CriClient) -> Vec<String> {
    let answer: wire::ListImagesResponse = client
        .call(wire::LIST_IMAGES, &wire::ListImagesRequest::default())
        .await
        .expect("ListImages");
    let mut names: Vec<String> = answer
        .images
        .into_iter()
        .flat_map(|image| {
            if image.repo_tags.is_empty() {
                vec![image.id]
            } else {
                image.repo_tags
            }
        })
        .collect();
    names.sort();
    names
}

// The CRI messages only the test sends (runtime.v1 api.proto field numbers).

const NAMESPACE_NODE: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    metadata: Option<wire::PodSandboxMetadata>,
    #[prost(message, optional, tag = "8")]
    linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    security_context: Option<LinuxSandboxSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct NamespaceOption {
    #[prost(int32, tag = "1")]
    network: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    metadata: Option<wire::ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    image: Option<wire::ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    command: Vec<String>,
    #[prost(map = "string, string", tag = "9")]
    labels: HashMap<String, String>,
}

/// StartContainer's and StopPodSandbox's requests: one ID in field 1.
#[derive(Clone, PartialEq, prost::Message)]
struct IdRequest {
    #[prost(string, tag = "1")]
    id: String,
}
