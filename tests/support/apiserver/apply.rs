//! Server-side apply and `managedFields` bookkeeping, a documented subset of the real algorithm:
//!
//! - Ownership is tracked per leaf field. Maps are walked field by field; lists are atomic except
//!   the well-known map-lists keyed by a merge key (`conditions` by `type`; `containers`, `env`,
//!   `volumes`... by `name`; `ownerReferences` by `uid`), whose items are tracked one by one.
//! - Apply conflicts when it would change the value of a field another manager owns; `force=true`
//!   takes the field over. Applying an equal value shares ownership, as in the real server.
//! - Fields a manager applied before and omits now are removed unless another manager owns them.
//! - Non-apply writes (PUT, merge/JSON patch) give their manager ownership of the fields they
//!   changed, recorded with operation `Update`.
//! - No schema: scalar types are not checked and unknown fields of custom resources are kept.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// One owned field: `f:<name>` and `k:<json keys>` elements, exactly as in `FieldsV1`.
type FieldPath = Vec<String>;
type FieldSet = BTreeSet<FieldPath>;

/// Merge keys of the map-lists nodekeeper and its tests touch.
fn list_keys(field: &str) -> Option<&'static [&'static str]> {
    match field {
        "conditions" => Some(&["type"]),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "volumeMounts"
        | "imagePullSecrets" => Some(&["name"]),
        "ownerReferences" => Some(&["uid"]),
        _ => None,
    }
}

fn item_key(item: &Value, keys: &[&str]) -> Option<String> {
    let mut selected = Map::new();
    for key in keys {
        selected.insert((*key).to_string(), item.get(*key)?.clone());
    }
    Some(format!("k:{}", Value::Object(selected)))
}

fn keyed_items<'a>(field: Option<&str>, items: &'a [Value]) -> Option<Vec<(String, &'a Value)>> {
    let keys = list_keys(field?)?;
    items
        .iter()
        .map(|item| item_key(item, keys).map(|key| (key, item)))
        .collect()
}

/// System fields that nobody "manages".
fn is_untracked(path: &[String]) -> bool {
    match path.first().map(String::as_str) {
        Some("f:apiVersion" | "f:kind") => true,
        Some("f:metadata") => matches!(
            path.get(1).map(String::as_str),
            Some(
                "f:name"
                    | "f:namespace"
                    | "f:uid"
                    | "f:resourceVersion"
                    | "f:generation"
                    | "f:creationTimestamp"
                    | "f:managedFields"
                    | "f:deletionTimestamp"
                    | "f:deletionGracePeriodSeconds"
                    | "f:selfLink"
            )
        ),
        _ => false,
    }
}

fn collect_value(value: &Value, field: Option<&str>, prefix: &mut FieldPath, out: &mut FieldSet) {
    match value {
        Value::Object(fields) if !fields.is_empty() => collect_map(fields, prefix, out),
        Value::Array(items) => match keyed_items(field, items) {
            Some(keyed) if !keyed.is_empty() => {
                for (key, item) in keyed {
                    prefix.push(key);
                    out.insert(prefix.clone());
                    if let Value::Object(fields) = item {
                        collect_map(fields, prefix, out);
                    }
                    prefix.pop();
                }
            }
            _ => {
                out.insert(prefix.clone());
            }
        },
        _ => {
            out.insert(prefix.clone());
        }
    }
}

fn collect_map(fields: &Map<String, Value>, prefix: &mut FieldPath, out: &mut FieldSet) {
    for (name, value) in fields {
        prefix.push(format!("f:{name}"));
        collect_value(value, Some(name), prefix, out);
        prefix.pop();
    }
}

/// Every managed leaf (and keyed list item) in an object.
fn field_set(object: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Value::Object(fields) = object {
        collect_map(fields, &mut Vec::new(), &mut out);
    }
    out.retain(|path| !is_untracked(path));
    out
}

fn find_item(items: &[Value], key: &str) -> Option<usize> {
    let wanted: Map<String, Value> = serde_json::from_str(key.strip_prefix("k:")?).ok()?;
    items.iter().position(|item| {
        wanted
            .iter()
            .all(|(name, value)| item.get(name) == Some(value))
    })
}

fn lookup<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut current = object;
    for element in path {
        current = if let Some(name) = element.strip_prefix("f:") {
            current.get(name)?
        } else {
            let items = current.as_array()?;
            &items[find_item(items, element)?]
        };
    }
    Some(current)
}

fn remove_path(object: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut current = object;
    for element in parent_path {
        let next = if let Some(name) = element.strip_prefix("f:") {
            current.get_mut(name)
        } else {
            match current.as_array_mut() {
                Some(items) => match find_item(items, element) {
                    Some(index) => items.get_mut(index),
                    None => None,
                },
                None => None,
            }
        };
        match next {
            Some(next) => current = next,
            None => return,
        }
    }
    if let Some(name) = last.strip_prefix("f:") {
        if let Some(fields) = current.as_object_mut() {
            fields.remove(name);
        }
    } else if let Some(items) = current.as_array_mut()
        && let Some(index) = find_item(items, last)
    {
        items.remove(index);
    }
}

/// `.status.conditions[type="Ready"].status`, as the real server names a conflicting field.
fn render(path: &[String]) -> String {
    let mut text = String::new();
    for element in path {
        if let Some(name) = element.strip_prefix("f:") {
            text.push('.');
            text.push_str(name);
        } else if let Some(Ok(Value::Object(keys))) = element
            .strip_prefix("k:")
            .map(serde_json::from_str::<Value>)
        {
            let rendered: Vec<String> = keys
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            text.push_str(&format!("[{}]", rendered.join(",")));
        }
    }
    text
}

fn is_membership(path: &[String]) -> bool {
    path.last().is_some_and(|element| element.starts_with("k:"))
}

fn insert_path(node: &mut Map<String, Value>, path: &[String], is_member: bool) {
    match path.split_first() {
        Some((first, rest)) => {
            let child = node.entry(first.clone()).or_insert_with(|| json!({}));
            if let Value::Object(child) = child {
                insert_path(child, rest, is_member);
            }
        }
        None if is_member => {
            node.insert(".".to_string(), json!({}));
        }
        None => {}
    }
}

fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        insert_path(&mut root, path, is_membership(path));
    }
    Value::Object(root)
}

fn from_fields_v1(node: &Value, prefix: &mut FieldPath, out: &mut FieldSet) {
    let Some(children) = node.as_object() else {
        return;
    };
    for (element, child) in children {
        if element == "." {
            out.insert(prefix.clone());
            continue;
        }
        prefix.push(element.clone());
        if child.as_object().is_some_and(Map::is_empty) {
            out.insert(prefix.clone());
        } else {
            from_fields_v1(child, prefix, out);
        }
        prefix.pop();
    }
}

#[derive(Debug, Clone)]
struct ManagerEntry {
    manager: String,
    operation: String,
    subresource: String,
    api_version: String,
    time: String,
    fields: FieldSet,
}

fn read_managers(object: &Value) -> Vec<ManagerEntry> {
    let Some(entries) = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    entries
        .iter()
        .map(|entry| {
            let text = |name: &str| {
                entry
                    .get(name)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let mut fields = FieldSet::new();
            if let Some(fields_v1) = entry.get("fieldsV1") {
                from_fields_v1(fields_v1, &mut Vec::new(), &mut fields);
            }
            ManagerEntry {
                manager: text("manager"),
                operation: text("operation"),
                subresource: text("subresource"),
                api_version: text("apiVersion"),
                time: text("time"),
                fields,
            }
        })
        .collect()
}

fn write_managers(object: &mut Value, entries: &[ManagerEntry]) {
    let rendered: Vec<Value> = entries
        .iter()
        .filter(|entry| !entry.fields.is_empty())
        .map(|entry| {
            let mut rendered = json!({
                "manager": entry.manager,
                "operation": entry.operation,
                "apiVersion": entry.api_version,
                "time": entry.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&entry.fields),
            });
            if !entry.subresource.is_empty() {
                rendered["subresource"] = json!(entry.subresource);
            }
            rendered
        })
        .collect();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if rendered.is_empty() {
            metadata.remove("managedFields");
        } else {
            metadata.insert("managedFields".to_string(), Value::Array(rendered));
        }
    }
}

/// Which part of an object a write may touch, given the subresource it was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everything: the resource has no status subresource.
    Whole,
    /// The main resource of a kind with a status subresource: all but `.status`.
    MainWithoutStatus,
    /// The `/status` subresource: `.status` only.
    StatusOnly,
}

impl Scope {
    fn covers(self, path: &[String]) -> bool {
        let is_status = path.first().is_some_and(|element| element == "f:status");
        match self {
            Scope::Whole => true,
            Scope::MainWithoutStatus => !is_status,
            Scope::StatusOnly => is_status,
        }
    }

    fn subresource(self) -> &'static str {
        if self == Scope::StatusOnly {
            "status"
        } else {
            ""
        }
    }
}

/// Who is writing, for `managedFields`.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub time: &'a str,
    pub scope: Scope,
}

fn merge_applied(live: &mut Value, applied: &Value, field: Option<&str>) {
    match (live, applied) {
        (Value::Object(live_fields), Value::Object(applied_fields)) => {
            for (name, value) in applied_fields {
                match live_fields.get_mut(name) {
                    Some(existing) => merge_applied(existing, value, Some(name)),
                    None => {
                        live_fields.insert(name.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(live_items), Value::Array(applied_items))
            if keyed_items(field, applied_items).is_some() =>
        {
            let keyed = keyed_items(field, applied_items).unwrap_or_default();
            for (key, item) in keyed {
                match find_item(live_items, &key) {
                    Some(index) => merge_applied(&mut live_items[index], item, None),
                    None => live_items.push(item.clone()),
                }
            }
        }
        (live, applied) => *live = applied.clone(),
    }
}

/// A server-side apply of `applied` onto `live` (absent when creating). Returns the merged object
/// with updated `managedFields`, or the conflicts as (manager, field) pairs.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    writer: &Writer,
    force: bool,
) -> Result<Value, Vec<(String, String)>> {
    let mut merged = live.cloned().unwrap_or_else(|| json!({"metadata": {}}));
    let mut managers = read_managers(&merged);
    let applied_set: FieldSet = field_set(applied)
        .into_iter()
        .filter(|path| writer.scope.covers(path))
        .collect();

    let mut conflicts = Vec::new();
    for entry in managers
        .iter_mut()
        .filter(|entry| entry.manager != writer.manager)
    {
        let contested: Vec<FieldPath> = entry
            .fields
            .intersection(&applied_set)
            .filter(|path| !is_membership(path) && lookup(&merged, path) != lookup(applied, path))
            .cloned()
            .collect();
        for path in contested {
            if force {
                entry.fields.remove(&path);
            } else {
                conflicts.push((entry.manager.clone(), render(&path)));
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }

    let is_own_apply = |entry: &ManagerEntry| {
        entry.manager == writer.manager
            && entry.operation == "Apply"
            && entry.subresource == writer.scope.subresource()
    };
    let previously_applied: FieldSet = managers
        .iter()
        .filter(|entry| is_own_apply(entry))
        .flat_map(|entry| entry.fields.clone())
        .collect();
    let owned_by_others: FieldSet = managers
        .iter()
        .filter(|entry| !is_own_apply(entry))
        .flat_map(|entry| entry.fields.clone())
        .collect();
    let mut abandoned: Vec<&FieldPath> = previously_applied
        .iter()
        .filter(|path| !applied_set.contains(*path) && !owned_by_others.contains(*path))
        .collect();
    abandoned.sort_by_key(|path| std::cmp::Reverse(path.len()));
    for path in abandoned {
        remove_path(&mut merged, path);
    }

    merge_applied(&mut merged, applied, None);

    managers.retain(|entry| !is_own_apply(entry));
    managers.push(ManagerEntry {
        manager: writer.manager.to_string(),
        operation: "Apply".to_string(),
        subresource: writer.scope.subresource().to_string(),
        api_version: writer.api_version.to_string(),
        time: writer.time.to_string(),
        fields: applied_set,
    });
    write_managers(&mut merged, &managers);
    Ok(merged)
}

/// Records a non-apply write: `writer` takes the fields whose values changed; removed fields are
/// forgotten by everyone. `updated` gets the bookkeeping of `previous` (clients cannot forge it).
pub fn record_update(previous: Option<&Value>, updated: &mut Value, writer: &Writer) {
    let empty = json!({});
    let before = previous.unwrap_or(&empty);
    let mut managers = read_managers(before);
    let old_fields = field_set(before);
    let new_fields = field_set(updated);
    let changed: FieldSet = new_fields
        .iter()
        .filter(|path| lookup(before, path) != lookup(updated, path))
        .cloned()
        .collect();
    let removed: FieldSet = old_fields.difference(&new_fields).cloned().collect();
    for entry in &mut managers {
        entry
            .fields
            .retain(|path| !changed.contains(path) && !removed.contains(path));
    }
    if !changed.is_empty() {
        let subresource = writer.scope.subresource();
        let position = managers.iter().position(|entry| {
            entry.manager == writer.manager
                && entry.operation == "Update"
                && entry.subresource == subresource
        });
        let entry = match position {
            Some(index) => &mut managers[index],
            None => {
                managers.push(ManagerEntry {
                    manager: writer.manager.to_string(),
                    operation: "Update".to_string(),
                    subresource: subresource.to_string(),
                    api_version: writer.api_version.to_string(),
                    time: String::new(),
                    fields: FieldSet::new(),
                });
                let last = managers.len() - 1;
                &mut managers[last]
            }
        };
        entry.fields.extend(changed);
        entry.time = writer.time.to_string();
    }
    write_managers(updated, &managers);
}
