//! Queue writes that wait for a replica (`--redis-wait-replicas`), on the stack's Redis Cluster whatever
//! `REDIS_URL` says: a place is answered only once the replica of the room's master holds it, so a failover to
//! that replica keeps it; a missing replica costs one bounded wait a second, and the joins meanwhile are
//! refused with a 503 the fan retries.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::*;

/// The address of the replica of the master serving `key`'s slot.
async fn replica_of(key: &str) -> String {
    let cluster = redisconn::Target::parse(&cluster_url()).expect("cluster URL");
    let (master, replicas) = cluster.serving(key).await.expect("the slot's master");
    replicas.into_iter().next().unwrap_or_else(|| panic!("the master {master} has no replica"))
}

/// A Redis process stopped (SIGSTOP) until dropped, or until `resume` (SIGCONT), even if the test fails.
struct Stopped(u32);

impl Stopped {
    async fn stop(addr: &str) -> Self {
        let info: String =
            redis::cmd("INFO").arg("server").query_async(&mut cluster_node(addr).await).await.expect("INFO");
        let pid = info.lines().find_map(|l| l.strip_prefix("process_id:")).expect("process_id").trim();
        let pid: u32 = pid.parse().expect("pid");
        assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().expect("kill").success());
        Self(pid)
    }

    fn resume(&self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.resume();
    }
}

/// The gateway's count of queue writes its replica did not acknowledge in time, with `outcome`.
async fn unreplicated(gw: &GatewayProcess, outcome: &str) -> u64 {
    gw.metric(&format!("waiting_room_unreplicated_writes_total{{outcome=\"{outcome}\"}}")).await.unwrap_or(0)
}

/// One gateway on the cluster whose queue writes wait up to `wait_ms` for one replica, and an open room.
async fn room_on_cluster(event: i64, wait_ms: u64) -> (Upstream, GatewayProcess, String) {
    let upstream = Upstream::start().await;
    let mut node = Node::new(upstream.addr, &prefix()).arg("--redis-wait-replicas", 1).arg("--redis-wait-ms", wait_ms);
    node.redis_url = cluster_url();
    let gw = GatewayProcess::start(node).await;
    gw.configure(event, json!({"state": "paused", "admit_per_minute": 60, "max_active": 10})).await;
    // The public listener's connection to the cluster is made on its first call, to every node: made now, while
    // every node answers.
    assert_eq!(gw.join(event, "fan-first").await.status, 200);
    (upstream, gw, replica_of(&format!("{{ev{event}}}")).await)
}

// One test, in two halves, because each stops a replica of the shared cluster: run side by side, one could
// wake the replica the other needs stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_is_answered_once_the_replica_holds_it_and_without_one_the_join_is_refused_after_one_wait() {
    // The replica stopped for less than the wait: the join is answered once it is back, not before.
    let event = 8101;
    let (upstream, gw, replica) = room_on_cluster(event, 3000).await;
    let stopped = Stopped::stop(&replica).await;
    let paused = Duration::from_millis(600);
    let resume = tokio::spawn(async move {
        tokio::time::sleep(paused).await;
        stopped.resume();
        stopped
    });
    let started = Instant::now();
    let joined = gw.join(event, "fan-w").await;
    let took = started.elapsed();
    drop(resume.await.expect("resumed"));
    assert_eq!(joined.status, 200, "{}", joined.text);
    assert!(took >= paused - Duration::from_millis(100), "answered after {took:?}, before the replica was back");
    assert_eq!(unreplicated(&gw, "refused").await, 0, "the wait was long enough");
    upstream.stop().await;

    // The replica stopped for longer than the wait: the join is refused (503) once the wait is over, the next
    // one at once, without waiting again; once the replica is back, joining again gives the place the first
    // refusal left pending.
    let event = 8102;
    let wait = Duration::from_millis(800);
    let (upstream, gw, replica) = room_on_cluster(event, wait.as_millis() as u64).await;
    let stopped = Stopped::stop(&replica).await;
    let started = Instant::now();
    let first = gw.join(event, "fan-x").await;
    let first_took = started.elapsed();
    let started = Instant::now();
    let second = gw.join(event, "fan-y").await;
    let second_took = started.elapsed();
    drop(stopped);
    for refused in [&first, &second] {
        assert_eq!((refused.status, refused.code()), (503, "queue_unavailable"), "{}", refused.text);
        assert!(refused.header("retry-after").is_some(), "a refusal says when to come back");
    }
    assert!(first_took >= wait, "the first join waited for the replica: {first_took:?}");
    assert!(second_took < wait, "the next one did not wait again: {second_took:?}");
    assert_eq!(unreplicated(&gw, "refused").await, 2);
    // The pause after a short wait is a quarter of a second; then the replica answers again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        let again = gw.join(event, "fan-x").await;
        if again.status == 200 || Instant::now() > deadline {
            break again;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.place(), 2, "the place the refused join left pending");
    assert_eq!(gw.join(event, "fan-y").await.place(), 3);
    upstream.stop().await;
}
