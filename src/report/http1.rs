//! The report endpoint's HTTP/1.1, kept to what agents send: one request at a time on a
//! keep-alive connection, a head of bounded size, a body framed by `Content-Length` or
//! chunked. It exists for memory: a general server (hyper) keeps a read and a write buffer
//! of 8 KiB each in every open connection, and 5,000 agents hold their connections open
//! between reports. Here a connection that waits for its next request holds no buffer at
//! all; one is allocated when a request starts and freed when it is answered.
//!
//! Parsing is pure (`parse_head`, `ChunkedDecoder`) so it is tested on bytes alone; the
//! async functions only move bytes between the socket and those.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use hyper::body::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Headers a request may carry at most (a report carries about six).
const MAX_HEADERS: usize = 64;
/// What a read asks the socket for while a request is being read.
const READ_CHUNK: usize = 4096;

/// A request's head, parsed.
#[derive(Debug)]
pub struct Head {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    /// The client keeps the connection after the answer (HTTP/1.1 unless it says
    /// `Connection: close`; HTTP/1.0 only when it says `keep-alive`).
    pub keep_alive: bool,
    pub framing: Framing,
    /// `Expect: 100-continue`: the client waits for a go-ahead before it sends the body.
    pub expects_continue: bool,
}

/// How the body's end is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
}

/// Why a request's head could not be taken.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head exceeds {0} bytes")]
    TooLarge(usize),
    #[error("the request head is malformed: {0}")]
    Malformed(String),
}

/// Parses the head at the start of `bytes`: `Ok(None)` while it is incomplete, else the
/// head and its length in bytes.
pub fn parse_head(bytes: &[u8], max_bytes: usize) -> Result<Option<(Head, usize)>, HeadError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    let length = match request.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if bytes.len() >= max_bytes => {
            return Err(HeadError::TooLarge(max_bytes));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::Malformed(format!(
                "more than {MAX_HEADERS} header fields"
            )));
        }
        Err(error) => return Err(HeadError::Malformed(error.to_string())),
    };
    if length > max_bytes {
        return Err(HeadError::TooLarge(max_bytes));
    }
    let method = Method::from_bytes(request.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Malformed("an invalid method".to_string()))?;
    // The path alone: an absolute-form target (`http://host/path`) and a query are
    // taken as the origin-form path they name.
    let path = request
        .path
        .unwrap_or_default()
        .parse::<http::Uri>()
        .map_err(|_| HeadError::Malformed("an invalid request target".to_string()))?
        .path()
        .to_string();
    let minor_version = request.version.unwrap_or(1);
    let mut headers = HeaderMap::with_capacity(request.headers.len());
    for header in request.headers.iter() {
        let name = HeaderName::from_bytes(header.name.as_bytes())
            .map_err(|_| HeadError::Malformed(format!("the header name {:?}", header.name)))?;
        let value = HeaderValue::from_bytes(header.value)
            .map_err(|_| HeadError::Malformed(format!("the value of header {name}")))?;
        headers.append(name, value);
    }
    let framing = framing(&headers)?;
    let connection_says = |token: &str| {
        headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|value| {
                value
                    .to_str()
                    .unwrap_or_default()
                    .split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(token))
            })
    };
    let keep_alive = if minor_version == 0 {
        connection_says("keep-alive")
    } else {
        !connection_says("close")
    };
    let expects_continue = headers
        .get(http::header::EXPECT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("100-continue"));
    Ok(Some((
        Head {
            method,
            path,
            headers,
            keep_alive,
            framing,
            expects_continue,
        },
        length,
    )))
}

/// The body's framing. Both `Transfer-Encoding` and `Content-Length`, differing lengths,
/// or a transfer coding other than `chunked` are refused: a request that two readers
/// could split differently is never guessed at.
fn framing(headers: &HeaderMap) -> Result<Framing, HeadError> {
    let mut codings = headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .peekable();
    let lengths: Vec<&HeaderValue> = headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .collect();
    if codings.peek().is_some() {
        if !lengths.is_empty() {
            return Err(HeadError::Malformed(
                "both Transfer-Encoding and Content-Length".to_string(),
            ));
        }
        let all: Vec<String> = codings
            .map(|value| String::from_utf8_lossy(value.as_bytes()).to_string())
            .collect();
        let joined = all.join(",");
        let parts: Vec<&str> = joined.split(',').map(str::trim).collect();
        if parts.len() == 1 && parts[0].eq_ignore_ascii_case("chunked") {
            return Ok(Framing::Chunked);
        }
        return Err(HeadError::Malformed(format!(
            "the transfer coding {joined:?} (only chunked is taken)"
        )));
    }
    let mut length = None;
    for value in lengths {
        for part in value.to_str().unwrap_or("x").split(',') {
            let part = part.trim();
            let parsed = if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                part.parse::<u64>().ok()
            } else {
                None
            };
            let Some(parsed) = parsed else {
                return Err(HeadError::Malformed(format!("the Content-Length {part:?}")));
            };
            if length.is_some_and(|seen| seen != parsed) {
                return Err(HeadError::Malformed(
                    "differing Content-Lengths".to_string(),
                ));
            }
            length = Some(parsed);
        }
    }
    Ok(Framing::Length(length.unwrap_or(0)))
}

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the body exceeds {0} bytes")]
    TooLarge(usize),
    #[error("the chunked body is malformed: {0}")]
    Malformed(String),
    #[error("the connection closed before the body's end")]
    Closed,
    #[error("reading the body: {0}")]
    Io(String),
}

/// Decodes a chunked body step by step, from whatever bytes have arrived.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    /// Data bytes still to come in the current chunk.
    remaining: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Before a chunk-size line.
    #[default]
    Size,
    Data,
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section after the last chunk, until its empty line.
    Trailer,
    Done,
}

/// A chunk-size line or trailer line longer than this is refused.
const MAX_CHUNK_LINE: usize = 4096;

impl ChunkedDecoder {
    /// Takes what it can from the front of `input` (removing it), appending data to
    /// `body`; `Ok(true)` once the body has ended. Bytes after the end stay in `input`.
    pub fn decode(
        &mut self,
        input: &mut Vec<u8>,
        body: &mut Vec<u8>,
        limit: usize,
    ) -> Result<bool, BodyError> {
        let mut at = 0;
        let result = loop {
            match self.state {
                ChunkState::Done => break Ok(true),
                ChunkState::Size | ChunkState::Trailer => {
                    let Some(end) = input[at..].windows(2).position(|w| w == b"\r\n") else {
                        if input.len() - at > MAX_CHUNK_LINE {
                            break Err(BodyError::Malformed("a line too long".to_string()));
                        }
                        break Ok(false);
                    };
                    let line = &input[at..at + end];
                    at += end + 2;
                    if self.state == ChunkState::Trailer {
                        if line.is_empty() {
                            self.state = ChunkState::Done;
                        }
                        continue;
                    }
                    match chunk_size(line) {
                        Some(0) => self.state = ChunkState::Trailer,
                        Some(size) => {
                            if (body.len() as u64).saturating_add(size) > limit as u64 {
                                break Err(BodyError::TooLarge(limit));
                            }
                            self.remaining = size;
                            self.state = ChunkState::Data;
                        }
                        None => {
                            break Err(BodyError::Malformed(format!(
                                "the chunk size {:?}",
                                String::from_utf8_lossy(line)
                            )));
                        }
                    }
                }
                ChunkState::Data => {
                    let available = (input.len() - at) as u64;
                    if available == 0 {
                        break Ok(false);
                    }
                    let take = available.min(self.remaining) as usize;
                    body.extend_from_slice(&input[at..at + take]);
                    at += take;
                    self.remaining -= take as u64;
                    if self.remaining == 0 {
                        self.state = ChunkState::DataEnd;
                    }
                }
                ChunkState::DataEnd => {
                    if input.len() - at < 2 {
                        break Ok(false);
                    }
                    if &input[at..at + 2] != b"\r\n" {
                        break Err(BodyError::Malformed("no CRLF after a chunk".to_string()));
                    }
                    at += 2;
                    self.state = ChunkState::Size;
                }
            }
        };
        input.drain(..at);
        result
    }
}

/// A chunk-size line's size (hex digits, then optional extensions after `;`).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(line).ok()?;
    let digits = text.split(';').next()?.trim();
    if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Waits for a request to start, holding no buffer while the connection idles: `None`
/// when the client closed the connection or sent nothing by `deadline`.
pub async fn await_request<IO: AsyncRead + Unpin>(io: &mut IO, deadline: Instant) -> Option<u8> {
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, io.read(&mut first)).await {
        Ok(Ok(1)) => Some(first[0]),
        _ => None,
    }
}

/// Reads until `buffer` holds a whole head, by `deadline`; the head and the bytes after
/// it stay in `buffer`. `Ok(None)`: the deadline passed or the client went away.
pub async fn read_head<IO: AsyncRead + Unpin>(
    io: &mut IO,
    buffer: &mut Vec<u8>,
    deadline: Instant,
    max_bytes: usize,
) -> Result<Option<(Head, usize)>, HeadError> {
    loop {
        if let Some(parsed) = parse_head(buffer, max_bytes)? {
            return Ok(Some(parsed));
        }
        match tokio::time::timeout_at(deadline, read_some(io, buffer)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Ok(None),
        }
    }
}

async fn read_some<IO: AsyncRead + Unpin>(
    io: &mut IO,
    buffer: &mut Vec<u8>,
) -> std::io::Result<usize> {
    buffer.reserve(READ_CHUNK);
    io.read_buf(buffer).await
}

/// One request's body, read from what followed its head in `buffered` and then from the
/// connection. After it is read, `buffered` keeps what came after it (a next request the
/// client already sent).
pub struct BodyReader<'a, IO> {
    pub io: &'a mut IO,
    pub buffered: &'a mut Vec<u8>,
    pub framing: Framing,
    pub expects_continue: bool,
    /// The whole body was read, so the connection can carry the next request.
    pub finished: bool,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> BodyReader<'_, IO> {
    /// The whole body, refused past `limit` bytes (a declared length past it is refused
    /// before a byte is read).
    pub async fn read_all(&mut self, limit: usize) -> Result<Bytes, BodyError> {
        if let Framing::Length(length) = self.framing
            && length > limit as u64
        {
            return Err(BodyError::TooLarge(limit));
        }
        if self.expects_continue {
            self.expects_continue = false;
            self.io
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .map_err(|e| BodyError::Io(e.to_string()))?;
            self.io
                .flush()
                .await
                .map_err(|e| BodyError::Io(e.to_string()))?;
        }
        let body = match self.framing {
            Framing::Length(length) => {
                let length = length as usize;
                while self.buffered.len() < length {
                    self.read_more().await?;
                }
                let rest = self.buffered.split_off(length);
                Bytes::from(std::mem::replace(self.buffered, rest))
            }
            Framing::Chunked => {
                let mut decoder = ChunkedDecoder::default();
                let mut body = Vec::new();
                while !decoder.decode(self.buffered, &mut body, limit)? {
                    self.read_more().await?;
                }
                Bytes::from(body)
            }
        };
        self.finished = true;
        Ok(body)
    }

    /// Reads what has arrived after `buffered`; the body cannot end if the client closes.
    async fn read_more(&mut self) -> Result<(), BodyError> {
        match read_some(self.io, self.buffered).await {
            Ok(0) => Err(BodyError::Closed),
            Ok(_) => Ok(()),
            Err(error) => Err(BodyError::Io(error.to_string())),
        }
    }
}

/// An answer's bytes on the wire.
pub fn encode_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    close: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == http::header::CONTENT_LENGTH || name == http::header::CONNECTION {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

/// Writes an answer; the connection is closed after it when `close`.
pub async fn write_response<IO: AsyncWrite + Unpin>(
    io: &mut IO,
    bytes: &[u8],
    close: bool,
    within: Duration,
) -> bool {
    let written = tokio::time::timeout(within, async {
        io.write_all(bytes).await?;
        io.flush().await
    })
    .await;
    let ok = matches!(written, Ok(Ok(())));
    if close || !ok {
        self::close(io, within).await;
    }
    ok
}

/// Ends the connection (a TLS one with its close_notify), waiting at most `within`.
pub async fn close<IO: AsyncWrite + Unpin>(io: &mut IO, within: Duration) {
    let _ = tokio::time::timeout(within, io.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 16 * 1024;

    fn head(text: &str) -> Result<Option<(Head, usize)>, HeadError> {
        parse_head(text.as_bytes(), MAX)
    }

    #[test]
    fn a_report_head_is_parsed_with_its_length_and_framing() {
        let text = "POST /v1/reports HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer t\r\nContent-Length: 12\r\n\r\n{\"a\":1}";
        let (head, length) = head(text).expect("valid").expect("complete");
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.path, "/v1/reports");
        assert_eq!(head.framing, Framing::Length(12));
        assert!(head.keep_alive);
        assert!(!head.expects_continue);
        assert_eq!(&text[length..], "{\"a\":1}");
        assert_eq!(head.headers["authorization"], "Bearer t");
    }

    #[test]
    fn an_incomplete_head_waits_and_an_endless_one_is_refused() {
        assert!(
            head("POST /v1/reports HTTP/1.1\r\nHost: c\r\n")
                .expect("valid")
                .is_none()
        );
        let endless = format!("POST / HTTP/1.1\r\nX: {}", "a".repeat(MAX));
        assert_eq!(
            head(&endless).err(),
            Some(HeadError::TooLarge(MAX)),
            "a head past the limit"
        );
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_header() {
        let keeps = |text: &str| head(text).expect("valid").expect("complete").0.keep_alive;
        assert!(keeps("GET / HTTP/1.1\r\n\r\n"));
        assert!(!keeps("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"));
        assert!(!keeps("GET / HTTP/1.1\r\nConnection: te, close\r\n\r\n"));
        assert!(!keeps("GET / HTTP/1.0\r\n\r\n"));
        assert!(keeps("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    }

    #[test]
    fn ambiguous_framing_is_refused_never_guessed() {
        for text in [
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n",
        ] {
            assert!(
                matches!(head(text), Err(HeadError::Malformed(_))),
                "{text:?}: {:?}",
                head(text)
            );
        }
        let same = head("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!(
            same.expect("valid").expect("complete").0.framing,
            Framing::Length(5)
        );
        let chunked = head("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n");
        assert_eq!(
            chunked.expect("valid").expect("complete").0.framing,
            Framing::Chunked
        );
        let none = head("POST / HTTP/1.1\r\n\r\n");
        assert_eq!(
            none.expect("valid").expect("complete").0.framing,
            Framing::Length(0)
        );
    }

    #[test]
    fn garbage_is_malformed() {
        assert!(matches!(
            head("\x16\x03\x01 hello\r\n\r\n"),
            Err(HeadError::Malformed(_))
        ));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        assert!(matches!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            Err(HeadError::Malformed(_))
        ));
    }

    fn decode_all(pieces: &[&[u8]], limit: usize) -> (Result<bool, BodyError>, Vec<u8>, Vec<u8>) {
        let mut decoder = ChunkedDecoder::default();
        let mut input = Vec::new();
        let mut body = Vec::new();
        let mut result = Ok(false);
        for piece in pieces {
            input.extend_from_slice(piece);
            // Once ended, the rest stays for the next request, undecoded.
            if matches!(result, Ok(false)) {
                result = decoder.decode(&mut input, &mut body, limit);
            }
        }
        (result, body, input)
    }

    #[test]
    fn a_chunked_body_is_decoded_across_any_split_and_leaves_what_follows() {
        let whole = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nGET / HTTP/1.1";
        for split in 0..whole.len() {
            let (result, body, rest) = decode_all(&[&whole[..split], &whole[split..]], 100);
            assert_eq!(result, Ok(true), "split at {split}");
            assert_eq!(body, b"hello world", "split at {split}");
            assert_eq!(rest, b"GET / HTTP/1.1", "split at {split}");
        }
    }

    #[test]
    fn a_chunked_body_past_the_limit_or_misframed_is_refused() {
        let (result, _, _) = decode_all(&[b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"], 8);
        assert_eq!(result, Err(BodyError::TooLarge(8)));
        let (result, _, _) = decode_all(&[b"ffffffffffffffff\r\n"], 8);
        assert!(matches!(result, Err(BodyError::Malformed(_))), "{result:?}");
        let (result, _, _) = decode_all(&[b"5\r\nhelloXX"], 100);
        assert!(matches!(result, Err(BodyError::Malformed(_))), "{result:?}");
        let (result, _, _) = decode_all(&[b"zz\r\n"], 100);
        assert!(matches!(result, Err(BodyError::Malformed(_))), "{result:?}");
        let endless = vec![b'1'; MAX_CHUNK_LINE + 1];
        let (result, _, _) = decode_all(&[&endless], 100);
        assert!(matches!(result, Err(BodyError::Malformed(_))), "{result:?}");
    }

    #[test]
    fn an_answer_carries_its_length_and_says_close_once() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        let text = String::from_utf8(encode_response(
            StatusCode::TOO_MANY_REQUESTS,
            &headers,
            b"{}",
            true,
        ))
        .expect("text");
        assert!(
            text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{text}"
        );
        assert_eq!(text.matches("connection: close").count(), 1, "{text}");
        assert!(text.ends_with("content-length: 2\r\n\r\n{}"), "{text}");
    }

    proptest! {
        #[test]
        fn no_bytes_make_the_parsers_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_head(&bytes, 512);
            let mut input = bytes.clone();
            let mut body = Vec::new();
            let _ = ChunkedDecoder::default().decode(&mut input, &mut body, 256);
            prop_assert!(body.len() <= 256);
        }

        #[test]
        fn a_chunked_body_round_trips(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
            split in 0usize..400,
        ) {
            let mut wire = Vec::new();
            for chunk in &chunks {
                wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                wire.extend_from_slice(chunk);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let split = split.min(wire.len());
            let (result, body, rest) = decode_all(&[&wire[..split], &wire[split..]], 1000);
            prop_assert_eq!(result, Ok(true));
            prop_assert_eq!(body, chunks.concat());
            prop_assert!(rest.is_empty());
        }
    }
}
