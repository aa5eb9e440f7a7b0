//! Reading the file: parse, validate, and place every error at its `file:line:column`.

use std::fmt;
use std::path::Path;

use super::check::Invalid;
use super::location::{locate, strip_location};
use super::schema::CollectorConfig;

/// A configuration error, with the place in the file when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<config>` for a string).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", self.file, self.message),
            (Some(l), None) => write!(f, "{}:{l}: {}", self.file, self.message),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

const STRING_SOURCE: &str = "<config>";

impl CollectorConfig {
    /// Parses and validates YAML text. An empty document gives the defaults.
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        Self::parse_named(text, STRING_SOURCE)
    }

    /// Reads, parses and validates a YAML file; errors name the file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let (text, name) = read(path)?;
        Self::parse_named(&text, &name)
    }

    /// Reads and parses a YAML file (an error when it cannot), and gives every problem
    /// validation finds in it (see [`problems`](Self::problems)) rather than only the first, as
    /// [`from_file`](Self::from_file) does, and whether the history store could be opened at
    /// its `store.data_dir`: what `check-config` shows. `adjust` changes the configuration
    /// before it is checked, as `collect`'s flags do (`--no-store`). The configuration is valid
    /// when the list is empty.
    pub fn check_file(
        path: &Path,
        adjust: impl FnOnce(&mut Self),
    ) -> Result<(Self, Vec<ConfigError>), ConfigError> {
        let (text, name) = read(path)?;
        let mut config = Self::parse_unvalidated(&text, &name)?;
        adjust(&mut config);
        let problems = config
            .problems()
            .into_iter()
            .map(|v| located(&text, &name, v))
            .collect();
        Ok((config, problems))
    }

    fn parse_named(text: &str, file: &str) -> Result<Self, ConfigError> {
        let config = Self::parse_unvalidated(text, file)?;
        config.validate().map_err(|v| located(text, file, v))?;
        Ok(config)
    }

    fn parse_unvalidated(text: &str, file: &str) -> Result<Self, ConfigError> {
        let config: Self = if text.trim().is_empty() {
            Self::default()
        } else {
            let yaml = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(yaml).map_err(|e| {
                let path = e.path().to_string();
                let e = e.into_inner();
                let loc = e.location();
                ConfigError {
                    file: file.to_owned(),
                    line: loc.as_ref().map(|l| l.line()),
                    column: loc.as_ref().map(|l| l.column()),
                    message: with_key_path(&path, &strip_location(&e.to_string())),
                }
            })?
        };
        Ok(config)
    }
}

/// The text of the config file at `path`, and its name for errors.
fn read(path: &Path) -> Result<(String, String), ConfigError> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((text, name)),
        Err(e) => Err(ConfigError {
            file: name,
            line: None,
            column: None,
            message: format!("cannot read the config file: {e}"),
        }),
    }
}

/// A validation problem placed at its key in `text`, when the file sets it.
fn located(text: &str, file: &str, v: Invalid) -> ConfigError {
    let pos = locate(text, &v.path);
    ConfigError {
        file: file.to_owned(),
        line: pos.map(|p| p.0),
        column: pos.map(|p| p.1),
        message: format!("{}: {}", v.path.join("."), v.message),
    }
}

/// `message` led by the whole key path of what failed (`assembly.grace: invalid duration …`):
/// the YAML parser names only the enclosing map (`assembly: …`), which it leads with.
fn with_key_path(path: &str, message: &str) -> String {
    if path.is_empty() || path == "." {
        return message.to_owned();
    }
    let rest = match message.split_once(": ") {
        Some((lead, rest)) if path.starts_with(lead) => rest,
        _ => message,
    };
    format!("{path}: {rest}")
}
