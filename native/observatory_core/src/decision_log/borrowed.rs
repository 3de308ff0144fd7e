//! A JSON document read without copying its text: strings without escapes borrow the
//! input bytes, objects are vectors sorted by key. The decision log reads every step
//! this way: building a `serde_json::Value` (a `String` per key and value, a B-tree per
//! object) was most of the cost of parsing a step.
//!
//! It means exactly what `serde_json::Value` means for the same text: the decision
//! log's own reader ([`reader`](super::reader)) reads it, leaving to serde_json's parser
//! every text it is not sure of (strict UTF-8, the escapes, numbers, the 128-level
//! nesting limit, the error messages are serde_json's), an
//! object's duplicate key keeps its last value, and members come out in the order of
//! `Value`'s `BTreeMap` (by key bytes). The one text `Value` reads differently — an
//! object whose first key is serde_json's private raw-value token — is refused here,
//! and [`Json::read`] reads it through `Value` instead.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

use crate::stable_json::{write_number, write_string};

/// A JSON value borrowing its strings where it can.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    Object(Object<'a>),
    /// A value left unread, as its canonical JSON text: `action.tool_input` or
    /// `action.result` read with [`Parts::CanonicalText`](super::reader::Parts), for
    /// hashing only. Never built by [`Json::read`].
    Canonical(&'a str),
}

/// An object's members sorted by key, each key once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object<'a>(Vec<(Cow<'a, str>, Json<'a>)>);

/// The key `serde_json::Value` reads as a raw value rather than as an object's key.
pub(super) const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'a> Json<'a> {
    /// Reads one JSON document as [`serde_json::from_slice`] would into a `Value`;
    /// `Err` carries serde_json's error for that `Value` (line and column).
    pub fn read(bytes: &'a [u8]) -> Result<Json<'a>, serde_json::Error> {
        match super::reader::read(bytes, super::reader::Parts::Built) {
            Some((json, _)) => Ok(json),
            None => Self::read_with_serde(bytes),
        }
    }

    /// [`read`](Self::read) by serde_json's parser alone: what `read` falls back on
    /// for any text its own reader leaves to serde_json.
    pub fn read_with_serde(bytes: &'a [u8]) -> Result<Json<'a>, serde_json::Error> {
        match serde_json::from_slice::<Json>(bytes) {
            Ok(json) => Ok(json),
            // Refused above (the raw-value token) or not JSON: `Value` gives the answer
            // and the error message, whichever it is.
            Err(_) => serde_json::from_slice::<Value>(bytes).map(Json::from),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(object) => object.get(key),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object<'a>> {
        match self {
            Json::Object(object) => Some(object),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null | Json::Canonical("null"))
    }

    /// The canonical JSON text of [`stable_stringify`](crate::stable_json::stable_stringify),
    /// appended to `out`: members are already in key order.
    pub fn write_canonical(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Number(n) => write_number(out, n),
            Json::String(s) => write_string(out, s),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_canonical(out);
                }
                out.push(']');
            }
            Json::Object(object) => object.write_canonical(out, |_| true),
            Json::Canonical(text) => out.push_str(text),
        }
    }
}

impl<'a> Object<'a> {
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        // An envelope's objects are small: a scan that compares lengths first costs
        // less than a binary search's ordered comparisons.
        if self.0.len() <= 16 {
            return self
                .0
                .iter()
                .find(|(k, _)| k.len() == key.len() && k.as_bytes() == key.as_bytes())
                .map(|(_, v)| v);
        }
        self.0
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Json<'a>)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The canonical text of the members `keep` accepts, appended to `out`.
    pub fn write_canonical(&self, out: &mut String, keep: impl Fn(&str) -> bool) {
        self.write_members(out, keep, |_, value, out| value.write_canonical(out));
    }

    /// The canonical text of the object, each member's value written by `write`.
    pub fn write_canonical_with(&self, out: &mut String, write: impl Fn(&str, &Json, &mut String)) {
        self.write_members(out, |_| true, write);
    }

    fn write_members(
        &self,
        out: &mut String,
        keep: impl Fn(&str) -> bool,
        write: impl Fn(&str, &Json, &mut String),
    ) {
        out.push('{');
        let mut first = true;
        for (key, value) in self.iter().filter(|(key, _)| keep(key)) {
            if !first {
                out.push(',');
            }
            first = false;
            write_string(out, key);
            out.push(':');
            write(key, value, out);
        }
        out.push('}');
    }

    /// Sorts members read in document order; of a repeated key the last value stays,
    /// as in `serde_json::Map` (a stable sort keeps repeats in reading order).
    pub(super) fn from_members(mut members: Vec<(Cow<'a, str>, Json<'a>)>) -> Self {
        if !members.is_sorted_by(|a, b| a.0 < b.0) {
            members.sort_by(|a, b| a.0.cmp(&b.0));
            let mut unique: Vec<(Cow<'a, str>, Json<'a>)> = Vec::with_capacity(members.len());
            for member in members {
                match unique.last_mut() {
                    Some(last) if last.0 == member.0 => *last = member,
                    _ => unique.push(member),
                }
            }
            members = unique;
        }
        Object(members)
    }
}

/// A `Value`'s tree, its strings moved, not copied.
impl From<Value> for Json<'static> {
    fn from(value: Value) -> Self {
        match value {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(b),
            Value::Number(n) => Json::Number(n),
            Value::String(s) => Json::String(Cow::Owned(s)),
            Value::Array(items) => Json::Array(items.into_iter().map(Json::from).collect()),
            // A `Map` iterates in key order, each key once.
            Value::Object(map) => Json::Object(Object(
                map.into_iter()
                    .map(|(k, v)| (Cow::Owned(k), Json::from(v)))
                    .collect(),
            )),
        }
    }
}

/// A `Value` seen as a tree borrowing its strings.
impl<'a> From<&'a Value> for Json<'a> {
    fn from(value: &'a Value) -> Self {
        match value {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => Json::Number(n.clone()),
            Value::String(s) => Json::String(Cow::Borrowed(s)),
            Value::Array(items) => Json::Array(items.iter().map(Json::from).collect()),
            Value::Object(map) => Json::Object(Object(
                map.iter()
                    .map(|(k, v)| (Cow::Borrowed(k.as_str()), Json::from(v)))
                    .collect(),
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Json<'de>, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Json<'de>, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Json<'de>, E> {
        // As `Value` does: a float that is not finite is null.
        Ok(Number::from_f64(n).map_or(Json::Null, Json::Number))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s)))
    }

    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json<'de>, D::Error> {
        Json::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        let mut members = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if members.is_empty() && key == RAW_VALUE_TOKEN {
                return Err(de::Error::custom("read as a raw value by serde_json"));
            }
            members.push((key, map.next_value()?));
        }
        Ok(Json::Object(Object::from_members(members)))
    }
}

/// An object's key, borrowed when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E>(self, s: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s))
    }
}
