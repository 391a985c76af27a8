//! Lists read in pages: `limit` objects a request, following the server's `continue` token, so
//! that no single response (nor the API server's work for it) grows with the cluster.

use std::future::Future;

use kube::api::{ListParams, ObjectList};

/// Objects per page where nothing else is set.
pub const PAGE: u32 = 100;
/// The most pages one listing follows: a server that never stops handing out `continue`
/// tokens fails the listing instead of holding the caller forever.
pub const MAX_PAGES: usize = 100_000;

/// Every object `list` gives for `base` (its selectors), read `page` objects at a time.
pub async fn all_pages<T, F, Fut>(
    what: &str,
    base: &ListParams,
    page: u32,
    mut list: F,
) -> Result<Vec<T>, kube::Error>
where
    T: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<T>, kube::Error>>,
{
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut params = base.clone().limit(page.max(1));
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let got = list(params).await?;
        out.extend(got.items);
        token = got.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(out);
        }
    }
    Err(kube::Error::Service(
        format!(
            "listing {what} gave more than {MAX_PAGES} pages of {page}: the API server keeps handing out continue tokens"
        )
        .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
    use std::sync::Mutex;

    fn list_of(items: Vec<u32>, next: Option<&str>) -> ObjectList<u32> {
        ObjectList {
            types: Default::default(),
            metadata: ListMeta {
                continue_: next.map(str::to_string),
                ..Default::default()
            },
            items,
        }
    }

    #[tokio::test]
    async fn pages_are_followed_to_the_end_with_the_limit_and_token_each_time() {
        let asked: Mutex<Vec<(Option<u32>, Option<String>)>> = Mutex::new(Vec::new());
        let base = ListParams::default().labels("a=b");
        let got = all_pages("things", &base, 2, |p| {
            let mut seen = asked.lock().expect("lock");
            assert_eq!(p.label_selector.as_deref(), Some("a=b"));
            seen.push((p.limit, p.continue_token.clone()));
            let page = match p.continue_token.as_deref() {
                None => list_of(vec![1, 2], Some("t1")),
                Some("t1") => list_of(vec![3, 4], Some("t2")),
                _ => list_of(vec![5], Some("")),
            };
            async move { Ok(page) }
        })
        .await
        .expect("listed");
        assert_eq!(got, [1, 2, 3, 4, 5]);
        assert_eq!(
            asked.into_inner().expect("lock"),
            [
                (Some(2), None),
                (Some(2), Some("t1".to_string())),
                (Some(2), Some("t2".to_string()))
            ]
        );
    }

    #[tokio::test]
    async fn a_server_that_never_ends_the_listing_fails_it_by_name() {
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let e = all_pages("results", &ListParams::default(), 1, |_| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Ok(list_of(vec![0], Some("again"))) }
        })
        .await
        .expect_err("endless");
        assert_eq!(calls.into_inner(), MAX_PAGES);
        assert!(e.to_string().contains("listing results"), "{e}");
    }
}
