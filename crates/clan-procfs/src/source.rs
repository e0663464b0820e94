//! Where the view's contents come from: a node's cland (`ProcRequest` on its local
//! socket), behind a trait so that the view's logic can be tested with a fake.

use clan_client::{BlockingLink, Client, ClientError, Unanswered};
use clan_core::NodeId;
use clan_proto::pb;
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Why a request to the source failed, as the view tells a reader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("permission denied: {0}")]
    Permission(String),
    #[error("node down: {0}")]
    NodeDown(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    /// cland not running, restarting, too slow, or it said something unexpected.
    #[error("cland unavailable: {0}")]
    Unavailable(String),
}

impl Failure {
    /// The errno a reader of a process's file gets: the kernel's for a process that is
    /// gone (a process of a dead node is gone too) or a file it may not read.
    pub fn errno(&self) -> i32 {
        match self {
            Failure::NotFound(_) | Failure::NodeDown(_) => libc::ENOENT,
            Failure::Permission(_) => libc::EACCES,
            Failure::Invalid(_) => libc::EINVAL,
            Failure::Unavailable(_) => libc::EIO,
        }
    }

    /// From an error a node attached to one file of a snapshot.
    pub fn from_pb(e: &pb::Error) -> Failure {
        use pb::ErrorCode as C;
        let m = e.message.clone();
        match e.kind() {
            C::NotFound => Failure::NotFound(m),
            C::Permission => Failure::Permission(m),
            C::NodeDown => Failure::NodeDown(m),
            C::Invalid => Failure::Invalid(m),
            _ => Failure::Unavailable(m),
        }
    }

    fn from_client(e: ClientError) -> Failure {
        match e {
            ClientError::Remote(e) => Failure::from_pb(&e),
            e => Failure::Unavailable(e.to_string()),
        }
    }
}

/// A source of /proc contents for the cluster.
pub trait Source: Send + Sync + 'static {
    /// One `ProcRequest`.
    fn proc(
        &self,
        req: pb::ProcRequest,
    ) -> impl Future<Output = Result<pb::ProcReply, Failure>> + Send;
    /// The nodes of the cluster.
    fn nodes(&self) -> impl Future<Output = Result<Vec<u32>, Failure>> + Send;
    /// The answer to `req` at once, waiting on this thread, when this thread may wait
    /// ([`may_wait_in`]) and the source can ask without its runtime; else `None`, and
    /// the caller asks with [`Source::proc`].
    fn proc_now(&self, _req: &pb::ProcRequest) -> Option<Result<pb::ProcReply, Failure>> {
        None
    }
}

thread_local! {
    static MAY_WAIT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on a thread that may wait a moment for a node's answer ([`Source::proc_now`]):
/// a FUSE loop thread polling a request's work before it hands the rest to the runtime.
pub fn may_wait_in<T>(f: impl FnOnce() -> T) -> T {
    /// Puts the thread's previous word back, also when `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            MAY_WAIT.with(|m| m.set(self.0));
        }
    }
    let _restore = Restore(MAY_WAIT.with(|m| m.replace(true)));
    f()
}

/// How long a FUSE loop thread waits for a node on a blocking link before it gives the
/// request to the runtime (the answer of a quick read is there within a millisecond; a
/// little more than TCP's least retransmission timeout, 200 ms, so that one lost segment
/// of a healthy node's answer does not count as the node being late, and short enough
/// that a silent node stalls the view's threads only for a moment, once).
pub const WAIT_ON_LINK: Duration = Duration::from_millis(250);

/// Blocking links to one node (for [`Source::proc_now`]).
#[derive(Default)]
struct Blocking {
    free: Vec<BlockingLink>,
    /// Links in use, free or being opened.
    links: usize,
    /// No blocking link to the node until then (one was late, or could not be had).
    off_until: Option<Instant>,
}

impl Blocking {
    /// One link less (broken, or never had); a node that was late, or whose link could
    /// not be had, is asked through the runtime for [`clan_client::RETRY_AFTER`].
    fn lost(&mut self, off: bool) {
        self.links -= 1;
        if off {
            self.off_until = Some(Instant::now() + clan_client::RETRY_AFTER);
        }
    }
}

/// At most this many blocking links to a node: one per FUSE loop thread.
pub const BLOCKING_LINKS: usize = 2;

/// A node's cland, through pools of connections (one `Client` serves one request at a
/// time). Requests go in lanes, one per node whose process (or own file) they ask for and
/// one for the rest (listings and cluster files, which leave out a node that does not
/// answer in time), each with `size` requests in flight and `size` clients at most: readers
/// of a node that was cut off and is not yet declared dead wait for it without holding up
/// the readers of the other nodes, and a client of a node's lane opens a direct link to
/// that node only. A request that fails for want of cland or is not answered within the
/// timeout (waiting for its lane included) fails with [`Failure::Unavailable`]; its
/// connection is dropped, and the next request connects again.
pub struct Cland {
    path: PathBuf,
    node: NodeId,
    lanes: Mutex<HashMap<u32, Arc<Lane>>>,
    blocking: Arc<Mutex<HashMap<u32, Blocking>>>,
    size: usize,
    timeout: Duration,
}

/// The requests for one node (or for several).
struct Lane {
    permits: Semaphore,
    free: Mutex<Vec<Arc<Client>>>,
}

/// The lane of requests that ask several nodes, or none in particular.
const ANY_NODE: u32 = 0;

/// The node whose process or file `req` asks for, if one.
fn lane_of(req: &pb::ProcRequest) -> u32 {
    use pb::ProcOp as P;
    match P::try_from(req.op) {
        Ok(P::ProcRead | P::ProcReadlink | P::ProcReaddir | P::ProcStatLink) => {
            clan_core::Gpid::from_raw(req.gpid).map_or(ANY_NODE, |g| g.node().get())
        }
        Ok(P::ProcGlobal) if req.nodes.len() == 1 => req.nodes[0],
        _ => ANY_NODE,
    }
}

impl Cland {
    /// At most `size` requests in flight to each node through the cland at `path` (node
    /// `node`).
    pub fn new(path: PathBuf, node: NodeId, size: usize, timeout: Duration) -> Cland {
        Cland {
            path,
            node,
            lanes: Mutex::new(HashMap::new()),
            blocking: Arc::new(Mutex::new(HashMap::new())),
            size: size.max(1),
            timeout,
        }
    }

    /// Runs `f` in `lane` on one of its clients, within the timeout.
    async fn with<T, F, Fut>(&self, lane: u32, f: F) -> Result<T, Failure>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let lane = self
            .lanes
            .lock()
            .entry(lane)
            .or_insert_with(|| {
                Arc::new(Lane {
                    permits: Semaphore::new(self.size),
                    free: Mutex::new(Vec::new()),
                })
            })
            .clone();
        let work = async {
            let _permit = lane
                .permits
                .acquire()
                .await
                .map_err(|_| Failure::Unavailable("shutting down".into()))?;
            let client = lane
                .free
                .lock()
                .pop()
                .unwrap_or_else(|| Arc::new(Client::at(self.path.clone(), self.node)));
            match f(client.clone()).await {
                Ok(v) => {
                    lane.free.lock().push(client);
                    Ok(v)
                }
                // cland answered: the connection is fine.
                Err(e @ ClientError::Remote(_)) => {
                    lane.free.lock().push(client);
                    Err(Failure::from_client(e))
                }
                // Dropped: a connection whose reply was not read can not be reused.
                Err(e) => Err(Failure::from_client(e)),
            }
        };
        // A client whose request is abandoned here is dropped with it (not put back).
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(Failure::Unavailable(format!(
                    "cland of node {} did not answer within {:?}",
                    self.node, self.timeout
                )))
            })
    }

    /// Whether cland answers at all (before mounting).
    pub async fn check(&self) -> Result<(), ClientError> {
        let c = Client::at(self.path.clone(), self.node);
        match tokio::time::timeout(self.timeout, c.nodes()).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(ClientError::Protocol(format!(
                "cland of node {} did not answer within {:?}",
                self.node, self.timeout
            ))),
        }
    }
}

impl Source for Cland {
    async fn proc(&self, req: pb::ProcRequest) -> Result<pb::ProcReply, Failure> {
        tracing::debug!(op = req.op, gpid = req.gpid, path = %req.path, files = ?req.files, "proc request");
        self.with(lane_of(&req), |c| async move { c.proc(req).await })
            .await
    }

    async fn nodes(&self) -> Result<Vec<u32>, Failure> {
        self.with(ANY_NODE, |c| async move { c.nodes().await })
            .await
            .map(|v| v.into_iter().map(|n| n.id).collect())
    }

    /// A read of one process of another node, on a blocking link to it: the node's answer
    /// wakes the waiting FUSE thread itself, where through the runtime it wakes one of the
    /// runtime's threads, which wakes the reader (docs/links.md). A link is opened by the
    /// runtime when there is none free (this request is then asked through it); one whose
    /// node is late (or that can not be had) is given up, and the node is asked through
    /// the runtime for [`clan_client::RETRY_AFTER`].
    fn proc_now(&self, req: &pb::ProcRequest) -> Option<Result<pb::ProcReply, Failure>> {
        if !MAY_WAIT.with(Cell::get) {
            return None;
        }
        let node = lane_of(req);
        if node == ANY_NODE || node == self.node.get() || req.op == pb::ProcOp::ProcGlobal as i32 {
            return None;
        }
        let mut link = {
            let mut m = self.blocking.lock();
            let b = m.entry(node).or_default();
            if b.off_until.is_some_and(|t| Instant::now() < t) {
                return None;
            }
            match b.free.pop() {
                Some(l) => l,
                None => {
                    if b.links < BLOCKING_LINKS {
                        if let Ok(rt) = tokio::runtime::Handle::try_current() {
                            b.links += 1;
                            self.open_blocking(&rt, node);
                        }
                    }
                    return None;
                }
            }
        };
        let answer = link.call(pb::peer_request::Op::Proc(req.clone()));
        let mut m = self.blocking.lock();
        let b = m.entry(node).or_default();
        match answer {
            Ok(r) => {
                b.free.push(link);
                match r {
                    pb::peer_reply::Reply::Proc(p) => Some(Ok(p)),
                    pb::peer_reply::Reply::Error(e) => Some(Err(Failure::from_pb(&e))),
                    other => Some(Err(Failure::Unavailable(format!(
                        "node {node}: unexpected reply {other:?}"
                    )))),
                }
            }
            Err(why) => {
                b.lost(why == Unanswered::Late);
                None
            }
        }
    }
}

impl Cland {
    /// Opens a blocking link to `node` on `rt` (counted in its `links` already); one not
    /// had within the request timeout (a cland that does not answer) is given up.
    fn open_blocking(&self, rt: &tokio::runtime::Handle, node: u32) {
        let (path, pool) = (self.path.clone(), self.blocking.clone());
        let limit = self.timeout;
        rt.spawn(async move {
            let opened = match NodeId::new(node) {
                Some(n) => tokio::time::timeout(limit, BlockingLink::open(&path, n, WAIT_ON_LINK))
                    .await
                    .ok()
                    .and_then(Result::ok),
                None => None,
            };
            let mut m = pool.lock();
            let b = m.entry(node).or_default();
            match opened {
                Some(l) => b.free.push(l),
                None => b.lost(true),
            }
        });
    }
}
