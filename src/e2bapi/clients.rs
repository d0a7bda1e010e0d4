//! Kubernetes clients that impersonate a key's ServiceAccount, so every object this API
//! creates, changes or reads is authorized by RBAC and audited as that ServiceAccount (the
//! operator's own RBAC needs `impersonate` on serviceaccounts). One client per account,
//! built once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::{Client, Config};

use super::error::ApiError;
use super::keys::Tenant;

/// Builds and keeps the impersonating clients.
#[derive(Clone)]
pub struct Impersonation {
    base: Config,
    clients: Arc<Mutex<HashMap<String, Client>>>,
}

impl Impersonation {
    /// Clients derived from the operator's own configuration.
    pub fn new(base: Config) -> Self {
        Impersonation {
            base,
            clients: Arc::default(),
        }
    }

    /// The client acting as `tenant`'s ServiceAccount.
    pub fn client(&self, tenant: &Tenant) -> Result<Client, ApiError> {
        let user = format!(
            "system:serviceaccount:{}:{}",
            tenant.namespace, tenant.service_account
        );
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(&user) {
            return Ok(c.clone());
        }
        let mut config = self.base.clone();
        config.auth_info.impersonate = Some(user.clone());
        config.auth_info.impersonate_groups = None;
        let client = crate::kube_client::client(config)
            .map_err(|e| ApiError::internal(format!("a client for {user}: {e}")))?;
        clients.insert(user, client.clone());
        Ok(client)
    }
}
