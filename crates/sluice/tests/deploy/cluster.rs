//! Running the StatefulSet: its pods as processes (or containers of the image) on
//! 127.0.0.1, scaled out and back in.

use super::*;

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
        // One at a time: given a name that is gone already (a pod that left), podman's `rm`
        // removes none of the others.
        if let Some((engine, names)) = &self.containers {
            for name in names {
                let _ = Command::new(engine)
                    .args(["rm", "--force", "--time", "0", name])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
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

    // Two more pods than the StatefulSet's replicas, for the scale out and in.
    let pods = replicas + 2;
    let (peer_ports, tcp) = free_ports(pods, 2 * pods);
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
    // Pod `i` of the StatefulSet, started as the kubelet would (its ordinal in POD_INDEX).
    let start_pod = |i: usize, nodes: &mut Nodes| {
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
                // The engine's client passes signals on to the container (SIGTERM included).
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
    };

    // The probes' paths: healthy, then ready (a valid lease: its peers heard).
    let probe = |p: &str| str_of(&c[p]["httpGet"]["path"], p).to_owned();
    let (ready, live) = (probe("readinessProbe"), probe("livenessProbe"));
    let wait_ready = |on: std::ops::Range<usize>, nodes: &Nodes| {
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in on {
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
    };
    let cluster = |on: std::ops::Range<usize>| {
        on.map(|i| {
            let status = http(http_of(i), "GET", "/v1/cluster", "").map(|r| r.1);
            format!("--- node {i} /v1/cluster\n{}\n", status.unwrap_or_default())
        })
        .collect::<String>()
    };

    for i in 0..replicas {
        start_pod(i, &mut nodes);
    }
    wait_ready(0..replicas, &nodes);

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

    // Over the limit: each running pod is offered the whole rate for two seconds. GCRA across
    // the cluster: at most rate × time + burst (the nodes' bursts are parts of the rule's,
    // each rounded up); and the cluster hands its capacity out: well over a single node's
    // share is used. Returns what each pod admitted.
    let offer = |on: std::ops::Range<usize>, phase: &str, nodes: &Nodes| -> Vec<u64> {
        let secs = 2.0;
        let started = Instant::now();
        let tallies: Vec<(u64, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = on
                .clone()
                .map(|i| {
                    let body = body.clone();
                    s.spawn(move || {
                        let gap = Duration::from_secs_f64(1.0 / limit as f64);
                        let start = Instant::now();
                        let (mut ok, mut refused) = (0u64, 0u64);
                        for k in 0..(limit as f64 * secs) as u32 {
                            if let Some(w) =
                                (start + gap * k).checked_duration_since(Instant::now())
                            {
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
        let most = limit as f64 * took + (burst + on.len() as u64) as f64;
        eprintln!(
            "{phase}: {admitted} admitted, {refused} refused in {took:.2} s (at most {most:.0}): {tallies:?}"
        );
        assert!(
            admitted as f64 <= most,
            "{phase}: {admitted} admitted in {took:.2} s > {most:.0}: {tallies:?}\n{}{}",
            nodes.logs(),
            cluster(on.clone())
        );
        assert!(
            admitted as f64 >= 0.5 * limit as f64 * secs,
            "{phase}: {admitted} admitted: {tallies:?}\n{}{}",
            nodes.logs(),
            cluster(on.clone())
        );
        assert!(refused > 0, "{phase}: {tallies:?}");
        tallies.iter().map(|t| t.0).collect()
    };
    offer(0..replicas, "the StatefulSet", &nodes);

    // Scaled out (`kubectl scale --replicas=N+2`): the new pods join the running cluster,
    // become ready, and each earns a share of the limit, which the cluster keeps.
    for i in replicas..pods {
        start_pod(i, &mut nodes);
    }
    wait_ready(replicas..pods, &nodes);
    let admitted = offer(0..pods, "scaled out", &nodes);
    for (i, n) in admitted.iter().enumerate().skip(replicas) {
        assert!(
            *n > 0,
            "pod {i} admitted nothing: {admitted:?}\n{}",
            cluster(0..pods)
        );
    }

    // Scaled back in, newest pod first: SIGTERM, as the kubelet sends it; each hands its
    // shares back and exits cleanly within the grace period, and the voters keep the limit.
    let grace = m.statefulset()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    for i in (replicas..pods).rev() {
        let child = &mut nodes.children[i];
        let pid = child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(grace);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "pod {i} still running {grace} s after SIGTERM\n{}",
                nodes.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "pod {i}: {status}\n{}", nodes.logs());
    }
    let leaves = || {
        http(http_of(0), "GET", "/v1/cluster", "")
            .and_then(|r| serde_json::from_str::<Value>(&r.1).ok())
            .and_then(|v| v["membership"]["leaves"].as_u64())
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while leaves() < Some(2) {
        assert!(
            Instant::now() < deadline,
            "the leaves were not counted\n{}",
            cluster(0..replicas)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    offer(0..replicas, "scaled back in", &nodes);
    for i in 0..replicas {
        assert_eq!(
            http(http_of(i), "GET", &live, "").map(|r| r.0),
            Some(200),
            "node {i}"
        );
    }
}
