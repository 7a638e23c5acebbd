//! A 3-master Redis Cluster: every algorithm decides as in memory on keys spread over the
//! slots, and a rule's slot migrated to another master mid-run (MIGRATING / IMPORTING,
//! MIGRATE, SETSLOT NODE, with `ASK` and `MOVED` followed by the client) loses no count.
//! Needs `redis-server` and `redis-cli` on PATH.
#![allow(clippy::unwrap_used)]

mod support;

use sluice_limits::{AlgorithmKind, AnyAlgorithm, Limit, Options};
use sluice_redis::{MemoryStore, RedisConfig, RedisStore};
use support::RedisCluster;

fn store(cluster: &RedisCluster, prefix: &str) -> RedisStore {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::cluster(
        &urls,
        RedisConfig {
            prefix: prefix.to_string(),
            timeout: std::time::Duration::from_secs(5),
            ..RedisConfig::caller_time()
        },
    )
    .unwrap()
}

fn algorithms() -> Vec<AnyAlgorithm> {
    AlgorithmKind::ALL
        .into_iter()
        .map(|k| AnyAlgorithm::new(k, Options::default()))
        .collect()
}

/// `(node id, port)` of the master serving `slot`, and of another master.
fn owner_and_other(cluster: &RedisCluster, slot: u16) -> ((String, u16), (String, u16)) {
    let nodes = cluster.cli(cluster.nodes[0].port, &["CLUSTER", "NODES"]);
    let mut owner = None;
    let mut others = Vec::new();
    for line in nodes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let id = f[0].to_string();
        let port: u16 = f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
        let serves = f[8..].iter().any(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
        });
        if serves {
            owner = Some((id, port));
        } else {
            others.push((id, port));
        }
    }
    (
        owner.expect("some master serves the slot"),
        others.remove(0),
    )
}

/// `n` requests of the rule "mover" per algorithm at `now`: Redis must answer as memory.
async fn round(
    redis: &RedisStore,
    memory: &MemoryStore,
    limit: &Limit,
    now: u64,
    n: usize,
    admitted: &mut [u64; 8],
) {
    for (i, alg) in algorithms().iter().enumerate() {
        for _ in 0..n {
            let want = memory.decide(alg, "mover", limit, now, 1);
            let got = redis.check(alg, "mover", limit, now, 1).await.unwrap();
            assert_eq!(got, want, "{alg:?}");
            admitted[i] += u64::from(got.allowed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_decides_as_memory_and_survives_a_slot_migration() {
    let cluster = RedisCluster::start(3);
    let memory = MemoryStore::new();
    let redis = store(&cluster, "c:");
    let limit = Limit::from_nanos(10, 1_000_000_000).unwrap();

    // Keys over many slots, every algorithm, a trace over two windows.
    for alg in algorithms() {
        for key in ["alice", "bob", "carol", "dave", "erin", "frank"] {
            for i in 0..14u64 {
                let now = 1_000 + i * 90_000_000;
                let want = memory.decide(&alg, key, &limit, now, 1);
                let got = redis.check(&alg, key, &limit, now, 1).await.unwrap();
                assert_eq!(got, want, "{alg:?} {key} request {i}");
            }
        }
    }

    // Migrate the slot of rule "mover" while it is being used.
    let slot: u16 = cluster
        .cli(cluster.nodes[0].port, &["CLUSTER", "KEYSLOT", "mover"])
        .parse()
        .unwrap();
    let ((src_id, src), (dst_id, dst)) = owner_and_other(&cluster, slot);
    let slot_s = slot.to_string();
    let hour: Limit = "20/1h".parse().unwrap();
    let now = 5_000_000_000;
    let mut admitted = [0u64; 8];
    round(&redis, &memory, &hour, now, 6, &mut admitted).await;

    assert_eq!(
        cluster.cli(dst, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]),
        "OK"
    );
    assert_eq!(
        cluster.cli(src, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id]),
        "OK"
    );
    // Keys still on the source: served there.
    round(&redis, &memory, &hour, now, 4, &mut admitted).await;

    let keys = cluster.cli(src, &["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert!(keys.len() >= 6, "the rule's keys are in its slot: {keys:?}");
    let mut migrate = redis::cmd("MIGRATE");
    migrate
        .arg("127.0.0.1")
        .arg(dst)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS");
    for k in &keys {
        migrate.arg(*k);
    }
    let client = redis::Client::open(format!("redis://127.0.0.1:{src}/")).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let reply: String = migrate.query_async(&mut con).await.unwrap();
    assert_eq!(reply, "OK");
    // Keys moved, slot still migrating: the source answers ASK, the client follows it.
    round(&redis, &memory, &hour, now, 4, &mut admitted).await;

    for node in &cluster.nodes {
        assert_eq!(
            cluster.cli(node.port, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]),
            "OK"
        );
    }
    // Slot moved: MOVED, then the new owner.
    round(&redis, &memory, &hour, now, 10, &mut admitted).await;
    // 24 requests per algorithm against 20 per hour: exactly 20 admitted, none lost; the
    // warm-up pays its first permit forward (minutes on a cold key), so it admits one.
    assert_eq!(admitted, [20, 20, 20, 20, 20, 20, 20, 1]);
    let ((id, _), _) = owner_and_other(&cluster, slot);
    assert_eq!(id, dst_id, "the slot moved");
}
