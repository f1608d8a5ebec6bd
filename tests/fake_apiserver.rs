//! The fake API server, exercised through the real kube client over HTTP.

mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};

use support::FakeApiServer;

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"k": "v"}}))
        .unwrap()
}

#[tokio::test]
async fn creates_and_reads_back() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let created = api
        .create(&PostParams::default(), &config_map("one"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    let fetched = api.get("one").await.unwrap();
    assert_eq!(fetched.data.unwrap()["k"], "v");
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    assert!(
        pods.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
