//! The CRI messages node-level reclaim sends and reads (package `runtime.v1`, the
//! kubelet's `api.proto`), written by hand with their field numbers so that no protobuf
//! compiler is needed to build. Fields the agent does not read are left out: protobuf
//! skips unknown fields when decoding, and an absent field is its default.

use std::collections::HashMap;

pub const LIST_IMAGES: &str = "/runtime.v1.ImageService/ListImages";
pub const REMOVE_IMAGE: &str = "/runtime.v1.ImageService/RemoveImage";
pub const LIST_CONTAINERS: &str = "/runtime.v1.RuntimeService/ListContainers";
pub const REMOVE_CONTAINER: &str = "/runtime.v1.RuntimeService/RemoveContainer";
pub const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
pub const STOP_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/StopPodSandbox";
pub const REMOVE_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/RemovePodSandbox";
pub const STATUS: &str = "/runtime.v1.RuntimeService/Status";

/// The kubelet's label naming a container's pod.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
    #[prost(map = "string, string", tag = "2")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "18")]
    pub user_specified_image: String,
    #[prost(string, tag = "19")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageFilter {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListImagesRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ImageFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, repeated, tag = "2")]
    pub repo_tags: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub repo_digests: Vec<String>,
    #[prost(uint64, tag = "4")]
    pub size: u64,
    #[prost(message, optional, tag = "7")]
    pub spec: Option<ImageSpec>,
    #[prost(bool, tag = "8")]
    pub pinned: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListImagesResponse {
    #[prost(message, repeated, tag = "1")]
    pub images: Vec<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveImageRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

/// CRI `ContainerState`.
pub mod container_state {
    pub const CREATED: i32 = 0;
    pub const RUNNING: i32 = 1;
    pub const EXITED: i32 = 2;
    pub const UNKNOWN: i32 = 3;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "3")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "4")]
    pub image: Option<ImageSpec>,
    #[prost(string, tag = "5")]
    pub image_ref: String,
    #[prost(int32, tag = "6")]
    pub state: i32,
    #[prost(int64, tag = "7")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "8")]
    pub labels: HashMap<String, String>,
    #[prost(string, tag = "10")]
    pub image_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// CRI `PodSandboxState`.
pub mod sandbox_state {
    pub const READY: i32 = 0;
    pub const NOT_READY: i32 = 1;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

/// RemovePodSandbox's request, and StopPodSandbox's, which has the same one field.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovePodSandboxRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {
    #[prost(bool, tag = "1")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}
