//! Durations written as `"500ms"`, `"30s"`, `"2m"`, `"1h"` or a whole number of seconds.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::SpecError;

/// A duration in a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurationSpec(pub Duration);

impl DurationSpec {
    /// From milliseconds.
    pub fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// From seconds.
    pub fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// Parses `"<n>ms"`, `"<n>s"`, `"<n>m"`, `"<n>h"` or `"<n>"` (seconds).
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let t = text.trim();
        let bad = || {
            SpecError::invalid(
                "duration",
                format!(
                    "{text:?} is not a duration; write e.g. \"500ms\", \"30s\", \"2m\" or \"1h\""
                ),
            )
        };
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let n: u64 = digits.parse().map_err(|_| bad())?;
        // Seconds are counted as seconds (not milliseconds), so every duration a whole number
        // of seconds reads (`tool_timeout = <n>`) is also one its text form reads.
        let duration = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "" | "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3_600).map(Duration::from_secs),
            _ => return Err(bad()),
        };
        duration.map(Self).ok_or_else(bad)
    }
}

impl std::fmt::Display for DurationSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(DurationSpec::from_secs(s)),
            Raw::Text(t) => DurationSpec::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}
