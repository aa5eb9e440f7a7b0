//! Reading the file: parse, validate, and place every error at its `file:line:column`.

use std::fmt;
use std::path::Path;

use super::check::{self, Invalid, key_path};
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

    /// Reads and parses a YAML file, and gives every problem validation finds in it (see
    /// [`problems`](Self::problems)) rather than only the first, as
    /// [`from_file`](Self::from_file) does, and whether the history store could be opened at
    /// its `store.data_dir`: what `check-config` shows. `adjust` changes the configuration
    /// before it is checked, as `collect`'s flags do (`--no-store`). The configuration is valid
    /// when the list is empty. Keys that cannot be read (unknown keys, values of the wrong
    /// type) are in the list too, and the rest of the file is checked without them. The error
    /// is a file that cannot be read, or one whose keys could not all be taken out to check
    /// the rest (a YAML syntax error: its first), with the problems found.
    pub fn check_file(
        path: &Path,
        adjust: impl FnOnce(&mut Self),
    ) -> Result<(Self, Vec<ConfigError>), Vec<ConfigError>> {
        Self::check_file_reaching(path, adjust, true)
    }

    /// [`check_file`](Self::check_file) without the look at the history store (which `collect`
    /// opens right after): what `collect` loads its file with, so that it refuses exactly what
    /// `check-config` refuses, flags applied first.
    pub fn from_file_adjusted(
        path: &Path,
        adjust: impl FnOnce(&mut Self),
    ) -> Result<Self, Vec<ConfigError>> {
        match Self::check_file_reaching(path, adjust, false) {
            Ok((config, problems)) if problems.is_empty() => Ok(config),
            Ok((_, problems)) | Err(problems) => Err(problems),
        }
    }

    fn check_file_reaching(
        path: &Path,
        adjust: impl FnOnce(&mut Self),
        disk: bool,
    ) -> Result<(Self, Vec<ConfigError>), Vec<ConfigError>> {
        let (text, name) = read(path).map_err(|e| vec![e])?;
        let (mut config, mut problems) = match Self::parse_unvalidated(&text, &name) {
            Ok(config) => (config, Vec::new()),
            Err(first) => match every_parse_error(&text, &name, first) {
                (errors, Some(rest)) => (rest, errors),
                (errors, None) => return Err(errors),
            },
        };
        let before = serde_yaml_ng::to_value(&config).ok();
        adjust(&mut config);
        let after = serde_yaml_ng::to_value(&config).ok();
        // A value `adjust` changed (a command-line flag) is no line of the file's.
        let adjusted = |path: &[check::Step<&str>]| {
            let at = |v: &Option<serde_yaml_ng::Value>| {
                path.iter()
                    .try_fold(v.as_ref()?, |v, step| match step {
                        check::Step::Key(key) => v.get(*key),
                        check::Step::Item(i) => v.get(*i),
                    })
                    .cloned()
            };
            at(&before) != at(&after)
        };
        let found = if disk {
            config.problems()
        } else {
            config.value_problems()
        };
        problems.extend(found.into_iter().map(|v| {
            if adjusted(&v.steps()) {
                let key = v.key();
                ConfigError {
                    file: name.clone(),
                    line: None,
                    column: None,
                    message: format!("{key} (as the command line sets it): {}", v.message),
                }
            } else {
                located(&text, &name, v)
            }
        }));
        // In the file's order; a flag's problems (no line) last.
        problems.sort_by_key(|e| (e.line.is_none(), e.line));
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

/// Most keys [`every_parse_error`] reports.
const MAX_PARSE_ERRORS: usize = 50;

/// One step of a key path of the file, as the parser names it.
type Step = check::Step<String>;

/// `first` (the file's first error as the parser placed it) and every further key that cannot
/// be read: the YAML read as a tree, the key that failed taken out of it, and the tree read
/// again — written back as YAML and read as the file is — until it reads (each key placed at
/// its line where the file sets it); with the configuration read without those keys. The list
/// ends without a configuration at a YAML syntax error, at [`MAX_PARSE_ERRORS`], or where a key
/// cannot be taken out.
fn every_parse_error(
    text: &str,
    file: &str,
    first: ConfigError,
) -> (Vec<ConfigError>, Option<CollectorConfig>) {
    let mut errors = vec![first];
    let Ok(mut tree) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) else {
        return (errors, None);
    };
    // List items taken out, as (the list's path, the item's index in the file): later indices
    // into that list are shifted back to the file's.
    let mut taken: Vec<(Vec<Step>, usize)> = Vec::new();
    let mut first_read = true;
    loop {
        let Ok(yaml) = serde_yaml_ng::to_string(&tree) else {
            return (errors, None);
        };
        let yaml = serde_yaml_ng::Deserializer::from_str(&yaml);
        let e = match serde_path_to_error::deserialize::<_, CollectorConfig>(yaml) {
            Ok(rest) => return (errors, Some(rest)),
            Err(e) => e,
        };
        let key = failing_key(&e);
        let in_file = in_the_file(&key, &taken);
        let path = key_path(&in_file);
        if std::mem::take(&mut first_read) {
            // The tree's first failure is the file's, already reported with its place.
            if !errors[0].message.starts_with(&path) {
                return (errors, None);
            }
        } else {
            let pos = locate(text, &in_file);
            errors.push(ConfigError {
                file: file.to_owned(),
                line: pos.map(|p| p.0),
                column: pos.map(|p| p.1),
                message: in_file_message(e, &path),
            });
        }
        if errors.len() >= MAX_PARSE_ERRORS || !remove_key(&mut tree, &key) {
            return (errors, None);
        }
        if let Some((Step::Item(i), list)) = in_file.split_last() {
            taken.push((list.to_vec(), *i));
        }
    }
}

/// The message of a failed read of the tree, led by `path`, the key's path in the file (the
/// parser leads with the path in the tree, whose list indices may have shifted).
fn in_file_message(e: serde_path_to_error::Error<serde_yaml_ng::Error>, path: &str) -> String {
    let in_tree = e.path().to_string();
    let message = with_key_path(&in_tree, &strip_location(&e.into_inner().to_string()));
    match message.strip_prefix(&in_tree) {
        Some(rest) if !in_tree.is_empty() => format!("{path}{rest}"),
        _ => message,
    }
}

/// `key` (indices into the tree) with its list indices as they are in the file, given the
/// items `taken` out of the tree so far.
fn in_the_file(key: &[Step], taken: &[(Vec<Step>, usize)]) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(key.len());
    for step in key {
        let step = match step {
            Step::Item(i) => {
                let mut gone: Vec<usize> = taken
                    .iter()
                    .filter(|(list, _)| *list == out)
                    .map(|&(_, j)| j)
                    .collect();
                gone.sort_unstable();
                let mut index = *i;
                for j in gone {
                    if j <= index {
                        index += 1;
                    }
                }
                Step::Item(index)
            }
            key => key.clone(),
        };
        out.push(step);
    }
    out
}

/// The key path of a failed read: the path serde followed, plus the unknown key an `unknown
/// field` error names (the path stops at the map holding it).
fn failing_key(e: &serde_path_to_error::Error<serde_yaml_ng::Error>) -> Vec<Step> {
    use serde_path_to_error::Segment;
    let mut key: Vec<Step> = e
        .path()
        .iter()
        .map(|s| match s {
            Segment::Map { key } => Step::Key(key.clone()),
            Segment::Seq { index } => Step::Item(*index),
            Segment::Enum { variant } => Step::Key(variant.clone()),
            Segment::Unknown => Step::Key(String::new()),
        })
        .collect();
    let message = e.inner().to_string();
    if let Some(rest) = message.split("unknown field `").nth(1)
        && let Some((unknown, _)) = rest.split_once('`')
        && key.last() != Some(&Step::Key(unknown.to_owned()))
    {
        key.push(Step::Key(unknown.to_owned()));
    }
    key
}

/// Takes the node at `key` out of `tree`; `false` when there is none.
fn remove_key(tree: &mut serde_yaml_ng::Value, key: &[Step]) -> bool {
    use serde_yaml_ng::Value;
    let Some((last, parents)) = key.split_last() else {
        return false;
    };
    let mut node = tree;
    for step in parents {
        node = match (node, step) {
            (Value::Mapping(m), Step::Key(k)) => match m.get_mut(k.as_str()) {
                Some(n) => n,
                None => return false,
            },
            (Value::Sequence(s), Step::Item(i)) => match s.get_mut(*i) {
                Some(n) => n,
                None => return false,
            },
            _ => return false,
        };
    }
    match (node, last) {
        (Value::Mapping(m), Step::Key(k)) => m.remove(k.as_str()).is_some(),
        (Value::Sequence(s), Step::Item(i)) if *i < s.len() => {
            s.remove(*i);
            true
        }
        _ => false,
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

impl ConfigError {
    /// `message` about the dotted `key` placed where the file at `path` sets it, as validation
    /// problems are placed (`file:line:column: …`): for what is found only once the files a
    /// key names are read, such as a listener's TLS certificate. The file alone when it does
    /// not set the key.
    pub fn at_key(path: &Path, key: &str, message: String) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let keys: Vec<check::Step<&str>> = key.split('.').map(check::Step::Key).collect();
        Self::placed(&text, path.display().to_string(), &keys, message)
    }

    /// `message` at the key `path` in `text`, when the file sets it.
    fn placed(text: &str, file: String, path: &[check::Step<&str>], message: String) -> Self {
        let pos = locate(text, path);
        Self {
            file,
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            message,
        }
    }
}

/// A validation problem placed at its key in `text`, when the file sets it, its message led by
/// the key path unless it already names a key below it (`forward.tls.ca_file …` under
/// `forward.tls`).
fn located(text: &str, file: &str, v: Invalid) -> ConfigError {
    let key = v.key();
    let steps = v.steps();
    let names_a_key_below = v
        .message
        .strip_prefix(key.as_str())
        .is_some_and(|rest| rest.starts_with('.'));
    let message = if names_a_key_below {
        v.message
    } else {
        format!("{key}: {}", v.message)
    };
    ConfigError::placed(text, file.to_owned(), &steps, message)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `check_file` on `text`: the messages of the file's problems.
    fn problems_of(text: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, text).unwrap();
        let no_store = |c: &mut CollectorConfig| c.store.enabled = false;
        match CollectorConfig::check_file(&path, no_store) {
            Ok((_, problems)) => problems,
            Err(errors) => errors,
        }
        .iter()
        .map(|e| format!("{}:{}", e.line.unwrap_or(0), e.message))
        .collect()
    }

    #[test]
    fn every_unreadable_key_is_named_at_its_place_in_the_file() {
        let got = problems_of(
            "kpi:\n  dimensions: [foo, service, bar]\nforward:\n  headers: { X-Scope-OrgID: 1 }\n  protocl: grpc\n",
        );
        // The list items keep their indices in the file though the first was taken out; a
        // number where a header takes a string is read as the file's parser reads it (no
        // problem).
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            got[0].starts_with("2:kpi.dimensions[0]: unknown variant `foo`"),
            "{got:?}"
        );
        assert!(
            got[1].starts_with("2:kpi.dimensions[2]: unknown variant `bar`"),
            "{got:?}"
        );
        assert!(
            got[2].starts_with("5:forward.protocl: unknown field"),
            "{got:?}"
        );
    }

    /// Problems come in the file's order, whatever order the sections are checked in.
    #[test]
    fn problems_come_in_the_files_order() {
        let got = problems_of("assembly:\n  max_age: 0s\nlimits:\n  soft_limit_percent: 0\n");
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("2:assembly.max_age"), "{got:?}");
        assert!(got[1].starts_with("4:limits.soft_limit_percent"), "{got:?}");
    }

    /// A problem of a list's item is placed at that item, and its key says which (a review:
    /// the second rule's bad `expr` was placed at the first rule's, as `alerts.rules.expr`).
    #[test]
    fn a_problem_of_a_list_item_is_placed_at_that_item() {
        let got = problems_of(
            "alerts:\n  rules:\n    - name: Good\n      expr: e2e.p95 > 1s\n    - name: Bad\n      \
             severity: warning\n      expr: e2e.p95 >> 1s\n    - { name: Flow, expr: ttft.p99 >> 1 }\n",
        );
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("7:alerts.rules[1].expr"), "{got:?}");
        assert!(got[1].starts_with("8:alerts.rules[2].expr"), "{got:?}");
        let got = problems_of(
            "alerts:\n  rules:\n    - name: Twice\n      expr: e2e.p95 > 1s\n    - name: Twice\n      expr: e2e.p99 > 1s\n",
        );
        assert!(got[0].starts_with("5:alerts.rules[1].name"), "{got:?}");
        // Items at their list key's own indent, a common style.
        let got = problems_of(
            "alerts:\n  rules:\n  - name: Good\n    expr: e2e.p95 > 1s\n  - name: Bad\n    expr: e2e.p95 >> 1s\nkpi:\n  windows: [1m]\n",
        );
        assert!(got[0].starts_with("6:alerts.rules[1].expr"), "{got:?}");
    }

    /// A value a command-line flag set is not blamed on the file's line for that key.
    #[test]
    fn a_problem_of_a_flags_value_names_no_line_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "receivers:\n  otlp_grpc:\n    endpoint: 127.0.0.1:4317\n  otlp_http:\n    endpoint: 127.0.0.1:4318\n",
        )
        .unwrap();
        let clash = |c: &mut CollectorConfig| {
            c.store.enabled = false;
            c.receivers.otlp_http.endpoint = "127.0.0.1:4317".parse().unwrap();
        };
        let (_, problems) = CollectorConfig::check_file(&path, clash).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].line, None, "{problems:?}");
        assert!(
            problems[0]
                .message
                .starts_with("receivers.otlp_http.endpoint (as the command line sets it): "),
            "{problems:?}"
        );
        // The same clash written in the file is placed at its line.
        std::fs::write(
            &path,
            "receivers:\n  otlp_grpc:\n    endpoint: 127.0.0.1:4317\n  otlp_http:\n    endpoint: 127.0.0.1:4317\n",
        )
        .unwrap();
        let no_store = |c: &mut CollectorConfig| c.store.enabled = false;
        let (_, problems) = CollectorConfig::check_file(&path, no_store).unwrap();
        assert_eq!(problems[0].line, Some(5), "{problems:?}");
    }

    #[test]
    fn a_yaml_syntax_error_is_the_only_problem_said() {
        let got = problems_of("kpi:\n  dimensions: [service\nlimits: {\n");
        assert_eq!(got.len(), 1, "{got:?}");
    }
}
