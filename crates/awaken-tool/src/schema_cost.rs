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
    let cost = walk.cost(schema, draft, &registry.resolver(base_uri), root)?;
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

struct Walk {
    /// The cost of each schema already walked, by address.
    memo: HashMap<usize, u64>,
    stack: Vec<Frame>,
}

impl Walk {
    /// The cost of validating one value against `schema`, reached by `edge`.
    fn cost(
        &mut self,
        schema: &Value,
        draft: Draft,
        resolver: &Resolver<'_>,
        edge: Edge,
    ) -> Result<u64, Refusal> {
        let Edge { step, path, via } = edge;
        let Value::Object(object) = schema else {
            return Ok(1);
        };
        let draft = draft.detect(schema);
        let address = std::ptr::from_ref(schema) as usize;
        if let Some(&cost) = self.memo.get(&address) {
            return Ok(cost);
        }
        if let Some(at) = self.stack.iter().rposition(|f| f.address == address) {
            // A cycle: through a member or an item it ends with the value; in place it never does.
            let in_place = step == Step::InPlace
                && self.stack[at + 1..].iter().all(|f| f.step == Step::InPlace);
            if in_place {
                return Err(Refusal {
                    message: format!(
                        "it applies {} to the value it is validating, through references that \
                         never move into the value: validation would not end",
                        pointer_or_root(&self.stack[at].path)
                    ),
                    path: via,
                });
            }
            return Ok(1);
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
        for (keyword, value) in object {
            let keyword = keyword.as_str();
            let (step, sum) = if is_in_place(keyword, value) {
                (Step::InPlace, &mut in_place)
            } else if CHILD_ONE.contains(&keyword)
                || CHILD_LIST.contains(&keyword)
                || CHILD_MAP.contains(&keyword)
            {
                unevaluated |= keyword.starts_with("unevaluated");
                (Step::Child, &mut child)
            } else if let Some(target) = self.reference(keyword, value, &resolver) {
                let (contents, resolver, draft) = target.into_inner();
                let edge = Edge {
                    step: Step::InPlace,
                    path: location(value.as_str().unwrap_or_default()),
                    via: format!("{}/{}", self.top_path(), escape(keyword)),
                };
                in_place = in_place.saturating_add(self.cost(contents, draft, &resolver, edge)?);
                continue;
            } else {
                continue;
            };
            for (sub_path, sub) in subschemas(keyword, value) {
                let path = format!("{}/{}{sub_path}", self.top_path(), escape(keyword));
                let edge = Edge {
                    step,
                    via: path.clone(),
                    path,
                };
                *sum = sum.saturating_add(self.cost(sub, draft, &resolver, edge)?);
            }
            if in_place.saturating_add(child) > MAX_SCHEMA_COST {
                return Err(too_costly());
            }
        }
        self.stack.pop();
        let factor = if unevaluated { UNEVALUATED_FACTOR } else { 1 };
        let cost = in_place
            .saturating_mul(factor)
            .saturating_add(child)
            .saturating_add(1);
        if cost > MAX_SCHEMA_COST {
            return Err(too_costly());
        }
        self.memo.insert(address, cost);
        Ok(cost)
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

/// The subschemas a keyword holds, each with its pointer below the keyword.
fn subschemas<'v>(keyword: &str, value: &'v Value) -> Vec<(String, &'v Value)> {
    match value {
        Value::Array(items)
            if IN_PLACE_LIST.contains(&keyword) || CHILD_LIST.contains(&keyword) =>
        {
            items
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("/{i}"), v))
                .collect()
        }
        Value::Object(map) if IN_PLACE_MAP.contains(&keyword) || CHILD_MAP.contains(&keyword) => {
            map.iter()
                .filter(|(_, v)| v.is_object() || v.is_boolean())
                .map(|(k, v)| (format!("/{}", escape(k)), v))
                .collect()
        }
        Value::Object(_) | Value::Bool(_) => vec![(String::new(), value)],
        _ => Vec::new(),
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
