//! envoyproxy/ratelimit's settings, read from the environment as it reads them
//! (`src/settings/settings.go`), so a Deployment's `env:` keeps working when the image is
//! swapped for Sluice. Each variable is applied, accepted as already Sluice's behaviour, or
//! warned about (never ignored silently); a value that cannot be read is an error.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context, bail};
use sluice_server::ConfigSource;
use sluice_server::daemon::{DaemonSpec, Extras};
use sluice_server::grpc::ResponseHeaders;

/// What the environment asks of `sluice serve`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Upstream {
    /// `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/`RUNTIME_APPDIRECTORY` (when `RUNTIME_ROOT` is
    /// set).
    pub(crate) config: Option<PathBuf>,
    /// `HOST`:`PORT` (when either is set).
    pub(crate) http_addr: Option<SocketAddr>,
    /// `GRPC_HOST`:`GRPC_PORT` (when either is set).
    pub(crate) grpc_addr: Option<SocketAddr>,
    /// `MERGE_DOMAIN_CONFIG`.
    pub(crate) merge_domains: bool,
    /// `SHADOW_MODE`.
    pub(crate) shadow_mode: bool,
    /// `QUOTA_MODE`.
    pub(crate) quota_mode: bool,
    /// `RESPONSE_DYNAMIC_METADATA`.
    pub(crate) response_dynamic_metadata: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub(crate) stop_increment: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` with `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`,
    /// `LIMIT_RESET_HEADER`.
    pub(crate) response_headers: Option<ResponseHeaders>,
    /// What is set but has no effect, one line each.
    pub(crate) warnings: Vec<String>,
}

/// Variables Sluice does not apply: `(name, why)`. Set, each is warned about.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("PROTO", "Sluice listens on TCP"),
    ("GRPC_UDS", "no unix socket listener"),
    (
        "DEBUG_HOST",
        "no debug listener (/metrics is on the HTTP port)",
    ),
    (
        "DEBUG_PORT",
        "no debug listener (/metrics is on the HTTP port)",
    ),
    ("GRPC_MAX_CONNECTION_AGE", "connections are not aged out"),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections are not aged out",
    ),
    (
        "GRPC_SERVER_USE_TLS",
        "no TLS: terminate it in front of Sluice",
    ),
    (
        "GRPC_SERVER_TLS_CERT",
        "no TLS: terminate it in front of Sluice",
    ),
    (
        "GRPC_SERVER_TLS_KEY",
        "no TLS: terminate it in front of Sluice",
    ),
    (
        "GRPC_CLIENT_TLS_CACERT",
        "no TLS: terminate it in front of Sluice",
    ),
    (
        "GRPC_CLIENT_TLS_SAN",
        "no TLS: terminate it in front of Sluice",
    ),
    (
        "CONFIG_TYPE",
        "configuration comes from files only (no xDS)",
    ),
    (
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "configuration comes from files only (no xDS)",
    ),
    ("CONFIG_GRPC_XDS_NODE_ID", "no xDS"),
    ("CONFIG_GRPC_XDS_NODE_METADATA", "no xDS"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "no xDS"),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "no xDS"),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "no xDS"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "no xDS"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "no xDS"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "no xDS"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "no xDS"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "no xDS"),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "no xDS"),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "no xDS"),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "no xDS"),
    ("XDS_CLIENT_BACKOFF_JITTER", "no xDS"),
    ("USE_DOG_STATSD", "no statsd: scrape /metrics (Prometheus)"),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        "no statsd: scrape /metrics (Prometheus)",
    ),
    ("USE_STATSD", "no statsd: scrape /metrics (Prometheus)"),
    ("STATSD_HOST", "no statsd: scrape /metrics (Prometheus)"),
    ("STATSD_PORT", "no statsd: scrape /metrics (Prometheus)"),
    ("EXTRA_TAGS", "no statsd: scrape /metrics (Prometheus)"),
    ("STATS_FLUSH_INTERVAL", "/metrics is read when scraped"),
    ("DISABLE_STATS", "/metrics is always served"),
    (
        "USE_PROMETHEUS",
        "/metrics is always served, on the HTTP port",
    ),
    ("PROMETHEUS_ADDR", "/metrics is served on the HTTP port"),
    ("PROMETHEUS_PATH", "/metrics is served at /metrics"),
    ("PROMETHEUS_MAPPER_YAML", "Sluice's metric names are fixed"),
    ("EXPIRATION_JITTER_MAX_SECONDS", "counters live in memory"),
    ("LOCAL_CACHE_SIZE_IN_BYTES", "counters live in memory"),
    ("NEAR_LIMIT_RATIO", "no near-limit statistic"),
    ("CACHE_KEY_PREFIX", "counters live in memory"),
    (
        "BACKEND_TYPE",
        "rules say where they are decided (`coordination`)",
    ),
    (
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "a node is healthy once it serves",
    ),
    (
        "REDIS_SOCKET_TYPE",
        "use --redis-url for `coordination: redis` rules",
    ),
    (
        "REDIS_TYPE",
        "use --redis-url for `coordination: redis` rules",
    ),
    (
        "REDIS_URL",
        "use --redis-url for `coordination: redis` rules",
    ),
    (
        "REDIS_POOL_SIZE",
        "use --redis-url for `coordination: redis` rules",
    ),
    ("REDIS_AUTH", "put the password in --redis-url"),
    ("REDIS_TLS", "no Redis TLS"),
    ("REDIS_TLS_CLIENT_CERT", "no Redis TLS"),
    ("REDIS_TLS_CLIENT_KEY", "no Redis TLS"),
    ("REDIS_TLS_CACERT", "no Redis TLS"),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "no Redis TLS"),
    ("REDIS_PIPELINE_WINDOW", "use --redis-mode batched"),
    ("REDIS_PIPELINE_LIMIT", "use --redis-mode batched"),
    ("REDIS_PERSECOND", "one Redis for every unit"),
    ("REDIS_PERSECOND_SOCKET_TYPE", "one Redis for every unit"),
    ("REDIS_PERSECOND_TYPE", "one Redis for every unit"),
    ("REDIS_PERSECOND_URL", "one Redis for every unit"),
    ("REDIS_PERSECOND_POOL_SIZE", "one Redis for every unit"),
    ("REDIS_PERSECOND_AUTH", "one Redis for every unit"),
    ("REDIS_PERSECOND_TLS", "one Redis for every unit"),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "one Redis for every unit",
    ),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", "one Redis for every unit"),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "Redis outages fall back to local decisions",
    ),
    ("MEMCACHE_HOST_PORT", "no memcache"),
    ("MEMCACHE_MAX_IDLE_CONNS", "no memcache"),
    ("MEMCACHE_SRV", "no memcache"),
    ("MEMCACHE_SRV_REFRESH", "no memcache"),
    ("MEMCACHE_TLS", "no memcache"),
    ("MEMCACHE_TLS_CLIENT_CERT", "no memcache"),
    ("MEMCACHE_TLS_CLIENT_KEY", "no memcache"),
    ("MEMCACHE_TLS_CACERT", "no memcache"),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "no memcache"),
    ("TRACING_ENABLED", "no tracing export"),
    ("TRACING_SERVICE_NAME", "no tracing export"),
    ("TRACING_SERVICE_NAMESPACE", "no tracing export"),
    ("TRACING_SERVICE_INSTANCE_ID", "no tracing export"),
    ("TRACING_EXPORTER_PROTOCOL", "no tracing export"),
    ("TRACING_SAMPLING_RATE", "no tracing export"),
];

/// What the command line said, so that a flag given wins over the environment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flags {
    /// `--config` was given.
    pub(crate) config_given: bool,
    /// `--grpc-addr` (applied over only when at its default).
    pub(crate) grpc_addr: SocketAddr,
    /// `--http-addr` (applied over only when at its default).
    pub(crate) http_addr: SocketAddr,
}

impl Upstream {
    /// The environment on top of the flags: a flag given (other than at its default) wins;
    /// what has no effect is logged once.
    pub(crate) fn apply(&self, flags: Flags, spec: &mut DaemonSpec, extras: &mut Extras) {
        for w in &self.warnings {
            tracing::warn!("{w}");
        }
        if let (false, Some(path)) = (flags.config_given, &self.config) {
            spec.source = ConfigSource::Path(path.clone());
        }
        if self.merge_domains
            && let Some(path) = spec.source.path()
        {
            spec.source = ConfigSource::Merged(path.to_path_buf());
        }
        if let Some(addr) = self.grpc_addr
            && flags.grpc_addr == SocketAddr::from(([0, 0, 0, 0], 8081))
        {
            spec.grpc_addr = addr;
        }
        if let Some(addr) = self.http_addr
            && flags.http_addr == SocketAddr::from(([0, 0, 0, 0], 8080))
        {
            spec.http_addr = Some(addr);
        }
        extras.shadow_mode |= self.shadow_mode;
        extras.quota_mode |= self.quota_mode;
        extras.response_dynamic_metadata |= self.response_dynamic_metadata;
        extras.compat.stop_increment_when_over_limit |= self.stop_increment;
        if let Some(names) = &self.response_headers {
            extras.response_headers = Some(names.clone());
        }
    }
}

/// `LOG_FORMAT` and `LOG_LEVEL`, read before the logs start.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Logs {
    pub(crate) format: Option<super::LogFormat>,
    /// A `RUST_LOG`-style level (used when `RUST_LOG` is not set).
    pub(crate) level: Option<&'static str>,
}

/// Reads `LOG_FORMAT` (`json` or `text`, as upstream) and `LOG_LEVEL` (upstream's logrus
/// levels; `fatal` and `panic` log errors only).
///
/// # Errors
/// A value upstream would not accept either.
pub(crate) fn logs(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Logs> {
    let format = match var("LOG_FORMAT").as_deref().map(str::to_ascii_lowercase) {
        None => None,
        Some(f) if f == "json" => Some(super::LogFormat::Json),
        Some(f) if f == "text" || f.is_empty() => Some(super::LogFormat::Text),
        Some(f) => bail!("LOG_FORMAT={f}: expected json or text"),
    };
    let level = match var("LOG_LEVEL").as_deref().map(str::to_ascii_lowercase) {
        None => None,
        Some(l) => Some(match l.as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => bail!("LOG_LEVEL={l}: expected trace, debug, info, warn, error, fatal or panic"),
        }),
    };
    Ok(Logs { format, level })
}

/// A boolean as Go's `strconv.ParseBool` reads it.
fn boolean(name: &str, value: &str) -> anyhow::Result<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => bail!("{name}={value}: not a boolean"),
    }
}

fn address(
    (host_name, host): (&str, Option<String>),
    (port_name, port): (&str, Option<String>),
    default_port: u16,
) -> anyhow::Result<Option<SocketAddr>> {
    if host.is_none() && port.is_none() {
        return Ok(None);
    }
    let ip: IpAddr = match host.as_deref() {
        None | Some("") => IpAddr::from([0, 0, 0, 0]),
        Some(h) => h
            .parse()
            .with_context(|| format!("{host_name}={h}: not an IP address"))?,
    };
    let port = match port.as_deref() {
        None => default_port,
        Some(p) => p
            .parse()
            .with_context(|| format!("{port_name}={p}: not a port"))?,
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

/// Reads envoyproxy/ratelimit's settings through `var` (the environment, in `sluice serve`).
///
/// # Errors
/// A value that cannot be read (a port, a boolean, an address).
pub(crate) fn read(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Upstream> {
    let mut out = Upstream::default();
    let flag = |name: &str| -> anyhow::Result<Option<bool>> {
        var(name).map(|v| boolean(name, &v)).transpose()
    };
    if let Some(root) = var("RUNTIME_ROOT") {
        let sub = var("RUNTIME_SUBDIRECTORY").unwrap_or_default();
        let app = var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".to_owned());
        out.config = Some(PathBuf::from(root).join(sub).join(app));
    } else {
        for name in ["RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"] {
            if var(name).is_some() {
                out.warnings
                    .push(format!("{name} has no effect without RUNTIME_ROOT"));
            }
        }
    }
    if flag("RUNTIME_IGNOREDOTFILES")? == Some(false) {
        out.warnings
            .push("RUNTIME_IGNOREDOTFILES=false: Sluice always skips dot files".to_owned());
    }
    out.http_addr = address(("HOST", var("HOST")), ("PORT", var("PORT")), 8080)?;
    out.grpc_addr = address(
        ("GRPC_HOST", var("GRPC_HOST")),
        ("GRPC_PORT", var("GRPC_PORT")),
        8081,
    )?;
    out.merge_domains = flag("MERGE_DOMAIN_CONFIG")?.unwrap_or(false);
    out.shadow_mode = flag("SHADOW_MODE")?.unwrap_or(false);
    out.quota_mode = flag("QUOTA_MODE")?.unwrap_or(false);
    out.response_dynamic_metadata = flag("RESPONSE_DYNAMIC_METADATA")?.unwrap_or(false);
    out.stop_increment = flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")?.unwrap_or(false);
    let names = [
        "LIMIT_LIMIT_HEADER",
        "LIMIT_REMAINING_HEADER",
        "LIMIT_RESET_HEADER",
    ];
    if flag("LIMIT_RESPONSE_HEADERS_ENABLED")?.unwrap_or(false) {
        let d = ResponseHeaders::default();
        out.response_headers = Some(ResponseHeaders {
            limit: var(names[0]).unwrap_or(d.limit),
            remaining: var(names[1]).unwrap_or(d.remaining),
            reset: var(names[2]).unwrap_or(d.reset),
        });
    } else {
        for name in names {
            if var(name).is_some() {
                out.warnings.push(format!(
                    "{name} has no effect without LIMIT_RESPONSE_HEADERS_ENABLED=true"
                ));
            }
        }
    }
    // RUNTIME_WATCH_ROOT needs nothing: Sluice watches the configuration directory,
    // which is what either value amounts to for files under it.
    for (name, why) in UNSUPPORTED {
        if let Some(value) = var(name) {
            out.warnings
                .push(format!("{name}={value} has no effect in Sluice: {why}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn log_format_and_level_are_read_as_upstream_reads_them() {
        assert_eq!(logs(env(&[])).unwrap(), Logs::default());
        let l = logs(env(&[("LOG_FORMAT", "json"), ("LOG_LEVEL", "WARN")])).unwrap();
        assert_eq!(l.format, Some(crate::cmd::LogFormat::Json));
        assert_eq!(l.level, Some("warn"));
        assert_eq!(
            logs(env(&[("LOG_LEVEL", "fatal")])).unwrap().level,
            Some("error")
        );
        assert!(logs(env(&[("LOG_FORMAT", "xml")])).is_err());
        assert!(logs(env(&[("LOG_LEVEL", "loud")])).is_err());
        // Applied, so not among the warnings of what has no effect.
        let u = read(env(&[("LOG_FORMAT", "json"), ("LOG_LEVEL", "debug")])).unwrap();
        assert!(u.warnings.is_empty(), "{:?}", u.warnings);
    }

    #[test]
    fn nothing_set_changes_nothing() {
        assert_eq!(read(env(&[])).unwrap(), Upstream::default());
    }

    /// A Deployment of envoyproxy/ratelimit's README: the runtime directory, ports, merging,
    /// global shadow mode and its "stop counting over the limit" switch.
    #[test]
    fn upstream_settings_apply() {
        let up = read(env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("PORT", "9080"),
            ("GRPC_HOST", "127.0.0.1"),
            ("MERGE_DOMAIN_CONFIG", "true"),
            ("SHADOW_MODE", "1"),
            ("QUOTA_MODE", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "True"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "X-RateLimit-Reset"),
        ]))
        .unwrap();
        let headers = up.response_headers.clone().unwrap();
        assert_eq!(
            (headers.limit.as_str(), headers.reset.as_str()),
            ("RateLimit-Limit", "X-RateLimit-Reset")
        );
        assert_eq!(up.config, Some(PathBuf::from("/data/ratelimit/config")));
        assert_eq!(up.http_addr, Some("0.0.0.0:9080".parse().unwrap()));
        assert_eq!(up.grpc_addr, Some("127.0.0.1:8081".parse().unwrap()));
        assert!(up.merge_domains && up.shadow_mode && up.stop_increment);
        assert!(up.quota_mode && up.response_dynamic_metadata);
        assert!(up.warnings.is_empty(), "{:?}", up.warnings);
    }

    /// The environment on top of the flags: the runtime directory (merged when
    /// MERGE_DOMAIN_CONFIG), its ports, shadow mode and STOP_CACHE_KEY_INCREMENT_…; a flag
    /// given wins.
    #[test]
    fn the_environment_applies_under_the_flags() {
        let upstream = Upstream {
            config: Some(PathBuf::from("/srv/runtime_data/current/config")),
            http_addr: Some("0.0.0.0:9080".parse().unwrap()),
            grpc_addr: Some("0.0.0.0:9081".parse().unwrap()),
            merge_domains: true,
            shadow_mode: true,
            quota_mode: true,
            response_dynamic_metadata: true,
            stop_increment: true,
            response_headers: Some(ResponseHeaders::default()),
            warnings: Vec::new(),
        };
        let spec = |source| DaemonSpec {
            source,
            grpc_addr: "0.0.0.0:8081".parse().unwrap(),
            http_addr: Some("0.0.0.0:8080".parse().unwrap()),
            cluster: None,
            watch: None,
            redis: None,
        };
        let defaults = Flags {
            config_given: false,
            grpc_addr: "0.0.0.0:8081".parse().unwrap(),
            http_addr: "0.0.0.0:8080".parse().unwrap(),
        };
        let (mut s, mut extras) = (spec(ConfigSource::Example), Extras::default());
        upstream.apply(defaults, &mut s, &mut extras);
        assert_eq!(
            s.source,
            ConfigSource::Merged(PathBuf::from("/srv/runtime_data/current/config"))
        );
        assert_eq!(s.http_addr, Some("0.0.0.0:9080".parse().unwrap()));
        assert_eq!(s.grpc_addr, "0.0.0.0:9081".parse().unwrap());
        assert!(extras.shadow_mode && extras.compat.stop_increment_when_over_limit);
        assert!(extras.quota_mode && extras.response_dynamic_metadata);
        assert_eq!(extras.response_headers, Some(ResponseHeaders::default()));

        let given = Flags {
            config_given: true,
            grpc_addr: "127.0.0.1:7000".parse().unwrap(),
            ..defaults
        };
        let mut s = spec(ConfigSource::Path(PathBuf::from("rules.yaml")));
        s.grpc_addr = given.grpc_addr;
        upstream.apply(given, &mut s, &mut Extras::default());
        assert_eq!(s.source, ConfigSource::Merged(PathBuf::from("rules.yaml")));
        assert_eq!(s.grpc_addr, "127.0.0.1:7000".parse().unwrap());
    }

    #[test]
    fn what_sluice_does_not_apply_is_warned_about_and_bad_values_refused() {
        let up = read(env(&[
            ("USE_STATSD", "true"),
            ("LIMIT_LIMIT_HEADER", "X-Limit"),
            ("RUNTIME_APPDIRECTORY", "config"),
        ]))
        .unwrap();
        assert_eq!(up.warnings.len(), 3, "{:?}", up.warnings);
        assert!(up.warnings.iter().any(|w| w.starts_with("USE_STATSD=true")));
        assert!(read(env(&[("GRPC_PORT", "http")])).is_err());
        assert!(read(env(&[("SHADOW_MODE", "yes")])).is_err());
    }
}
