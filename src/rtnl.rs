//! One rtnetlink connection per call, on a thread and runtime of its own, and deleting a
//! link by name. Depends on nothing else in the crate, so the benches can include it.

use futures_util::stream::TryStreamExt;

/// Runs `f` with an rtnetlink handle on a runtime of its own, on a thread of its own (the
/// callers may already be inside the agent's runtime, which cannot nest).
pub fn with_rtnetlink<T, F, Fut>(f: F) -> Result<T, String>
where
    T: Send,
    F: FnOnce(rtnetlink::Handle) -> Fut + Send,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    std::thread::scope(|s| {
        s.spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
                let task = tokio::spawn(conn);
                let out = f(handle).await;
                task.abort();
                out
            })
        })
        .join()
        .unwrap_or_else(|_| Err("rtnetlink thread panicked".to_string()))
    })
}

/// Delete the interface `name` (kube-proxy's `kube-ipvs0`) if it exists, over rtnetlink;
/// `Ok(false)` when there is none.
pub fn delete_link(name: &str) -> Result<bool, String> {
    let name = name.to_string();
    with_rtnetlink(|handle| async move {
        let mut links = handle.link().get().match_name(name.clone()).execute();
        let found = match links.try_next().await {
            Ok(Some(link)) => Some(link.header.index),
            Ok(None) => None,
            // The kernel answers a name it does not know with ENODEV.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => None,
            Err(e) => return Err(e.to_string()),
        };
        match found {
            Some(index) => handle
                .link()
                .del(index)
                .execute()
                .await
                .map(|_| true)
                .map_err(|e| format!("deleting {name}: {e}")),
            None => Ok(false),
        }
    })
}
