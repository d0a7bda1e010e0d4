//! Who is asking: the front proxy (the API server's aggregation layer) authenticated the
//! user and forwards the identity in request headers. Those headers are believed only on a
//! connection whose client certificate chains to the requestheader CA (checked by TLS, see
//! [`super::tls`]) and whose common name is an allowed name; otherwise anyone who can reach
//! the listener could claim to be anyone.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use super::status::AccessError;

/// Where the API server publishes the front proxy's settings.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
/// Its name.
pub const CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";

/// The front proxy's settings, as the API server publishes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontProxy {
    /// PEM CA bundle that signs the front proxy's client certificate.
    pub client_ca_pem: Option<String>,
    /// Common names the front proxy's certificate may carry (empty: any the CA signed).
    pub allowed_names: Vec<String>,
    /// Headers carrying the user name (the first present wins).
    pub username_headers: Vec<String>,
    /// Headers carrying groups (every value of every one).
    pub group_headers: Vec<String>,
    /// Headers carrying the user's UID (the first present wins).
    pub uid_headers: Vec<String>,
    /// Prefixes of headers carrying extra attributes.
    pub extra_prefixes: Vec<String>,
}

impl FrontProxy {
    /// Reads the ConfigMap's data; list values are JSON arrays of strings.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<FrontProxy, String> {
        let list = |key: &str| -> Result<Vec<String>, String> {
            match data.get(key) {
                None => Ok(Vec::new()),
                Some(text) => serde_json::from_str(text)
                    .map_err(|e| format!("{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} {key}: {e}")),
            }
        };
        Ok(FrontProxy {
            client_ca_pem: data.get("requestheader-client-ca-file").cloned(),
            allowed_names: list("requestheader-allowed-names")?,
            username_headers: list("requestheader-username-headers")?,
            group_headers: list("requestheader-group-headers")?,
            uid_headers: list("requestheader-uid-headers")?,
            extra_prefixes: list("requestheader-extra-headers-prefix")?,
        })
    }

    /// Reads the settings from the API server.
    pub async fn load(client: &Client) -> Result<FrontProxy, String> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), CONFIG_MAP_NAMESPACE);
        let cm = api.get(CONFIG_MAP_NAME).await.map_err(|e| {
            format!("cannot read {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} (the operator needs the extension-apiserver-authentication-reader Role): {e}")
        })?;
        FrontProxy::from_data(&cm.data.unwrap_or_default())
    }
}

/// What TLS proved about a connection's client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peer {
    /// The common name of a client certificate that chains to the requestheader CA; `None`
    /// when the client presented none.
    pub common_name: Option<String>,
}

/// The user the front proxy asserts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    /// User name.
    pub name: String,
    /// UID, when the front proxy sends one.
    pub uid: Option<String>,
    /// Every group.
    pub groups: Vec<String>,
    /// Extra attributes (keys lower-cased and unescaped, as the API server does).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The user of a request on a connection from `peer`, or 401 saying why not.
pub fn authenticate(
    front: &FrontProxy,
    peer: &Peer,
    headers: &HeaderMap,
) -> Result<UserInfo, AccessError> {
    let refuse = |why: &str| Err(AccessError::Unauthorized(format!("Unauthorized: {why}")));
    if front.client_ca_pem.is_none() {
        return refuse(
            "the API server publishes no requestheader CA (kube-apiserver --requestheader-client-ca-file), so no front proxy can be trusted",
        );
    }
    let Some(cn) = &peer.common_name else {
        return refuse("no client certificate signed by the requestheader CA was presented");
    };
    if !front.allowed_names.is_empty() && !front.allowed_names.contains(cn) {
        return refuse(&format!(
            "client certificate common name {cn:?} is not one of requestheader-allowed-names {:?}",
            front.allowed_names
        ));
    }
    let Some(name) = first_value(headers, &front.username_headers) else {
        return refuse("the front proxy sent no user name header");
    };
    Ok(UserInfo {
        name,
        uid: first_value(headers, &front.uid_headers),
        groups: all_values(headers, &front.group_headers),
        extra: extras(headers, &front.extra_prefixes),
    })
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = String> + 'a {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

fn first_value(headers: &HeaderMap, names: &[String]) -> Option<String> {
    names.iter().find_map(|n| values(headers, n).next())
}

fn all_values(headers: &HeaderMap, names: &[String]) -> Vec<String> {
    names.iter().flat_map(|n| values(headers, n)).collect()
}

fn extras(headers: &HeaderMap, prefixes: &[String]) -> BTreeMap<String, Vec<String>> {
    let prefixes: Vec<String> = prefixes.iter().map(|p| p.to_ascii_lowercase()).collect();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        let Some(rest) = prefixes
            .iter()
            .find_map(|p| name.as_str().strip_prefix(p.as_str()))
        else {
            continue;
        };
        let Ok(value) = value.to_str() else {
            continue;
        };
        let key = percent_encoding::percent_decode_str(rest)
            .decode_utf8_lossy()
            .to_lowercase();
        out.entry(key).or_default().push(value.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn front() -> FrontProxy {
        let data: BTreeMap<String, String> = [
            ("requestheader-client-ca-file", "PEM"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        FrontProxy::from_data(&data).unwrap()
    }

    fn headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", HeaderValue::from_static("alice"));
        h.append("x-remote-group", HeaderValue::from_static("dev"));
        h.append(
            "x-remote-group",
            HeaderValue::from_static("system:authenticated"),
        );
        h.insert("x-remote-uid", HeaderValue::from_static("u-1"));
        h.append("x-remote-extra-scopes%2fa", HeaderValue::from_static("s1"));
        h.append("x-remote-extra-scopes%2fa", HeaderValue::from_static("s2"));
        h
    }

    fn peer(cn: Option<&str>) -> Peer {
        Peer {
            common_name: cn.map(str::to_string),
        }
    }

    #[test]
    fn an_allowed_front_proxy_asserts_user_groups_uid_and_extra() {
        let user = authenticate(&front(), &peer(Some("front-proxy-client")), &headers()).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["dev", "system:authenticated"]);
        assert_eq!(user.uid.as_deref(), Some("u-1"));
        assert_eq!(user.extra["scopes/a"], ["s1", "s2"]);
    }

    #[test]
    fn forged_headers_without_an_allowed_certificate_are_refused() {
        for (cn, says) in [
            (None, "no client certificate"),
            (
                Some("someone-else"),
                "not one of requestheader-allowed-names",
            ),
        ] {
            let err = authenticate(&front(), &peer(cn), &headers()).unwrap_err();
            assert!(
                matches!(&err, AccessError::Unauthorized(m) if m.contains(says)),
                "{err}"
            );
        }
        let no_ca = FrontProxy {
            client_ca_pem: None,
            ..front()
        };
        let err = authenticate(&no_ca, &peer(Some("front-proxy-client")), &headers());
        assert!(matches!(err, Err(AccessError::Unauthorized(_))));
    }
}
