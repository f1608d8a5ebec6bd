//! A gRPC client for the container runtime's CRI socket: unary calls only, over HTTP/2
//! on a Unix socket, with protobuf messages from [`super::wire`]. The few calls
//! node-level reclaim makes do not need a full gRPC stack; what they need is here: the
//! five-byte message frame, `grpc-status` from the trailers (or from the headers of a
//! trailers-only answer), a size limit on answers and a deadline on every call.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The largest answer read, as the kubelet's CRI client allows (`maxMsgSize`, 16 MiB):
/// a node with thousands of images lists them in a few MiB.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("container runtime endpoint {endpoint:?}: {message}")]
    Endpoint { endpoint: String, message: String },
    #[error("cannot connect to the container runtime at {}: {error}", .socket.display())]
    Connect {
        socket: PathBuf,
        error: std::io::Error,
    },
    #[error("the container runtime at {}: {method}: {message}", .socket.display())]
    Call {
        socket: PathBuf,
        method: &'static str,
        message: String,
    },
    #[error("the container runtime at {} answered {method} with gRPC status {code}: {message}", .socket.display())]
    Status {
        socket: PathBuf,
        method: &'static str,
        code: u32,
        message: String,
    },
    #[error("the container runtime at {} did not answer {method} within {timeout:?}", .socket.display())]
    TimedOut {
        socket: PathBuf,
        method: &'static str,
        timeout: Duration,
    },
}

/// The longest one call may take, whatever the whole reclaim's budget: a runtime that
/// does not answer a list or a removal in this long is not going to.
pub const CALL_TIMEOUT_LIMIT: Duration = Duration::from_secs(30);

/// gRPC's NOT_FOUND: what a runtime answers for a container, sandbox or image already
/// gone, which removal treats as done.
pub const NOT_FOUND: u32 = 5;

impl CriError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::Status { code, .. } if *code == NOT_FOUND)
    }
}

/// The socket of a CRI endpoint ([`crate::config::runtime_endpoint_socket`]).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    crate::config::runtime_endpoint_socket(endpoint).map_err(|message| CriError::Endpoint {
        endpoint: endpoint.to_string(),
        message,
    })
}

/// One HTTP/2 connection to the runtime; calls on it may run one after another.
pub struct CriClient {
    socket: PathBuf,
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    timeout: Duration,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for CriClient {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl CriClient {
    /// Connect to `socket`; every call then has `timeout` (at most
    /// [`CALL_TIMEOUT_LIMIT`]) to complete, which the runtime is told (`grpc-timeout`).
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<CriClient, CriError> {
        let timeout = timeout.min(CALL_TIMEOUT_LIMIT);
        let connect_error = |error| CriError::Connect {
            socket: socket.to_path_buf(),
            error,
        };
        let late = |what: &str| {
            connect_error(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no {what} within {timeout:?}"),
            ))
        };
        let stream = tokio::time::timeout(timeout, tokio::net::UnixStream::connect(socket))
            .await
            .map_err(|_| late("connection"))?
            .map_err(connect_error)?;
        let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .max_frame_size(1 << 20)
            .handshake(TokioIo::new(stream));
        let (sender, connection) = tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| late("HTTP/2 handshake"))?
            .map_err(|error| connect_error(std::io::Error::other(error)))?;
        let connection = tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "container runtime connection ended");
            }
        });
        Ok(CriClient {
            socket: socket.to_path_buf(),
            sender,
            timeout,
            connection,
        })
    }

    /// One unary call: `method` is the gRPC path, e.g.
    /// `/runtime.v1.ImageService/ListImages`.
    pub async fn call<Request, Answer>(
        &mut self,
        method: &'static str,
        request: &Request,
    ) -> Result<Answer, CriError>
    where
        Request: prost::Message,
        Answer: prost::Message + Default,
    {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.call_unbounded(method, request)).await {
            Ok(result) => result,
            Err(_) => Err(CriError::TimedOut {
                socket: self.socket.clone(),
                method,
                timeout,
            }),
        }
    }

    async fn call_unbounded<Request, Answer>(
        &mut self,
        method: &'static str,
        request: &Request,
    ) -> Result<Answer, CriError>
    where
        Request: prost::Message,
        Answer: prost::Message + Default,
    {
        let socket = self.socket.clone();
        let failed = |message: String| CriError::Call {
            socket: socket.clone(),
            method,
            message,
        };
        let body = frame(&request.encode_to_vec());
        let request = http::Request::post(format!("http://localhost{method}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(
                "grpc-timeout",
                format!("{}m", self.timeout.as_millis().max(1)),
            )
            .header(
                http::header::USER_AGENT,
                concat!("nodekeeper/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| failed(e.to_string()))?;
        self.sender
            .ready()
            .await
            .map_err(|e| failed(format!("connection lost: {e}")))?;
        let answer = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (parts, body) = answer.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(failed(format!("HTTP status {}", parts.status)));
        }
        // A trailers-only answer (an error at once) carries the status in its headers.
        let header_status = grpc_status(&parts.headers);
        if let Some(status) = header_status.clone().filter(|s| s.0 != 0) {
            return Err(self.status_error(method, status));
        }
        let collected = Limited::new(body, MAX_MESSAGE_BYTES + 5)
            .collect()
            .await
            .map_err(|e| failed(format!("reading the answer: {e}")))?;
        let trailers = collected.trailers().cloned();
        let bytes = collected.to_bytes();
        match trailers.as_ref().and_then(grpc_status) {
            Some(status) if status.0 != 0 => return Err(self.status_error(method, status)),
            Some(_) => {}
            None if header_status.is_some() => {}
            None => return Err(failed("the answer carries no grpc-status".to_string())),
        }
        let message = unframe(&bytes).map_err(failed)?;
        Answer::decode(message).map_err(|e| failed(format!("undecodable answer: {e}")))
    }

    fn status_error(&self, method: &'static str, (code, message): (u32, String)) -> CriError {
        CriError::Status {
            socket: self.socket.clone(),
            method,
            code,
            message,
        }
    }
}

/// A gRPC message frame: not compressed, four bytes of length, the message.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0);
    framed.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    framed.extend_from_slice(message);
    framed
}

/// The one message of a unary answer. A body without one is an error, not the empty
/// message: an empty list read from it would make every image look unused.
fn unframe(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.is_empty() {
        return Err("an answer without a message".to_string());
    }
    let Some((header, rest)) = bytes.split_first_chunk::<5>() else {
        return Err(format!("a message frame cut short ({} bytes)", bytes.len()));
    };
    if header[0] != 0 {
        return Err("a compressed message, which was not asked for".to_string());
    }
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if length > MAX_MESSAGE_BYTES {
        return Err(format!(
            "a message of {length} bytes, over the {MAX_MESSAGE_BYTES}-byte limit"
        ));
    }
    if rest.len() != length {
        return Err(format!(
            "a message frame of {length} bytes with {} bytes of body",
            rest.len()
        ));
    }
    Ok(rest)
}

/// `grpc-status` and `grpc-message` (percent-decoded), when present.
fn grpc_status(headers: &http::HeaderMap) -> Option<(u32, String)> {
    let code = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some((code, message))
}

fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_as_the_kubelet_writes_them() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/var/run/crio/crio.sock").unwrap(),
            PathBuf::from("/var/run/crio/crio.sock")
        );
        let error = socket_path("tcp://127.0.0.1:1234").unwrap_err().to_string();
        assert!(error.contains("\"tcp\" is not supported"), "{error}");
        assert!(socket_path("unix://relative.sock").is_err());
    }

    #[test]
    fn frames_round_trip_and_bad_frames_are_named() {
        let framed = frame(b"hello");
        assert_eq!(framed[..5], [0, 0, 0, 0, 5]);
        assert_eq!(unframe(&framed).unwrap(), b"hello");
        assert!(unframe(&[]).unwrap_err().contains("without a message"));
        assert_eq!(unframe(&frame(b"")).unwrap(), b"");
        assert!(unframe(&framed[..3]).unwrap_err().contains("cut short"));
        assert!(
            unframe(&framed[..7])
                .unwrap_err()
                .contains("5 bytes with 2 bytes")
        );
        let mut compressed = framed.clone();
        compressed[0] = 1;
        assert!(unframe(&compressed).unwrap_err().contains("compressed"));
        assert!(
            unframe(&[0, 0xff, 0xff, 0xff, 0xff])
                .unwrap_err()
                .contains("limit")
        );
    }

    #[test]
    fn status_messages_are_percent_decoded() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", "5".parse().unwrap());
        headers.insert("grpc-message", "image %22x%22 not found%".parse().unwrap());
        assert_eq!(
            grpc_status(&headers),
            Some((5, "image \"x\" not found%".to_string()))
        );
    }
}
