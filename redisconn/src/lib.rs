//! One Redis connection type for both deployments, chosen by the URL:
//!
//! - `redis://[:password@]host:port[/db]`: a single server, through redis's `ConnectionManager` (one multiplexed
//!   connection, reconnected in the background);
//! - `redis+cluster://[[user]:password@]host:port[,host:port...]`: a Redis Cluster, through redis's cluster
//!   client, which learns the slot map from any of the nodes named, follows `MOVED` and `ASK` while slots move,
//!   and routes each command by its keys. A script's keys must share one hash slot (ours carry a `{...}` tag).
//!
//! [`Conn`] is cheap to clone and implements [`redis::aio::ConnectionLike`], so commands, pipelines and
//! `Script::invoke_async` work on either. A script unknown to the node a call reaches (`NOSCRIPT`: a restart, a
//! failover to a replica, `SCRIPT FLUSH`) is loaded again and retried by `invoke_async` itself.

pub mod keys;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value};

const CLUSTER_SCHEME: &str = "redis+cluster://";

/// Where Redis is: parsed from a URL, nothing connected yet.
#[derive(Clone)]
pub enum Target {
    Single(redis::Client),
    Cluster { nodes: Vec<String>, username: Option<String>, password: Option<String> },
}

/// How connections behave: every field applies to both kinds.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Longest wait to open a connection.
    pub connection_timeout: Duration,
    /// Longest wait for one answer (`None`: the redis client's own default, 500 ms for a single server).
    pub response_timeout: Option<Duration>,
    /// Longest pause between two attempts to reconnect.
    pub max_delay: Duration,
    /// A single server: attempts to reconnect before a command fails. A cluster keeps its client's own count,
    /// which also covers following `MOVED` and `ASK` while slots move.
    pub retries: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            connection_timeout: Duration::from_secs(2),
            response_timeout: None,
            max_delay: Duration::from_millis(200),
            retries: 6,
        }
    }
}

impl Target {
    /// Reads `redis://...` (a single server) or `redis+cluster://...` (a cluster, the nodes comma-separated).
    pub fn parse(url: &str) -> RedisResult<Self> {
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return Ok(Target::Single(redis::Client::open(url)?));
        };
        let rest = rest.trim_end_matches('/');
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (Some(auth), hosts),
            None => (None, rest),
        };
        let (username, password) = match auth.map(|a| a.split_once(':').unwrap_or((a, ""))) {
            Some((user, pass)) => (
                Some(user).filter(|u| !u.is_empty()).map(str::to_owned),
                Some(pass).filter(|p| !p.is_empty()).map(str::to_owned),
            ),
            None => (None, None),
        };
        let nodes: Vec<String> =
            hosts.split(',').map(str::trim).filter(|h| !h.is_empty()).map(|h| format!("redis://{h}")).collect();
        if nodes.is_empty() {
            return Err(invalid("a redis+cluster:// URL names at least one node (host:port, comma-separated)"));
        }
        // Each node must read as an address; the cluster client would only say so when it first connects.
        for node in &nodes {
            redis::Client::open(node.as_str())?;
        }
        Ok(Target::Cluster { nodes, username, password })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster { .. })
    }

    fn cluster_client(&self, options: &Options) -> RedisResult<ClusterClient> {
        let Target::Cluster { nodes, username, password } = self else {
            return Err(invalid("not a cluster"));
        };
        let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
            .connection_timeout(options.connection_timeout)
            .max_retry_wait(options.max_delay.as_millis() as u64);
        if let Some(timeout) = options.response_timeout {
            builder = builder.response_timeout(timeout);
        }
        if let Some(user) = username {
            builder = builder.username(user);
        }
        if let Some(pass) = password {
            builder = builder.password(pass);
        }
        builder.build()
    }

    /// A shared connection that connects on first use and reconnects by itself; made without waiting for Redis,
    /// so a service starts while Redis is down and answers 503 until it is back.
    pub fn lazy(&self, options: Options) -> RedisResult<Conn> {
        match self {
            Target::Single(client) => {
                let mut config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(options.connection_timeout))
                    .set_number_of_retries(options.retries as usize)
                    .set_max_delay(options.max_delay);
                if let Some(timeout) = options.response_timeout {
                    config = config.set_response_timeout(Some(timeout));
                }
                Ok(Conn(Inner::Manager(ConnectionManager::new_lazy_with_config(client.clone(), config)?)))
            }
            Target::Cluster { .. } => {
                Ok(Conn(Inner::Cluster(Arc::new(LazyCluster::new(self.cluster_client(&options)?)))))
            }
        }
    }

    /// [`Target::lazy`], connected before it is returned, so a wrong URL or a missing Redis fails the caller's
    /// start; a Redis that does not answer at once (a node busy, loading, a failover under way) is asked again
    /// for about 3 s.
    pub async fn connected(&self, options: Options) -> RedisResult<Conn> {
        let conn = self.lazy(options)?;
        let mut attempts = 10;
        loop {
            match redis::cmd("PING").query_async::<String>(&mut conn.clone()).await {
                Ok(_) => return Ok(conn),
                Err(e) if attempts > 1 && is_unavailable(&e) => {
                    attempts -= 1;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Where `key` lives: the address (`host:port`) of the server that holds it, then those of its replicas. On
    /// a cluster: the master serving the key's slot now and its replicas not marked failed, as `CLUSTER NODES`
    /// says; on a single server: its own address, and no replica.
    pub async fn serving(&self, key: &str) -> RedisResult<(String, Vec<String>)> {
        if let Target::Single(client) = self {
            return match client.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
                    Ok((format!("{host}:{port}"), Vec::new()))
                }
                _ => Err(invalid("a Redis reached by a Unix socket has no host:port")),
            };
        }
        let mut conn = self.connected(Options::default()).await?;
        let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(&mut conn).await?;
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await?;
        shard_of(&nodes, slot).ok_or_else(|| invalid("no master serves the key's slot now"))
    }

    /// One server of this target, as a single-server target with the same credentials (a cluster's node, to
    /// ask it what only it knows).
    pub fn node(&self, addr: &str) -> RedisResult<Target> {
        let auth = match self {
            Target::Single(client) => {
                let settings = client.get_connection_info().redis_settings();
                (settings.username().map(str::to_owned), settings.password().map(str::to_owned))
            }
            Target::Cluster { username, password, .. } => (username.clone(), password.clone()),
        };
        let url = match auth {
            (None, None) => format!("redis://{addr}/"),
            (user, pass) => format!("redis://{}:{}@{addr}/", user.unwrap_or_default(), pass.unwrap_or_default()),
        };
        Ok(Target::Single(redis::Client::open(url)?))
    }

    /// A connection of its own, connected now: for blocking reads (`XREAD BLOCK`), which would hold up every
    /// other caller of a shared one.
    pub async fn dedicated(&self, options: Options) -> RedisResult<Conn> {
        match self {
            Target::Single(client) => {
                let mut config =
                    redis::AsyncConnectionConfig::new().set_connection_timeout(Some(options.connection_timeout));
                if let Some(timeout) = options.response_timeout {
                    config = config.set_response_timeout(Some(timeout));
                }
                Ok(Conn(Inner::Multiplexed(client.get_multiplexed_async_connection_with_config(&config).await?)))
            }
            Target::Cluster { .. } => {
                let cluster = LazyCluster::new(self.cluster_client(&options)?);
                cluster.get().await?;
                Ok(Conn(Inner::Cluster(Arc::new(cluster))))
            }
        }
    }
}

/// From `CLUSTER NODES`: the address of the master serving `slot` and those of its replicas not marked failed.
fn shard_of(nodes: &str, slot: u16) -> Option<(String, Vec<String>)> {
    let lines: Vec<Vec<&str>> =
        nodes.lines().map(|l| l.split_whitespace().collect()).filter(|f: &Vec<&str>| f.len() >= 8).collect();
    let addr = |f: &[&str]| f[1].split('@').next().unwrap_or(f[1]).to_owned();
    let serves = |f: &[&str]| {
        f[8..].iter().any(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
        })
    };
    let alive = |f: &[&str]| !f[2].split(',').any(|flag| flag == "fail" || flag == "fail?");
    let master = lines.iter().find(|f| f[2].split(',').any(|flag| flag == "master") && alive(f) && serves(f))?;
    let replicas = lines.iter().filter(|f| f[3] == master[0] && alive(f)).map(|f| addr(f)).collect();
    Some((addr(master), replicas))
}

/// Whether an error means Redis cannot answer now but will shortly (a client may retry, so a service answers
/// 503): the connection failed, dropped or timed out; or the server is loading its data after a restart
/// (`LOADING`), or a cluster is between masters (`TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, or `READONLY` from a
/// master just demoted).
pub fn is_unavailable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
}

/// Whether a transaction was refused because a command in it belongs to a slot another node serves now.
fn moved_inside(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ExecAbort)
        && e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, err)| err.kind() == Some(ServerErrorKind::Moved)))
}

/// The first key a pipeline names: the first argument of its first command that takes one (a command's first
/// argument after its name; `TIME`, `MULTI` and the like take none).
fn first_key(pipeline: &Pipeline) -> Option<Vec<u8>> {
    pipeline.cmd_iter().find_map(|cmd| match cmd.args_iter().nth(1) {
        Some(redis::Arg::Simple(key)) => Some(key.to_vec()),
        _ => None,
    })
}

fn invalid(message: &'static str) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, message))
}

/// A connection to a single Redis or to a cluster; clones share it.
#[derive(Clone)]
pub struct Conn(Inner);

#[derive(Clone)]
enum Inner {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Cluster(Arc<LazyCluster>),
}

/// The cluster client connects when first used; until a connection is made, each use tries again. A connection
/// whose answers stop coming is made again: the cluster client can end up sending every request into a void
/// after a storm of redirections while a slot moves (every call then waits out its timeout, for good).
struct LazyCluster {
    client: ClusterClient,
    /// The connection, and which one it is (the count of connections made before it).
    conn: tokio::sync::Mutex<Option<(u64, ClusterConnection)>>,
    made: AtomicU64,
    /// Calls on the current connection that timed out since the last that did not.
    timeouts: AtomicU32,
}

/// Calls in a row that time out before a cluster connection is made again.
const STUCK_AFTER_TIMEOUTS: u32 = 8;

impl LazyCluster {
    fn new(client: ClusterClient) -> Self {
        Self { client, conn: tokio::sync::Mutex::new(None), made: AtomicU64::new(0), timeouts: AtomicU32::new(0) }
    }

    async fn get(&self) -> RedisResult<(u64, ClusterConnection)> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let c = (self.made.fetch_add(1, Ordering::Relaxed), self.client.get_async_connection().await?);
        self.timeouts.store(0, Ordering::Relaxed);
        *conn = Some(c.clone());
        Ok(c)
    }

    /// Notes how a call on connection `which` ended; after `STUCK_AFTER_TIMEOUTS` timeouts in a row on the
    /// current connection, the next call connects anew (calls still under way on an older one do not count).
    async fn ended<T>(&self, which: u64, result: RedisResult<T>) -> RedisResult<T> {
        if self.made.load(Ordering::Relaxed) != which + 1 {
            return result;
        }
        match &result {
            Err(e) if e.is_timeout() => {
                if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 == STUCK_AFTER_TIMEOUTS {
                    let mut conn = self.conn.lock().await;
                    if conn.as_ref().is_some_and(|(made, _)| *made == which) {
                        tracing::warn!("the Redis Cluster connection answers nothing; connecting again");
                        conn.take();
                    }
                }
            }
            Ok(_) => self.timeouts.store(0, Ordering::Relaxed),
            Err(_) => {}
        }
        result
    }
}

impl Conn {
    /// `WAIT`: blocks until at least `replicas` replicas of the master that serves `key` have acknowledged every
    /// write this connection sent it, or `timeout` passed (at least 1 ms: Redis reads 0 as "forever"); returns
    /// how many did. On a cluster it goes to that key's master (the client would send a keyless `WAIT` to every
    /// master), over the connection the writes took. While it waits, Redis holds back every later command on
    /// the connection, so the timeout bounds what a missing replica costs every caller sharing it.
    pub async fn wait_replicas(&self, key: &str, replicas: u32, timeout: Duration) -> RedisResult<u32> {
        let ms = timeout.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(ms);
        let acked: i64 = match &self.0 {
            Inner::Cluster(c) => {
                let (which, mut conn) = c.get().await?;
                let routing = || {
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master)))
                };
                let mut answer = conn.route_command(cmd.clone(), routing()).await.and_then(Value::extract_error);
                if answer.as_ref().is_err_and(|e| e.to_string().contains("replica")) {
                    // Sent by a slot map that still names a master a failover demoted (WAIT carries no key, so
                    // the node cannot redirect it): a command on the key makes the client learn the new master,
                    // then WAIT goes there, where the writes went.
                    let _: RedisResult<Value> = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await;
                    answer = conn.route_command(cmd, routing()).await.and_then(Value::extract_error);
                }
                redis::from_redis_value(c.ended(which, answer).await?)?
            }
            _ => cmd.query_async(&mut self.clone()).await?,
        };
        Ok(u32::try_from(acked.max(0)).unwrap_or(u32::MAX))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Inner::Manager(c) => c.req_packed_command(cmd),
            Inner::Multiplexed(c) => c.req_packed_command(cmd),
            Inner::Cluster(c) => {
                let c = c.clone();
                Box::pin(async move {
                    let (which, mut conn) = c.get().await?;
                    let answer = conn.req_packed_command(cmd).await;
                    c.ended(which, answer).await
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Inner::Manager(c) => c.req_packed_commands(cmd, offset, count),
            Inner::Multiplexed(c) => c.req_packed_commands(cmd, offset, count),
            Inner::Cluster(c) => {
                let c = c.clone();
                Box::pin(async move {
                    let (which, mut conn) = c.get().await?;
                    let mut answer = conn.req_packed_commands(cmd, offset, count).await;
                    // The client follows MOVED for a command, not inside MULTI/EXEC: a transaction sent to a
                    // master demoted by a failover would fail there for as long as the connection lives. A plain
                    // command on the transaction's key makes the client learn the slot's new master (it
                    // rebuilds its slot map in the background, hence the pause); then the transaction goes
                    // again, a few times at most.
                    for pause in [0, 100, 300] {
                        match &answer {
                            Err(e) if cmd.is_transaction() && moved_inside(e) => {}
                            _ => break,
                        }
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        if let Some(key) = first_key(cmd) {
                            let _: RedisResult<Value> = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await;
                        }
                        answer = conn.req_packed_commands(cmd, offset, count).await;
                    }
                    c.ended(which, answer).await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::Manager(c) => c.get_db(),
            Inner::Multiplexed(c) => c.get_db(),
            Inner::Cluster(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_url_is_one_server_and_a_cluster_url_names_its_nodes_and_password() {
        assert!(!Target::parse("redis://:pw@127.0.0.1:6379/").expect("single").is_cluster());
        let Target::Cluster { nodes, username, password } =
            Target::parse("redis+cluster://:s3cret@127.0.0.1:7001, 127.0.0.1:7002/").expect("cluster")
        else {
            panic!("a cluster URL reads as a cluster");
        };
        assert_eq!(nodes, ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]);
        assert_eq!((username, password.as_deref()), (None, Some("s3cret")));
        let Target::Cluster { username, password, .. } = Target::parse("redis+cluster://app:pw@h:1").expect("user")
        else {
            panic!("cluster");
        };
        assert_eq!((username.as_deref(), password.as_deref()), (Some("app"), Some("pw")));
    }

    #[test]
    fn a_slot_is_found_on_its_master_and_its_live_replicas_beside_it() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922 12000
c3 127.0.0.1:7003@17003 master,fail - 0 0 3 connected
d4 127.0.0.1:7004@17004 slave b2 0 0 2 connected
e5 127.0.0.1:7005@17005 slave,fail b2 0 0 2 connected
f6 127.0.0.1:7006@17006 master - 0 0 4 connected 10923-11999 12001-16383
";
        assert_eq!(shard_of(nodes, 0), Some(("127.0.0.1:7001".into(), vec![])));
        assert_eq!(shard_of(nodes, 12000), Some(("127.0.0.1:7002".into(), vec!["127.0.0.1:7004".into()])));
        assert_eq!(shard_of(nodes, 16383), Some(("127.0.0.1:7006".into(), vec![])));
        assert_eq!(shard_of("", 1), None);
    }

    #[test]
    fn a_node_of_a_cluster_keeps_its_credentials() {
        let cluster = Target::parse("redis+cluster://app:pw@127.0.0.1:7001,127.0.0.1:7002").expect("cluster");
        let Target::Single(client) = cluster.node("127.0.0.1:7002").expect("node") else { panic!("single") };
        let info = client.get_connection_info();
        assert_eq!((info.redis_settings().username(), info.redis_settings().password()), (Some("app"), Some("pw")));
        assert!(matches!(info.addr(), redis::ConnectionAddr::Tcp(h, 7002) if h == "127.0.0.1"));
    }

    #[test]
    fn a_server_loading_or_a_cluster_between_masters_is_unavailable_and_a_script_error_is_not() {
        let server = |code: &str| RedisError::from((ErrorKind::Server(server_kind(code)), "from the server"));
        for code in ["LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY"] {
            assert!(is_unavailable(&server(code)), "{code}");
        }
        assert!(is_unavailable(&RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))));
        for code in ["ERR", "NOSCRIPT", "CROSSSLOT", "NOPERM"] {
            assert!(!is_unavailable(&server(code)), "{code}");
        }
    }

    fn server_kind(code: &str) -> ServerErrorKind {
        match code {
            "LOADING" => ServerErrorKind::BusyLoading,
            "TRYAGAIN" => ServerErrorKind::TryAgain,
            "CLUSTERDOWN" => ServerErrorKind::ClusterDown,
            "MASTERDOWN" => ServerErrorKind::MasterDown,
            "READONLY" => ServerErrorKind::ReadOnly,
            "NOSCRIPT" => ServerErrorKind::NoScript,
            "CROSSSLOT" => ServerErrorKind::CrossSlot,
            "NOPERM" => ServerErrorKind::NoPerm,
            _ => ServerErrorKind::ResponseError,
        }
    }

    #[test]
    fn a_transaction_s_key_is_the_first_a_command_of_it_names() {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("TIME").hgetall("queue:{ev1}:settings").get("queue:{ev1}:seq");
        assert_eq!(first_key(&pipe).as_deref(), Some(&b"queue:{ev1}:settings"[..]));
        let mut keyless = redis::pipe();
        keyless.cmd("TIME");
        assert_eq!(first_key(&keyless), None);
    }

    #[test]
    fn a_cluster_url_without_nodes_or_with_a_bad_one_is_refused() {
        assert!(Target::parse("redis+cluster://").is_err());
        assert!(Target::parse("redis+cluster://:pw@").is_err());
        assert!(Target::parse("redis+cluster://h:notaport").is_err());
        assert!(Target::parse("nonsense").is_err());
    }
}
