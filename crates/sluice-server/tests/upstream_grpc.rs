//! envoyproxy/ratelimit's expectations, checked through Envoy's generated RLS v3 client
//! against a Sluice gRPC server loaded with upstream's own fixtures (unchanged). Each test
//! names the upstream file whose expectations it ports. Skipped, with a note, when the
//! corpus is not next to the checkout.
#![allow(clippy::unwrap_used)]

mod conformance;

use conformance::{
    SEC, Server, T0, bounded, brief, corpus, descriptor, integration_config, load, ok, over,
    request, upstream_config,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use sluice_server::Engine;
use sluice_server::grpc::GrpcOptions;

/// test/config/config_test.go (TestWildcardConfig) on test/config/wildcard.yaml, and
/// src/config/config_impl.go's `wildcardMatch`: a `*` anywhere in a value matches any run
/// of characters (`foo*`, `bar*b`, `foo*bar*baz`), at any level; a value without `*` is
/// literal.
#[tokio::test]
async fn wildcards_match_in_any_position() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let mut s = Server::start(load(upstream_config(&corpus, "wildcard.yaml"))).await;
        let d = "test-domain";
        type Entries = &'static [(&'static str, &'static str)];
        let cases: &[(Entries, Option<u32>)] = &[
            (&[("wild", "foo1")], Some(20)),
            (&[("wild", "foo")], Some(20)),
            (&[("wild", "fo")], None),
            (&[("noWild", "foo1")], None),
            (&[("noWild", "foo")], Some(20)),
            (&[("noVal", "anything")], Some(20)),
            (&[("midWild", "barab")], Some(20)),
            (&[("midWild", "barb")], Some(20)),
            (&[("midWild", "bara")], None),
            (&[("multiWild", "foo1bar2baz")], Some(10)),
            (&[("multiWild", "foobarbaz")], Some(10)),
            (&[("multiWild", "foo1baz")], None),
            (&[("multiWild", "foo1baz2bar")], None),
            (&[("nestedWild", "val1"), ("wild", "goo1")], Some(20)),
            (&[("nestedWild", "val1"), ("wild", "foo1")], None),
        ];
        for (entries, limit) in cases {
            let r = s.ask(d, &[entries], 1).await;
            let got = r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit);
            assert_eq!(got, *limit, "{entries:?}");
        }
        // Each value a wildcard matches has its own counter.
        for _ in 0..9 {
            s.ask(d, &[&[("multiWild", "fooXbarYbaz")]], 1).await;
        }
        let a = s.ask(d, &[&[("multiWild", "fooXbarYbaz")]], 1).await;
        let b = s.ask(d, &[&[("multiWild", "fooZbarYbaz")]], 1).await;
        assert_eq!(brief(&a.statuses[0]), (ok(), Some(10), 0));
        assert_eq!(brief(&b.statuses[0]), (ok(), Some(10), 9));
        s.stop().await;
    })
    .await;
}

/// src/config/config_impl.go (`NewRateLimit` sets `Limit.Name`) on test/config/
/// basic_config.yaml: `current_limit.name` is the rule's `name`, empty for a rule without.
#[tokio::test]
async fn current_limit_carries_the_rules_name() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let mut s = Server::start(load(upstream_config(&corpus, "basic_config.yaml"))).await;
        let r = s
            .ask("test-domain", &[&[("key4", "x")], &[("key3", "y")]], 1)
            .await;
        let names: Vec<_> = r
            .statuses
            .iter()
            .map(|s| s.current_limit.as_ref().unwrap().name.as_str())
            .collect();
        assert_eq!(names, ["key4_rate_limit", ""]);
        s.stop().await;
    })
    .await;
}

/// test/integration/integration_test.go (testBasicBaseConfig) and src/utils' `CalculateReset`
/// (`unit − now mod unit`, in whole seconds): `duration_until_reset` is exactly 1 s in a
/// per-second window, and the seconds left, rounded up, in a minute's. Sub-second precision
/// is Sluice's opt-in.
#[tokio::test]
async fn duration_until_reset_is_whole_seconds_unless_asked() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let secs = |seconds| Some(PbDuration { seconds, nanos: 0 });
        let mut s = Server::start(load(integration_config(&corpus))).await;
        // T0 is 250 ms into a second, a minute, an hour.
        let r = s.ask("basic", &[&[("key1", "foo")]], 1).await;
        assert_eq!(r.statuses[0].duration_until_reset, secs(1));
        s.clock.set(T0 + 30 * SEC);
        let r = s.ask("basic", &[&[("one_per_minute", "foo")]], 1).await;
        assert_eq!(r.statuses[0].duration_until_reset, secs(30));
        let r = s.ask("another", &[&[("key3", "foo")]], 1).await;
        assert_eq!(r.statuses[0].duration_until_reset, secs(3_570));
        s.stop().await;

        let options = GrpcOptions {
            subsecond_reset: true,
            ..GrpcOptions::default()
        };
        let mut s =
            Server::start_with(Engine::new(load(integration_config(&corpus))), options).await;
        let r = s.ask("basic", &[&[("key1", "foo")]], 1).await;
        assert_eq!(
            r.statuses[0].duration_until_reset,
            Some(PbDuration {
                seconds: 0,
                nanos: 750_000_000
            })
        );
        s.stop().await;
    })
    .await;
}

/// test/integration/integration_test.go (testBasicBaseConfig): 25 requests against 20 a
/// minute (`another`, key2), then two descriptors of 20 a minute and 10 an hour in one
/// request, 15 times: OVER_LIMIT with 0 remaining from the 21st (11th), while the other
/// descriptor goes on counting.
#[tokio::test]
async fn integration_sequences() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let mut s = Server::start(load(integration_config(&corpus))).await;
        for i in 0..25u32 {
            let r = s.ask("another", &[&[("key2", "7345")]], 1).await;
            let want = if i >= 20 {
                (over(), Some(20), 0)
            } else {
                (ok(), Some(20), 20 - (i + 1))
            };
            assert_eq!(
                (r.overall_code, brief(&r.statuses[0])),
                (want.0, want),
                "{i}"
            );
        }
        for i in 0..15u32 {
            let r = s
                .ask("another", &[&[("key2", "9810")], &[("key3", "9810")]], 1)
                .await;
            let (code, second) = if i >= 10 {
                (over(), (over(), Some(10), 0))
            } else {
                (ok(), (ok(), Some(10), 10 - (i + 1)))
            };
            assert_eq!(r.overall_code, code, "{i}");
            assert_eq!(brief(&r.statuses[0]), (ok(), Some(20), 20 - (i + 1)), "{i}");
            assert_eq!(brief(&r.statuses[1]), second, "{i}");
        }
        s.stop().await;
    })
    .await;
}

/// src/limiter/base_limiter.go (`GetResponseDescriptorStatus`: the counter is increased by
/// every request, and a status over the limit says 0 remaining) and the fixed-window
/// caches' tests: after 8 of 10 used, a refused request of 5, then a request of 1, is
/// OVER_LIMIT. Not counting refused requests is Sluice's opt-in.
#[tokio::test]
async fn refused_hits_are_counted_and_over_limit_says_zero_left() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        // `another`, key3: 10 an hour.
        let key3: &[&[(&str, &str)]] = &[&[("key3", "x")]];
        let mut s = Server::start(load(integration_config(&corpus))).await;
        let r = s.ask("another", key3, 8).await;
        assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 2));
        let r = s.ask("another", key3, 5).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (over(), (over(), Some(10), 0))
        );
        let r = s.ask("another", key3, 1).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (over(), (over(), Some(10), 0))
        );
        s.stop().await;

        let engine = Engine::new(load(integration_config(&corpus)));
        engine.set_count_refused(false);
        let mut s = Server::start_with(engine, GrpcOptions::default()).await;
        s.ask("another", key3, 8).await;
        let r = s.ask("another", key3, 5).await;
        assert_eq!(brief(&r.statuses[0]), (over(), Some(10), 0));
        let r = s.ask("another", key3, 1).await;
        assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 1));
        s.stop().await;
    })
    .await;
}

/// src/limiter/base_limiter.go and the service tests of per-descriptor `hits_addend`
/// (test/service/ratelimit_test.go): a descriptor's `hits_addend` of 0 checks without
/// consuming — OK while the counter is within the limit, OVER_LIMIT once it is past it —
/// while the request's `hits_addend` 0 (the field's default) counts as 1.
#[tokio::test]
async fn descriptor_hits_addend_zero_checks_without_consuming() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let mut s = Server::start(load(integration_config(&corpus))).await;
        let with = |hits: Option<u64>| RateLimitRequest {
            domain: "another".into(),
            descriptors: vec![descriptor(&[("key3", "z")], hits)],
            hits_addend: 0,
        };
        for _ in 0..3 {
            let r = s.call(with(Some(0))).await;
            assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 10));
        }
        assert!(s.engine.is_empty(), "a check of 0 stores nothing");
        // The request's addend 0 counts as 1.
        let r = s.call(with(None)).await;
        assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 9));
        let r = s.call(with(Some(9))).await;
        assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 0));
        // At the limit, not past it: a check of 0 is still OK.
        let r = s.call(with(Some(0))).await;
        assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 0));
        let r = s.call(with(Some(1))).await;
        assert_eq!(brief(&r.statuses[0]), (over(), Some(10), 0));
        // Past it (the refused hit counted): a check of 0 is over the limit.
        let r = s.call(with(Some(0))).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (over(), (over(), Some(10), 0))
        );
        s.stop().await;
    })
    .await;
}

/// test/server/health_test.go and src/server/health.go: the server answers gRPC health
/// checks (`grpc.health.v1.Health/Check`), SERVING, for the server and the service.
#[tokio::test]
async fn grpc_health_is_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let s = Server::start(load(integration_config(&corpus))).await;
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
            let r = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.status, i32::from(ServingStatus::Serving), "{service:?}");
        }
        let e = health
            .check(HealthCheckRequest {
                service: "nobody".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        s.stop().await;
    })
    .await;
}

/// An empty runtime directory: upstream serves with no domain (every descriptor OK, no
/// limit) rather than refusing to start (src/config/config_impl.go `IsEmptyDomains`).
#[tokio::test]
async fn an_empty_configuration_directory_serves_no_domain() {
    bounded(async {
        let dir = std::env::temp_dir().join(format!("sluice-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = Server::start(load(dir.clone())).await;
        let r = s.ask("any", &[&[("k", "v")]], 1).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (ok(), (ok(), None, 0))
        );
        s.stop().await;
        let _ = std::fs::remove_dir(&dir);
    })
    .await;
}

/// test/integration/integration_test.go (share_threshold) on the runtime directory's
/// share_threshold.yaml: values matching a `share_threshold: true` wildcard share one
/// counter; without the flag each value has its own.
#[tokio::test]
async fn share_threshold_values_share_one_counter() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let mut s = Server::start(load(integration_config(&corpus))).await;
        let d = "share-threshold-test";
        for i in 0..10u32 {
            let file = format!("files/f{i}");
            let r = s.ask(d, &[&[("files", &file)]], 1).await;
            assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 9 - i), "{file}");
        }
        let r = s.ask(d, &[&[("files", "files/another")]], 1).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (over(), (over(), Some(10), 0))
        );
        for i in 0..3 {
            let file = format!("files_no_share/f{i}");
            let r = s.ask(d, &[&[("files_no_share", &file)]], 1).await;
            assert_eq!(brief(&r.statuses[0]), (ok(), Some(10), 9), "{file}");
        }
        s.stop().await;
    })
    .await;
}

/// src/service/ratelimit.go (`shouldRateLimitWorker`: with `SHADOW_MODE`, "if finalCode ==
/// OVER_LIMIT && globalShadowMode" the overall code becomes OK, and nothing else changes)
/// and test/service/ratelimit_test.go (`TestServiceGlobalShadowMode`: the OVER_LIMIT
/// status is kept): configured limits are still counted and their statuses still say
/// OVER_LIMIT, and a descriptor's own `limit` is shadowed too (settings.go's comment says
/// otherwise; its code does not). More in upstream_service.rs.
#[tokio::test]
async fn global_shadow_mode_answers_ok_overall_and_keeps_the_statuses() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let options = GrpcOptions {
            shadow_mode: true,
            ..GrpcOptions::default()
        };
        let engine = Engine::new(load(integration_config(&corpus)));
        let mut s = Server::start_with(engine, options).await;
        let one: &[&[(&str, &str)]] = &[&[("one_per_minute", "a")]];
        let r = s.ask("basic", one, 1).await;
        assert_eq!(brief(&r.statuses[0]), (ok(), Some(1), 0));
        let r = s.ask("basic", one, 1).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (ok(), (over(), Some(1), 0))
        );
        let mut overridden = request("basic", one, 1);
        overridden.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 0,
            unit: 2, // MINUTE
        });
        let r = s.call(overridden).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (ok(), (over(), Some(0), 0))
        );
        s.stop().await;
    })
    .await;
}

/// src/service/ratelimit.go and src/settings/settings.go (`LIMIT_RESPONSE_HEADERS_ENABLED`,
/// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`) and the service
/// tests of custom headers (test/service/ratelimit_test.go): when enabled, the response
/// asks Envoy to add the limit, the permits left and the seconds to reset of the
/// descriptor with the fewest left; off by default.
#[tokio::test]
async fn rate_limit_headers_for_envoy_when_enabled() {
    use sluice_server::grpc::ResponseHeaders;
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let headers = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
            r.response_headers_to_add
                .iter()
                .map(|h| (h.key.clone(), h.value.clone()))
                .collect::<Vec<_>>()
        };
        let two: &[&[(&str, &str)]] = &[&[("key2", "h")], &[("key3", "h")]];
        let mut s = Server::start(load(integration_config(&corpus))).await;
        let r = s.ask("another", two, 1).await;
        assert!(headers(&r).is_empty());
        s.stop().await;

        let options = GrpcOptions {
            response_headers: Some(ResponseHeaders::default()),
            ..GrpcOptions::default()
        };
        let engine = Engine::new(load(integration_config(&corpus)));
        let mut s = Server::start_with(engine, options).await;
        // key2: 20 a minute, key3: 10 an hour; key3 has fewer left. T0 is 0.25 s into the
        // hour: 3,600 s to its end, rounded up.
        let r = s.ask("another", two, 1).await;
        let want = |a: &str, b: &str, c: &str| {
            vec![
                ("RateLimit-Limit".to_owned(), a.to_owned()),
                ("RateLimit-Remaining".to_owned(), b.to_owned()),
                ("RateLimit-Reset".to_owned(), c.to_owned()),
            ]
        };
        assert_eq!(headers(&r), want("10", "9", "3600"));
        let r = s.ask("another", &[&[("key2", "h")]], 1).await;
        assert_eq!(headers(&r), want("20", "18", "60"));
        // No limit: no header.
        let r = s.ask("another", &[&[("nothing", "h")]], 1).await;
        assert!(headers(&r).is_empty());
        s.stop().await;
    })
    .await;
}

/// src/config/config_impl.go (`GetLimit`: the detailed and value_to_metric stats keys) and
/// test/config/config_test.go's detailed-metric and value_to_metric cases: a
/// `detailed_metric` rule counts its hits per runtime value (a `share_threshold` entry by its
/// pattern); `value_to_metric` names the runtime value of an entry matched by the key alone
/// or a wildcard; other rules count under their configured path.
#[tokio::test]
async fn detailed_and_value_to_metric_statistics_name_the_runtime_values() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let hits = |s: &Server, domain: &str, path: &str| {
            s.engine
                .stats()
                .snapshot()
                .into_iter()
                .find(|(d, p, _)| d == domain && p == path)
                .map(|(_, _, c)| c.total_hits)
        };
        let mut s = Server::start(load(upstream_config(&corpus, "basic_config.yaml"))).await;
        let d = "test-domain";
        for v in ["foo", "foo", "bar"] {
            s.ask(d, &[&[("key7", v)]], 1).await;
            s.ask(d, &[&[("key3", v)]], 1).await;
        }
        assert_eq!(hits(&s, d, "key7_foo"), Some(2));
        assert_eq!(hits(&s, d, "key7_bar"), Some(1));
        assert_eq!(hits(&s, d, "key3"), Some(3));
        assert_eq!(hits(&s, d, "key3_foo"), None);
        s.stop().await;

        let mut s = Server::start(load(upstream_config(&corpus, "share_threshold.yaml"))).await;
        s.ask(d, &[&[("service", "svc/a"), ("endpoint", "e1")]], 1).await;
        s.ask(d, &[&[("service", "svc/b"), ("endpoint", "e1")]], 1).await;
        assert_eq!(hits(&s, d, "service_svc/*.endpoint_e1"), Some(2));
        s.stop().await;

        let yaml = "domain: v\ndescriptors:\n  - key: path\n    value_to_metric: true\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: route\n    value: api/*\n    value_to_metric: true\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
        let mut s = Server::start(sluice_server::Config::from_yaml("v.yaml", yaml).unwrap()).await;
        s.ask("v", &[&[("path", "/a")]], 1).await;
        s.ask("v", &[&[("route", "api/x")]], 1).await;
        assert_eq!(hits(&s, "v", "path_/a"), Some(1));
        assert_eq!(hits(&s, "v", "route_api/x"), Some(1));
        assert_eq!(hits(&s, "v", "path"), Some(0), "the rule's own series stays");
        s.stop().await;
    })
    .await;
}

#[tokio::test]
async fn the_harness_request_sets_the_request_addend() {
    // The request builder used above: `hits` goes in the request's `hits_addend`.
    assert_eq!(request("d", &[&[("k", "v")]], 3).hits_addend, 3);
}
