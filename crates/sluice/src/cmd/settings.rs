//! `sluice serve --settings FILE`: the daemon's own settings (addresses, peers, cluster
//! tuning, Redis) in a YAML file instead of, or under, the command line.
//!
//! The file is one flat mapping whose keys are the long flags of `sluice serve`, with `_` or
//! `-` (`grpc_addr: 0.0.0.0:8081`, `peers: [1=10.0.0.2:8082, 2=10.0.0.3:8082]`). Each entry
//! is applied as if it were given as that flag *before* the command line's flags, so a flag
//! on the command line wins, and a value in the file is checked exactly as the flag is. The
//! rule files (`--config`) stay envoyproxy/ratelimit's format, unchanged.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, bail};
use saphyr::{MarkedYaml, YamlData, YamlLoader};
use saphyr_parser::Parser;

/// Flags that are not settings (`--settings` itself; `--help`, `--version`).
const NOT_SETTINGS: &[&str] = &["settings", "help", "version"];

/// The flags `file` stands for, as command-line arguments (`--grpc-addr`, `0.0.0.0:8081`,
/// …), in the file's order. `known` is every long flag `sluice serve` takes, with whether it
/// takes a value (a switch is given as `true` or `false` in the file).
///
/// # Errors
/// A file that cannot be read, is not YAML, is not a flat mapping, or names a key that is
/// not a flag, with the file, line and column.
pub(crate) fn flags_from_file(
    file: &Path,
    known: &[(String, bool)],
) -> anyhow::Result<Vec<OsString>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the settings file {}", file.display()))?;
    flags_from_yaml(&file.display().to_string(), &text, known)
}

fn flags_from_yaml(
    name: &str,
    text: &str,
    known: &[(String, bool)],
) -> anyhow::Result<Vec<OsString>> {
    let mut loader: YamlLoader<'_, MarkedYaml<'_>> = YamlLoader::default();
    // Scalars as written: `incarnation: 010` stays "010" for the flag's own parser.
    loader.early_parse(false);
    let mut parser = Parser::new_from_str(text);
    if let Some(e) = parser
        .load(&mut loader, true)
        .err()
        .or_else(|| loader.error().cloned())
    {
        let m = e.marker();
        bail!(
            "{name}:{}:{}: invalid YAML: {}",
            m.line(),
            m.col() + 1,
            e.info()
        );
    }
    let docs = loader.into_documents();
    let Some(doc) = docs.first() else {
        return Ok(Vec::new());
    };
    let at = |node: &MarkedYaml<'_>| {
        format!(
            "{name}:{}:{}",
            node.span.start.line(),
            node.span.start.col() + 1
        )
    };
    if docs.len() > 1 {
        bail!("{}: one settings document per file", at(&docs[1]));
    }
    let map = match &doc.data {
        YamlData::Mapping(map) => map,
        // An empty file or `~`: no settings.
        YamlData::Representation(s, _, _) if s.trim().is_empty() || s == "~" => {
            return Ok(Vec::new());
        }
        _ => bail!("{}: the settings must be a mapping of flag: value", at(doc)),
    };
    let mut out = Vec::new();
    for (key, value) in map {
        let YamlData::Representation(k, _, _) = &key.data else {
            bail!("{}: a setting's name must be a plain word", at(key));
        };
        let flag = k.replace('_', "-");
        let takes_value = known.iter().find(|(f, _)| *f == flag).map(|(_, v)| *v);
        let Some(takes_value) = takes_value.filter(|_| !NOT_SETTINGS.contains(&flag.as_str()))
        else {
            let mut names: Vec<String> = known
                .iter()
                .map(|(f, _)| f)
                .filter(|f| !NOT_SETTINGS.contains(&f.as_str()))
                .map(|f| f.replace('-', "_"))
                .collect();
            names.sort();
            bail!(
                "{}: unknown setting `{k}` (expected one of: {})",
                at(key),
                names.join(", ")
            );
        };
        let text = match &value.data {
            YamlData::Representation(v, _, _) => v.to_string(),
            // A list is the flag's comma-separated form (`peers`, `redis_url`).
            YamlData::Sequence(items) => {
                let mut parts = Vec::with_capacity(items.len());
                for item in items {
                    let YamlData::Representation(v, _, _) = &item.data else {
                        bail!("{}: `{k}`: list items must be plain values", at(item));
                    };
                    parts.push(v.to_string());
                }
                parts.join(",")
            }
            _ => bail!("{}: `{k}` must be a value or a list of values", at(value)),
        };
        if takes_value {
            out.push(OsString::from(format!("--{flag}")));
            out.push(OsString::from(text));
        } else {
            match text.as_str() {
                "true" | "yes" | "on" => out.push(OsString::from(format!("--{flag}"))),
                "false" | "no" | "off" => {}
                _ => bail!("{}: `{k}` is a switch: true or false", at(value)),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<(String, bool)> {
        [
            ("grpc-addr", true),
            ("peers", true),
            ("node-id", true),
            ("json", false),
            ("settings", true),
            ("help", false),
        ]
        .iter()
        .map(|(s, v)| ((*s).to_owned(), *v))
        .collect()
    }

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter()
            .map(|s| s.into_string().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_mapping_becomes_flags_in_file_order() {
        let yaml = "node_id: 1\npeers: [2=127.0.0.1:9002, 3=127.0.0.1:9003@0.5]\ngrpc-addr: 0.0.0.0:9081\n";
        let flags = strings(flags_from_yaml("s.yaml", yaml, &known()).unwrap());
        assert_eq!(
            flags,
            [
                "--node-id",
                "1",
                "--peers",
                "2=127.0.0.1:9002,3=127.0.0.1:9003@0.5",
                "--grpc-addr",
                "0.0.0.0:9081"
            ]
        );
    }

    #[test]
    fn switches_take_true_or_false() {
        let flags = strings(flags_from_yaml("s.yaml", "json: true\n", &known()).unwrap());
        assert_eq!(flags, ["--json"]);
        assert!(
            flags_from_yaml("s.yaml", "json: false\n", &known())
                .unwrap()
                .is_empty()
        );
        let e = flags_from_yaml("s.yaml", "json: 3\n", &known())
            .unwrap_err()
            .to_string();
        assert!(e.contains("s.yaml:1:7: `json` is a switch"), "{e}");
    }

    #[test]
    fn empty_files_are_no_settings() {
        assert!(flags_from_yaml("s.yaml", "", &known()).unwrap().is_empty());
        assert!(
            flags_from_yaml("s.yaml", "# nothing\n", &known())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_files_are_refused_with_their_place() {
        let e = flags_from_yaml("s.yaml", "grpc_addr: 1\nbogus: 2\n", &known())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.yaml:2:1: unknown setting `bogus`"), "{e}");
        assert!(e.contains("grpc_addr"), "{e}");
        let e = flags_from_yaml("s.yaml", "settings: other.yaml\n", &known())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown setting `settings`"), "{e}");
        let e = flags_from_yaml("s.yaml", "- a\n- b\n", &known())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s.yaml:1:1: the settings must be a mapping"),
            "{e}"
        );
        let e = flags_from_yaml("s.yaml", "peers: {a: 1}\n", &known())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`peers` must be a value or a list"), "{e}");
        let e = flags_from_yaml("s.yaml", "peers: [a\n", &known())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.yaml:"), "{e}");
        assert!(e.contains("invalid YAML"), "{e}");
    }
}
