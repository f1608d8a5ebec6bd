//! Custom resources defined the way a cluster defines them, by creating a
//! CustomResourceDefinition, and the `Table` form kubectl asks for (`Accept: ...;as=Table`),
//! with each CRD's `additionalPrinterColumns` evaluated as the real server does: a
//! `Name` column first, `date` columns shown as an age, missing values as null.

use k8s_openapi::jiff;
use serde_json::{Value, json};

use super::resources::ResourceType;

/// One of a CRD version's `additionalPrinterColumns`.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub json_path: String,
    pub priority: i64,
    pub description: String,
}

/// What a CRD defines for the fake: one resource type per served version.
pub fn types_of_crd(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
    let group = text(&spec["group"]);
    let kind = text(&spec["names"]["kind"]);
    let plural = text(&spec["names"]["plural"]);
    let short_names: Vec<String> = spec["names"]["shortNames"]
        .as_array()
        .map(|names| names.iter().map(text).collect())
        .unwrap_or_default();
    let namespaced = spec["scope"] != "Cluster";
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|version| version["served"].as_bool().unwrap_or(true))
        .map(|version| {
            let columns = version["additionalPrinterColumns"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|column| PrinterColumn {
                    name: text(&column["name"]),
                    type_: text(&column["type"]),
                    json_path: text(&column["jsonPath"]),
                    priority: column["priority"].as_i64().unwrap_or(0),
                    description: text(&column["description"]),
                })
                .collect();
            ResourceType::custom(
                &group,
                &text(&version["name"]),
                &kind,
                &plural,
                namespaced,
                !version["subresources"]["status"].is_null(),
                short_names.clone(),
                columns,
            )
        })
        .collect()
}

/// Whether the client asked for the Table form.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .any(|media| media.split(';').any(|part| part.trim() == "as=Table"))
}

/// A simple JSONPath (`.spec.nodeName`, `.status.pause.reason`) into `object`.
fn at_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    path.trim_start_matches('.')
        .split('.')
        .filter(|segment| !segment.is_empty())
        .try_fold(object, |value, segment| value.get(segment))
        .filter(|value| !value.is_null())
}

/// An age as kubectl shows one: `45s`, `3m12s`, `5h`, `2d`.
fn age(timestamp: &str, now: jiff::Timestamp) -> Option<String> {
    let then: jiff::Timestamp = timestamp.parse().ok()?;
    let seconds = now.duration_since(then).as_secs().max(0);
    Some(match seconds {
        0..=119 => format!("{seconds}s"),
        120..=599 => format!("{}m{}s", seconds / 60, seconds % 60),
        600..=10_799 => format!("{}m", seconds / 60),
        10_800..=172_799 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    })
}

fn cell(object: &Value, column: &PrinterColumn, now: jiff::Timestamp) -> Value {
    let Some(value) = at_path(object, &column.json_path) else {
        return Value::Null;
    };
    match (column.type_.as_str(), value) {
        ("date", Value::String(text)) => age(text, now).map_or(Value::Null, Value::String),
        (_, Value::String(_) | Value::Number(_) | Value::Bool(_)) => value.clone(),
        (_, other) => Value::String(other.to_string()),
    }
}

/// `objects` as a `meta.k8s.io/v1` Table with the type's printer columns.
pub fn table(resource_type: &ResourceType, objects: &[Value], revision: u64) -> Value {
    let now = jiff::Timestamp::now();
    let mut definitions = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."
    })];
    let columns: Vec<PrinterColumn> = if resource_type.columns.is_empty() {
        vec![PrinterColumn {
            name: "Created At".to_string(),
            type_: "date".to_string(),
            json_path: ".metadata.creationTimestamp".to_string(),
            priority: 0,
            description: String::new(),
        }]
    } else {
        resource_type.columns.clone()
    };
    definitions.extend(columns.iter().map(|column| {
        json!({"name": column.name, "type": column.type_, "format": "",
               "priority": column.priority, "description": column.description})
    }));
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(columns.iter().map(|column| cell(object, column, now)));
            json!({
                "cells": cells,
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                           "metadata": object["metadata"].clone()},
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": revision.to_string()},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}
