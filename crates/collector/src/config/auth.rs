//! `auth:` — bearer tokens for the receivers and the API, and the `insecure` escape hatch; also
//! the validation of `api.allowed_hosts` (the Host allowlist of the API port).
//!
//! The tokens themselves never appear in the configuration: they come from a file
//! (`auth.tokens_file`) and/or an environment variable (`auth.tokens_env`, default
//! `INFERTRACE_TOKENS`), parsed by [`crate::auth::TokenSet`]. See `docs/deploy.md` (Security).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::check::Invalid;

/// The environment variable read for tokens unless `auth.tokens_env` names another.
pub const DEFAULT_TOKENS_ENV: &str = "INFERTRACE_TOKENS";

/// `auth:` — where the bearer tokens come from, and whether an open non-loopback listener is
/// allowed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// File of tokens, one per line: `scope[,scope...] token` (scopes `ingest`, `read`,
    /// `metrics`, or `all`), `#` comments and blank lines allowed. Re-read on SIGHUP.
    /// Default `null` (no file).
    pub tokens_file: Option<PathBuf>,
    /// Environment variable holding tokens in the same format, entries separated by newlines
    /// or `;`. An unset or empty variable adds no token. `null` reads none.
    /// Default `INFERTRACE_TOKENS`.
    pub tokens_env: Option<String>,
    /// Allow listening on a non-loopback address without any token configured (everything
    /// then answers anyone; a warning is logged at start). Default `false`: such a start is
    /// refused.
    pub insecure: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            tokens_file: None,
            tokens_env: Some(DEFAULT_TOKENS_ENV.to_owned()),
            insecure: false,
        }
    }
}

/// The default `api.allowed_hosts`: the loopback names (the listen address is always added).
pub fn default_allowed_hosts() -> Vec<String> {
    ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(str::to_owned)
        .collect()
}

impl AuthConfig {
    /// Checks the keys of `auth:`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Some(file) = &self.tokens_file
            && file.as_os_str().is_empty()
        {
            return Err(Invalid::new(
                &["auth", "tokens_file"],
                "must name a file (or be null)",
            ));
        }
        if let Some(var) = &self.tokens_env
            && (var.is_empty() || var.contains('=') || var.contains('\0'))
        {
            return Err(Invalid::new(
                &["auth", "tokens_env"],
                "must be an environment variable name (or null)",
            ));
        }
        Ok(())
    }
}

/// Checks `api.allowed_hosts`: host names or IP addresses without scheme, port or path, or `*`.
pub(crate) fn validate_allowed_hosts(hosts: &[String]) -> Result<(), Invalid> {
    const PATH: &[&str] = &["api", "allowed_hosts"];
    if hosts.is_empty() {
        return Err(Invalid::new(
            PATH,
            "needs at least one host (or \"*\" to allow any Host header)",
        ));
    }
    for h in hosts {
        if h == "*" {
            continue;
        }
        let bare = h.trim_start_matches('[').trim_end_matches(']');
        let ip = bare.parse::<std::net::IpAddr>().is_ok();
        let name_ok = !bare.is_empty()
            && bare
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !ip && !name_ok {
            return Err(Invalid::new(
                PATH,
                format!(
                    "{h:?} is not a host name or IP address: write the name alone, without \
                     scheme, port or path (e.g. infertrace.example.com), or \"*\""
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_names_ips_or_star() {
        let ok = |v: &[&str]| {
            validate_allowed_hosts(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert!(ok(&["localhost", "::1", "[::1]", "10.0.0.1", "a-b.example.com"]).is_ok());
        assert!(ok(&["*"]).is_ok());
        assert!(ok(&[]).is_err());
        for bad in ["http://x", "x:9464", "x/y", "", "a b"] {
            let e = ok(&[bad]).unwrap_err();
            assert_eq!(e.path, vec!["api", "allowed_hosts"], "{bad}");
        }
    }

    #[test]
    fn env_name_is_checked() {
        let mut c = AuthConfig::default();
        assert!(c.validate().is_ok());
        c.tokens_env = Some("A=B".into());
        assert!(c.validate().is_err());
        c.tokens_env = None;
        c.tokens_file = Some(PathBuf::new());
        assert!(c.validate().is_err());
    }
}
