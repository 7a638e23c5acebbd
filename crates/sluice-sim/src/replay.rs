//! Trace replay: feed a recorded trace of requests through one limiting algorithm and write
//! one decision per request.
//!
//! Input: CSV with the header `time_ns,key,cost` and one request per row, sorted by time
//! (time in ns from 0; equal times are fine, a time earlier than the row before is an
//! error). Output, one row per request in input order, as CSV with the header
//! `time_ns,key,cost,allowed,remaining,retry_after_ns` or as JSON lines with those field
//! names. `retry_after_ns` is 0 for an admitted request, the wait for a refused one, and
//! empty (CSV) / `null` (JSON) when the request can never be admitted under the limit
//! (its cost exceeds what the limit can hold). Each key has its own state. The replay
//! streams: memory is the state of the keys seen, not the trace.
//!
//! [`replay`] decides in memory with `sluice-limits`; [`replay_with`] takes any decision
//! function, so the same reader, checks and writer serve every backend. With the `redis`
//! feature (on by default), [`redis::replay_redis`] sends every decision through
//! `sluice-redis` with the trace's own timestamps: the output is byte-identical to the
//! in-memory one (`crates/sluice/tests/replay_backends.rs`), which is the conformance
//! suite of issue 5 run end to end.

#[cfg(feature = "redis")]
pub mod redis;

use std::collections::{HashMap, HashSet};
use std::io::{self, BufWriter, Read, Write};
use std::str::FromStr;

use sluice_limits::{Algorithm, AnyAlgorithm, AnyState, Decision, Limit, Nanos};

/// The header a trace must start with.
pub const TRACE_HEADER: &str = "time_ns,key,cost";

/// The header of the CSV output.
pub const DECISION_HEADER: &str = "time_ns,key,cost,allowed,remaining,retry_after_ns";

/// How decisions are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// CSV with [`DECISION_HEADER`].
    #[default]
    Csv,
    /// One JSON object per line, with the fields of [`DECISION_HEADER`].
    Jsonl,
}

impl FromStr for OutputFormat {
    type Err = ReplayError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "csv" => Ok(Self::Csv),
            "jsonl" | "json" | "ndjson" => Ok(Self::Jsonl),
            _ => Err(ReplayError::UnknownFormat(s.to_string())),
        }
    }
}

/// What to replay with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replay {
    /// The algorithm deciding every request.
    pub algorithm: AnyAlgorithm,
    /// The limit, the same for every key.
    pub limit: Limit,
    /// The output format.
    pub format: OutputFormat,
}

/// Totals of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplaySummary {
    /// Requests read.
    pub requests: u64,
    /// Requests admitted.
    pub allowed: u64,
    /// Permits admitted (sum of the costs of admitted requests).
    pub allowed_cost: u64,
    /// Distinct keys.
    pub keys: usize,
}

/// Why a replay stopped. Errors about the trace name the line (1 is the header).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The output format is not `csv` or `jsonl`.
    #[error("unknown output format {0:?} (expected csv or jsonl)")]
    UnknownFormat(String),
    /// The trace has no header.
    #[error("the trace is empty: it must start with the header `{TRACE_HEADER}`")]
    Empty,
    /// The first line is not the expected header.
    #[error("line {line}: bad header {found:?}: expected `{TRACE_HEADER}`")]
    BadHeader {
        /// Line number.
        line: u64,
        /// The header found.
        found: String,
    },
    /// A row does not have three fields.
    #[error("line {line}: expected 3 fields (`{TRACE_HEADER}`), found {found}")]
    FieldCount {
        /// Line number.
        line: u64,
        /// Number of fields found.
        found: usize,
    },
    /// A time or cost is not a whole number.
    #[error("line {line}: {field} {value:?} is not a whole number from 0 to 2^64-1")]
    NotANumber {
        /// Line number.
        line: u64,
        /// `time_ns` or `cost`.
        field: &'static str,
        /// The text found.
        value: String,
    },
    /// A row's time is earlier than the row before.
    #[error(
        "line {line}: time_ns {time} goes backwards (the row before has {previous}); sort the trace by time"
    )]
    TimeBackwards {
        /// Line number.
        line: u64,
        /// This row's time.
        time: Nanos,
        /// The previous row's time.
        previous: Nanos,
    },
    /// The trace is not readable CSV (e.g. not UTF-8, or an I/O error).
    #[error("line {line}: cannot read the trace: {source}")]
    Read {
        /// Line number (as far as the reader got).
        line: u64,
        /// The underlying error.
        #[source]
        source: csv::Error,
    },
    /// Writing a decision failed.
    #[error("cannot write decisions: {0}")]
    Write(#[source] io::Error),
    /// The backend could not decide a request (e.g. Redis stopped answering).
    #[error("line {line}: the backend could not decide")]
    Decide {
        /// Line number of the request.
        line: u64,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The backend cannot run this replay at all (an algorithm it has no implementation
    /// of, an address it cannot reach).
    #[error("cannot use the backend")]
    Backend(#[source] BoxError),
}

/// A backend's error, whatever its type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One output row.
#[derive(serde::Serialize)]
struct Row<'a> {
    time_ns: Nanos,
    key: &'a str,
    cost: u64,
    allowed: bool,
    remaining: u64,
    retry_after_ns: Option<Nanos>,
}

/// Writes rows in the chosen format.
enum Sink<W: Write> {
    Csv(Box<csv::Writer<W>>),
    Jsonl(BufWriter<W>),
}

impl<W: Write> Sink<W> {
    fn new(format: OutputFormat, out: W) -> Result<Self, ReplayError> {
        Ok(match format {
            OutputFormat::Csv => {
                let mut w = csv::Writer::from_writer(out);
                w.write_record(DECISION_HEADER.split(','))
                    .map_err(csv_write)?;
                Self::Csv(Box::new(w))
            }
            OutputFormat::Jsonl => Self::Jsonl(BufWriter::new(out)),
        })
    }

    fn row(&mut self, row: &Row<'_>) -> Result<(), ReplayError> {
        match self {
            Self::Csv(w) => {
                let retry = row
                    .retry_after_ns
                    .map(|r| r.to_string())
                    .unwrap_or_default();
                let fields = [
                    row.time_ns.to_string(),
                    row.key.to_string(),
                    row.cost.to_string(),
                    row.allowed.to_string(),
                    row.remaining.to_string(),
                    retry,
                ];
                w.write_record(&fields).map_err(csv_write)
            }
            Self::Jsonl(w) => {
                serde_json::to_writer(&mut *w, row).map_err(|e| ReplayError::Write(e.into()))?;
                w.write_all(b"\n").map_err(ReplayError::Write)
            }
        }
    }

    fn finish(self) -> Result<(), ReplayError> {
        match self {
            Self::Csv(mut w) => w.flush().map_err(ReplayError::Write),
            Self::Jsonl(mut w) => w.flush().map_err(ReplayError::Write),
        }
    }
}

fn csv_write(e: csv::Error) -> ReplayError {
    match e.into_kind() {
        csv::ErrorKind::Io(e) => ReplayError::Write(e),
        other => ReplayError::Write(io::Error::other(format!("{other:?}"))),
    }
}

fn number(line: u64, field: &'static str, value: &str) -> Result<u64, ReplayError> {
    value.parse().map_err(|_| ReplayError::NotANumber {
        line,
        field,
        value: value.to_string(),
    })
}

/// Replays the trace read from `input` and writes one decision per request to `output`,
/// deciding in memory with `config.algorithm` (one state per key).
///
/// # Errors
/// A [`ReplayError`] naming the line for a bad header, a row without three fields, a
/// time or cost that is not a whole number, a time going backwards, or unreadable input;
/// [`ReplayError::Write`] if the output fails. Rows before the bad one have been written.
pub fn replay<R: Read, W: Write>(
    config: &Replay,
    input: R,
    output: W,
) -> Result<ReplaySummary, ReplayError> {
    let (alg, limit) = (&config.algorithm, &config.limit);
    let mut states: HashMap<String, AnyState> = HashMap::new();
    let mut summary = drive(config.format, input, output, |key, now, cost| {
        if let Some(state) = states.get_mut(key) {
            return Ok::<_, std::convert::Infallible>(alg.check(state, limit, now, cost));
        }
        let mut state = alg.new_state(limit, now);
        let decision = alg.check(&mut state, limit, now, cost);
        states.insert(key.to_string(), state);
        Ok(decision)
    })?;
    summary.keys = states.len();
    Ok(summary)
}

/// Replays the trace with decisions made by `decide(key, time_ns, cost)`: the reader, the
/// checks of the trace and the writer of [`replay`], for any backend. `decide` is called
/// once per request, in trace order, and owns the per-key state.
///
/// # Errors
/// As [`replay`], and [`ReplayError::Decide`] (naming the line) when `decide` fails; rows
/// before that one have been written.
pub fn replay_with<R, W, E, F>(
    format: OutputFormat,
    input: R,
    output: W,
    mut decide: F,
) -> Result<ReplaySummary, ReplayError>
where
    R: Read,
    W: Write,
    E: Into<BoxError>,
    F: FnMut(&str, Nanos, u64) -> Result<Decision, E>,
{
    // The backend keeps the state; the keys are only counted for the summary.
    let mut keys: HashSet<String> = HashSet::new();
    let mut summary = drive(format, input, output, |key, now, cost| {
        if !keys.contains(key) {
            keys.insert(key.to_string());
        }
        decide(key, now, cost)
    })?;
    summary.keys = keys.len();
    Ok(summary)
}

/// The loop shared by every backend; `summary.keys` is left to the caller.
fn drive<R, W, E, F>(
    format: OutputFormat,
    input: R,
    output: W,
    mut decide: F,
) -> Result<ReplaySummary, ReplayError>
where
    R: Read,
    W: Write,
    E: Into<BoxError>,
    F: FnMut(&str, Nanos, u64) -> Result<Decision, E>,
{
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(input);
    let mut sink = Sink::new(format, output)?;
    let mut summary = ReplaySummary::default();
    let mut record = csv::StringRecord::new();
    let mut previous: Option<Nanos> = None;
    let mut header_seen = false;
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(source) => {
                let line = source
                    .position()
                    .map_or(reader.position().line(), |p| p.line());
                return Err(ReplayError::Read { line, source });
            }
        }
        let line = record.position().map_or(0, |p| p.line());
        if !header_seen {
            let found: Vec<&str> = record.iter().collect();
            if found != TRACE_HEADER.split(',').collect::<Vec<_>>() {
                return Err(ReplayError::BadHeader {
                    line,
                    found: found.join(","),
                });
            }
            header_seen = true;
            continue;
        }
        if record.len() != 3 {
            return Err(ReplayError::FieldCount {
                line,
                found: record.len(),
            });
        }
        let time = number(line, "time_ns", &record[0])?;
        let key = &record[1];
        let cost = number(line, "cost", &record[2])?;
        if let Some(previous) = previous.filter(|&p| time < p) {
            return Err(ReplayError::TimeBackwards {
                line,
                time,
                previous,
            });
        }
        previous = Some(time);
        let decision = decide(key, time, cost).map_err(|e| ReplayError::Decide {
            line,
            source: e.into(),
        })?;
        summary.requests += 1;
        if decision.allowed {
            summary.allowed += 1;
            summary.allowed_cost = summary.allowed_cost.saturating_add(cost);
        }
        sink.row(&Row {
            time_ns: time,
            key,
            cost,
            allowed: decision.allowed,
            remaining: decision.remaining,
            retry_after_ns: decision.retry_after,
        })?;
    }
    if !header_seen {
        return Err(ReplayError::Empty);
    }
    sink.finish()?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_limits::{AlgorithmKind, Options};

    fn config(kind: AlgorithmKind, limit: &str, format: OutputFormat) -> Replay {
        Replay {
            algorithm: AnyAlgorithm::new(kind, Options::default()),
            limit: limit.parse().unwrap(),
            format,
        }
    }

    fn run(cfg: &Replay, input: &str) -> Result<String, ReplayError> {
        let mut out = Vec::new();
        replay(cfg, input.as_bytes(), &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn csv_round() {
        let cfg = config(AlgorithmKind::SlidingLog, "2/10ns", OutputFormat::Csv);
        let out = run(
            &cfg,
            "time_ns,key,cost\n0,a,1\n1,a,1\n2,a,1\n2,b,3\n10,a,1\n",
        )
        .unwrap();
        assert_eq!(
            out,
            "time_ns,key,cost,allowed,remaining,retry_after_ns\n\
             0,a,1,true,1,0\n1,a,1,true,0,0\n2,a,1,false,0,8\n2,b,3,false,2,\n10,a,1,true,0,0\n"
        );
    }

    #[test]
    fn jsonl_uses_null_for_never() {
        let cfg = config(AlgorithmKind::FixedWindow, "1/10ns", OutputFormat::Jsonl);
        let out = run(&cfg, "time_ns,key,cost\n0,\"a,b\",2\n").unwrap();
        assert_eq!(
            out,
            "{\"time_ns\":0,\"key\":\"a,b\",\"cost\":2,\"allowed\":false,\"remaining\":1,\"retry_after_ns\":null}\n"
        );
    }

    #[test]
    fn errors_name_the_line() {
        let cfg = config(AlgorithmKind::Gcra, "2/10ns", OutputFormat::Csv);
        let err = |input: &str| run(&cfg, input).unwrap_err().to_string();
        assert_eq!(
            err("time,key,cost\n"),
            "line 1: bad header \"time,key,cost\": expected `time_ns,key,cost`"
        );
        assert_eq!(
            err(""),
            "the trace is empty: it must start with the header `time_ns,key,cost`"
        );
        assert_eq!(
            err("time_ns,key,cost\n0,a,1\nx,a,1\n"),
            "line 3: time_ns \"x\" is not a whole number from 0 to 2^64-1"
        );
        assert_eq!(
            err("time_ns,key,cost\n0,a,-1\n"),
            "line 2: cost \"-1\" is not a whole number from 0 to 2^64-1"
        );
        assert_eq!(
            err("time_ns,key,cost\n5,a,1\n4,b,1\n"),
            "line 3: time_ns 4 goes backwards (the row before has 5); sort the trace by time"
        );
        assert_eq!(
            err("time_ns,key,cost\n5,a\n"),
            "line 2: expected 3 fields (`time_ns,key,cost`), found 2"
        );
        let bad_utf8 = b"time_ns,key,cost\n0,\xff,1\n";
        let e = replay(&cfg, &bad_utf8[..], Vec::new()).unwrap_err();
        assert!(matches!(e, ReplayError::Read { line: 2, .. }), "{e}");
    }

    proptest::proptest! {
        /// Replay is the algorithm, key by key: each output row is what a fresh state per key,
        /// fed that key's rows in order, decides.
        #[test]
        fn replay_decides_each_key_apart(
            kind in proptest::sample::select(sluice_limits::AlgorithmKind::ALL.to_vec()),
            rows in proptest::collection::vec((0u64..40, 0usize..3, 0u64..4), 0..60),
        ) {
            let cfg = config(kind, "3/100ns", OutputFormat::Csv);
            let mut input = String::from("time_ns,key,cost\n");
            let mut expected = String::from("time_ns,key,cost,allowed,remaining,retry_after_ns\n");
            let mut states: Vec<AnyState> =
                (0..3).map(|_| cfg.algorithm.new_state(&cfg.limit, 0)).collect();
            let mut t = 0;
            for (dt, key, cost) in rows {
                t += dt;
                input += &format!("{t},k{key},{cost}\n");
                let d = cfg.algorithm.check(&mut states[key], &cfg.limit, t, cost);
                let retry = d.retry_after.map(|r| r.to_string()).unwrap_or_default();
                expected += &format!("{t},k{key},{cost},{},{},{retry}\n", d.allowed, d.remaining);
            }
            proptest::prop_assert_eq!(run(&cfg, &input).unwrap(), expected);
        }
    }

    proptest::proptest! {
        /// `replay_with` given the in-memory algorithm writes exactly what `replay` writes,
        /// and counts the same keys: every backend shares one reader, checker and writer.
        #[test]
        fn replay_with_memory_is_replay(
            kind in proptest::sample::select(sluice_limits::AlgorithmKind::ALL.to_vec()),
            rows in proptest::collection::vec((0u64..40, 0usize..4, 0u64..5), 0..60),
            jsonl in proptest::bool::ANY,
        ) {
            let format = if jsonl { OutputFormat::Jsonl } else { OutputFormat::Csv };
            let cfg = config(kind, "3/100ns", format);
            let mut input = String::from("time_ns,key,cost\n");
            let mut t = 0;
            for (dt, key, cost) in rows {
                t += dt;
                input += &format!("{t},k{key},{cost}\n");
            }
            let mut want = Vec::new();
            let want_summary = replay(&cfg, input.as_bytes(), &mut want).unwrap();
            let mut states: HashMap<String, AnyState> = HashMap::new();
            let mut got = Vec::new();
            let got_summary = replay_with(format, input.as_bytes(), &mut got, |key, now, cost| {
                let state = states
                    .entry(key.to_string())
                    .or_insert_with(|| cfg.algorithm.new_state(&cfg.limit, now));
                Ok::<_, std::convert::Infallible>(cfg.algorithm.check(state, &cfg.limit, now, cost))
            })
            .unwrap();
            proptest::prop_assert_eq!(got, want);
            proptest::prop_assert_eq!(got_summary, want_summary);
        }
    }

    /// A backend failing mid-way stops the replay with its error and the line; the rows
    /// before it are written.
    #[test]
    fn a_failing_backend_names_the_line() {
        let mut out = Vec::new();
        let mut calls = 0;
        let e = replay_with(
            OutputFormat::Csv,
            &b"time_ns,key,cost\n0,a,1\n5,a,1\n"[..],
            &mut out,
            |_, _, _| {
                calls += 1;
                if calls == 2 {
                    return Err(io::Error::other("connection reset"));
                }
                Ok(Decision::allow(1, 0, 0))
            },
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "line 3: the backend could not decide");
        assert_eq!(
            std::error::Error::source(&e).map(ToString::to_string),
            Some("connection reset".to_string())
        );
        assert!(matches!(e, ReplayError::Decide { line: 3, .. }));
        drop(e);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "time_ns,key,cost,allowed,remaining,retry_after_ns\n0,a,1,true,0,0\n"
        );
    }

    #[test]
    fn summary_counts_keys_and_admissions() {
        let cfg = config(AlgorithmKind::TokenBucket, "1/1s", OutputFormat::Csv);
        let s = replay(
            &cfg,
            &b"time_ns,key,cost\n0,a,1\n0,a,1\n0,b,1\n"[..],
            io::sink(),
        )
        .unwrap();
        assert_eq!(
            s,
            ReplaySummary {
                requests: 3,
                allowed: 2,
                allowed_cost: 2,
                keys: 2
            }
        );
    }
}
