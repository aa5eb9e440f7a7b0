//! Where a key lies in the YAML text, so that every error names `file:line:column`.

use super::check::Step;

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
/// style: each key is searched among the lines indented deeper than its parent's, a list item
/// among its list's `- ` lines. Returns the deepest step found, so an error still points near
/// the problem (an item written in flow style, `- { name: x, expr: … }`, at its line).
pub(super) fn locate<K: AsRef<str>>(text: &str, path: &[Step<K>]) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0usize;
    let mut parent_indent: Option<usize> = None;
    let mut found = None;
    for step in path {
        let mut hit = None;
        let mut items = 0usize;
        for (i, line) in lines.iter().enumerate().skip(from) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let indent = line.len() - trimmed.len();
            // A list's items may sit at its key's own indent (`rules:` then `- name: …`).
            let item_at_the_keys_indent = matches!(step, Step::Item(_)) && trimmed.starts_with('-');
            if let Some(p) = parent_indent
                && (indent < p || (indent == p && !item_at_the_keys_indent))
                && i > from
            {
                break;
            }
            match step {
                Step::Key(key) => {
                    let body = trimmed.trim_start_matches("- ");
                    if body
                        .strip_prefix(key.as_ref())
                        .is_some_and(|r| r.trim_start().starts_with(':'))
                    {
                        hit = Some((i, indent + (trimmed.len() - body.len()), i + 1));
                        break;
                    }
                }
                Step::Item(n) if trimmed.starts_with("- ") || trimmed == "-" => {
                    if items == *n {
                        // The item's first key is on its own line: searched from there.
                        hit = Some((i, indent, i));
                        break;
                    }
                    items += 1;
                }
                Step::Item(_) => {}
            }
        }
        match hit {
            Some((i, col, next)) => {
                found = Some((i + 1, col + 1));
                from = next;
                parent_indent = Some(col);
            }
            None => break,
        }
    }
    found
}
