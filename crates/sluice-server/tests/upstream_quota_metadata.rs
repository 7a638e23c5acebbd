//! envoyproxy/ratelimit's `quota_mode` and descriptor `metadata`, checked through Envoy's
//! generated RLS v3 client against a Sluice gRPC server. The upstream code ported (read at
//! upstream commit 8fe6ea42; the fixtures are from the corpus's commit):
//! - src/config/config_impl.go: `YamlDescriptor` (`QuotaMode`, `Metadata`), `parseMetadata`,
//!   `validateYamlKeys` (keys under `metadata` are not checked), `GetLimit` (the matched
//!   descriptor's metadata is handed on with its limit, and lost where the limit is rebuilt
//!   by `NewRateLimit` for `detailed_metric` or `value_to_metric`);
//! - src/service/ratelimit.go: `shouldRateLimitWorker` (the overall code),
//!   `ratelimitToMetadata`, `descriptorToStruct`, `mergeMetadata`;
//! - src/limiter/base_limiter.go: `GetResponseDescriptorStatus` answers a `shadow_mode`
//!   descriptor over its limit OK, and leaves a `quota_mode` one OVER_LIMIT;
//! - src/settings/settings.go: `QUOTA_MODE`, `RESPONSE_DYNAMIC_METADATA` (both off by
//!   default).
#![allow(clippy::unwrap_used)]

mod conformance;

use conformance::{Server, bounded, brief, corpus, ok, over, request, upstream_config};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value, value::Kind};
use serde_json::json;
use sluice_server::Engine;
use sluice_server::grpc::GrpcOptions;

fn json_of(v: &Value) -> serde_json::Value {
    match v.kind.as_ref().unwrap() {
        Kind::NullValue(_) => serde_json::Value::Null,
        Kind::NumberValue(n) => json!(n),
        Kind::StringValue(s) => json!(s),
        Kind::BoolValue(b) => json!(b),
        Kind::StructValue(s) => struct_json(s),
        Kind::ListValue(l) => serde_json::Value::Array(l.values.iter().map(json_of).collect()),
    }
}

fn struct_json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), json_of(v)))
            .collect(),
    )
}

fn metadata(r: &RateLimitResponse) -> serde_json::Value {
    struct_json(r.dynamic_metadata.as_ref().expect("dynamic_metadata"))
}

async fn serve(yaml: &str, options: GrpcOptions) -> Server {
    let config = sluice_server::Config::from_yaml("q.yaml", yaml).unwrap();
    Server::start_with(Engine::new(config), options).await
}

const QUOTA: &str = "domain: q
descriptors:
  - key: backend
    value: a
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: backend
    value: b
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: backend
    value: s
    quota_mode: true
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: plain
    rate_limit: { unit: minute, requests_per_unit: 3 }
";

/// `shouldRateLimitWorker`: a quota-mode descriptor over its quota is answered OVER_LIMIT
/// with 0 left, but the request is refused only when every quota-mode descriptor of it is
/// over; a descriptor not in quota mode that is over refuses it as always. No
/// `dynamic_metadata` unless `RESPONSE_DYNAMIC_METADATA` (and never `quotaModeViolations`).
#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
    bounded(async {
        let mut s = serve(QUOTA, GrpcOptions::default()).await;
        let both: &[&[(&str, &str)]] = &[&[("backend", "a")], &[("backend", "b")]];
        for _ in 0..2 {
            let r = s.ask("q", both, 1).await;
            assert_eq!(r.overall_code, ok());
        }
        // a is over its quota, b is not: the request passes, a's status says it is over.
        let r = s.ask("q", both, 1).await;
        assert_eq!(r.overall_code, ok());
        assert_eq!(brief(&r.statuses[0]), (over(), Some(2), 0));
        assert_eq!(brief(&r.statuses[1]), (ok(), Some(5), 2));
        assert_eq!(r.dynamic_metadata, None);
        // a alone: every quota-mode descriptor of the request is over.
        let r = s.ask("q", &[&[("backend", "a")]], 1).await;
        assert_eq!(r.overall_code, over());
        assert_eq!(brief(&r.statuses[0]), (over(), Some(2), 0));
        // b's last two permits: still let through.
        for _ in 0..2 {
            let r = s.ask("q", both, 1).await;
            assert_eq!((r.overall_code, r.statuses[1].code), (ok(), ok()));
        }
        // Over in both: refused.
        let r = s.ask("q", both, 1).await;
        assert_eq!((r.overall_code, r.statuses[1].code), (over(), over()));
        s.stop().await;
    })
    .await;
}

/// `shouldRateLimitWorker`: a descriptor not in quota mode over its limit refuses the
/// request even when its quota-mode descriptors have quota left; one without a rule, or
/// `unlimited`, is not a quota-mode descriptor.
#[tokio::test]
async fn a_plain_descriptor_over_its_limit_refuses_whatever_the_quotas() {
    bounded(async {
        let mut s = serve(QUOTA, GrpcOptions::default()).await;
        let mixed: &[&[(&str, &str)]] = &[&[("plain", "p")], &[("backend", "b")], &[("none", "x")]];
        for _ in 0..3 {
            assert_eq!(s.ask("q", mixed, 1).await.overall_code, ok());
        }
        let r = s.ask("q", mixed, 1).await;
        assert_eq!(r.overall_code, over());
        assert_eq!(r.statuses[1].code, ok());
        s.stop().await;
    })
    .await;
}

/// `GetResponseDescriptorStatus` answers a `shadow_mode` descriptor over its limit OK before
/// the service looks at quota mode: a descriptor in both modes never counts as over, so a
/// request whose only quota-mode descriptor is one passes. Global `SHADOW_MODE` answers OK
/// what quota mode would refuse.
#[tokio::test]
async fn shadow_mode_comes_before_quota_mode() {
    bounded(async {
        let mut s = serve(QUOTA, GrpcOptions::default()).await;
        let shadow: &[&[(&str, &str)]] = &[&[("backend", "s")]];
        for _ in 0..3 {
            let r = s.ask("q", shadow, 1).await;
            assert_eq!((r.overall_code, brief(&r.statuses[0]).0), (ok(), ok()));
        }
        s.stop().await;

        let options = GrpcOptions {
            shadow_mode: true,
            ..GrpcOptions::default()
        };
        let mut s = serve(QUOTA, options).await;
        let a: &[&[(&str, &str)]] = &[&[("backend", "a")]];
        for _ in 0..3 {
            assert_eq!(s.ask("q", a, 1).await.overall_code, ok());
        }
        s.stop().await;
    })
    .await;
}

/// `QUOTA_MODE` (settings.go `GlobalQuotaMode`; `isQuotaMode := globalQuotaMode || …`):
/// every descriptor but an `unlimited` one is a quota-mode descriptor, those without a rule
/// included, so a plain rule over its limit no longer refuses while another descriptor
/// passes.
#[tokio::test]
async fn global_quota_mode_makes_every_descriptor_a_quota() {
    bounded(async {
        let options = GrpcOptions {
            quota_mode: true,
            ..GrpcOptions::default()
        };
        let mut s = serve(QUOTA, options).await;
        let plain: &[&[(&str, &str)]] = &[&[("plain", "p")]];
        let with_free: &[&[(&str, &str)]] = &[&[("plain", "p")], &[("none", "x")]];
        for _ in 0..3 {
            assert_eq!(s.ask("q", plain, 1).await.overall_code, ok());
        }
        let r = s.ask("q", with_free, 1).await;
        assert_eq!((r.overall_code, r.statuses[0].code), (ok(), over()));
        assert_eq!(s.ask("q", plain, 1).await.overall_code, over());
        s.stop().await;
    })
    .await;
}

/// `ratelimitToMetadata` with `RESPONSE_DYNAMIC_METADATA` on upstream's
/// test/config/metadata.yaml: `domain`, one struct of `entries` per descriptor, the
/// request's `hitsAddend` when not 0, and under `metadata` the configured metadata of the
/// descriptors answered OK, merged; a descriptor over its limit gives none; nothing named
/// after quota mode.
#[tokio::test]
async fn dynamic_metadata_carries_the_metadata_of_descriptors_under_their_limit() {
    let Some(corpus) = corpus() else { return };
    bounded(async {
        let config = conformance::load(upstream_config(&corpus, "metadata.yaml"));
        let options = GrpcOptions {
            response_dynamic_metadata: true,
            ..GrpcOptions::default()
        };
        let mut s = Server::start_with(Engine::new(config), options).await;
        let d: &[&[(&str, &str)]] = &[
            &[("key1", "value1"), ("subkey1", "x")],
            &[("key2", "y")],
            &[("nothing", "z")],
        ];
        let r = s.ask("test-domain", d, 1).await;
        assert_eq!(r.overall_code, ok());
        let expected = json!({
            "domain": "test-domain",
            "hitsAddend": 1.0,
            "descriptors": [
                { "entries": ["key1=value1", "subkey1=x"] },
                { "entries": ["key2=y"] },
                { "entries": ["nothing=z"] },
            ],
            "metadata": { "name": "service_1", "service_with_quota": { "name": "service_2" } },
        });
        assert_eq!(metadata(&r), expected);
        // subkey1 (5 per second) goes over: its metadata is no longer sent.
        let r = s.ask("test-domain", &d[..1], 5).await;
        assert_eq!(r.statuses[0].code, over());
        let sent = metadata(&r);
        assert_eq!(sent["hitsAddend"], json!(5.0));
        assert_eq!(sent.get("metadata"), None, "{sent}");
        // key1=value1/subkey1=subvalue1 has its own rule, without metadata.
        let r = s
            .ask(
                "test-domain",
                &[&[("key1", "value1"), ("subkey1", "subvalue1")]],
                1,
            )
            .await;
        assert_eq!(metadata(&r).get("metadata"), None);
        s.stop().await;
    })
    .await;
}

/// `mergeMetadata`: in request order, a key already present keeps its value unless both
/// are mappings, merged key by key; `parseMetadata` keeps YAML's scalar types and any key
/// names. `GetLimit` hands on no metadata for a `detailed_metric` rule (rebuilt by
/// `NewRateLimit`), nor for an `unlimited` one (`ratelimitToMetadata` only reads passed,
/// limited descriptors). A descriptor's `limit` override and `hits_addend` are listed.
#[tokio::test]
async fn metadata_merges_in_request_order() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    bounded(async {
        let yaml = "domain: m
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 9 }
    metadata:
      route: first
      pool: { primary: a, weight: 1 }
      tags: [x, 'y']
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 9 }
    metadata:
      route: second
      pool: { primary: b, backup: b2 }
      nothing: ~
      quoted: '10'
  - key: detailed
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 9 }
    metadata: { lost: true }
  - key: free
    rate_limit: { unlimited: true }
    metadata: { free: true }
";
        let options = GrpcOptions {
            response_dynamic_metadata: true,
            ..GrpcOptions::default()
        };
        let mut s = serve(yaml, options).await;
        let d: &[&[(&str, &str)]] = &[&[("a", "1")], &[("b", "2")], &[("detailed", "3")], &[("free", "4")]];
        let r = s.ask("m", d, 1).await;
        let expected = json!({
            "route": "first",
            "pool": { "primary": "a", "weight": 1.0, "backup": "b2" },
            "tags": ["x", "y"],
            "nothing": null,
            "quoted": "10",
        });
        assert_eq!(metadata(&r)["metadata"], expected);

        let mut req = request("m", &[&[("b", "2")]], 0);
        req.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 7, unit: 2 });
        req.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
        let r = s.call(req).await;
        let sent = metadata(&r);
        assert_eq!(
            sent["descriptors"],
            json!([{ "entries": ["b=2"], "limit": "requests_per_unit:7 unit:MINUTE", "hitsAddend": 3.0 }])
        );
        // With a `limit` override the configured rule is not used: no metadata.
        assert_eq!(sent.get("metadata"), None);
        assert_eq!(sent.get("hitsAddend"), None);
        s.stop().await;
    })
    .await;
}
