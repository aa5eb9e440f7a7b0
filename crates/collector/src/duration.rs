//! Human-readable durations (`2s`, `500ms`, `1h30m`) in the config file, the store's options
//! and the API's query parameters: parsing and the serde helpers.

use std::time::Duration;

/// Serde helpers for one human-readable duration (`2s`, `500ms`).
pub mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `2s`, `1m 30s`….
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    /// Reads a humantime duration string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// Serde helpers for a list of human-readable durations.
pub mod human_durations {
    use std::time::Duration;

    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `["1m", "5m"]`.
    pub fn serialize<S: Serializer>(ds: &[Duration], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(ds.len()))?;
        for d in ds {
            seq.serialize_element(&humantime::format_duration(*d).to_string())?;
        }
        seq.end()
    }

    /// Reads a list of humantime duration strings.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        v.iter()
            .map(|s| super::parse_duration(s).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// Parses `2s`, `500ms`, `1h30m`; a bare `0` is zero. The message says what is accepted.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("invalid duration {s:?} ({e}); write e.g. \"500ms\", \"2s\", \"5m\", \"1h\"")
    })
}
