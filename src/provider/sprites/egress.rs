//! Egress observation for sprites.
//!
//! Sprites enforces outbound rules outside the sprite (its DNS and proxy apply the network
//! policy), so nothing inside a sprite can see more than the service reports, and a probe from
//! inside would only test whatever the network beyond happens to allow. The verdict is built
//! from the policy the service says it ENFORCES, read back with `GET …/policy/network` — never
//! from the spec or from what the operator last sent:
//!
//! - `Filtered` when the enforced rules end every unlisted domain at a `deny` for `*` (first
//!   match wins, so only the rules before it let anything out).
//! - `Open` when no rule denies `*` before one allows it: unlisted domains are reachable.
//! - `Inconclusive` when the policy could not be read (an error or timeout of the API, a
//!   refused token), or when the sprite has never run: the check did not run, which is never
//!   read as filtered.
//!
//! A sprite that does not exist is `NotFound`.

use async_trait::async_trait;
use reqwest::Method;

use super::wire::NetworkPolicy;
use super::{SpritesProvider, convert};
use crate::provider::{
    Egress, EgressState, EgressVerdict, ErrorKind, ProviderResult, SandboxState,
};

/// What the enforced `policy` does to a domain no rule names, and a description of it.
pub(crate) fn judge(policy: &NetworkPolicy) -> (EgressState, String) {
    let mut allowed = Vec::new();
    for rule in &policy.rules {
        match (rule.domain.as_str(), rule.action.as_str()) {
            ("*", "deny") => {
                let what = if allowed.is_empty() {
                    "every domain".to_string()
                } else {
                    format!("every domain except {}", allowed.join(", "))
                };
                return (
                    EgressState::Filtered,
                    format!("the network policy the Sprites API reports denies {what}"),
                );
            }
            ("*", _) => break,
            (domain, "allow") => allowed.push(domain.to_string()),
            _ => {}
        }
    }
    (
        EgressState::Open,
        "the network policy the Sprites API reports lets unlisted domains out (no deny rule for \
         `*` before an allow for it)"
            .to_string(),
    )
}

#[async_trait]
impl Egress for SpritesProvider {
    async fn egress_verdict(&self, id: &str) -> ProviderResult<EgressVerdict> {
        if convert::state(&self.must_exist(id).await?) == SandboxState::Creating {
            return Ok(EgressVerdict {
                state: EgressState::Inconclusive,
                detail: "the sprite has never run, so no traffic of it has met the policy yet"
                    .into(),
                remediation: Some("run the sandbox (spec.state: Running)".into()),
            });
        }
        let request = self
            .client
            .request(Method::GET, &format!("/v1/sprites/{id}/policy/network"));
        let what = format!("reading the network policy of sandbox {id}");
        let policy: NetworkPolicy = match self.client.json(request, &what).await {
            Ok(p) => p,
            Err(e) if e.is(ErrorKind::NotFound) => return Err(e),
            Err(e) => {
                return Ok(EgressVerdict {
                    state: EgressState::Inconclusive,
                    detail: format!("could not read the enforced network policy: {e}"),
                    remediation: Some(
                        "the verdict is taken again on the next change; check the provider's \
                         API access if this persists"
                            .into(),
                    ),
                });
            }
        };
        let (state, detail) = judge(&policy);
        let remediation = (state == EgressState::Open).then(|| {
            "set spec.egress.allowedDomains to the domains the sandbox may reach".to_string()
        });
        Ok(EgressVerdict {
            state,
            detail,
            remediation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::convert::policy;
    use super::*;

    #[test]
    fn the_enforced_policy_decides_the_verdict() {
        assert_eq!(judge(&policy(None)).0, EgressState::Open);
        let (state, detail) = judge(&policy(Some(&[])));
        assert_eq!(state, EgressState::Filtered);
        assert!(detail.contains("every domain"), "{detail}");
        let (state, detail) = judge(&policy(Some(&["example.com".to_string()])));
        assert_eq!(state, EgressState::Filtered);
        assert!(detail.contains("except example.com"), "{detail}");
        let mut allow_all = policy(Some(&["example.com".to_string()]));
        allow_all.rules.insert(
            0,
            super::super::wire::PolicyRule {
                domain: "*".into(),
                action: "allow".into(),
            },
        );
        assert_eq!(judge(&allow_all).0, EgressState::Open, "first match wins");
    }
}
