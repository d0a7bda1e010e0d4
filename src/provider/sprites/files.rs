//! Exact file I/O through the Sprites filesystem endpoints (`/v1/sprites/{name}/fs/…`), which
//! carry raw bytes: nothing is re-encoded through a shell.

use async_trait::async_trait;
use reqwest::Method;

use super::SpritesProvider;
use super::wire::FsList;
use crate::provider::validate;
use crate::provider::{DirEntry, EntryKind, ErrorKind, Files, ProviderError, ProviderResult};

/// Only permission bits are ever written: setuid, setgid and sticky are dropped.
const PERMISSION_BITS: u32 = 0o777;

impl SpritesProvider {
    /// A filesystem call on sandbox `id` at `path`.
    fn fs(&self, method: Method, id: &str, op: &str, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, &format!("/v1/sprites/{id}/fs/{op}"))
            .query(&[("path", path)])
    }

    /// A 404 from a filesystem call means "no such path" only when the sprite exists.
    async fn absent_path(&self, id: &str, err: ProviderError) -> ProviderResult<()> {
        if err.is(ErrorKind::NotFound) {
            self.must_exist(id).await?;
            return Ok(());
        }
        Err(err)
    }
}

fn refuse_root(id: &str, what: &str, path: &str) -> ProviderResult<()> {
    if path == "/" {
        return Err(ProviderError::invalid(format!(
            "refusing to {what} \"/\" in sandbox {id}; name a path below it"
        )));
    }
    Ok(())
}

fn entry_kind(kind: &str) -> EntryKind {
    match kind {
        "file" => EntryKind::File,
        "directory" | "dir" => EntryKind::Directory,
        "symlink" | "link" => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

#[async_trait]
impl Files for SpritesProvider {
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        let path = validate::sandbox_path("path to read", path)?;
        let request = self.fs(Method::GET, id, "read", &path);
        let what = format!("reading {path} in sandbox {id}");
        let response = self.client.send(request, &what).await?;
        let bytes = response.bytes().await.map_err(|e| {
            ProviderError::transient(format!("{what}: the body was cut off")).with_source(e)
        })?;
        Ok(bytes.to_vec())
    }

    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()> {
        let path = validate::sandbox_path("path to write", path)?;
        refuse_root(id, "write", &path)?;
        let mode = format!("{:04o}", mode & PERMISSION_BITS);
        let request = self
            .fs(Method::PUT, id, "write", &path)
            .query(&[("mode", mode.as_str()), ("mkdirParents", "true")])
            .header("content-type", "application/octet-stream")
            .body(data.to_vec());
        let what = format!("writing {path} in sandbox {id}");
        self.client.send(request, &what).await.map(|_| ())
    }

    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        let path = validate::sandbox_path("directory to list", path)?;
        let request = self.fs(Method::GET, id, "list", &path);
        let what = format!("listing {path} in sandbox {id}");
        let listed: FsList = self.client.json(request, &what).await?;
        Ok(listed
            .entries
            .into_iter()
            .map(|e| {
                let kind = entry_kind(&e.kind);
                DirEntry {
                    size: (kind == EntryKind::File).then_some(e.size).flatten(),
                    symlink_target: (kind == EntryKind::Symlink)
                        .then_some(e.link_target)
                        .flatten(),
                    name: e.name,
                    kind,
                }
            })
            .collect())
    }

    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()> {
        let path = validate::sandbox_path("path to delete", path)?;
        refuse_root(id, "delete", &path)?;
        let request = self
            .fs(Method::DELETE, id, "delete", &path)
            .query(&[("recursive", "true")]);
        let what = format!("deleting {path} in sandbox {id}");
        match self.client.send(request, &what).await {
            Ok(_) => Ok(()),
            Err(e) => self.absent_path(id, e).await,
        }
    }
}
