//! Config sections claimed by plugins, validated against their JSON Schemas at resolve time.

use std::sync::Arc;

use awaken_spec::Sections;
use serde_json::Value;

/// A section key and the JSON Schema its value must satisfy. The schema is compiled once, when
/// the `ConfigSchema` is made; keep it in the plugin and clone it (cheap) in
/// [`crate::Plugin::config_schemas`].
#[derive(Clone)]
pub struct ConfigSchema {
    section: String,
    schema: Value,
    validator: Arc<jsonschema::Validator>,
}

/// A schema that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("the JSON Schema of config section `{section}` is invalid: {message}")]
pub struct ConfigSchemaError {
    /// The section.
    pub section: String,
    /// The compiler's message.
    pub message: String,
}

impl ConfigSchema {
    /// Compiles `schema` for `section`.
    pub fn new(section: impl Into<String>, schema: Value) -> Result<Self, ConfigSchemaError> {
        let section = section.into();
        let validator = jsonschema::validator_for(&schema).map_err(|e| ConfigSchemaError {
            section: section.clone(),
            message: e.to_string(),
        })?;
        Ok(Self {
            section,
            schema,
            validator: Arc::new(validator),
        })
    }

    /// The section key.
    pub fn section(&self) -> &str {
        &self.section
    }

    /// The schema.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Every violation of `value`, with its JSON path.
    pub fn violations(&self, value: &Value) -> Vec<SectionViolation> {
        self.validator
            .iter_errors(value)
            .map(|e| SectionViolation {
                path: e.instance_path().to_string(),
                message: e.to_string(),
            })
            .collect()
    }
}

impl std::fmt::Debug for ConfigSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSchema")
            .field("section", &self.section)
            .field("schema", &self.schema)
            .finish()
    }
}

/// One schema violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionViolation {
    /// JSON pointer to the offending value inside the section (empty: the section itself).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for SectionViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.message)
    }
}

/// The outcome for one section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SectionStatus {
    /// Present and valid.
    Valid,
    /// Present and invalid: every violation.
    Invalid(Vec<SectionViolation>),
    /// Claimed but absent (allowed: the plugin uses its defaults).
    Missing,
    /// Present but claimed by no plugin (a warning).
    Unclaimed,
}

/// The outcome for one section key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionReport {
    /// The section key.
    pub section: String,
    /// The plugin that claims it, if any.
    pub claimed_by: Option<String>,
    /// Its status.
    pub status: SectionStatus,
}

/// Validates `sections` against the claimed schemas (`(plugin id, schema)` pairs). Returns one
/// report per claimed or present section, sorted by key. A section claimed twice is checked
/// against each claim and reported under the first claimant.
pub fn validate_sections<'a>(
    sections: &Sections,
    claims: impl IntoIterator<Item = &'a (String, ConfigSchema)>,
) -> Vec<SectionReport> {
    // A few sections at most: a list searched by name, sorted at the end (a map's node would
    // be a kilobyte allocated on every resolution).
    let mut reports: Vec<SectionReport> = Vec::new();
    for (plugin_id, schema) in claims {
        let section = schema.section();
        let status = match sections.get(section) {
            None => SectionStatus::Missing,
            Some(value) => {
                let violations = schema.violations(value);
                if violations.is_empty() {
                    SectionStatus::Valid
                } else {
                    SectionStatus::Invalid(violations)
                }
            }
        };
        match reports.iter_mut().find(|r| r.section == section) {
            Some(existing) => {
                if let (SectionStatus::Invalid(found), SectionStatus::Invalid(more)) =
                    (&mut existing.status, &status)
                {
                    found.extend(more.iter().cloned());
                } else if matches!(status, SectionStatus::Invalid(_)) {
                    existing.status = status;
                }
            }
            None => reports.push(SectionReport {
                section: section.to_owned(),
                claimed_by: Some(plugin_id.clone()),
                status,
            }),
        }
    }
    for key in sections.keys() {
        if !reports.iter().any(|r| r.section == *key) {
            reports.push(SectionReport {
                section: key.to_owned(),
                claimed_by: None,
                status: SectionStatus::Unclaimed,
            });
        }
    }
    reports.sort_by(|a, b| a.section.cmp(&b.section));
    reports
}
