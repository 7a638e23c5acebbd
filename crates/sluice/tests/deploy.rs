//! The deployment files of `deploy/` against the binary they deploy: the Kubernetes manifests
//! parse and agree with each other (flags, paths, ports, probes, names), the Dockerfile runs
//! `sluice serve`, the Envoy example asks for the descriptors the ConfigMap limits, and the
//! StatefulSet's command line — with the pod's environment substituted and every listen
//! address moved to 127.0.0.1 — starts a real three-node cluster that keeps the ConfigMap's
//! cluster limit. Two more tests, ignored unless `scripts/test-image.sh` runs them, do the
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

/// Free ports on 127.0.0.1: `n` UDP, then `m` TCP, all held until every one is chosen.
fn free_ports(udp: usize, tcp: usize) -> (Vec<u16>, Vec<u16>) {
    let u: Vec<_> = (0..udp)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let t: Vec<_> = (0..tcp)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    (
        u.iter().map(|s| s.local_addr().unwrap().port()).collect(),
        t.iter().map(|s| s.local_addr().unwrap().port()).collect(),
    )
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |b| b.1).to_owned();
    Some((status, body))
}

/// The nodes' processes, killed when dropped (a failed assertion included); with an image,
/// the container engine and the containers' names, removed too.
struct Nodes {
    children: Vec<Child>,
    dir: PathBuf,
    containers: Option<(String, Vec<String>)>,
}

impl Nodes {
    fn logs(&self) -> String {
        (0..self.children.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.join(format!("node{i}.log")));
                format!("--- node {i}\n{}", log.unwrap_or_default())
            })
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if let Some((engine, names)) = &self.containers {
            let _ = Command::new(engine)
                .args(["rm", "--force", "--time", "0"])
                .args(names)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The StatefulSet's arguments for pod `index`, as the test runs them: `$(VAR)` from the
/// pod's environment, the `--config` directory at `config`, and every address (listen
/// addresses and each peer's `HOST:PORT`) on 127.0.0.1 at the ports chosen for this run.
fn command_line(
    a: &[(String, Option<String>)],
    env: &BTreeMap<&str, String>,
    config: &Path,
    listen: [(&str, u16); 3],
    peer_ports: &[u16],
) -> Vec<String> {
    a.iter()
        .map(|(f, v)| {
            let Some(v) = v else { return f.clone() };
            let mut v = v.clone();
            for (name, value) in env {
                v = v.replace(&format!("$({name})"), value);
            }
            let v = match f.as_str() {
                "--config" => config.display().to_string(),
                "--peers" => v
                    .split(',')
                    .map(|e| {
                        let (id, _) = e.split_once('=').unwrap();
                        let id: usize = id.parse().unwrap();
                        format!("{id}=127.0.0.1:{}", peer_ports[id])
                    })
                    .collect::<Vec<_>>()
                    .join(","),
                _ => match listen.iter().find(|(l, _)| *l == f.as_str()) {
                    Some((_, port)) => format!("127.0.0.1:{port}"),
                    None => v,
                },
            };
            format!("{f}={v}")
        })
        .collect()
}

/// How the StatefulSet's pods are run: the binary this test was built with, or the image
/// built from `deploy/Dockerfile`, by a container engine (podman or docker).
enum Launch {
    Binary,
    Image { engine: String, image: String },
}

/// The StatefulSet's command line, run: three `sluice serve` processes with POD_INDEX 0..2,
/// the ConfigMap as their configuration directory and a key in SLUICE_PEER_KEY, their
/// addresses on 127.0.0.1. Each becomes ready and healthy on the probes' paths, a request of
/// the ConfigMap's cluster rule is admitted, and over the limit the three together admit
/// no more than the rule's rate and burst.
#[test]
fn the_statefulset_command_line_runs_a_cluster_that_keeps_the_limit() {
    statefulset_keeps_the_limit(&Launch::Binary);
}

/// The same with the image: each pod a container of the image, run as the pod spec says
/// (its user, a read-only root, no capabilities, no privilege escalation, the ConfigMap
/// mounted read-only at its path) on the host's network. `scripts/test-image.sh` builds the
/// image and runs this with SLUICE_TEST_IMAGE (and SLUICE_TEST_ENGINE, podman by default).
#[test]
#[ignore = "needs a container engine and the image: scripts/test-image.sh"]
fn the_image_runs_the_statefulset_and_keeps_the_limit() {
    let (engine, image) = engine_and_image();
    statefulset_keeps_the_limit(&Launch::Image { engine, image });
}

fn engine_and_image() -> (String, String) {
    let image = std::env::var("SLUICE_TEST_IMAGE").expect("SLUICE_TEST_IMAGE: the image to run");
    let engine = std::env::var("SLUICE_TEST_ENGINE").unwrap_or_else(|_| "podman".to_owned());
    (engine, image)
}

/// The built image is what the Dockerfile says and what this test suite runs: its user is
/// not root, its entrypoint is `sluice serve` with the flags of the binary under test (the
/// same `--help`), and it has no shell.
#[test]
#[ignore = "needs a container engine and the image: scripts/test-image.sh"]
fn the_image_is_non_root_without_a_shell_and_serves_this_build() {
    let (engine, image) = engine_and_image();
    let out = Command::new(&engine)
        .args(["image", "inspect", &image])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inspect: Value = serde_json::from_slice(&out.stdout).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(
        config["Entrypoint"],
        json!(["/usr/local/bin/sluice", "serve"])
    );

    let help = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let theirs = help(Command::new(&engine).args(["run", "--rm", &image, "--help"]));
    let ours = help(Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--help"]));
    assert_eq!(theirs, ours, "the image's `sluice serve --help` differs");

    let shell = Command::new(&engine)
        .args([
            "run",
            "--rm",
            "--entrypoint",
            "/bin/sh",
            &image,
            "-c",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!shell.success(), "the image has a shell");
}

/// The engine's `run` arguments for pod `index` of the StatefulSet: the pod's and the
/// container's security context, its volume mounts (a ConfigMap from `config`), its
/// environment.
fn container_run_args(
    m: &Manifests,
    config: &Path,
    name: &str,
    env: &[(&str, &str)],
) -> Vec<String> {
    let pod = &m.statefulset()["spec"]["template"]["spec"];
    let c = m.container();
    let (psc, csc) = (&pod["securityContext"], &c["securityContext"]);
    let mut out: Vec<String> = ["run", "--rm", "--network", "host", "--name", name]
        .map(str::to_owned)
        .to_vec();
    let user = csc["runAsUser"].as_u64().or(psc["runAsUser"].as_u64());
    let group = csc["runAsGroup"].as_u64().or(psc["runAsGroup"].as_u64());
    if let Some(u) = user {
        out.push(format!("--user={u}:{}", group.unwrap_or(u)));
    }
    if csc["readOnlyRootFilesystem"] == true {
        out.push("--read-only".to_owned());
    }
    if csc["allowPrivilegeEscalation"] == false {
        out.push("--security-opt=no-new-privileges".to_owned());
    }
    for cap in csc["capabilities"]["drop"].as_array().into_iter().flatten() {
        out.push(format!("--cap-drop={}", str_of(cap, "capability")));
    }
    for mount in c["volumeMounts"].as_array().unwrap() {
        let vname = str_of(&mount["name"], "volumeMounts.name");
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == vname)
            .unwrap_or_else(|| panic!("volume {vname}"));
        assert!(
            volume["configMap"].is_object(),
            "only ConfigMap volumes are run here: {volume}"
        );
        let ro = if mount["readOnly"] == true { ":ro" } else { "" };
        let path = str_of(&mount["mountPath"], "mountPath");
        out.push(format!("--volume={}:{path}{ro}", config.display()));
    }
    for (k, v) in env {
        out.push(format!("--env={k}={v}"));
    }
    out
}

fn statefulset_keeps_the_limit(launch: &Launch) {
    let m = Manifests::load();
    let c = m.container();
    let a = args(c);
    let replicas = usize::try_from(m.statefulset()["spec"]["replicas"].as_u64().unwrap()).unwrap();
    let dir = std::env::temp_dir().join(format!("sluice-deploy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = dir.join("limits");
    std::fs::create_dir_all(&config).unwrap();

    // The ConfigMap's files, and its cluster rule (domain, key, rate per second, burst).
    let (limits, _) = m.limits();
    let mut rule = None;
    for (file, body) in limits["data"].as_object().unwrap() {
        let body = body.as_str().unwrap();
        std::fs::write(config.join(file), body).unwrap();
        let doc = yaml_docs(file, body).remove(0);
        for d in doc["descriptors"].as_array().unwrap() {
            let r = &d["rate_limit"];
            if r["coordination"] == "cluster" && rule.is_none() {
                assert_eq!(r["unit"], "second", "the test counts per second");
                let per = r["requests_per_unit"].as_u64().unwrap();
                rule = Some((
                    doc["domain"].as_str().unwrap().to_owned(),
                    d["key"].as_str().unwrap().to_owned(),
                    per,
                    r["burst"].as_u64().unwrap_or(per),
                ));
            }
        }
    }
    let (domain, key, limit, burst) = rule.expect("a `coordination: cluster` rule");

    let (peer_ports, tcp) = free_ports(replicas, 2 * replicas);
    let http_of = |i: usize| SocketAddr::from(([127, 0, 0, 1], tcp[2 * i]));
    let mut nodes = Nodes {
        children: Vec::new(),
        dir: dir.clone(),
        containers: None,
    };
    // In a container, `--config` is the ConfigMap's mount path, as in the pod.
    let config_arg = match launch {
        Launch::Binary => config.clone(),
        Launch::Image { .. } => PathBuf::from(flag(&a, "--config").expect("--config")),
    };
    let peer_key = "deploy-test-key-0123456789abcdef";
    for i in 0..replicas {
        let env = BTreeMap::from([("POD_INDEX", i.to_string())]);
        let line = command_line(
            &a,
            &env,
            &config_arg,
            [
                ("--http-addr", tcp[2 * i]),
                ("--grpc-addr", tcp[2 * i + 1]),
                ("--peer-addr", peer_ports[i]),
            ],
            &peer_ports,
        );
        assert!(line.contains(&format!("--node-id={i}")), "{line:?}");
        assert!(
            !line.iter().any(|l| l.contains("$(")),
            "unset variable: {line:?}"
        );
        let log = std::fs::File::create(dir.join(format!("node{i}.log"))).unwrap();
        let mut cmd = match launch {
            Launch::Binary => {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
                cmd.arg("serve").env("SLUICE_PEER_KEY", peer_key);
                cmd
            }
            Launch::Image { engine, image } => {
                let name = format!("sluice-deploy-{}-{i}", std::process::id());
                let index = i.to_string();
                let env = [("POD_INDEX", index.as_str()), ("SLUICE_PEER_KEY", peer_key)];
                let mut cmd = Command::new(engine);
                cmd.args(container_run_args(&m, &config, &name, &env))
                    .arg(image);
                let (_, names) = nodes
                    .containers
                    .get_or_insert_with(|| (engine.clone(), Vec::new()));
                names.push(name);
                cmd
            }
        };
        let child = cmd
            .args(&line)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        nodes.children.push(child);
    }

    // The probes' paths, on every node: healthy, then ready (a valid lease: its peers heard).
    let probe = |p: &str| str_of(&c[p]["httpGet"]["path"], p).to_owned();
    let (ready, live) = (probe("readinessProbe"), probe("livenessProbe"));
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..replicas {
        for path in [&live, &ready] {
            while http(http_of(i), "GET", path, "").is_none_or(|r| r.0 != 200) {
                assert!(
                    Instant::now() < deadline,
                    "node {i}: {path} not 200\n{}",
                    nodes.logs()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    // A request of the rule is admitted (once the cluster holds its capacity).
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"acme"}}]}}]}}"#
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while http(http_of(0), "POST", "/json", &body).is_none_or(|r| r.0 != 200) {
        assert!(
            Instant::now() < deadline,
            "never admitted\n{}",
            nodes.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Over the limit: each node is offered the whole rate for two seconds (three times the
    // limit in all). GCRA across the cluster: at most rate × time + burst (the nodes' bursts
    // are parts of the rule's, each rounded up).
    let secs = 2.0;
    let started = Instant::now();
    let tallies: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..replicas)
            .map(|i| {
                let body = body.clone();
                s.spawn(move || {
                    let gap = Duration::from_secs_f64(1.0 / limit as f64);
                    let start = Instant::now();
                    let (mut ok, mut refused) = (0u64, 0u64);
                    for k in 0..(limit as f64 * secs) as u32 {
                        if let Some(w) = (start + gap * k).checked_duration_since(Instant::now()) {
                            std::thread::sleep(w);
                        }
                        match http(http_of(i), "POST", "/json", &body).map(|r| r.0) {
                            Some(200) => ok += 1,
                            Some(429) => refused += 1,
                            other => panic!("node {i}: {other:?}"),
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed().as_secs_f64();
    let admitted: u64 = tallies.iter().map(|t| t.0).sum();
    let refused: u64 = tallies.iter().map(|t| t.1).sum();
    let most = limit as f64 * took + (burst + replicas as u64) as f64;
    let cluster = || {
        (0..replicas)
            .map(|i| {
                let status = http(http_of(i), "GET", "/v1/cluster", "").map(|r| r.1);
                format!("--- node {i} /v1/cluster\n{}\n", status.unwrap_or_default())
            })
            .collect::<String>()
    };
    eprintln!("{admitted} admitted, {refused} refused in {took:.2} s (at most {most:.0})");
    assert!(
        admitted as f64 <= most,
        "{admitted} admitted in {took:.2} s > {most:.0}: {tallies:?}\n{}{}",
        nodes.logs(),
        cluster()
    );
    // The cluster hands its capacity out: well over a single node's third is used.
    assert!(
        admitted as f64 >= 0.5 * limit as f64 * secs,
        "{admitted} admitted: {tallies:?}\n{}",
        nodes.logs()
    );
    assert!(refused > 0);
    for i in 0..replicas {
        assert_eq!(
            http(http_of(i), "GET", &live, "").map(|r| r.0),
            Some(200),
            "node {i}"
        );
    }
}
