//! Unit tests of the request rendering, the schedule, the checks and the comparison.
#![allow(clippy::unwrap_used)]
use super::*;

/// Strings made of pieces that matter here: placeholders, JSON escapes, braces,
/// non-ASCII; at least `min` pieces.
fn text(min: usize) -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::strategy::Strategy as _;
    const PIECES: [&str; 10] = [
        "a",
        "{i}",
        "\"",
        "\\",
        "\n",
        "\u{e9}",
        "{",
        "}",
        "i",
        "\u{1F600}",
    ];
    proptest::collection::vec(proptest::sample::select(&PIECES[..]), min..6)
        .prop_map(|v| v.concat())
}

proptest::proptest! {
    /// Whatever the strings (quotes, backslashes, control characters, `{i}` anywhere),
    /// the JSON body is valid and says exactly the spec with `{i}` replaced, and the
    /// gRPC request carries the same.
    #[test]
    fn bodies_are_the_spec_with_the_index_substituted(
        domain in text(1),
        entries in proptest::collection::vec((text(1), text(0)), 1..4),
        keys in 1u64..1000,
        n in 0u64..1_000_000,
    ) {
        let mut spec = LoadSpec::new(domain.clone(), vec![entries.clone()]);
        spec.keys = keys;
        let r = Requests::new(&spec);
        let i = (n % keys).to_string();
        let sub = |s: &str| s.replace(KEY_PLACEHOLDER, &i);
        let mut body = String::new();
        r.json(n, &mut body);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let want = serde_json::json!({
            "domain": domain,
            "descriptors": [{"entries": entries.iter()
                .map(|(k, v)| serde_json::json!({"key": sub(k), "value": sub(v)}))
                .collect::<Vec<_>>()}],
        });
        proptest::prop_assert_eq!(v, want);
        let g = r.grpc(n);
        // The frame sent is that request, whether encoded before the load or per call.
        let sent = <RateLimitRequest as prost::Message>::decode(&r.grpc_frame(n)[5..]).unwrap();
        proptest::prop_assert_eq!(&sent, &g);
        proptest::prop_assert_eq!(g.domain, domain);
        let got: Vec<_> = g.descriptors[0].entries.iter()
            .map(|e| (e.key.clone(), e.value.clone())).collect();
        let want: Vec<_> = entries.iter().map(|(k, v)| (sub(k), sub(v))).collect();
        proptest::prop_assert_eq!(got, want);
    }
}

#[test]
fn template_substitutes_every_placeholder() {
    let t = Template::new("a{i}-b{i}");
    assert_eq!(t.render(7), "a7-b7");
    assert_eq!(Template::new("plain").render(3), "plain");
    assert_eq!(Template::new("{i}").render(42), "42");
}

#[test]
fn json_body_escapes_the_template_and_substitutes_the_index() {
    let mut spec = LoadSpec::new(
        "d\"om",
        vec![vec![("k".into(), "v{i}".into()), ("x".into(), "y".into())]],
    );
    spec.keys = 10;
    let r = Requests::new(&spec);
    let mut body = String::new();
    r.json(23, &mut body);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"domain": "d\"om", "descriptors": [{"entries": [
            {"key": "k", "value": "v3"}, {"key": "x", "value": "y"}]}]})
    );
    let g = r.grpc(23);
    assert_eq!(g.descriptors[0].entries[0].value, "v3");
    assert_eq!(g.domain, "d\"om");
}

#[test]
fn open_loop_schedule_and_stops() {
    let start = Instant::now();
    let plan = Plan {
        stop: Stop::Duration(Duration::from_secs(1)),
        rate: Some(100.0),
        timeout: Duration::from_secs(1),
        start,
    };
    assert_eq!(plan.due(0), Some(Some(start)));
    assert_eq!(plan.due(50), Some(Some(start + Duration::from_millis(500))));
    assert_eq!(plan.due(99), Some(Some(start + Duration::from_millis(990))));
    assert_eq!(plan.due(100), None);
    let plan = Plan {
        stop: Stop::Requests(3),
        rate: None,
        ..plan
    };
    assert_eq!(plan.due(2), Some(None));
    assert_eq!(plan.due(3), None);
}

#[test]
fn addresses_are_checked() {
    assert!(HttpBase::parse("https://x:1").is_err());
    assert!(HttpBase::parse("http://x:1/?q").is_err());
    let b = HttpBase::parse("127.0.0.1:9/api/").unwrap();
    assert_eq!(b.authority, "127.0.0.1:9");
    assert_eq!(b.path, "/api/json");
    let b = HttpBase::parse("http://localhost").unwrap();
    assert_eq!(b.authority, "localhost:80");
    assert_eq!(b.path, "/json");
    // gRPC addresses: `grpc_client::tests`.
}

#[test]
fn invalid_specs_are_refused() {
    let ok = LoadSpec::new("d", vec![vec![("k".into(), "v".into())]]);
    assert!(ok.validate().is_ok());
    let cases: Vec<fn(&mut LoadSpec)> = vec![
        |s| s.domain.clear(),
        |s| s.descriptors.clear(),
        |s| s.descriptors[0].clear(),
        |s| s.descriptors[0][0].0.clear(),
        |s| s.keys = 0,
        |s| s.concurrency = 0,
        |s| s.connections = Some(0),
        |s| s.stop = Stop::Requests(0),
        |s| s.stop = Stop::Duration(Duration::ZERO),
        |s| s.rate = Some(0.0),
        |s| s.rate = Some(f64::NAN),
        |s| s.timeout = Duration::ZERO,
    ];
    for (k, change) in cases.iter().enumerate() {
        let mut s = ok.clone();
        change(&mut s);
        assert!(
            matches!(s.validate(), Err(LoadError::InvalidSpec(_))),
            "case {k}"
        );
    }
}

#[test]
fn comparison_is_subject_over_baseline() {
    let lat = |p: f64| Latency {
        count: 1,
        mean: p,
        p50: p,
        p90: p,
        p99: p,
        p99_9: p,
        max: p,
    };
    let report = |throughput: f64, p: f64| Report {
        protocol: "grpc".into(),
        addresses: vec![],
        mode: Mode::ClosedLoop,
        concurrency: 1,
        connections: 1,
        target_rate: None,
        keys: 1,
        elapsed_s: 1.0,
        sent: 1,
        ok: 1,
        over_limit: 0,
        errors: 0,
        throughput,
        latency_us: Some(lat(p)),
        service_time_us: Some(lat(p)),
        errors_by_reason: BTreeMap::new(),
    };
    let c = compare(&report(300.0, 10.0), &report(100.0, 40.0));
    assert_eq!(c.throughput, Some(3.0));
    assert_eq!(c.p99, Some(0.25));
    let c = compare(&report(300.0, 10.0), &report(0.0, 0.0));
    assert_eq!(c.throughput, None);
    assert_eq!(c.p50, None);
}
