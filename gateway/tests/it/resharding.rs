//! A room's hash slot moved to another master of the stack's Redis Cluster (whatever `REDIS_URL` says) while
//! fans join: the client follows `ASK` for keys already moved and `MOVED` once the slot is the other master's,
//! and tries again a script whose keys are split between the two for a moment (`TRYAGAIN`). What it cannot
//! carry through is a 503 the fan retries (on a busy box the client once stopped answering altogether after
//! the redirections, until `redisconn` connected it again). Nobody gets an error of any other kind, and every
//! fan ends up with a place of its own.

use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::json;

use crate::harness::*;

async fn cmd<T: redis::FromRedisValue>(conn: &mut redisconn::Conn, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(conn).await.unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Moves `slot` from the master at `from` to the one at `to`, a key at a time, as `redis-cli --cluster
/// reshard` does: the target imports, the source migrates, the keys go over, then every master is told.
/// Returns when the keys started and finished going over.
async fn move_slot(slot: u16, from: &str, to: &str, masters: &[String]) -> (Instant, Instant) {
    let password = cluster_url()
        .strip_prefix("redis+cluster://")
        .and_then(|rest| rest.split_once('@'))
        .map(|(auth, _)| auth.rsplit(':').next().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let (mut src, mut dst) = (cluster_node(from).await, cluster_node(to).await);
    let (src_id, dst_id): (String, String) =
        (cmd(&mut src, &["CLUSTER", "MYID"]).await, cmd(&mut dst, &["CLUSTER", "MYID"]).await);
    let slot = slot.to_string();
    let () = cmd(&mut dst, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]).await;
    let () = cmd(&mut src, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]).await;
    let (host, port) = to.rsplit_once(':').expect("host:port");
    let started = Instant::now();
    for _ in 0..10_000 {
        let keys: Vec<String> = cmd(&mut src, &["CLUSTER", "GETKEYSINSLOT", &slot, "1"]).await;
        if keys.is_empty() {
            break;
        }
        let mut migrate = vec!["MIGRATE", host, port, "", "0", "5000", "AUTH", &password, "KEYS"];
        migrate.extend(keys.iter().map(String::as_str));
        let _: redis::Value = cmd(&mut src, &migrate).await;
        // Slowly, so that joins meet the slot half moved.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let moved = Instant::now();
    for addr in masters {
        let () = cmd(&mut cluster_node(addr).await, &["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]).await;
    }
    (started, moved)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fans_joining_while_the_rooms_slot_moves_to_another_master_each_get_a_place() {
    let event = 8201;
    let upstream = Upstream::start().await;
    let mut n = Node::new(upstream.addr, &prefix());
    n.redis_url = cluster_url();
    let gw = GatewayProcess::start(n).await;
    gw.configure(event, json!({"state": "paused"})).await;
    // Keys the room has before the move: its settings, and places of fans who joined earlier.
    for i in 0..20 {
        assert_eq!(gw.join(event, &format!("fan-early-{i}")).await.status, 200);
    }
    let cluster = redisconn::Target::parse(&cluster_url()).expect("cluster URL");
    let tag = format!("{{ev{event}}}");
    let (from, _) = cluster.serving(&tag).await.expect("the slot's master");
    let mut any = cluster_node(&from).await;
    let slot: u16 = cmd(&mut any, &["CLUSTER", "KEYSLOT", &tag]).await;
    let nodes: String = cmd(&mut any, &["CLUSTER", "NODES"]).await;
    let masters: Vec<String> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 2 && f[2].contains("master") && !f[2].contains("fail"))
        .map(|f| f[1].split('@').next().expect("addr").to_owned())
        .collect();
    let to = masters.iter().find(|m| **m != from).expect("another master").clone();

    // The move, and 200 fans joining meanwhile (each tries again after a 503, as the page does).
    let fans: Vec<String> = (0..200).map(|i| format!("fan-{i}")).collect();
    let moving = move_slot(slot, &from, &to, &masters);
    let joining = join_all(fans.iter().enumerate().map(|(i, fan)| {
        let gw = &gw;
        async move {
            tokio::time::sleep(Duration::from_millis(i as u64 * 2)).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut statuses = Vec::new();
            loop {
                let sent = Instant::now();
                let reply = gw.join(event, fan).await;
                statuses.push((sent, reply.status));
                if reply.status != 503 || Instant::now() > deadline {
                    return (reply, statuses);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }));
    let ((started, moved), joined) = tokio::join!(moving, joining);

    let (now_on, _) = cluster.serving(&tag).await.expect("the slot's master");
    assert_eq!(now_on, to, "the slot moved");
    let seen: Vec<(Instant, u16)> = joined.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    assert!(seen.iter().all(|(_, s)| [200, 503].contains(s)), "only places and 503s");
    let during = seen.iter().filter(|(at, _)| (started..moved).contains(at)).count();
    let refused = seen.iter().filter(|(_, s)| *s == 503).count();
    eprintln!("{during} joins sent while the keys went over ({:?}); {refused} refused with a 503", moved - started);
    assert!(during > 0, "the joins met the slot half moved");
    let mut places: Vec<u64> = joined
        .iter()
        .map(|(r, _)| {
            assert_eq!(r.status, 200, "{}", r.text);
            r.place()
        })
        .collect();
    places.sort_unstable();
    assert_eq!(places, (21..=220).collect::<Vec<u64>>(), "one place each, after the earlier fans'");
    // The room's earlier keys came along: those fans keep their places.
    assert_eq!(gw.join(event, "fan-early-0").await.place(), 1);
    upstream.stop().await;
}
