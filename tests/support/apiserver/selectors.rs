//! Label and field selectors with the grammar of `labels.Parse` and `fields.ParseSelector`.

use serde_json::Value;

use super::resources::ResourceType;

#[derive(Debug, Clone, PartialEq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelRequirement>);

/// Splits on commas that are not inside a `( ... )` value set.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, character) in text.char_indices() {
        match character {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
        .into_iter()
        .map(str::trim)
        .filter(|term| !term.is_empty())
        .collect()
}

fn value_set(text: &str, term: &str) -> Result<Vec<String>, String> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| {
            format!("unable to parse requirement: found '{term}', expected: '(' ... ')'")
        })?;
    Ok(inner
        .split(',')
        .map(|value| value.trim().to_string())
        .filter(|value| !value.is_empty())
        .collect())
}

fn parse_label_term(term: &str) -> Result<LabelRequirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(LabelRequirement::Absent(key.trim().to_string()));
    }
    let key_end = term
        .find(|character: char| character.is_whitespace() || character == '=' || character == '!');
    let (key, rest) = match key_end {
        Some(end) => (term[..end].to_string(), term[end..].trim_start()),
        None => return Ok(LabelRequirement::Exists(term.to_string())),
    };
    if key.is_empty() {
        return Err(format!(
            "unable to parse requirement: {term:?}: missing key"
        ));
    }
    if let Some(value) = rest.strip_prefix("!=") {
        return Ok(LabelRequirement::NotEquals(key, value.trim().to_string()));
    }
    if let Some(value) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
        return Ok(LabelRequirement::Equals(key, value.trim().to_string()));
    }
    if let Some(values) = rest.strip_prefix("notin") {
        return Ok(LabelRequirement::NotIn(key, value_set(values, term)?));
    }
    if let Some(values) = rest.strip_prefix("in") {
        return Ok(LabelRequirement::In(key, value_set(values, term)?));
    }
    if rest.is_empty() {
        return Ok(LabelRequirement::Exists(key));
    }
    Err(format!("unable to parse requirement: {term:?}"))
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        split_terms(text)
            .into_iter()
            .map(parse_label_term)
            .collect::<Result<_, _>>()
            .map(Self)
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| {
            labels
                .and_then(|labels| labels.get(key))
                .and_then(Value::as_str)
        };
        self.0.iter().all(|requirement| match requirement {
            LabelRequirement::Equals(key, value) => label(key) == Some(value.as_str()),
            LabelRequirement::NotEquals(key, value) => label(key) != Some(value.as_str()),
            LabelRequirement::In(key, values) => {
                label(key).is_some_and(|found| values.iter().any(|v| v == found))
            }
            LabelRequirement::NotIn(key, values) => {
                label(key).is_none_or(|found| !values.iter().any(|v| v == found))
            }
            LabelRequirement::Exists(key) => label(key).is_some(),
            LabelRequirement::Absent(key) => label(key).is_none(),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
struct FieldRequirement {
    field: String,
    equal: bool,
    value: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    /// Parses and checks each field against the labels the real server supports for the resource.
    pub fn parse(text: &str, resource_type: &ResourceType) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in text
            .split(',')
            .map(str::trim)
            .filter(|term| !term.is_empty())
        {
            let (field, equal, value) = if let Some((field, value)) = term.split_once("!=") {
                (field, false, value)
            } else if let Some((field, value)) = term.split_once("==") {
                (field, true, value)
            } else if let Some((field, value)) = term.split_once('=') {
                (field, true, value)
            } else {
                return Err(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            if !resource_type.supports_field_label(field) {
                return Err(format!("field label not supported: {field}"));
            }
            requirements.push(FieldRequirement {
                field: field.to_string(),
                equal,
                value: value.trim().to_string(),
            });
        }
        Ok(Self(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|requirement| {
            (field_value(object, &requirement.field) == requirement.value) == requirement.equal
        })
    }

    /// The name this selector pins with `metadata.name=`, as `watch_object` sends.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|requirement| requirement.equal && requirement.field == "metadata.name")
            .map(|requirement| requirement.value.as_str())
    }
}

/// A field's value as the server compares it: strings as-is, other scalars printed, missing as "".
fn field_value(object: &Value, path: &str) -> String {
    let pointer = format!("/{}", path.replace('.', "/"));
    match object.pointer(&pointer) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Bool(flag)) => flag.to_string(),
        Some(Value::Number(number)) => number.to_string(),
        _ => String::new(),
    }
}
