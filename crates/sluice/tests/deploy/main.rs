//! The deployment files of `deploy/` against the binary they deploy: the Kubernetes manifests
//! parse and agree with each other (flags, paths, ports, probes, names), the Dockerfile runs
//! `sluice serve`, the Envoy example asks for the descriptors the ConfigMap limits, and the
//! StatefulSet's command line — with the pod's environment substituted and every listen
//! address moved to 127.0.0.1 — starts a real three-node cluster that keeps the ConfigMap's
//! cluster limit, also scaled out by two pods (they join and earn shares) and back in (they
//! leave on SIGTERM). Two more tests, ignored unless `scripts/test-image.sh` runs them, do the
//! same with the image built from the Dockerfile, and check the image itself.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use saphyr::{LoadableYamlNode as _, Scalar, Yaml};
use serde_json::{Value, json};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// A YAML node as JSON (keys as strings), so the tests can index it.
fn to_json(y: &Yaml<'_>) -> Value {
    match y {
        Yaml::Value(Scalar::Null) => Value::Null,
        Yaml::Value(Scalar::Boolean(b)) => json!(b),
        Yaml::Value(Scalar::Integer(i)) => json!(i),
        Yaml::Value(Scalar::FloatingPoint(f)) => json!(f.into_inner()),
        Yaml::Value(Scalar::String(s)) => json!(s),
        Yaml::Representation(s, _, _) => json!(s),
        Yaml::Sequence(v) => Value::Array(v.iter().map(to_json).collect()),
        Yaml::Mapping(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match to_json(k) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Tagged(_, inner) => to_json(inner),
        other => panic!("unsupported YAML node {other:?}"),
    }
}

/// Every document of a (multi-document) YAML text; empty documents skipped.
fn yaml_docs(name: &str, text: &str) -> Vec<Value> {
    let docs = Yaml::load_from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
    docs.iter().map(to_json).filter(|d| !d.is_null()).collect()
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v}"))
}

/// The Kubernetes objects of `deploy/kubernetes/*.yaml`.
struct Manifests(Vec<Value>);

impl Manifests {
    fn load() -> Self {
        let dir = deploy_dir().join("kubernetes");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no manifests in {}", dir.display());
        let mut objects = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for doc in yaml_docs(&f.display().to_string(), &text) {
                for field in ["apiVersion", "kind"] {
                    assert!(doc[field].is_string(), "{}: no {field}", f.display());
                }
                assert!(
                    doc["metadata"]["name"].is_string(),
                    "{}: no name",
                    f.display()
                );
                objects.push(doc);
            }
        }
        Self(objects)
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.0.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let all = self.all(kind);
        assert_eq!(all.len(), 1, "expected one {kind}");
        all[0]
    }

    fn named(&self, kind: &str, name: &str) -> &Value {
        self.0
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} named {name}"))
    }

    fn statefulset(&self) -> &Value {
        self.one("StatefulSet")
    }

    fn container(&self) -> &Value {
        let containers = self.statefulset()["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 1, "one container: sluice");
        &containers[0]
    }

    /// The StatefulSet's headless Service (its `serviceName`).
    fn peer_service(&self) -> &Value {
        let name = str_of(&self.statefulset()["spec"]["serviceName"], "serviceName");
        self.named("Service", name)
    }

    /// The Service that is not the peers' one: where clients and Envoy go.
    fn client_service(&self) -> &Value {
        let peers = self.peer_service()["metadata"]["name"].clone();
        let others: Vec<_> = self
            .all("Service")
            .into_iter()
            .filter(|s| s["metadata"]["name"] != peers)
            .collect();
        assert_eq!(others.len(), 1, "one client Service");
        others[0]
    }

    /// The ConfigMap mounted where `--config` points, and that directory.
    fn limits(&self) -> (&Value, String) {
        let dir = flag(&args(self.container()), "--config").expect("--config");
        let volume = mount_of(self, &dir).expect("--config is mounted");
        let name = str_of(
            &volume["configMap"]["name"],
            "the --config volume's ConfigMap",
        );
        (self.named("ConfigMap", name), dir)
    }
}

/// The container's arguments as `(flag, value)`: `--name=value`, or `--name` alone.
fn args(container: &Value) -> Vec<(String, Option<String>)> {
    container["args"]
        .as_array()
        .expect("the container passes args (the entrypoint is `sluice serve`)")
        .iter()
        .map(|a| {
            let a = str_of(a, "an argument");
            assert!(a.starts_with("--"), "`{a}`: flags only, as `--name=value`");
            match a.split_once('=') {
                Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
                None => (a.to_owned(), None),
            }
        })
        .collect()
}

fn flag(args: &[(String, Option<String>)], name: &str) -> Option<String> {
    args.iter()
        .find(|(f, _)| f == name)
        .and_then(|(_, v)| v.clone())
}

/// The volume mounted at `path` or above it (with its mount), if any.
fn mount_of<'a>(m: &'a Manifests, path: &str) -> Option<&'a Value> {
    let mounts = m.container()["volumeMounts"].as_array()?;
    let mount = mounts.iter().find(|v| {
        let at = v["mountPath"].as_str().unwrap_or("");
        !at.is_empty() && Path::new(path).starts_with(at)
    })?;
    m.statefulset()["spec"]["template"]["spec"]["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])
}

/// A container port by name or number: (number, protocol).
fn container_port(container: &Value, port: &Value) -> (u16, String) {
    let ports = container["ports"].as_array().expect("container ports");
    let found = ports
        .iter()
        .find(|p| match port {
            Value::String(name) => p["name"] == *name,
            n => p["containerPort"] == *n,
        })
        .unwrap_or_else(|| panic!("no container port {port}"));
    (
        u16::try_from(found["containerPort"].as_u64().unwrap()).unwrap(),
        found["protocol"].as_str().unwrap_or("TCP").to_owned(),
    )
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("`{addr}`: no port"))
}

/// `sluice serve --help`: every long flag, with its value's name (`PATH`, …) if it takes one.
fn serve_flags() -> BTreeMap<String, Option<String>> {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let mut flags = BTreeMap::new();
    for raw in help.lines() {
        // Option lines (`  -h, --help`, `      --config <PATH>`), not their descriptions
        // (indented further), which may mention flags too.
        let line = raw.trim_start();
        let (Some(i), true) = (line.find("--"), raw.len() - line.len() <= 6) else {
            continue;
        };
        if !line.starts_with('-') {
            continue;
        }
        let mut words = line[i..].split_whitespace();
        let name = words.next().unwrap().trim_end_matches(',').to_owned();
        let value = words
            .next()
            .filter(|w| w.starts_with('<'))
            .map(|w| w.trim_matches(['<', '>']).to_owned());
        flags.insert(name, value);
    }
    assert!(flags.contains_key("--config"), "{help}");
    flags
}

/// Every flag the container passes is one of `sluice serve`'s; every path it passes is
/// mounted; ports agree between the flags, the container, both Services and the probes;
/// the peers list names every pod of the StatefulSet; the pod is locked down.
#[test]
fn the_manifests_parse_and_agree_with_the_binary() {
    let m = Manifests::load();
    let sts = m.statefulset();
    let c = m.container();
    let pod = &sts["spec"]["template"]["spec"];
    let a = args(c);
    assert!(c.get("command").is_none(), "the image's entrypoint runs");

    let known = serve_flags();
    for (f, v) in &a {
        let takes = known
            .get(f)
            .unwrap_or_else(|| panic!("{f} is not a flag of `sluice serve`"));
        assert_eq!(
            takes.is_some(),
            v.is_some(),
            "{f}: value {v:?}, help {takes:?}"
        );
        if takes.as_deref() == Some("PATH") {
            let path = v.as_deref().unwrap();
            assert!(mount_of(&m, path).is_some(), "{f}={path}: not mounted");
        }
    }

    // Environment references resolve to the container's env.
    let env: BTreeMap<&str, &Value> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (str_of(&e["name"], "env name"), e))
        .collect();
    for (f, v) in &a {
        let mut rest = v.as_deref().unwrap_or("");
        while let Some(i) = rest.find("$(") {
            let end = rest[i..].find(')').unwrap() + i;
            let var = &rest[i + 2..end];
            assert!(env.contains_key(var), "{f} uses $({var}), not in env");
            rest = &rest[end..];
        }
    }
    assert_eq!(flag(&a, "--node-id").as_deref(), Some("$(POD_INDEX)"));
    assert_eq!(
        env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.labels['apps.kubernetes.io/pod-index']"
    );
    let key_ref = &env["SLUICE_PEER_KEY"]["valueFrom"]["secretKeyRef"];
    let secret = m.named("Secret", str_of(&key_ref["name"], "the key's Secret"));
    let key = str_of(&key_ref["key"], "the key's entry");
    assert!(
        secret["stringData"].get(key).is_some() || secret["data"].get(key).is_some(),
        "the Secret has no `{key}`"
    );

    // Ports: flags, container, Services, probes.
    let http = container_port(c, &json!("http"));
    let grpc = container_port(c, &json!("grpc"));
    let peer = container_port(c, &json!("peer"));
    assert_eq!(
        http,
        (port_of(&flag(&a, "--http-addr").unwrap()), "TCP".into())
    );
    assert_eq!(
        grpc,
        (port_of(&flag(&a, "--grpc-addr").unwrap()), "TCP".into())
    );
    assert_eq!(
        peer,
        (port_of(&flag(&a, "--peer-addr").unwrap()), "UDP".into())
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(container_port(c, &get["port"]), http, "{probe} port");
    }
    let pod_labels = &sts["spec"]["template"]["metadata"]["labels"];
    assert_eq!(sts["spec"]["selector"]["matchLabels"], *pod_labels);
    let peers_svc = m.peer_service();
    let client_svc = m.client_service();
    for svc in [peers_svc, client_svc] {
        assert_eq!(
            svc["spec"]["selector"], *pod_labels,
            "{}",
            svc["metadata"]["name"]
        );
    }
    assert_eq!(peers_svc["spec"]["clusterIP"], "None", "headless");
    assert_eq!(peers_svc["spec"]["publishNotReadyAddresses"], true);
    let svc_ports = |svc: &Value| -> BTreeSet<(u16, u16, String)> {
        svc["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let target = container_port(c, &p["targetPort"]);
                let proto = p["protocol"].as_str().unwrap_or("TCP").to_owned();
                assert_eq!(proto, target.1, "{p}: protocol of its target");
                (
                    u16::try_from(p["port"].as_u64().unwrap()).unwrap(),
                    target.0,
                    proto,
                )
            })
            .collect()
    };
    assert_eq!(
        svc_ports(peers_svc),
        BTreeSet::from([(peer.0, peer.0, "UDP".into())])
    );
    assert_eq!(
        svc_ports(client_svc),
        BTreeSet::from([
            (grpc.0, grpc.0, "TCP".into()),
            (http.0, http.0, "TCP".into())
        ])
    );

    // --peers: every pod by its stable DNS name (pod.service) and the peer port, ids = ordinals.
    let replicas = sts["spec"]["replicas"].as_u64().unwrap();
    let name = str_of(&sts["metadata"]["name"], "StatefulSet name");
    let service = str_of(&peers_svc["metadata"]["name"], "peer Service name");
    let expected: Vec<String> = (0..replicas)
        .map(|i| format!("{i}={name}-{i}.{service}:{}", peer.0))
        .collect();
    assert_eq!(flag(&a, "--peers").unwrap(), expected.join(","));
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");

    // Locked down: non-root, read-only root, no privilege escalation; requests; a PDB.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    let pdb = m.one("PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], *pod_labels);

    // The ConfigMap is a configuration the daemon accepts (checked by running it below) and
    // its volume is the --config directory.
    let (limits, dir) = m.limits();
    assert!(limits["data"].as_object().is_some_and(|d| !d.is_empty()));
    assert!(Path::new(&dir).is_absolute());
}

/// The Dockerfile builds the binary the workspace's way and its image runs `sluice serve`
/// as a non-root user, exposing the ports the manifests use.
#[test]
fn the_dockerfile_runs_sluice_serve() {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    // Instructions with their continuation lines joined.
    let mut lines = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        let l = l.trim();
        if l.starts_with('#') || (l.is_empty() && cur.is_empty()) {
            continue;
        }
        match l.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(l);
                lines.push(std::mem::take(&mut cur));
            }
        }
    }
    // The builder's toolchain is the workspace's `rust-version`.
    let cargo = std::fs::read_to_string(deploy_dir().join("../Cargo.toml")).unwrap();
    let rust = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("rust-version in Cargo.toml")
        .trim_matches('"');
    let builder_image = lines
        .iter()
        .find_map(|l| l.strip_prefix("ARG BUILDER_IMAGE="))
        .expect("ARG BUILDER_IMAGE");
    assert!(
        builder_image.starts_with(&format!("rust:{rust}-")),
        "{builder_image}: the workspace asks for Rust {rust}"
    );
    let stages: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("FROM "))
        .collect();
    assert!(stages.len() >= 2, "multi-stage");
    let runtime = &lines[*stages.last().unwrap()..];
    let builder = &lines[..*stages.last().unwrap()];
    assert!(
        builder.iter().any(
            |l| l.starts_with("RUN ") && l.contains("cargo build --release --locked -p sluice")
        ),
        "{builder:?}"
    );
    let entry = runtime
        .iter()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .expect("ENTRYPOINT in the runtime stage");
    let entry: Vec<String> = serde_json::from_str(entry).expect("ENTRYPOINT in exec form");
    assert_eq!(Path::new(&entry[0]).file_name().unwrap(), "sluice");
    assert_eq!(entry[1..], ["serve"]);
    assert!(
        runtime
            .iter()
            .any(|l| l.starts_with("COPY --from=") && l.ends_with(&format!(" {}", entry[0]))),
        "the binary is copied to {}",
        entry[0]
    );
    let user = runtime
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    assert!(
        !matches!(user.split(':').next(), Some("root" | "0")),
        "{user}"
    );
    let exposed: BTreeSet<&str> = runtime
        .iter()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(str::split_whitespace)
        .collect();
    let m = Manifests::load();
    let c = m.container();
    for p in c["ports"].as_array().unwrap() {
        let n = p["containerPort"].as_u64().unwrap();
        let want = match p["protocol"].as_str().unwrap_or("TCP") {
            "UDP" => format!("{n}/udp"),
            _ => n.to_string(),
        };
        assert!(
            exposed.contains(want.as_str()),
            "EXPOSE {want}: {exposed:?}"
        );
    }
}

/// The Envoy example sends the ConfigMap's domain to the client Service's gRPC port, and
/// every descriptor it builds has a rule.
#[test]
fn the_envoy_example_asks_for_the_configured_descriptors() {
    let text = std::fs::read_to_string(deploy_dir().join("envoy.yaml")).unwrap();
    let envoy = yaml_docs("envoy.yaml", &text).remove(0);
    let m = Manifests::load();
    let (limits, _) = m.limits();
    let mut rules = BTreeMap::new();
    for (file, body) in limits["data"].as_object().unwrap() {
        let doc = yaml_docs(file, body.as_str().unwrap()).remove(0);
        let keys: BTreeSet<String> = doc["descriptors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["key"].as_str().unwrap().to_owned())
            .collect();
        rules.insert(doc["domain"].as_str().unwrap().to_owned(), keys);
    }

    let hcm = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let filters = hcm["http_filters"].as_array().unwrap();
    let rl = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the ratelimit filter")["typed_config"]
        .clone();
    assert_eq!(
        rl["@type"],
        "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
    );
    assert_eq!(filters.last().unwrap()["name"], "envoy.filters.http.router");
    let service = &rl["rate_limit_service"];
    assert_eq!(service["transport_api_version"], "V3");
    let domain = str_of(&rl["domain"], "domain");
    let keys = rules
        .get(domain)
        .unwrap_or_else(|| panic!("domain {domain} is not in the ConfigMap: {rules:?}"));

    // The RLS cluster: HTTP/2 to the client Service's gRPC port.
    let cluster_name = &service["grpc_service"]["envoy_grpc"]["cluster_name"];
    let cluster = envoy["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == *cluster_name)
        .expect("the rate limit service's cluster");
    assert!(
        cluster["typed_extension_protocol_options"]
            .to_string()
            .contains("http2_protocol_options"),
        "gRPC needs HTTP/2"
    );
    let addr = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    let client = m.client_service();
    let host = str_of(&addr["address"], "RLS address");
    assert_eq!(host.split('.').next(), client["metadata"]["name"].as_str());
    let grpc = client["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "grpc")
        .unwrap();
    assert_eq!(addr["port_value"], grpc["port"]);

    // Every descriptor the routes build starts with a key the domain has a rule for.
    let mut checked = 0;
    for vh in hcm["route_config"]["virtual_hosts"].as_array().unwrap() {
        for route in vh["routes"].as_array().unwrap() {
            for limit in route["route"]["rate_limits"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let first = &limit["actions"][0];
                let key = if let Some(h) = first.get("request_headers") {
                    str_of(&h["descriptor_key"], "descriptor_key").to_owned()
                } else if first.get("remote_address").is_some() {
                    "remote_address".to_owned()
                } else if let Some(g) = first.get("generic_key") {
                    g["descriptor_key"]
                        .as_str()
                        .unwrap_or("generic_key")
                        .to_owned()
                } else {
                    panic!("action not checked here: {first}")
                };
                assert!(
                    keys.contains(&key),
                    "descriptor key {key}: no rule in {domain}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "no rate_limits on any route");
}

mod cluster;
