//! Identifier newtypes. Ids are opaque strings chosen by the caller (or by the
//! runtime's id source); this crate never reads a clock or a random source.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest id accepted, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The string was empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// Which id type was being parsed.
        kind: &'static str,
    },
    /// The string was longer than [`MAX_ID_LEN`] bytes.
    #[error("{kind} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which id type was being parsed.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The string held whitespace or a control character.
    #[error("{kind} {value:?} contains whitespace or a control character at byte {at}")]
    BadCharacter {
        /// Which id type was being parsed.
        kind: &'static str,
        /// The rejected value.
        value: String,
        /// Byte offset of the first offending character.
        at: usize,
    },
}

fn check_id(kind: &'static str, s: &str) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if s.len() > MAX_ID_LEN {
        return Err(IdError::TooLong {
            kind,
            len: s.len(),
            max: MAX_ID_LEN,
        });
    }
    if let Some((at, _)) = s
        .char_indices()
        .find(|(_, c)| c.is_whitespace() || c.is_control())
    {
        return Err(IdError::BadCharacter {
            kind,
            value: s.to_owned(),
            at,
        });
    }
    Ok(())
}

macro_rules! define_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        ///
        /// Cheap to clone (a shared string). Parsing rejects empty strings, strings longer than
        /// [`MAX_ID_LEN`] bytes and strings holding whitespace or control characters.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            /// Parses an id, rejecting what [`IdError`] describes.
            pub fn new(value: impl AsRef<str>) -> Result<Self, IdError> {
                let value = value.as_ref();
                check_id($kind, value)?;
                Ok(Self(Arc::from(value)))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(s: &str) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

define_id!(
    /// Identifies a thread: one conversation with its history and thread-scoped state.
    ThreadId,
    "thread id"
);
define_id!(
    /// Identifies one run of an agent on a thread (a run may span several activations).
    RunId,
    "run id"
);
define_id!(
    /// Identifies one tool call, as given by the model.
    ToolCallId,
    "tool call id"
);
define_id!(
    /// Identifies a profile (a user or tenant) whose profile-scoped state runs share.
    ProfileId,
    "profile id"
);
