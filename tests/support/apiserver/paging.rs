//! List paging with `limit` and `continue`, as kube-rs watchers (500 per page) and kubectl
//! (`--chunk-size`) use it.
//!
//! As on the real server: a page holds at most `limit` items in key order (namespace,
//! then name); `metadata.continue` is an opaque token when more remain, and
//! `metadata.remainingItemCount` counts them when no selector filters the list. Every
//! page reports the first page's `resourceVersion`. A continue token older than the
//! retained history is `410 Expired`; a malformed one, or one given with a
//! `resourceVersion`, is `400`.
//!
//! One difference: the real server serves every page from the first page's snapshot;
//! here later pages show the current state after the last key returned. A client that
//! watches from the list's version afterwards sees the changes in between again, which
//! reflectors absorb.

use serde_json::{Value, json};

use super::status::ApiError;

/// One page of a list.
pub struct Page {
    pub items: Vec<Value>,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
    /// The version the list reports: the first page's.
    pub revision: u64,
}

/// The request's paging parameters.
pub struct Paging<'a> {
    pub limit: Option<&'a str>,
    pub continue_token: Option<&'a str>,
    pub resource_version: Option<&'a str>,
    /// A label or field selector filters the list (no remaining count then).
    pub filtered: bool,
}

fn key_of(object: &Value) -> String {
    let text = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    format!("{}/{}", text("/metadata/namespace"), text("/metadata/name"))
}

fn encode(revision: u64, start: &str) -> String {
    json!({"v": "meta.k8s.io/v1", "rv": revision, "start": start})
        .to_string()
        .bytes()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn decode(token: &str) -> Option<(u64, String)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let value: Value = serde_json::from_slice(&bytes?).ok()?;
    Some((value["rv"].as_u64()?, value["start"].as_str()?.to_string()))
}

/// The page `paging` asks for out of `items` (already filtered, in key order).
pub fn page(
    mut items: Vec<Value>,
    paging: &Paging<'_>,
    revision: u64,
    oldest_resumable: u64,
) -> Result<Page, ApiError> {
    let limit = match paging.limit.filter(|limit| !limit.is_empty()) {
        None => None,
        Some(text) => match text.parse::<i64>() {
            Ok(limit) if limit > 0 => Some(limit as usize),
            Ok(_) => None,
            Err(_) => return Err(ApiError::bad_request(format!("invalid limit {text:?}"))),
        },
    };
    let mut first_revision = revision;
    if let Some(token) = paging.continue_token.filter(|token| !token.is_empty()) {
        if paging.resource_version.is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let Some((token_revision, start)) = decode(token) else {
            return Err(ApiError::bad_request(
                "continue key is not valid: the token is not one this server issued",
            ));
        };
        if token_revision < oldest_resumable {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter.",
            ));
        }
        first_revision = token_revision;
        items.retain(|object| key_of(object) > start);
    }
    let (continue_token, remaining) = match limit {
        Some(limit) if items.len() > limit => {
            let rest = items.split_off(limit);
            let last = items.last().map(key_of).unwrap_or_default();
            (
                Some(encode(first_revision, &last)),
                (!paging.filtered).then_some(rest.len()),
            )
        }
        _ => (None, None),
    };
    Ok(Page {
        items,
        continue_token,
        remaining,
        revision: first_revision,
    })
}
