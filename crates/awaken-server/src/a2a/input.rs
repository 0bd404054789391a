//! What the server reads of a client's message: its text, and the decisions it gives on
//! waiting calls.
//!
//! Decisions come as a data part `{"decisions": [{"call_id": "…", "approve": true}]}` (also
//! `callId`; `"decision": "approve" | "deny"` instead of `approve`; an optional
//! `argument_digest` and `payload`), or, when exactly one call waits, as the message's whole
//! text: `yes`, `y`, `ok`, `approve`, `approved` approve it; `no`, `n`, `deny`, `denied`,
//! `reject` deny it (any case, trailing `.` or `!` ignored). When that one call asks for a text
//! answer (a remote agent's question), the whole text is the answer instead.

use awaken_a2a::{A2aError, Message, PartContent, Role};
use awaken_event::{ResumeDecision, SuspendTicket};
use serde_json::{Map, Value};

use crate::runs::Decision;

/// A message as the server reads it.
#[derive(Debug, Default)]
pub(crate) struct Input {
    /// Its text parts, and its data parts other than decisions as JSON text, one per line.
    pub(crate) text: String,
    /// The decisions of its data parts.
    pub(crate) decisions: Vec<Decision>,
}

impl Input {
    /// Reads `message`, naming the part at fault.
    pub(crate) fn read(message: &Message) -> Result<Self, A2aError> {
        if message.role != Role::User {
            return Err(A2aError::InvalidParams {
                field: "message.role".to_owned(),
                detail: "a client's message has role `ROLE_USER`".to_owned(),
            });
        }
        if message.parts.is_empty() {
            return Err(A2aError::InvalidParams {
                field: "message.parts".to_owned(),
                detail: "the message has no part".to_owned(),
            });
        }
        let mut input = Input::default();
        let mut lines = Vec::new();
        for (index, part) in message.parts.iter().enumerate() {
            match &part.content {
                PartContent::Text(text) => lines.push(text.clone()),
                PartContent::Data(Value::Object(data)) if data.contains_key("decisions") => {
                    input.decisions.extend(decisions(index, data)?);
                }
                PartContent::Data(other) => lines.push(other.to_string()),
                PartContent::Raw(_) | PartContent::Url(_) => {
                    return Err(A2aError::ContentTypeNotSupported {
                        index,
                        kind: part.kind().to_owned(),
                    });
                }
            }
        }
        input.text = lines.join("\n");
        Ok(input)
    }

    /// The decision the text gives on the one call of `waiting`: the answer itself when the
    /// call asks for a text answer, else a yes or a no.
    pub(crate) fn decision_on(&self, waiting: &[SuspendTicket]) -> Option<Decision> {
        let [only] = waiting else {
            return None;
        };
        let decision = |decision, payload| Decision {
            call_id: only.call.call_id.to_string(),
            decision,
            argument_digest: None,
            payload,
        };
        let wants_text = only
            .response_schema
            .as_ref()
            .and_then(|schema| schema.get("type"))
            .and_then(Value::as_str)
            == Some("string");
        if wants_text && !self.text.trim().is_empty() {
            let answer = Value::String(self.text.clone());
            return Some(decision(ResumeDecision::Approve, Some(answer)));
        }
        self.yes_or_no().map(|d| decision(d, None))
    }

    /// The decision the text gives, read as a yes or a no.
    pub(crate) fn yes_or_no(&self) -> Option<ResumeDecision> {
        let word = self
            .text
            .trim()
            .trim_end_matches(['.', '!'])
            .to_ascii_lowercase();
        match word.as_str() {
            "yes" | "y" | "ok" | "okay" | "approve" | "approved" => Some(ResumeDecision::Approve),
            "no" | "n" | "deny" | "denied" | "reject" => Some(ResumeDecision::Deny),
            _ => None,
        }
    }
}

/// The decisions of the data part at `index`.
fn decisions(index: usize, data: &Map<String, Value>) -> Result<Vec<Decision>, A2aError> {
    let field = |at: Option<usize>| match at {
        Some(at) => format!("message.parts[{index}].data.decisions[{at}]"),
        None => format!("message.parts[{index}].data.decisions"),
    };
    let Some(Value::Array(entries)) = data.get("decisions") else {
        return Err(A2aError::InvalidParams {
            field: field(None),
            detail: "`decisions` must be an array of `{\"call_id\", \"approve\"}` objects"
                .to_owned(),
        });
    };
    entries
        .iter()
        .enumerate()
        .map(|(at, entry)| {
            let bad = |detail: &str| A2aError::InvalidParams {
                field: field(Some(at)),
                detail: detail.to_owned(),
            };
            let Value::Object(entry) = entry else {
                return Err(bad("a decision is an object"));
            };
            let string = |keys: [&str; 2]| {
                keys.iter()
                    .find_map(|k| entry.get(*k))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let Some(call_id) = string(["call_id", "callId"]) else {
                return Err(bad("the decision names no `call_id`"));
            };
            let decision = match (entry.get("approve"), entry.get("decision")) {
                (Some(Value::Bool(true)), None) => ResumeDecision::Approve,
                (Some(Value::Bool(false)), None) => ResumeDecision::Deny,
                (None, Some(Value::String(d))) if d == "approve" => ResumeDecision::Approve,
                (None, Some(Value::String(d))) if d == "deny" => ResumeDecision::Deny,
                _ => {
                    return Err(bad(
                        "give either `approve` (true or false) or `decision` (\"approve\" or \"deny\")",
                    ));
                }
            };
            Ok(Decision {
                call_id,
                decision,
                argument_digest: string(["argument_digest", "argumentDigest"]),
                payload: entry.get("payload").filter(|p| !p.is_null()).cloned(),
            })
        })
        .collect()
}
