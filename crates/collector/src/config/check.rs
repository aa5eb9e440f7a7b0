//! What a failed check says ([`Invalid`]: the key path and what is wrong), and the checks
//! several sections share.

use std::fmt;

/// A semantic validation failure: the key path and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Key path, e.g. `["assembly", "grace"]`.
    pub path: Vec<&'static str>,
    /// What is wrong and what to do.
    pub message: String,
}

impl Invalid {
    pub(super) fn new(path: &[&'static str], message: impl Into<String>) -> Self {
        Self {
            path: path.to_vec(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.join("."), self.message)
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
