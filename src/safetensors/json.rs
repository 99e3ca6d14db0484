//! A JSON tree that keeps every key of every object, in order, so that
//! duplicate keys can be detected (serde_json's own `Value` silently keeps
//! the last of two equal keys). Keys arrive unescaped: `"a"` and `"\u0061"`
//! are the same string here.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// One JSON value; objects keep duplicate keys in document order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    /// Any other number.
    F64(f64),
    Str(String),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

impl Node {
    /// The first key that appears twice in this object (not recursive).
    pub(crate) fn duplicate_key(entries: &[(String, Node)]) -> Option<&str> {
        let mut seen = std::collections::HashSet::with_capacity(entries.len());
        entries
            .iter()
            .map(|(k, _)| k.as_str())
            .find(|k| !seen.insert(*k))
    }

    /// Converts to a serde_json value (duplicate keys: the last one wins,
    /// as serde_json does). Used for free-form metadata only.
    pub(crate) fn into_value(self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Node::Null => Value::Null,
            Node::Bool(b) => Value::Bool(b),
            Node::U64(n) => Value::from(n),
            Node::I64(n) => Value::from(n),
            Node::F64(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
            Node::Str(s) => Value::String(s),
            Node::Array(a) => Value::Array(a.into_iter().map(Node::into_value).collect()),
            Node::Object(o) => {
                Value::Object(o.into_iter().map(|(k, v)| (k, v.into_value())).collect())
            }
        }
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any json value")
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(if v >= 0 {
            Node::U64(v.unsigned_abs())
        } else {
            Node::I64(v)
        })
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::F64(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Node>()? {
            out.push(v);
        }
        Ok(Node::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Node>()? {
            out.push((k, v));
        }
        Ok(Node::Object(out))
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_duplicates_after_unescaping() {
        let n: Node =
            serde_json::from_str(r#"{"a": 1, "\u0061": [true, null, -2, 1.5, "x"]}"#).unwrap();
        let Node::Object(o) = n else {
            panic!("not an object")
        };
        assert_eq!(o.len(), 2);
        assert_eq!(Node::duplicate_key(&o), Some("a"));
        assert_eq!(
            o[1].1,
            Node::Array(vec![
                Node::Bool(true),
                Node::Null,
                Node::I64(-2),
                Node::F64(1.5),
                Node::Str("x".into())
            ])
        );
    }
}
