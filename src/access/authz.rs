//! Whether the user may: one SubjectAccessReview per request, for the subresource's verb
//! on `sandboxes/<subresource>` in group `sandboxes.dev`, carrying everything the front
//! proxy said about the user (name, every group, UID, extra), so RBAC decides exactly as
//! it would for a request to the API server itself.

use async_trait::async_trait;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::authn::UserInfo;
use super::status::AccessError;

/// What is asked: `verb` on `sandboxes/<subresource>` named `name` in `namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// `create` or `get`.
    pub verb: &'static str,
    /// `exec`, `attach`, `log`, `portforward` or `files`.
    pub subresource: &'static str,
    /// The Sandbox's namespace (from the URL).
    pub namespace: String,
    /// The Sandbox's name (from the URL).
    pub name: String,
}

impl Attributes {
    /// The 403 message, worded as the API server words its own.
    pub fn denied(&self, user: &str, reason: &str) -> AccessError {
        let mut message = format!(
            "sandboxes.{group} {name:?} is forbidden: User {user:?} cannot {verb} resource \"sandboxes/{sub}\" in API group {group:?} in the namespace {ns:?}",
            group = crate::api::common::GROUP,
            name = self.name,
            verb = self.verb,
            sub = self.subresource,
            ns = self.namespace,
        );
        if !reason.is_empty() {
            message.push_str(": ");
            message.push_str(reason);
        }
        AccessError::Forbidden(message)
    }
}

/// Decides whether a user may do something.
#[async_trait]
pub trait Authorizer: Send + Sync {
    /// `Ok` when allowed; 403 naming the verb and resource when not.
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), AccessError>;
}

/// The API server's authorizer, through SubjectAccessReviews.
pub struct SubjectAccessReviews {
    client: Client,
}

impl SubjectAccessReviews {
    /// Reviews with `client` (which needs `create` on subjectaccessreviews).
    pub fn new(client: Client) -> Self {
        SubjectAccessReviews { client }
    }
}

/// The review of `attrs` for `user`.
pub fn review(user: &UserInfo, attrs: &Attributes) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: user.uid.clone(),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(crate::api::common::GROUP.into()),
                resource: Some("sandboxes".into()),
                subresource: Some(attrs.subresource.into()),
                verb: Some(attrs.verb.into()),
                namespace: Some(attrs.namespace.clone()),
                name: Some(attrs.name.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

#[async_trait]
impl Authorizer for SubjectAccessReviews {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), AccessError> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review(user, attrs))
            .await
            .map_err(|e| {
                AccessError::Unavailable(format!(
                    "cannot check authorization (SubjectAccessReview): {e}"
                ))
            })?;
        let status = answer.status.unwrap_or_default();
        if status.allowed {
            return Ok(());
        }
        Err(attrs.denied(&user.name, status.reason.as_deref().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_review_carries_the_whole_user_and_the_subresource() {
        let user = UserInfo {
            name: "alice".into(),
            uid: Some("u-1".into()),
            groups: vec!["dev".into(), "system:authenticated".into()],
            extra: [("scopes".to_string(), vec!["a".to_string()])].into(),
        };
        let attrs = Attributes {
            verb: "create",
            subresource: "exec",
            namespace: "team-a".into(),
            name: "box".into(),
        };
        let spec = review(&user, &attrs).spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.uid.as_deref(), Some("u-1"));
        assert_eq!(spec.groups.unwrap().len(), 2);
        assert_eq!(spec.extra.unwrap()["scopes"], ["a"]);
        let ra = spec.resource_attributes.unwrap();
        assert_eq!(ra.group.as_deref(), Some("sandboxes.dev"));
        assert_eq!(ra.resource.as_deref(), Some("sandboxes"));
        assert_eq!(ra.subresource.as_deref(), Some("exec"));
        assert_eq!(ra.verb.as_deref(), Some("create"));
        assert_eq!(ra.namespace.as_deref(), Some("team-a"));
        let denied = attrs.denied("alice", "").to_string();
        assert!(
            denied.contains("cannot create resource \"sandboxes/exec\""),
            "{denied}"
        );
    }
}
