//! Asking several nodes at once, and running blocking work, without hops the answer has to
//! wait for.
//!
//! A request for one node (a job switch on one node, a /proc read of one process) is the
//! common case and the latency-critical one: it is awaited where it is, not spawned as a
//! task that a worker must pick up and another wake-up must report. Blocking work (cgroup
//! files, /proc) runs on the calling worker with `block_in_place`, which hands the
//! worker's other tasks to another thread, instead of on a blocking thread the caller
//! must wait to be scheduled and then woken from.

use clan_core::NodeId;
use std::future::Future;

/// `f` for each of `nodes` at once, answers in node order. One node is asked directly.
pub async fn on_each<T, F, Fut>(nodes: Vec<NodeId>, f: F) -> Vec<(NodeId, T)>
where
    F: Fn(NodeId) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    if let [n] = nodes[..] {
        return vec![(n, f(n).await)];
    }
    let mut set = tokio::task::JoinSet::new();
    for n in nodes {
        let fut = f(n);
        set.spawn(async move { (n, fut.await) });
    }
    let mut out = set.join_all().await;
    out.sort_by_key(|(n, _)| *n);
    out
}

/// Runs blocking `f` from async code: on this worker (`block_in_place`) in a multi-thread
/// runtime, else on a blocking thread.
pub async fn blocking<T, F>(f: F) -> Result<T, tokio::task::JoinError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        Ok(tokio::task::block_in_place(f))
    } else {
        tokio::task::spawn_blocking(f).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<NodeId> {
        v.iter().map(|&n| NodeId::new(n).unwrap()).collect()
    }

    #[tokio::test]
    async fn answers_come_in_node_order() {
        let out = on_each(ids(&[3, 1, 2]), |n| async move { n.get() * 10 }).await;
        let got: Vec<(u32, u32)> = out.into_iter().map(|(n, v)| (n.get(), v)).collect();
        assert_eq!(got, vec![(1, 10), (2, 20), (3, 30)]);
        let one = on_each(ids(&[5]), |n| async move { n.get() }).await;
        assert_eq!(one[0].1, 5);
        assert!(on_each(vec![], |n| async move { n.get() }).await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocking_work_runs_in_either_runtime() {
        assert_eq!(blocking(|| 7).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn blocking_work_runs_on_a_current_thread_runtime() {
        assert_eq!(blocking(|| 8).await.unwrap(), 8);
    }
}
