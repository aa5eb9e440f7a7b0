//! Where a key lies in the YAML text, so that every error names `file:line:column`.

/// Removes libyaml's " at line L column C" (the location is reported separately).
pub(super) fn strip_location(msg: &str) -> String {
    if let Some(at) = msg.find(" at line ") {
        let rest = &msg[at + " at line ".len()..];
        let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let l = digits(rest);
        if let Some(after) = rest[l..].strip_prefix(" column ") {
            let c = digits(after);
            return format!("{}{}", &msg[..at], &after[c..]);
        }
    }
    msg.to_owned()
}

/// Best-effort position (1-based line, column) of a key path in YAML text written in block
/// style: each key is searched among the lines indented deeper than its parent's. Returns the
/// deepest key found, so an error still points near the problem.
pub(super) fn locate(text: &str, path: &[&str]) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0usize;
    let mut parent_indent: Option<usize> = None;
    let mut found = None;
    for key in path {
        let mut hit = None;
        for (i, line) in lines.iter().enumerate().skip(from) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let indent = line.len() - trimmed.len();
            if let Some(p) = parent_indent
                && indent <= p
                && i > from
            {
                break;
            }
            let body = trimmed.trim_start_matches("- ");
            if body
                .strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with(':'))
            {
                hit = Some((i, indent + (trimmed.len() - body.len())));
                break;
            }
        }
        match hit {
            Some((i, col)) => {
                found = Some((i + 1, col + 1));
                from = i + 1;
                parent_indent = Some(col);
            }
            None => break,
        }
    }
    found
}
