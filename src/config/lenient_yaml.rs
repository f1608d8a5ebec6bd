//! A YAML document read as the kubelet reads its config file when strict decoding fails:
//! a key given twice keeps its last value (the kubelet logs "Using lenient decoding as
//! strict decoding failed" and starts). `serde_yaml_ng::Value` refuses such a mapping,
//! so the tree is built here, and each repeated key is reported with its path.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde_yaml_ng::value::{Tag, TaggedValue};
use serde_yaml_ng::{Mapping, Number, Value};

/// One YAML document as a value, with the dotted paths of keys that appeared more than
/// once (the last occurrence is in the value).
pub struct LenientDocument {
    pub value: Value,
    pub repeated_keys: Vec<String>,
}

pub fn read<'de, D: de::Deserializer<'de>>(document: D) -> Result<LenientDocument, D::Error> {
    let repeated = RefCell::new(Vec::new());
    let value = Node {
        path: String::new(),
        repeated: &repeated,
    }
    .deserialize(document)?;
    Ok(LenientDocument {
        value,
        repeated_keys: repeated.into_inner(),
    })
}

/// The seed for one node of the tree: where it is, and where repeats are recorded.
struct Node<'a> {
    path: String,
    repeated: &'a RefCell<Vec<String>>,
}

impl Node<'_> {
    /// The node under `key` of this mapping: `a.b` for plain names, `a["memory.available"]`
    /// for keys with other characters, as field errors name map keys.
    fn field(&self, key: &str) -> Node<'_> {
        let plain = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        let path = match (self.path.is_empty(), plain) {
            (true, true) => key.to_string(),
            (false, true) => format!("{}.{key}", self.path),
            (_, false) => format!("{}[{key:?}]", self.path),
        };
        self.at(path)
    }

    fn at(&self, path: String) -> Node<'_> {
        Node {
            path,
            repeated: self.repeated,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(Number::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(Number::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Number(Number::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) =
            seq.next_element_seed(self.at(format!("{}[{}]", self.path, items.len())))?
        {
            items.push(item);
        }
        Ok(Value::Sequence(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut mapping = Mapping::new();
        while let Some(key) = map.next_key_seed(self.at(self.path.clone()))? {
            let segment = match &key {
                Value::String(text) => text.clone(),
                Value::Number(number) => number.to_string(),
                Value::Bool(flag) => flag.to_string(),
                Value::Null => "null".to_string(),
                _ => "(a complex key)".to_string(),
            };
            let node = self.field(&segment);
            let path = node.path.clone();
            let value = map.next_value_seed(node)?;
            if mapping.insert(key, value).is_some() {
                let mut repeated = self.repeated.borrow_mut();
                if !repeated.contains(&path) {
                    repeated.push(path);
                }
            }
        }
        Ok(Value::Mapping(mapping))
    }

    /// A tagged value (`!custom 5`), which serde_yaml_ng hands over as an enum.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        let (tag, variant) = data.variant::<String>()?;
        let value = variant.newtype_variant_seed(self)?;
        Ok(Value::Tagged(Box::new(TaggedValue {
            tag: Tag::new(tag),
            value,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_str(text: &str) -> LenientDocument {
        read(serde_yaml_ng::Deserializer::from_str(text)).unwrap()
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_and_is_reported_by_path() {
        let document = read_str(
            "a: 1\nmap:\n  x: first\n  y: 2\n  x: last\nlist: [1, {k: v, k: w}]\na: 3\nevictionHard: {memory.available: 1Gi, memory.available: 2Gi}\n",
        );
        assert_eq!(document.value["a"], Value::from(3));
        assert_eq!(document.value["map"]["x"], Value::from("last"));
        assert_eq!(document.value["list"][1]["k"], Value::from("w"));
        assert_eq!(
            document.repeated_keys,
            [
                "map.x",
                "list[1].k",
                "a",
                "evictionHard[\"memory.available\"]"
            ]
        );
    }

    #[test]
    fn without_repeats_the_value_is_what_serde_yaml_ng_reads() {
        let text = "kind: K\nn: 1.5\nb: true\nnothing: ~\nnested: {list: [a, 2, -3]}\ntagged: !custom {x: 1}\n3: three\n";
        let document = read_str(text);
        let plain: Value = serde_yaml_ng::from_str(text).unwrap();
        assert_eq!(document.value, plain);
        assert!(document.repeated_keys.is_empty());
    }
}
