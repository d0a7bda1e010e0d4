//! Validation of settings files: every problem is collected with its field path and a fix,
//! and reported at once, so a user fixes a configuration in one round instead of one error
//! per restart.

use std::fmt;

/// One validation problem: where it is and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Field path in YAML notation, e.g. `providers[1].fly.org`.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// The problems found so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Issues(Vec<Issue>);

impl Issues {
    /// Records a problem at `path`.
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Issue {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Each problem as (path, message).
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|i| (&i.path, &i.message))
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The problems, in the order found.
    pub fn into_vec(self) -> Vec<Issue> {
        self.0
    }
}

/// Renders issues one per line, for an error message.
pub fn format_issues(issues: &[Issue]) -> String {
    issues.iter().map(|i| format!("\n  - {i}")).collect()
}

pub fn check_url(url: &str, at: &str, issues: &mut Issues) {
    if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() <= "https://".len()
    {
        issues.push(
            at.to_string(),
            format!("`{url}` is not an http(s) URL; use e.g. `https://host[:port]`"),
        );
    }
}

/// DNS-1123 label: 1–63 characters, lowercase alphanumerics and '-', alphanumeric at both ends.
pub fn check_dns_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("is empty".into());
    }
    if value.len() > 63 {
        return Err(format!("`{value}` is longer than 63 characters"));
    }
    let valid_chars = value
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid_chars || value.starts_with('-') || value.ends_with('-') {
        return Err(format!("`{value}` is not a DNS-1123 label"));
    }
    Ok(())
}

pub fn list_or_none<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.map(|n| format!("`{n}`")).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}
