//! What a failed check says ([`Invalid`]: the key path and what is wrong), and the checks
//! several sections share.

use std::fmt;

/// A semantic validation failure: the key path and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Key path, e.g. `["assembly", "grace"]`.
    pub path: Vec<&'static str>,
    /// The list item the path goes through, when it does: after `path[..depth]`, item `index`
    /// (`alerts.rules[2].expr` is `["alerts", "rules", "expr"]` with `Some((2, 2))`).
    pub item: Option<(usize, usize)>,
    /// What is wrong and what to do.
    pub message: String,
}

/// One step of a key path: a map's key, or a list's item (from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step<K> {
    /// A map's key.
    Key(K),
    /// A list's item.
    Item(usize),
}

/// `steps` written as the messages write key paths: `assembly.grace`, `alerts.rules[2].expr`.
pub(super) fn key_path<K: AsRef<str>>(steps: &[Step<K>]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k.as_ref());
            }
            Step::Item(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

impl Invalid {
    pub(super) fn new(path: &[&'static str], message: impl Into<String>) -> Self {
        Self {
            path: path.to_vec(),
            item: None,
            message: message.into(),
        }
    }

    /// A problem at `field` of item `index` of the list at `list`.
    pub(super) fn in_item(
        list: &[&'static str],
        index: usize,
        field: &'static str,
        message: impl Into<String>,
    ) -> Self {
        let mut path = list.to_vec();
        path.push(field);
        Self {
            path,
            item: Some((list.len(), index)),
            message: message.into(),
        }
    }

    /// The path's steps, the list item in its place.
    pub(super) fn steps(&self) -> Vec<Step<&'static str>> {
        let mut steps: Vec<Step<&'static str>> = self.path.iter().map(|k| Step::Key(*k)).collect();
        if let Some((depth, index)) = self.item {
            steps.insert(depth.min(steps.len()), Step::Item(index));
        }
        steps
    }

    /// The key path as a file writes it: `assembly.grace`, `alerts.rules[2].expr`.
    pub fn key(&self) -> String {
        key_path(&self.steps())
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key(), self.message)
    }
}

/// The problems the checks find: every one, so that `check-config` says what to fix everywhere
/// in one run (`collect` stops at the first).
#[derive(Debug, Default)]
pub(super) struct Problems(pub(super) Vec<Invalid>);

impl Problems {
    /// Adds a problem at `path`.
    pub(super) fn add(&mut self, path: &[&'static str], message: impl Into<String>) {
        self.0.push(Invalid::new(path, message));
    }

    /// Adds a problem at `field` of item `index` of the list at `list`.
    pub(super) fn add_in_item(
        &mut self,
        list: &[&'static str],
        index: usize,
        field: &'static str,
        message: impl Into<String>,
    ) {
        self.0.push(Invalid::in_item(list, index, field, message));
    }

    /// Adds `result`'s problem, if it has one; whether it had none.
    pub(super) fn check(&mut self, result: Result<(), Invalid>) -> bool {
        match result {
            Ok(()) => true,
            Err(e) => {
                self.0.push(e);
                false
            }
        }
    }
}

/// Checks `headers` as the client sending them will build them
/// ([`header_map`](crate::client_tls::header_map)); a problem is placed at `path`.
pub(super) fn check_headers(
    headers: &std::collections::BTreeMap<String, String>,
    path: &[&'static str],
) -> Result<(), Invalid> {
    crate::client_tls::header_map(headers)
        .map(|_| ())
        .map_err(|m| Invalid::new(path, m))
}

/// Checks that `url` is an `http://` or `https://` URL with a host; `headers_key` names the
/// setting that takes the headers to send with it (where credentials belong).
pub(super) fn check_http_url(url: &str, headers_key: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(format!("{url:?} must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    // Neither would be sent: refused rather than dropped without a word.
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(format!(
            "{} holds credentials (user:password@), which would not be sent: remove them (an \
             authorization header goes in {headers_key})",
            redact_userinfo(url)
        ));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(format!(
            "{} has a query string or fragment, which would not be sent: remove it (the path is kept)",
            redact_userinfo(url)
        ));
    }
    Ok(())
}

/// `url` with whatever precedes an `@` in its authority replaced by `***`, for messages.
fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("\"{scheme}://***{}\"", &rest[at..]),
        None => format!("{url:?}"),
    }
}
