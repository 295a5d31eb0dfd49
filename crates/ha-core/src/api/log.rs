//! Logging bridge: a hand-written `tracing` subscriber that formats each event into one line
//! and forwards it to the installed [`LogSink`] (NCCL's logger once `init` ran, stderr
//! before that). The verbosity follows `NCCL_DEBUG`, read once.

use parking_lot::RwLock;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Arc, Once, OnceLock};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// Severity as NCCL understands it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Warn,
    Info,
    Trace,
}

impl Level {
    /// `ERROR`/`WARN` → `Warn`, `INFO` → `Info`, `DEBUG`/`TRACE` → `Trace`.
    pub(crate) fn from_tracing(level: &tracing::Level) -> Level {
        if *level <= tracing::Level::WARN {
            Level::Warn
        } else if *level == tracing::Level::INFO {
            Level::Info
        } else {
            Level::Trace
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Trace => "TRACE",
        }
    }
}

/// Where formatted log lines go.
pub trait LogSink: Send + Sync {
    /// One event. `subsys_init` marks initialization messages (NCCL's `INIT` subsystem).
    fn log(&self, level: Level, subsys_init: bool, file: &str, line: u32, msg: &str);
}

/// The sink used until another is installed: `HA NET <LEVEL> msg` lines on stderr.
#[derive(Clone, Copy, Debug, Default)]
pub struct StderrSink;

impl LogSink for StderrSink {
    fn log(&self, level: Level, _subsys_init: bool, _file: &str, _line: u32, msg: &str) {
        let _ = std::io::stderr().write_all(stderr_line(level, msg).as_bytes());
    }
}

/// One whole line for [`StderrSink`], written with one `write_all`: `eprintln!` writes each
/// piece of its format separately (stderr is unbuffered), so two processes sharing a log
/// file (two ranks, a tool and its child) interleaved pieces and fused two lines into one.
fn stderr_line(level: Level, msg: &str) -> String {
    format!("HA NET {} {msg}\n", level.as_str())
}

static SINK: RwLock<Option<Arc<dyn LogSink>>> = parking_lot::const_rwlock(None);

/// Route every subsequent event to `sink` (replaces any previous sink; thread-safe).
pub fn install(sink: Arc<dyn LogSink>) {
    *SINK.write() = Some(sink);
}

/// The installed sink, or [`StderrSink`].
fn current_sink() -> Arc<dyn LogSink> {
    // Clone under the lock and call outside it, so a sink that logs cannot deadlock.
    match &*SINK.read() {
        Some(s) => s.clone(),
        None => Arc::new(StderrSink),
    }
}

/// Most verbose level enabled by an `NCCL_DEBUG` value: unset/`WARN` → warnings,
/// `INFO` → info, `TRACE` → everything, `VERSION`/`NONE` → nothing.
pub(crate) fn max_level_from_nccl_debug(value: Option<&str>) -> LevelFilter {
    let Some(v) = value else {
        return LevelFilter::WARN;
    };
    match v.trim().to_ascii_uppercase().as_str() {
        "INFO" => LevelFilter::INFO,
        "TRACE" => LevelFilter::TRACE,
        "VERSION" | "NONE" => LevelFilter::OFF,
        _ => LevelFilter::WARN,
    }
}

/// `NCCL_DEBUG`'s level, read from the environment on first use.
pub(crate) fn env_max_level() -> LevelFilter {
    static LEVEL: OnceLock<LevelFilter> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let v = std::env::var_os("NCCL_DEBUG").map(|v| v.to_string_lossy().into_owned());
        max_level_from_nccl_debug(v.as_deref())
    })
}

/// The plugin's `tracing` subscriber.
pub struct HaSubscriber {
    max: LevelFilter,
    /// A fixed sink; `None` = whatever [`install`] set last.
    sink: Option<Arc<dyn LogSink>>,
}

impl HaSubscriber {
    /// Level from `NCCL_DEBUG`, events to the installed sink.
    pub fn from_env() -> HaSubscriber {
        HaSubscriber::new(env_max_level())
    }

    /// Given level, events to the installed sink.
    pub fn new(max: LevelFilter) -> HaSubscriber {
        HaSubscriber { max, sink: None }
    }

    #[cfg(test)]
    /// Given level, events always to `sink` (ignores [`install`]).
    pub(crate) fn with_sink(max: LevelFilter, sink: Arc<dyn LogSink>) -> HaSubscriber {
        HaSubscriber {
            max,
            sink: Some(sink),
        }
    }

    fn level_enabled(&self, level: &tracing::Level) -> bool {
        self.max >= *level
    }
}

/// Collects an event's fields into `message key=value ...`.
#[derive(Default)]
struct LineVisitor {
    message: String,
    fields: String,
    init: bool,
}

impl LineVisitor {
    fn push_field(&mut self, name: &str, value: std::fmt::Arguments<'_>) {
        let _ = write!(self.fields, " {name}={value}");
    }

    fn into_line(self) -> String {
        let mut line = self.message;
        if line.is_empty() {
            line.push_str(self.fields.trim_start());
        } else {
            line.push_str(&self.fields);
        }
        line
    }
}

impl Visit for LineVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.push_field(field.name(), format_args!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.push_field(field.name(), format_args!("{value}"));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "init" {
            // A routing flag (NCCL's INIT subsystem), not part of the text.
            self.init |= value;
        } else {
            self.push_field(field.name(), format_args!("{value}"));
        }
    }
}

impl Subscriber for HaSubscriber {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Cached per callsite by `tracing`: a disabled event then costs one atomic load.
        if self.level_enabled(metadata.level()) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.level_enabled(metadata.level())
    }

    fn new_span(&self, _span: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _span: &span::Id, _values: &span::Record<'_>) {}

    fn record_follows_from(&self, _span: &span::Id, _follows: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        if !self.level_enabled(meta.level()) {
            return;
        }
        let mut visitor = LineVisitor::default();
        event.record(&mut visitor);
        let subsys_init = visitor.init || meta.target().contains("init");
        let line = visitor.into_line();
        let sink = match &self.sink {
            Some(s) => s.clone(),
            None => current_sink(),
        };
        sink.log(
            Level::from_tracing(meta.level()),
            subsys_init,
            meta.file().unwrap_or(""),
            meta.line().unwrap_or(0),
            &line,
        );
    }

    fn enter(&self, _span: &span::Id) {}

    fn exit(&self, _span: &span::Id) {}
}

/// Make [`HaSubscriber::from_env`] the process-wide `tracing` default, once. If another
/// subscriber is already the global default, it is left in place.
pub fn ensure_subscriber() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(HaSubscriber::from_env());
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Rec {
        level: Level,
        init: bool,
        file: String,
        line: u32,
        msg: String,
    }

    #[derive(Default)]
    struct Capture(Mutex<Vec<Rec>>);

    impl LogSink for Capture {
        fn log(&self, level: Level, subsys_init: bool, file: &str, line: u32, msg: &str) {
            self.0.lock().push(Rec {
                level,
                init: subsys_init,
                file: file.to_string(),
                line,
                msg: msg.to_string(),
            });
        }
    }

    impl Capture {
        fn take(&self) -> Vec<Rec> {
            std::mem::take(&mut *self.0.lock())
        }
    }

    fn capture(max: LevelFilter) -> (Arc<Capture>, HaSubscriber) {
        let cap = Arc::new(Capture::default());
        let sub = HaSubscriber::with_sink(max, cap.clone());
        (cap, sub)
    }

    #[test]
    fn level_mapping_message_and_fields() {
        let (cap, sub) = capture(LevelFilter::TRACE);
        let line = tracing::subscriber::with_default(sub, || {
            tracing::error!("e1");
            tracing::warn!(dev = 3, name = "mlx5_0", "link down");
            tracing::info!(ok = true, "i1");
            tracing::debug!("d1");
            tracing::trace!(bytes = 4096u64);
            line!()
        });
        let recs = cap.take();
        let got: Vec<(Level, &str)> = recs.iter().map(|r| (r.level, r.msg.as_str())).collect();
        assert_eq!(
            got,
            vec![
                (Level::Warn, "e1"),
                (Level::Warn, "link down dev=3 name=mlx5_0"),
                (Level::Info, "i1 ok=true"),
                (Level::Trace, "d1"),
                (Level::Trace, "bytes=4096"),
            ]
        );
        for (i, r) in recs.iter().enumerate() {
            assert!(r.file.ends_with("log.rs"), "{}", r.file);
            assert_eq!(r.line, line - 5 + i as u32);
            assert!(!r.init);
        }
    }

    #[test]
    fn init_flag_from_field_or_target() {
        let (cap, sub) = capture(LevelFilter::INFO);
        tracing::subscriber::with_default(sub, || {
            tracing::info!(init = true, "from field");
            tracing::info!(target: "nccl_net_ha::init", "from target");
            tracing::info!(init = false, "not init");
            tracing::info!(target: "nccl_net_ha::data", "plain");
        });
        let got: Vec<(bool, String)> = cap.take().into_iter().map(|r| (r.init, r.msg)).collect();
        assert_eq!(
            got,
            vec![
                (true, "from field".to_string()),
                (true, "from target".to_string()),
                (false, "not init".to_string()),
                (false, "plain".to_string()),
            ]
        );
    }

    #[test]
    fn level_filtering() {
        for (max, expect) in [
            (LevelFilter::OFF, vec![]),
            (LevelFilter::WARN, vec!["e", "w"]),
            (LevelFilter::INFO, vec!["e", "w", "i"]),
            (LevelFilter::TRACE, vec!["e", "w", "i", "d", "t"]),
        ] {
            let (cap, sub) = capture(max);
            tracing::subscriber::with_default(sub, || {
                tracing::error!("e");
                tracing::warn!("w");
                tracing::info!("i");
                tracing::debug!("d");
                tracing::trace!("t");
            });
            let msgs: Vec<String> = cap.take().into_iter().map(|r| r.msg).collect();
            assert_eq!(msgs, expect, "max level {max}");
        }
    }

    #[test]
    fn nccl_debug_parsing() {
        assert_eq!(max_level_from_nccl_debug(None), LevelFilter::WARN);
        assert_eq!(max_level_from_nccl_debug(Some("WARN")), LevelFilter::WARN);
        assert_eq!(max_level_from_nccl_debug(Some("info")), LevelFilter::INFO);
        assert_eq!(max_level_from_nccl_debug(Some("TRACE")), LevelFilter::TRACE);
        assert_eq!(max_level_from_nccl_debug(Some("VERSION")), LevelFilter::OFF);
        assert_eq!(max_level_from_nccl_debug(Some("NONE")), LevelFilter::OFF);
        assert_eq!(max_level_from_nccl_debug(Some("bogus")), LevelFilter::WARN);
    }

    #[test]
    fn install_replaces_the_global_sink() {
        // Other tests may log through the global sink concurrently: match on unique text.
        let first = Arc::new(Capture::default());
        let second = Arc::new(Capture::default());
        let mine = |c: &Capture| -> Vec<String> {
            c.take()
                .into_iter()
                .map(|r| r.msg)
                .filter(|m| m.starts_with("install-test"))
                .collect()
        };
        tracing::subscriber::with_default(HaSubscriber::new(LevelFilter::INFO), || {
            install(first.clone());
            tracing::warn!("install-test one");
            install(second.clone());
            tracing::info!("install-test two");
        });
        assert_eq!(mine(&first), vec!["install-test one"]);
        assert_eq!(mine(&second), vec!["install-test two"]);
    }

    #[test]
    fn ensure_subscriber_is_idempotent() {
        ensure_subscriber();
        ensure_subscriber();
        assert!(tracing::dispatcher::has_been_set());
    }
}
