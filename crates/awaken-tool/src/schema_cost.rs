//! A bound, checked when a tool registers, on the work validating its arguments can take.
//!
//! A validator applies a schema's in-place subschemas (`allOf`, `anyOf`, `oneOf`, `not`,
//! `if`/`then`/`else`, `dependentSchemas`, references) to the same value, and a schema with
//! `unevaluatedProperties` or `unevaluatedItems` applies them again to learn what they
//! evaluated. Nested, or reached through references that share a target, that work grows
//! exponentially with the schema's size: a schema of a few hundred bytes can keep a validator
//! busy for minutes on `{}`. [`check`] walks the schema as validation does, following
//! references, and refuses a reference cycle that never moves into the value (validation
//! would not end) and a schema whose walk counts more than [`MAX_SCHEMA_COST`] steps.

use std::collections::HashMap;

use referencing::{Draft, Registry, Resolver, ResourceRef};
use serde_json::Value;

/// The most schema applications validating one value may take, counted as [`check`] counts
/// them: far above any real tool's schema (a thousand nested properties reused a hundred
/// times), and a few tens of milliseconds of validation at worst.
pub(crate) const MAX_SCHEMA_COST: u64 = 1_000_000;

/// How much more a schema with `unevaluatedProperties`/`unevaluatedItems` costs than its
/// in-place subschemas alone: they are evaluated once to validate and again for annotations.
const UNEVALUATED_FACTOR: u64 = 3;

/// Keywords whose subschema applies to the value itself.
const IN_PLACE_ONE: &[&str] = &["not", "if", "then", "else"];
const IN_PLACE_LIST: &[&str] = &["allOf", "anyOf", "oneOf"];
const IN_PLACE_MAP: &[&str] = &["dependentSchemas", "dependencies"];
/// Keywords whose subschemas apply to the value's members or items.
const CHILD_ONE: &[&str] = &[
    "items",
    "additionalItems",
    "additionalProperties",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];
const CHILD_LIST: &[&str] = &["prefixItems", "items"];
const CHILD_MAP: &[&str] = &["properties", "patternProperties"];

/// Why a schema was refused: where (a JSON Pointer into the schema) and what.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) path: String,
    pub(crate) message: String,
}

/// Checks that validating against `schema` (which compiled) ends, within [`MAX_SCHEMA_COST`].
pub(crate) fn check(schema: &Value) -> Result<(), Refusal> {
    let draft = Draft::default().detect(schema);
    let resource = draft.create_resource_ref(schema);
    let base = resource.id().unwrap_or("json-schema:///");
    let refused = |e: referencing::Error| Refusal {
        path: String::new(),
        message: format!("its references cannot be followed: {e}"),
    };
    let registry = Registry::new()
        .draft(draft)
        .add(base, resource)
        .and_then(|builder| builder.prepare())
        .map_err(refused)?;
    let mut base_uri = referencing::uri::from_str(base).map_err(refused)?;
    if base_uri.fragment().is_some_and(|f| f.as_str().is_empty()) {
        base_uri.set_fragment(None);
    }
    let mut walk = Walk {
        memo: HashMap::new(),
        stack: Vec::new(),
    };
    let root = Edge {
        step: Step::Root,
        path: String::new(),
        via: String::new(),
    };
    let (cost, _) = walk.cost(schema, draft, &registry.resolver(base_uri), root)?;
    if cost > MAX_SCHEMA_COST {
        return Err(too_costly());
    }
    Ok(())
}

fn too_costly() -> Refusal {
    Refusal {
        path: String::new(),
        message: format!(
            "validating a value against it could take more than {MAX_SCHEMA_COST} schema \
             applications (nested or shared in-place subschemas under `unevaluatedProperties` \
             or `unevaluatedItems`, or references reused too often)"
        ),
    }
}

/// How the walk reached a schema.
#[derive(Clone, Copy, PartialEq)]
enum Step {
    Root,
    /// Applied to the same value as its parent.
    InPlace,
    /// Applied to a member or an item of its parent's value.
    Child,
}

/// Which members of a value a child subschema applies to, as far as recursion goes.
#[derive(Debug, Clone, PartialEq)]
enum Member {
    /// The property of this name (`properties`).
    Property(String),
    /// Any property (`patternProperties`, `additionalProperties`, `unevaluatedProperties`,
    /// `propertyNames`).
    AnyProperty,
    /// The item at this index (`prefixItems`, an array of `items`).
    Item(usize),
    /// Any item (`items`, `additionalItems`, `contains`, `unevaluatedItems`).
    AnyItem,
}

impl Member {
    /// Whether both can apply to one member of one value.
    fn overlaps(&self, other: &Member) -> bool {
        use Member::{AnyItem, AnyProperty, Item, Property};
        match (self, other) {
            (Property(a), Property(b)) => a == b,
            (Item(a), Item(b)) => a == b,
            (Property(_) | AnyProperty, Property(_) | AnyProperty)
            | (Item(_) | AnyItem, Item(_) | AnyItem) => true,
            _ => false,
        }
    }

    /// The members `keyword`'s subschema at `key` applies to.
    fn of(keyword: &str, key: Key<'_>) -> Member {
        match (keyword, key) {
            ("properties", Key::Name(name)) => Member::Property(name.to_owned()),
            ("prefixItems" | "items", Key::Index(i)) => Member::Item(i),
            ("items" | "additionalItems" | "contains" | "unevaluatedItems", _) => Member::AnyItem,
            _ => Member::AnyProperty,
        }
    }
}

/// Where a subschema sits in its keyword's value.
#[derive(Clone, Copy)]
enum Key<'v> {
    /// The keyword's value is the subschema.
    Whole,
    /// At this name of an object of subschemas.
    Name(&'v str),
    /// At this index of an array of subschemas.
    Index(usize),
}

/// How the walk reaches a schema: the step, the schema's location (the reference's own text for
/// a reference target, as a pointer when it is one) and where the keyword that led there is.
struct Edge {
    step: Step,
    path: String,
    via: String,
}

/// A schema on the walk's path: its address (its identity: every schema the walk visits lives
/// in the document or in a built-in meta-schema), how it was reached, and its location.
struct Frame {
    address: usize,
    step: Step,
    path: String,
}

/// A reference back to a schema being walked (recursion): the schema, the members of its value
/// the recursion first moves into (`None` while the path back has stayed on the value), and
/// where the reference is.
#[derive(Debug, Clone, PartialEq)]
struct Recursion {
    target: usize,
    member: Option<Member>,
    via: String,
}

/// A schema's cost and the recursions out of it into schemas being walked above it.
type Walked = (u64, Vec<Recursion>);

/// Most recursions out of one schema the walk follows.
const MAX_RECURSIONS: usize = 256;

struct Walk {
    /// What each schema already walked gave, by address.
    memo: HashMap<usize, Walked>,
    stack: Vec<Frame>,
}

impl Walk {
    /// The cost of validating one value against `schema`, reached by `edge`, and the
    /// recursions out of it.
    fn cost(
        &mut self,
        schema: &Value,
        draft: Draft,
        resolver: &Resolver<'_>,
        edge: Edge,
    ) -> Result<Walked, Refusal> {
        let Edge { step, path, via } = edge;
        let Value::Object(object) = schema else {
            return Ok((1, Vec::new()));
        };
        let draft = draft.detect(schema);
        let address = std::ptr::from_ref(schema) as usize;
        if let Some((cost, out)) = self.memo.get(&address) {
            // Walked before: its recursions count again where their schema is being walked.
            let out = out
                .iter()
                .filter(|r| self.stack.iter().any(|f| f.address == r.target))
                .cloned()
                .collect();
            return Ok((*cost, out));
        }
        if let Some(at) = self.stack.iter().rposition(|f| f.address == address) {
            // A cycle: through a member or an item it ends with the value; in place it never does.
            let in_place = step == Step::InPlace
                && self.stack[at + 1..].iter().all(|f| f.step == Step::InPlace);
            if in_place {
                return Err(endless(&self.stack[at].path, via));
            }
            let recursion = Recursion {
                target: address,
                member: None,
                via,
            };
            return Ok((1, vec![recursion]));
        }
        let resolver = resolver
            .in_subresource(ResourceRef::new(schema, draft))
            .unwrap_or_else(|_| resolver.clone());
        self.stack.push(Frame {
            address,
            step,
            path,
        });
        let mut in_place: u64 = 0;
        let mut child: u64 = 0;
        let mut unevaluated = false;
        let mut recursions: Vec<Recursion> = Vec::new();
        for (keyword, value) in object {
            let keyword = keyword.as_str();
            let mut edges = Vec::new();
            if is_in_place(keyword, value) {
                for (sub_path, sub, _) in subschemas(keyword, value) {
                    let path = format!("{}/{}{sub_path}", self.top_path(), escape(keyword));
                    edges.push((sub, None, path));
                }
            } else if CHILD_ONE.contains(&keyword)
                || CHILD_LIST.contains(&keyword)
                || CHILD_MAP.contains(&keyword)
            {
                unevaluated |= keyword.starts_with("unevaluated");
                for (sub_path, sub, key) in subschemas(keyword, value) {
                    let path = format!("{}/{}{sub_path}", self.top_path(), escape(keyword));
                    edges.push((sub, Some(Member::of(keyword, key)), path));
                }
            } else if let Some(target) = self.reference(keyword, value, &resolver) {
                let (contents, resolver, draft) = target.into_inner();
                let edge = Edge {
                    step: Step::InPlace,
                    path: location(value.as_str().unwrap_or_default()),
                    via: format!("{}/{}", self.top_path(), escape(keyword)),
                };
                let (cost, out) = self.cost(contents, draft, &resolver, edge)?;
                in_place = in_place.saturating_add(cost);
                recursions.extend(out);
                continue;
            }
            for (sub, member, path) in edges {
                let edge = Edge {
                    step: if member.is_some() {
                        Step::Child
                    } else {
                        Step::InPlace
                    },
                    via: path.clone(),
                    path,
                };
                let (cost, out) = self.cost(sub, draft, &resolver, edge)?;
                if member.is_some() {
                    child = child.saturating_add(cost);
                } else {
                    in_place = in_place.saturating_add(cost);
                }
                // Moving up through a child step, a recursion's first member is that step's.
                recursions.extend(out.into_iter().map(|mut r| {
                    if member.is_some() {
                        r.member.clone_from(&member);
                    }
                    r
                }));
            }
            if in_place.saturating_add(child) > MAX_SCHEMA_COST || recursions.len() > MAX_RECURSIONS
            {
                return Err(too_costly());
            }
        }
        let frame = self.stack.pop();
        let (into_this, out): (Vec<Recursion>, Vec<Recursion>) =
            recursions.into_iter().partition(|r| r.target == address);
        check_recursions(frame.as_ref().map_or("", |f| f.path.as_str()), &into_this)?;
        let factor = if unevaluated { UNEVALUATED_FACTOR } else { 1 };
        let cost = in_place
            .saturating_mul(factor)
            .saturating_add(child)
            .saturating_add(1);
        if cost > MAX_SCHEMA_COST {
            return Err(too_costly());
        }
        self.memo.insert(address, (cost, out.clone()));
        Ok((cost, out))
    }

    /// Where a reference keyword leads, when it can be followed without the dynamic scope of a
    /// validation (the validator resolves the rest; its compile already proved they resolve).
    fn reference<'r>(
        &self,
        keyword: &str,
        value: &Value,
        resolver: &Resolver<'r>,
    ) -> Option<referencing::Resolved<'r>> {
        match (keyword, value) {
            ("$ref" | "$dynamicRef", Value::String(reference)) => resolver.lookup(reference).ok(),
            ("$recursiveRef", Value::String(_)) => resolver.lookup_recursive_ref().ok(),
            _ => None,
        }
    }

    fn top_path(&self) -> &str {
        self.stack.last().map_or("", |f| f.path.as_str())
    }
}

/// Whether `keyword` holds subschemas applied to the value itself (`dependencies` only for its
/// schema-valued entries; its arrays of names are not schemas).
fn is_in_place(keyword: &str, value: &Value) -> bool {
    IN_PLACE_ONE.contains(&keyword)
        || IN_PLACE_LIST.contains(&keyword)
        || (IN_PLACE_MAP.contains(&keyword) && value.is_object())
}

/// The subschemas a keyword holds, each with its pointer below the keyword and its key.
fn subschemas<'v>(keyword: &str, value: &'v Value) -> Vec<(String, &'v Value, Key<'v>)> {
    match value {
        Value::Array(items)
            if IN_PLACE_LIST.contains(&keyword) || CHILD_LIST.contains(&keyword) =>
        {
            items
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("/{i}"), v, Key::Index(i)))
                .collect()
        }
        Value::Object(map) if IN_PLACE_MAP.contains(&keyword) || CHILD_MAP.contains(&keyword) => {
            map.iter()
                .filter(|(_, v)| v.is_object() || v.is_boolean())
                .map(|(k, v)| (format!("/{}", escape(k)), v, Key::Name(k.as_str())))
                .collect()
        }
        Value::Object(_) | Value::Bool(_) => vec![(String::new(), value, Key::Whole)],
        _ => Vec::new(),
    }
}

/// Refuses recursions into the schema at `path` that reach one member of its value along two
/// paths, or none: the first makes validation work grow exponentially with the value's depth
/// (each level applies the schema twice to the level below), the second never ends.
fn check_recursions(path: &str, into_this: &[Recursion]) -> Result<(), Refusal> {
    for (i, r) in into_this.iter().enumerate() {
        let Some(member) = &r.member else {
            return Err(endless(path, r.via.clone()));
        };
        if let Some(other) = into_this[..i]
            .iter()
            .find(|o| o.member.as_ref().is_some_and(|m| m.overlaps(member)))
        {
            return Err(Refusal {
                message: format!(
                    "it applies {} again to one member of the value along two paths (through {} \
                     and {}): validation work would double with each level of the value",
                    pointer_or_root(path),
                    other.via,
                    r.via
                ),
                path: r.via.clone(),
            });
        }
    }
    Ok(())
}

/// The refusal of a reference at `via` that applies the schema at `path` to the value it came
/// from.
fn endless(path: &str, via: String) -> Refusal {
    Refusal {
        message: format!(
            "it applies {} to the value it is validating, through references that never move \
             into the value: validation would not end",
            pointer_or_root(path)
        ),
        path: via,
    }
}

/// A JSON Pointer segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// A reference target's location: its pointer when the reference is one into this document,
/// else the reference as written.
fn location(reference: &str) -> String {
    match reference.strip_prefix('#') {
        Some(pointer) if pointer.is_empty() || pointer.starts_with('/') => pointer.to_owned(),
        _ => reference.to_owned(),
    }
}

fn pointer_or_root(path: &str) -> String {
    if path.is_empty() {
        "the root schema".to_owned()
    } else {
        format!("the schema at {path}")
    }
}
