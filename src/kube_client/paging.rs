//! Lists read in pages (`limit` + `continue`), so one answer of the API server stays bounded
//! however many objects there are. Every list that may be long goes through here — the
//! Kubernetes provider's Pods and claims, the sweeper's owners — so the page size and the end
//! condition (no token, or an empty one) are written once.
//!
//! A failed page fails the whole listing: a caller never sees part of a list as all of it
//! (contract rule 1).

use std::future::Future;

use kube::api::{ListParams, ObjectList};

/// Objects per page: big enough that 10,000 objects are 20 requests, small enough that one
/// answer stays a few megabytes.
pub const PAGE: u32 = 500;

/// Calls `fetch` for each page of the listing `params` describes (its selectors kept, the page
/// size and continue token set here) and hands each page's items to `visit`, in order.
pub async fn each_page<T, E, F, Fut>(
    params: &ListParams,
    mut fetch: F,
    mut visit: impl FnMut(Vec<T>),
) -> Result<(), E>
where
    T: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<T>, E>>,
{
    let mut params = params.clone().limit(PAGE);
    loop {
        let page = fetch(params.clone()).await?;
        visit(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}

/// Every item of every page (see [`each_page`]).
pub async fn list_all<T, E, F, Fut>(params: &ListParams, fetch: F) -> Result<Vec<T>, E>
where
    T: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<T>, E>>,
{
    let mut all = Vec::new();
    each_page(params, fetch, |items| all.extend(items)).await?;
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ListMeta;
    use std::sync::Mutex;

    fn page(items: &[u32], token: Option<&str>) -> ObjectList<u32> {
        ObjectList {
            types: Default::default(),
            metadata: ListMeta {
                continue_: token.map(String::from),
                ..ListMeta::default()
            },
            items: items.to_vec(),
        }
    }

    /// A server of three pages, chained by continue tokens; the last ends with an empty one.
    /// Records the parameters of each request.
    async fn serve(
        params: ListParams,
        seen: &Mutex<Vec<ListParams>>,
    ) -> Result<ObjectList<u32>, String> {
        seen.lock().unwrap().push(params.clone());
        Ok(match params.continue_token.as_deref() {
            None => page(&[1, 2], Some("a")),
            Some("a") => page(&[3], Some("b")),
            Some("b") => page(&[4], Some("")),
            Some(other) => return Err(format!("unknown token {other}")),
        })
    }

    #[tokio::test]
    async fn every_page_is_read_with_the_callers_selector() {
        let seen = Mutex::new(Vec::new());
        let params = ListParams::default().labels("a=b");
        let all = list_all(&params, |p| serve(p, &seen)).await.unwrap();
        assert_eq!(all, [1, 2, 3, 4]);
        let mut pages = 0;
        each_page(&params, |p| serve(p, &seen), |_| pages += 1)
            .await
            .unwrap();
        assert_eq!(pages, 3);
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 6);
        assert!(seen.iter().all(|p| p.limit == Some(PAGE)));
        assert!(
            seen.iter()
                .all(|p| p.label_selector.as_deref() == Some("a=b"))
        );
        let tokens: Vec<_> = seen[..3].iter().map(|p| p.continue_token.clone()).collect();
        assert_eq!(tokens, [None, Some("a".into()), Some("b".into())]);
    }

    #[tokio::test]
    async fn a_failed_page_fails_the_listing() {
        let failing = |p: ListParams| async move {
            match p.continue_token {
                None => Ok(page(&[1], Some("a"))),
                Some(_) => Err("the second page failed".to_string()),
            }
        };
        assert_eq!(
            list_all(&ListParams::default(), failing).await,
            Err("the second page failed".to_string())
        );
    }
}
