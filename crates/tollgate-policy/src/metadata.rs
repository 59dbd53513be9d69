//! envoyproxy/ratelimit's descriptor `metadata`: free-form YAML that its
//! loader turns into a `google.protobuf.Struct` (`parseMetadata` in
//! `src/config/config_impl.go`) and its service returns in the response's
//! dynamic metadata. Kept here in the Struct's value model, so each Envoy
//! door can encode it in its wire format.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};

/// A Struct's fields by name. A `BTreeMap` so that answers list them in one
/// order (a Struct's fields have none; Go's maps randomise it).
pub type Metadata = BTreeMap<String, MetadataValue>;

/// One `google.protobuf.Value`.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    /// `null_value`.
    Null,
    /// `bool_value`.
    Bool(bool),
    /// `number_value`: every YAML number, as `structpb.NewValue` makes it a
    /// float64.
    Number(f64),
    /// `string_value`.
    String(String),
    /// `list_value`.
    List(Vec<MetadataValue>),
    /// `struct_value`.
    Struct(Metadata),
}

impl<'de> Deserialize<'de> for MetadataValue {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = MetadataValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<MetadataValue, E> {
        Ok(MetadataValue::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<MetadataValue, E> {
        Ok(MetadataValue::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<MetadataValue, D::Error> {
        MetadataValue::deserialize(d)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<MetadataValue, E> {
        Ok(MetadataValue::Bool(v))
    }

    #[expect(
        clippy::cast_precision_loss,
        reason = "a float64, as structpb makes it"
    )]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<MetadataValue, E> {
        Ok(MetadataValue::Number(v as f64))
    }

    #[expect(
        clippy::cast_precision_loss,
        reason = "a float64, as structpb makes it"
    )]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<MetadataValue, E> {
        Ok(MetadataValue::Number(v as f64))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<MetadataValue, E> {
        Ok(MetadataValue::Number(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<MetadataValue, E> {
        Ok(MetadataValue::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<MetadataValue, E> {
        Ok(MetadataValue::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MetadataValue, A::Error> {
        let mut list = Vec::new();
        while let Some(value) = seq.next_element()? {
            list.push(value);
        }
        Ok(MetadataValue::List(list))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MetadataValue, A::Error> {
        fields(map).map(MetadataValue::Struct)
    }
}

/// A mapping's fields, each key as its text (`convertMap`'s `%v`).
fn fields<'de, A: MapAccess<'de>>(mut map: A) -> Result<Metadata, A::Error> {
    let mut fields = Metadata::new();
    while let Some(Key(key)) = map.next_key()? {
        let value = map.next_value()?;
        // A repeated key: YAML decoders keep the last.
        fields.insert(key, value);
    }
    Ok(fields)
}

/// A mapping key: any scalar, as Go's `fmt.Sprintf("%v", k)` writes it.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                Ok(Key("<nil>".into()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A descriptor's `metadata` field: a mapping, or null; `None` when null or
/// empty, as `parseMetadata` returns no Struct for an empty mapping.
pub(crate) struct MetadataField(pub(crate) Option<Metadata>);

impl<'de> Deserialize<'de> for MetadataField {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MetadataField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_unit<E: de::Error>(self) -> Result<MetadataField, E> {
                Ok(MetadataField(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MetadataField, A::Error> {
                let fields = fields(map)?;
                Ok(MetadataField(Some(fields).filter(|f| !f.is_empty())))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(yaml: &str) -> Option<Metadata> {
        serde_saphyr::from_str::<Option<MetadataField>>(yaml)
            .expect("valid metadata")
            .and_then(|m| m.0)
    }

    #[test]
    fn yaml_becomes_struct_values() {
        let m = read("name: service_1\nweight: 5\nratio: 0.5\nenabled: true\nnone: ~\nlist: [a, 1]\nnested: {1: x}\n")
            .expect("fields");
        assert_eq!(m["name"], MetadataValue::String("service_1".into()));
        assert_eq!(m["weight"], MetadataValue::Number(5.0));
        assert_eq!(m["ratio"], MetadataValue::Number(0.5));
        assert_eq!(m["enabled"], MetadataValue::Bool(true));
        assert_eq!(m["none"], MetadataValue::Null);
        assert_eq!(
            m["list"],
            MetadataValue::List(vec![
                MetadataValue::String("a".into()),
                MetadataValue::Number(1.0)
            ])
        );
        let MetadataValue::Struct(nested) = &m["nested"] else {
            panic!("a struct: {:?}", m["nested"]);
        };
        assert_eq!(nested["1"], MetadataValue::String("x".into()));
    }

    #[test]
    fn empty_and_null_are_none() {
        assert_eq!(read("{}"), None);
        assert_eq!(read("~"), None);
    }
}
