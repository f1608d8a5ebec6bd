//! JSON merge patch (RFC 7386) and JSON patch (RFC 6902). Strategic merge patch is served as a
//! merge patch: the difference only shows for lists with merge keys, which nodekeeper does not send.

use serde_json::Value;

/// Applies an RFC 7386 merge patch: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target_fields) = target {
        for (key, value) in patch_fields {
            if value.is_null() {
                target_fields.remove(key);
            } else {
                merge_patch(
                    target_fields.entry(key.clone()).or_insert(Value::Null),
                    value,
                );
            }
        }
    }
}

#[derive(Debug, PartialEq)]
pub enum JsonPatchError {
    /// A `test` operation found a different value.
    TestFailed(String),
    /// The document is malformed or a path does not resolve.
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> JsonPatchError {
    JsonPatchError::Invalid(message.into())
}

/// Splits an RFC 6901 pointer into unescaped tokens.
fn tokens(pointer: &str) -> Result<Vec<String>, JsonPatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| invalid(format!("path {pointer:?} must start with '/'")))?;
    Ok(rest
        .split('/')
        .map(|token| token.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn array_index(token: &str, length: usize, allow_end: bool) -> Result<usize, JsonPatchError> {
    if allow_end && token == "-" {
        return Ok(length);
    }
    let index: usize = token
        .parse()
        .map_err(|_| invalid(format!("array index {token:?} is not a number")))?;
    let limit = if allow_end {
        length
    } else {
        length.saturating_sub(1)
    };
    if index > limit || (!allow_end && length == 0) {
        return Err(invalid(format!("array index {index} out of bounds")));
    }
    Ok(index)
}

fn parent_of<'a>(
    document: &'a mut Value,
    path: &[String],
) -> Result<&'a mut Value, JsonPatchError> {
    let mut current = document;
    for token in path {
        current = match current {
            Value::Object(fields) => fields
                .get_mut(token)
                .ok_or_else(|| invalid(format!("missing path element {token:?}")))?,
            Value::Array(items) => {
                let index = array_index(token, items.len(), false)?;
                &mut items[index]
            }
            _ => {
                return Err(invalid(format!(
                    "path element {token:?} is inside a scalar"
                )));
            }
        };
    }
    Ok(current)
}

fn add(document: &mut Value, path: &[String], value: Value) -> Result<(), JsonPatchError> {
    let Some((last, parent_path)) = path.split_last() else {
        *document = value;
        return Ok(());
    };
    match parent_of(document, parent_path)? {
        Value::Object(fields) => {
            fields.insert(last.clone(), value);
        }
        Value::Array(items) => {
            let index = array_index(last, items.len(), true)?;
            items.insert(index, value);
        }
        _ => return Err(invalid(format!("cannot add {last:?} to a scalar"))),
    }
    Ok(())
}

fn remove(document: &mut Value, path: &[String]) -> Result<Value, JsonPatchError> {
    let (last, parent_path) = path
        .split_last()
        .ok_or_else(|| invalid("cannot remove the whole document"))?;
    match parent_of(document, parent_path)? {
        Value::Object(fields) => fields
            .remove(last)
            .ok_or_else(|| invalid(format!("missing path element {last:?}"))),
        Value::Array(items) => {
            let index = array_index(last, items.len(), false)?;
            Ok(items.remove(index))
        }
        _ => Err(invalid(format!("cannot remove {last:?} from a scalar"))),
    }
}

fn lookup(document: &Value, path: &[String]) -> Result<Value, JsonPatchError> {
    let mut copy = document.clone();
    parent_of(&mut copy, path).map(|found| found.clone())
}

fn string_member<'a>(operation: &'a Value, member: &str) -> Result<&'a str, JsonPatchError> {
    operation
        .get(member)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("operation lacks a string {member:?}: {operation}")))
}

/// Applies an RFC 6902 patch to a copy of `document`; on any error the document is untouched.
pub fn json_patch(document: &Value, operations: &Value) -> Result<Value, JsonPatchError> {
    let operations = operations
        .as_array()
        .ok_or_else(|| invalid("a JSON patch must be an array of operations"))?;
    let mut patched = document.clone();
    for operation in operations {
        let op = string_member(operation, "op")?;
        let path = tokens(string_member(operation, "path")?)?;
        let value = || {
            operation
                .get("value")
                .cloned()
                .ok_or_else(|| invalid(format!("operation {op:?} lacks a value")))
        };
        match op {
            "add" => add(&mut patched, &path, value()?)?,
            "remove" => {
                remove(&mut patched, &path)?;
            }
            "replace" => {
                remove(&mut patched, &path)?;
                add(&mut patched, &path, value()?)?;
            }
            "move" => {
                let from = tokens(string_member(operation, "from")?)?;
                let moved = remove(&mut patched, &from)?;
                add(&mut patched, &path, moved)?;
            }
            "copy" => {
                let from = tokens(string_member(operation, "from")?)?;
                let copied = lookup(&patched, &from)?;
                add(&mut patched, &path, copied)?;
            }
            "test" => {
                let expected = value()?;
                let found = lookup(&patched, &path).map_err(|_| {
                    JsonPatchError::TestFailed(format!(
                        "testing value {} failed: path not found",
                        string_member(operation, "path").unwrap_or("")
                    ))
                })?;
                if found != expected {
                    return Err(JsonPatchError::TestFailed(format!(
                        "testing value {} failed: test failed",
                        string_member(operation, "path").unwrap_or("")
                    )));
                }
            }
            other => return Err(invalid(format!("unknown JSON patch operation {other:?}"))),
        }
    }
    Ok(patched)
}
