//! The aggregated API the plugin talks to: its group, its subresources, and the URLs of a
//! Sandbox's subresources (the same shapes and query parameters as a Pod's).

use url::form_urlencoded;

pub use crate::access::discovery::{GROUP, VERSION};
pub use crate::access::params::Subresource;

/// The APIService that registers it (`<version>.<group>`), named in errors.
pub const API_SERVICE: &str = "v1alpha1.subresources.sandboxes.dev";

/// The path and query of a Sandbox's subresource; `query` pairs are encoded and kept in
/// order (a repeated key, like exec's `command`, stays repeated).
pub fn subresource_url(ns: &str, name: &str, sub: Subresource, query: &[(&str, String)]) -> String {
    let mut url = format!(
        "/apis/{GROUP}/{VERSION}/namespaces/{}/sandboxes/{}/{}",
        encode_segment(ns),
        encode_segment(name),
        sub.name()
    );
    if !query.is_empty() {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in query {
            q.append_pair(k, v);
        }
        url.push('?');
        url.push_str(&q.finish());
    }
    url
}

/// A path segment, percent-encoded (names are DNS labels, but the user typed them).
fn encode_segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
        .to_string()
        .replace("%2D", "-")
        .replace("%2E", ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_urls_repeat_the_command_and_encode_it() {
        let q = [
            ("command", "sh".to_string()),
            ("command", "-c".to_string()),
            ("command", "echo a&b=c".to_string()),
            ("stdin", "true".to_string()),
        ];
        assert_eq!(
            subresource_url("team-a", "demo.1", Subresource::Exec, &q),
            "/apis/subresources.sandboxes.dev/v1alpha1/namespaces/team-a/sandboxes/demo.1/exec\
             ?command=sh&command=-c&command=echo+a%26b%3Dc&stdin=true"
        );
    }

    #[test]
    fn urls_without_a_query_have_no_question_mark() {
        assert_eq!(
            subresource_url("a", "b", Subresource::PortForward, &[]),
            "/apis/subresources.sandboxes.dev/v1alpha1/namespaces/a/sandboxes/b/portforward"
        );
        assert!(
            subresource_url("a", "x/y", Subresource::Log, &[]).contains("/sandboxes/x%2Fy/log")
        );
    }

    #[test]
    fn log_is_a_view_right_and_the_rest_edit() {
        assert_eq!(
            (Subresource::Log.verb(), Subresource::Log.role()),
            ("get", "view")
        );
        for s in [
            Subresource::Exec,
            Subresource::Attach,
            Subresource::PortForward,
            Subresource::Files,
        ] {
            assert_eq!((s.verb(), s.role()), ("create", "edit"));
        }
    }
}
