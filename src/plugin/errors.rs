//! What went wrong, said so that the message names the fix. The aggregated API answers a
//! refused request with a `metav1.Status` (404 no such Sandbox, 409 not Ready, 403 RBAC
//! denied, 501 the provider cannot); the API server's aggregation layer answers for an API
//! that is not installed (404 without details) or not available (503). [`refusal`] maps
//! each to one variant here.

use super::api::{API_SERVICE, GROUP, Subresource, VERSION};

/// A plugin failure; printed as `error: <message>` with exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The command line does not say something we can do.
    #[error("{0}")]
    Usage(String),
    /// No usable kubeconfig / context / cluster.
    #[error("{0}")]
    Config(String),
    /// 404 with the Sandbox named.
    #[error(
        "no Sandbox {name:?} in namespace {ns:?}: list them with `kubectl get sandboxes -n {ns}` \
         (or pick the namespace with -n)"
    )]
    NoSandbox { ns: String, name: String },
    /// 409: the Sandbox exists but cannot be reached yet.
    #[error(
        "Sandbox {ns}/{name} is not Ready ({message}): wait with \
         `kubectl wait --for=condition=Ready sandbox/{name} -n {ns}`, or see why with \
         `kubectl describe sandbox {name} -n {ns}`"
    )]
    NotReady {
        ns: String,
        name: String,
        message: String,
    },
    /// 403 from the API's SubjectAccessReview (or the API server).
    #[error(
        "you may not {verb} sandboxes/{sub} in namespace {ns}: ask for the {role} role there \
         (server said: {message})"
    )]
    Forbidden {
        verb: &'static str,
        sub: &'static str,
        role: &'static str,
        ns: String,
        message: String,
    },
    /// 401: the credentials were refused.
    #[error(
        "the API server refused your credentials ({message}): log in again or pick another \
         context with --context"
    )]
    Unauthorized { message: String },
    /// 501: the Sandbox's provider lacks the capability.
    #[error("the provider of Sandbox {ns}/{name} cannot {what} ({message}); {instead}")]
    Unsupported {
        ns: String,
        name: String,
        what: &'static str,
        message: String,
        /// What works instead ([`instead`]).
        instead: String,
    },
    /// The aggregated API is not registered.
    #[error(
        "the aggregated API {GROUP}/{VERSION} is not installed in this cluster (no APIService \
         {API_SERVICE}): install the sandbox-operator chart, then check \
         `kubectl get apiservice {API_SERVICE}`"
    )]
    ApiMissing,
    /// The aggregated API is registered but not answering.
    #[error(
        "the aggregated API {GROUP}/{VERSION} is unavailable ({message}): \
         `kubectl get apiservice {API_SERVICE} -o yaml` says why (is the operator running?)"
    )]
    ApiUnavailable { message: String },
    /// Any other refusal.
    #[error("the API server answered {code}: {message}")]
    Api { code: u16, message: String },
    /// The connection or the stream failed.
    #[error("{0}")]
    Transport(String),
    /// A local file operation failed.
    #[error("{context}: {source}")]
    Local {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A remote process or stream reported a failure (not an exit code).
    #[error("{0}")]
    Remote(String),
}

impl PluginError {
    /// A local I/O failure with what we were doing.
    pub fn local(context: impl Into<String>, source: std::io::Error) -> Self {
        PluginError::Local {
            context: context.into(),
            source,
        }
    }
}

/// A non-success answer: the HTTP status and what its body said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` (empty when the body was not a Status).
    pub reason: String,
    /// `Status.message`, or the body's text.
    pub message: String,
    /// `Status.details.name`: set when the server named the object it could not find.
    pub details_name: Option<String>,
}

impl Refusal {
    /// Reads an error response's body (a `metav1.Status`, or text from a proxy).
    pub fn parse(code: u16, body: &[u8]) -> Refusal {
        let text = String::from_utf8_lossy(body).trim().to_string();
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) if v["kind"] == "Status" || v["status"] == "Failure" => Refusal {
                code,
                reason: v["reason"].as_str().unwrap_or_default().to_string(),
                message: v["message"].as_str().unwrap_or(&text).to_string(),
                details_name: v["details"]["name"].as_str().map(str::to_string),
            },
            _ => Refusal {
                code,
                reason: String::new(),
                message: text,
                details_name: None,
            },
        }
    }
}

/// What to do when the provider lacks `sub`. Attaching to the main process is what a
/// provider may lack while it runs new processes fine, so attach names the exec that works;
/// for the rest, a provider that has the capability.
fn instead(sub: Subresource, ns: &str, name: &str) -> String {
    match sub {
        Subresource::Attach => {
            format!("run a new process instead: kubectl sandbox exec -it {name} -n {ns} -- sh")
        }
        _ => "use a Sandbox on a provider that can (Docker or Kubernetes)".to_string(),
    }
}

/// What a refused request for `sub` of Sandbox `ns/name` means for the user.
pub fn refusal(r: Refusal, ns: &str, name: &str, sub: Subresource) -> PluginError {
    let (ns, name) = (ns.to_string(), name.to_string());
    let said = r.message.to_ascii_lowercase();
    match r.code {
        404 if r.details_name.is_some() || r.message.contains(&format!("\"{name}\"")) => {
            PluginError::NoSandbox { ns, name }
        }
        // The API server itself: no APIService routes the group.
        404 if said.contains("could not find the requested resource")
            || said.contains("page not found") =>
        {
            PluginError::ApiMissing
        }
        409 => PluginError::NotReady {
            ns,
            name,
            message: r.message,
        },
        403 => PluginError::Forbidden {
            verb: sub.verb(),
            sub: sub.name(),
            role: sub.role(),
            ns,
            message: r.message,
        },
        401 => PluginError::Unauthorized { message: r.message },
        501 => PluginError::Unsupported {
            instead: instead(sub, &ns, &name),
            ns,
            name,
            what: sub.capability(),
            message: r.message,
        },
        // The aggregation layer: the APIService is not Available or its backend not reached
        // (our API's own 503s carry a Status with a message of their own).
        502..=504
            if r.reason.is_empty()
                || said.contains("service unavailable")
                || said.contains("trying to reach service") =>
        {
            PluginError::ApiUnavailable { message: r.message }
        }
        code => PluginError::Api {
            code,
            message: r.message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str, name: Option<&str>) -> Vec<u8> {
        let mut v = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": code, "reason": reason, "message": message,
        });
        if let Some(n) = name {
            v["details"] = serde_json::json!({"name": n, "kind": "sandboxes"});
        }
        v.to_string().into_bytes()
    }

    fn said(code: u16, body: &[u8], sub: Subresource) -> String {
        refusal(Refusal::parse(code, body), "a", "demo", sub).to_string()
    }

    #[test]
    fn a_missing_sandbox_names_the_namespace_and_the_listing_command() {
        let body = status(
            404,
            "NotFound",
            "sandboxes \"demo\" not found",
            Some("demo"),
        );
        let m = said(404, &body, Subresource::Exec);
        assert!(m.contains("no Sandbox \"demo\" in namespace \"a\""), "{m}");
        assert!(m.contains("kubectl get sandboxes -n a"), "{m}");
    }

    #[test]
    fn a_404_without_the_sandbox_is_the_api_not_installed() {
        let body = status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            None,
        );
        let m = said(404, &body, Subresource::Exec);
        assert!(m.contains("not installed"), "{m}");
        assert!(m.contains("v1alpha1.subresources.sandboxes.dev"), "{m}");
        let m = said(503, b"service unavailable\n", Subresource::Log);
        assert!(m.contains("unavailable (service unavailable)"), "{m}");
        assert!(
            m.contains("kubectl get apiservice v1alpha1.subresources.sandboxes.dev"),
            "{m}"
        );
    }

    #[test]
    fn rbac_denials_name_the_verb_the_resource_and_the_role() {
        let body = status(403, "Forbidden", "denied", None);
        assert!(said(403, &body, Subresource::Exec).starts_with(
            "you may not create sandboxes/exec in namespace a: ask for the edit role"
        ));
        assert!(
            said(403, &body, Subresource::Log)
                .starts_with("you may not get sandboxes/log in namespace a: ask for the view role")
        );
    }

    #[test]
    fn not_ready_and_unsupported_say_what_to_do() {
        let m = said(
            409,
            &status(409, "Conflict", "Stopped", None),
            Subresource::Exec,
        );
        assert!(m.contains("Sandbox a/demo is not Ready (Stopped)"), "{m}");
        assert!(m.contains("kubectl describe sandbox demo -n a"), "{m}");
        let m = said(
            501,
            &status(501, "NotImplemented", "fly", None),
            Subresource::Exec,
        );
        assert!(m.contains("cannot run an interactive process"), "{m}");
        let m = said(
            501,
            &status(501, "NotImplemented", "docker cannot attach", None),
            Subresource::Attach,
        );
        assert!(m.contains("cannot attach to its main process"), "{m}");
        assert!(
            m.ends_with("run a new process instead: kubectl sandbox exec -it demo -n a -- sh"),
            "{m}"
        );
    }

    #[test]
    fn the_aggregated_apis_own_messages_are_told_apart_from_the_api_servers() {
        let body = status(
            404,
            "NotFound",
            "sandboxes.sandboxes.dev \"demo\" not found in namespace \"a\"",
            None,
        );
        assert!(said(404, &body, Subresource::Exec).contains("kubectl get sandboxes -n a"));
        let body = status(
            404,
            "NotFound",
            "sandbox a/demo is gone at its provider",
            None,
        );
        let m = said(404, &body, Subresource::Exec);
        assert_eq!(
            m,
            "the API server answered 404: sandbox a/demo is gone at its provider"
        );
        let body = status(
            503,
            "ServiceUnavailable",
            "exec: the Docker engine is unreachable",
            None,
        );
        let m = said(503, &body, Subresource::Exec);
        assert!(
            m.starts_with("the API server answered 503: exec: the Docker"),
            "{m}"
        );
    }

    #[test]
    fn other_answers_keep_the_code_and_the_message() {
        let m = said(
            500,
            &status(500, "InternalError", "boom", None),
            Subresource::Files,
        );
        assert_eq!(m, "the API server answered 500: boom");
    }
}
