//! NIFs behind `Observatory.JSON`: JSON text ↔ Erlang terms, via serde_json.
//!
//! Decoding: objects become maps with binary keys, arrays lists, strings binaries,
//! `null` `nil`, numbers integers or floats. Encoding accepts maps (binary or atom
//! keys), lists, binaries (UTF-8), numbers, `true`/`false`/`nil` and other atoms (as
//! strings); tuples, pids, refs, funs, structs and invalid UTF-8 are refused with a
//! reason. Inputs above a few tens of KiB go to the dirty-scheduler twins.

use observatory_core::decision_log::Json as Tree;
use rustler::sys::{self, ErlNifEnv, ErlNifTerm};
use rustler::types::map::MapIterator;
use rustler::{Binary, Encoder, Env, NewBinary, Term, TermType};
use serde::ser::{Error as _, SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::atoms;

/// Deeper terms are refused when encoding (decoding is limited by serde_json alike).
const MAX_DEPTH: u32 = 128;

#[rustler::nif]
fn json_decode<'a>(env: Env<'a>, text: Binary<'a>) -> Term<'a> {
    decode(env, text)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn json_decode_dirty<'a>(env: Env<'a>, text: Binary<'a>) -> Term<'a> {
    decode(env, text)
}

#[rustler::nif]
fn json_encode<'a>(env: Env<'a>, term: Term<'a>) -> Term<'a> {
    encode(env, term)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn json_encode_dirty<'a>(env: Env<'a>, term: Term<'a>) -> Term<'a> {
    encode(env, term)
}

/// SHA-256 of the term's canonical JSON (sorted keys): `{:ok, digest}` or
/// `{:error, reason}`. The breaker's arguments hash.
#[rustler::nif(schedule = "DirtyCpu")]
fn json_stable_hash<'a>(env: Env<'a>, term: Term<'a>) -> Term<'a> {
    match serde_json::to_value(Json { term, depth: 0 }) {
        Ok(value) => (
            atoms::ok(),
            binary(env, &observatory_core::stable_json::stable_hash(&value)),
        )
            .encode(env),
        Err(e) => (atoms::error(), e.to_string()).encode(env),
    }
}

fn decode<'a>(env: Env<'a>, text: Binary<'a>) -> Term<'a> {
    match serde_json::from_slice::<Value>(text.as_slice()) {
        Ok(value) => (atoms::ok(), value_to_term(env, &value)).encode(env),
        Err(e) => (atoms::error(), e.to_string()).encode(env),
    }
}

fn encode<'a>(env: Env<'a>, term: Term<'a>) -> Term<'a> {
    match serde_json::to_vec(&Json { term, depth: 0 }) {
        Ok(bytes) => (atoms::ok(), binary(env, &bytes)).encode(env),
        Err(e) => (atoms::error(), e.to_string()).encode(env),
    }
}

pub fn binary<'a>(env: Env<'a>, bytes: &[u8]) -> Term<'a> {
    let mut out = NewBinary::new(env, bytes.len());
    out.as_mut_slice().copy_from_slice(bytes);
    Binary::from(out).encode(env)
}

/// A JSON value as a term (see the module doc for the mapping).
pub fn value_to_term<'a>(env: Env<'a>, value: &Value) -> Term<'a> {
    let build = Build::new(env);
    // SAFETY: a term the env's own calls made.
    unsafe { Term::new(env, build.value(value)) }
}

/// A decision log's tree as a term: the same term [`value_to_term`] makes of the
/// same document. Its strings are copies, not sub-binaries of the body: measured, a
/// sub-binary was no cheaper than the copy of a 3.6 KiB string (docs/ingest-cost.md),
/// and it would keep the whole body alive with any string a holder keeps.
// Not inlined: the parse without the term keeps its own code as it was.
#[inline(never)]
pub fn tree_to_term<'a>(env: Env<'a>, value: &Tree) -> Term<'a> {
    let build = Build::new(env);
    // SAFETY: a term the env's own calls made.
    unsafe { Term::new(env, build.tree(value)) }
}

/// Makes a JSON document's term (a `serde_json::Value` or a decision log's tree) by
/// the NIF API's own calls, each term one word:
/// rustler's `Term` carries its env along (three words), which moved through every
/// call and array cost more than the calls, and its map constructor copies both
/// arrays into two vectors per object.
struct Build {
    env: *mut ErlNifEnv,
    nil: ErlNifTerm,
    yes: ErlNifTerm,
    no: ErlNifTerm,
    empty_list: ErlNifTerm,
}

impl Build {
    fn new(env: Env<'_>) -> Self {
        Build {
            env: env.as_c_arg(),
            nil: rustler::types::atom::nil().as_c_arg(),
            yes: rustler::types::atom::true_().as_c_arg(),
            no: rustler::types::atom::false_().as_c_arg(),
            empty_list: Term::list_new_empty(env).as_c_arg(),
        }
    }

    fn tree(&self, value: &Tree) -> ErlNifTerm {
        match value {
            Tree::Null => self.nil,
            Tree::Bool(b) => self.bool(*b),
            Tree::Number(n) => self.number(n),
            Tree::String(s) => self.binary(s.as_bytes()),
            Tree::Array(items) => self.list(items.iter().map(|v| self.tree(v))),
            Tree::Object(object) => {
                self.object(object.len(), object.iter().map(|(k, v)| (k, self.tree(v))))
            }
            // Not built by the parse that makes the envelope's term; read here if ever met.
            Tree::Canonical(text) => match Tree::read(text.as_bytes()) {
                Ok(tree) => self.tree(&tree),
                Err(_) => self.nil,
            },
        }
    }

    fn value(&self, value: &Value) -> ErlNifTerm {
        match value {
            Value::Null => self.nil,
            Value::Bool(b) => self.bool(*b),
            Value::Number(n) => self.number(n),
            Value::String(s) => self.binary(s.as_bytes()),
            Value::Array(items) => self.list(items.iter().map(|v| self.value(v))),
            Value::Object(map) => self.object(
                map.len(),
                map.iter().map(|(k, v)| (k.as_str(), self.value(v))),
            ),
        }
    }

    fn bool(&self, b: bool) -> ErlNifTerm {
        if b {
            self.yes
        } else {
            self.no
        }
    }

    /// An integer as an integer, any other number as a float.
    fn number(&self, n: &serde_json::Number) -> ErlNifTerm {
        // SAFETY: the env is the NIF call's.
        unsafe {
            match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => sys::enif_make_int64(self.env, i),
                (None, Some(u)) => sys::enif_make_uint64(self.env, u),
                _ => sys::enif_make_double(self.env, n.as_f64().unwrap_or(0.0)),
            }
        }
    }

    /// A new binary of `bytes`.
    fn binary(&self, bytes: &[u8]) -> ErlNifTerm {
        let mut term = ErlNifTerm::default();
        // SAFETY: the env is the NIF call's; the new binary has room for `bytes`.
        unsafe {
            let data = sys::enif_make_new_binary(self.env, bytes.len(), &mut term);
            if !bytes.is_empty() {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, bytes.len());
            }
        }
        term
    }

    /// A list of the items' terms, built from the tail, cell by cell.
    fn list(&self, items: impl DoubleEndedIterator<Item = ErlNifTerm>) -> ErlNifTerm {
        items.rev().fold(self.empty_list, |list, item| {
            // SAFETY: the env is the NIF call's, both terms its own.
            unsafe { sys::enif_make_list_cell(self.env, item, list) }
        })
    }

    /// A map of an object's `len` members, each key's binary made before its value's
    /// term; most objects are small: their terms go on the stack.
    fn object<'k>(
        &self,
        len: usize,
        members: impl Iterator<Item = (&'k str, ErlNifTerm)>,
    ) -> ErlNifTerm {
        let mut map = ErlNifTerm::default();
        let made = if len <= SMALL_OBJECT {
            let (mut keys, mut values) = ([map; SMALL_OBJECT], [map; SMALL_OBJECT]);
            for (i, (key, value)) in members.enumerate() {
                keys[i] = self.binary(key.as_bytes());
                values[i] = value;
            }
            self.map(&keys[..len], &values[..len], &mut map)
        } else {
            let (keys, values): (Vec<ErlNifTerm>, Vec<ErlNifTerm>) = members
                .map(|(key, value)| (self.binary(key.as_bytes()), value))
                .unzip();
            self.map(&keys, &values, &mut map)
        };
        assert!(made, "JSON object keys are unique");
        map
    }

    fn map(&self, keys: &[ErlNifTerm], values: &[ErlNifTerm], out: &mut ErlNifTerm) -> bool {
        // SAFETY: the env is the NIF call's, both arrays `keys.len()` of its terms long.
        unsafe {
            sys::enif_make_map_from_arrays(
                self.env,
                keys.as_ptr(),
                values.as_ptr(),
                keys.len(),
                out,
            ) != 0
        }
    }
}

/// Objects up to this many members are built without allocating (see [`Build::object`]).
const SMALL_OBJECT: usize = 16;

/// A term serialized as JSON.
struct Json<'a> {
    term: Term<'a>,
    depth: u32,
}

impl Json<'_> {
    fn child<'b>(&self, term: Term<'b>) -> Json<'b> {
        Json {
            term,
            depth: self.depth + 1,
        }
    }
}

impl Serialize for Json<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.depth > MAX_DEPTH {
            return Err(S::Error::custom("nesting deeper than 128 levels"));
        }
        let term = self.term;
        match term.get_type() {
            TermType::Atom => {
                let name = term
                    .atom_to_string()
                    .map_err(|_| S::Error::custom("unreadable atom"))?;
                match name.as_str() {
                    "true" => s.serialize_bool(true),
                    "false" => s.serialize_bool(false),
                    "nil" => s.serialize_unit(),
                    other => s.serialize_str(other),
                }
            }
            TermType::Integer => match (term.decode::<i64>(), term.decode::<u64>()) {
                (Ok(i), _) => s.serialize_i64(i),
                (_, Ok(u)) => s.serialize_u64(u),
                _ => Err(S::Error::custom("integer out of the 64-bit range")),
            },
            TermType::Float => s.serialize_f64(
                term.decode::<f64>()
                    .map_err(|_| S::Error::custom("bad float"))?,
            ),
            TermType::Binary => s.serialize_str(utf8(term).map_err(S::Error::custom)?),
            TermType::List => {
                let items = term
                    .into_list_iterator()
                    .map_err(|_| S::Error::custom("improper list"))?;
                let mut seq = s.serialize_seq(None)?;
                for item in items {
                    seq.serialize_element(&self.child(item))?;
                }
                seq.end()
            }
            TermType::Map => {
                let entries = MapIterator::new(term).ok_or_else(|| S::Error::custom("bad map"))?;
                let mut map = s.serialize_map(None)?;
                for (key, value) in entries {
                    map.serialize_entry(
                        &key_string(key).map_err(S::Error::custom)?,
                        &self.child(value),
                    )?;
                }
                map.end()
            }
            other => Err(S::Error::custom(format!(
                "cannot encode a {other:?} as JSON"
            ))),
        }
    }
}

fn utf8<'a>(term: Term<'a>) -> Result<&'a str, &'static str> {
    let bin = term.decode::<Binary>().map_err(|_| "bad binary")?;
    std::str::from_utf8(bin.as_slice()).map_err(|_| "a string is not valid UTF-8")
}

fn key_string(key: Term<'_>) -> Result<String, String> {
    match key.get_type() {
        TermType::Binary => utf8(key).map(str::to_owned).map_err(str::to_owned),
        TermType::Atom => {
            let name = key
                .atom_to_string()
                .map_err(|_| "unreadable atom".to_owned())?;
            if name == "__struct__" {
                Err("structs cannot be encoded as JSON; convert them to maps first".to_owned())
            } else {
                Ok(name)
            }
        }
        other => Err(format!(
            "map keys must be strings or atoms, got a {other:?}"
        )),
    }
}
