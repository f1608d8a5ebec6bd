//! Talking to the controller's report endpoint the way a hostile or broken client does: raw
//! HTTP/1.1 over TCP, so the tests control every byte, and the answer read whole.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A report request's bytes: `POST /v1/reports` with `body`, the bearer `token` if any,
/// and `Connection: close` if `close`.
pub fn report_request(token: Option<&str>, body: &[u8], close: bool) -> Vec<u8> {
    let mut head = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: nodekeeper\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    request
}

/// One HTTP/1.1 exchange; the status and the JSON body.
pub async fn post(address: &str, token: Option<&str>, body: &[u8]) -> (u16, Value) {
    exchange(address, &report_request(token, body, true)).await
}

/// Writes `request` while reading the answer: a server that refuses a body it has not
/// read answers and closes early, and the answer must still be read (a write into the
/// closed connection fails, and is ignored).
pub async fn exchange(address: &str, request: &[u8]) -> (u16, Value) {
    let stream = TcpStream::connect(address).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let request = request.to_vec();
    // The write half stays open until the answer is read: closing it would end the
    // request early.
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&request).await;
        writer
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), reader.read_to_end(&mut answer))
        .await
        .expect("an answer within 20 s");
    if let Err(error) = read {
        // A reset after the answer (the server dropped unread body bytes) is fine.
        assert!(!answer.is_empty(), "no answer: {error}");
    }
    drop(writing);
    parse_answer(&answer)
}

pub fn parse_answer(answer: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// POSTs `report` as JSON, with the bearer `token` if any; the status and the JSON body.
pub async fn post_report(address: &str, token: Option<&str>, report: &Value) -> (u16, Value) {
    post(address, token, &serde_json::to_vec(report).expect("json")).await
}
