//! What the two sides of a stream tell each other besides the traffic itself, and how a side
//! reports failure.
//!
//! A `--duration` stream ends with a stop handshake, because a receiver cannot take back
//! receives it has posted: the sender, at its deadline, stops starting operations and asks
//! to stop after the `P` it has started; the receiver answers with `L = max(P, posted)`, and
//! both sides then run operations up to `L`. A `--messages` stream needs no handshake.

use nccl_net_loader::NcclError;
use std::sync::mpsc;

/// The sender's end of the control link.
pub trait SenderLink {
    /// Asks the receiver to stop after `started` operations (non-blocking).
    fn request_stop(&mut self, started: u64) -> Result<(), String>;
    /// The receiver's answer, once it arrived: the number of operations both sides run.
    fn stop_reply(&mut self) -> Option<u64>;
}

/// The receiver's end of the control link.
pub trait ReceiverLink {
    /// A stop request, once it arrived: the number of operations the sender started.
    fn stop_request(&mut self) -> Option<u64>;
    /// Answers a stop request with the number of operations both sides run.
    fn reply_stop(&mut self, limit: u64) -> Result<(), String>;
}

/// The link between two threads of one process.
pub struct ChanSender {
    tx: mpsc::Sender<u64>,
    rx: mpsc::Receiver<u64>,
}

pub struct ChanReceiver {
    tx: mpsc::Sender<u64>,
    rx: mpsc::Receiver<u64>,
}

pub fn channel_link() -> (ChanSender, ChanReceiver) {
    let (req_tx, req_rx) = mpsc::channel();
    let (rep_tx, rep_rx) = mpsc::channel();
    (
        ChanSender {
            tx: req_tx,
            rx: rep_rx,
        },
        ChanReceiver {
            tx: rep_tx,
            rx: req_rx,
        },
    )
}

impl SenderLink for ChanSender {
    fn request_stop(&mut self, started: u64) -> Result<(), String> {
        self.tx
            .send(started)
            .map_err(|_| "receiver gone before the stop request".to_string())
    }

    fn stop_reply(&mut self) -> Option<u64> {
        self.rx.try_recv().ok()
    }
}

impl ReceiverLink for ChanReceiver {
    fn stop_request(&mut self) -> Option<u64> {
        self.rx.try_recv().ok()
    }

    fn reply_stop(&mut self, limit: u64) -> Result<(), String> {
        self.tx
            .send(limit)
            .map_err(|_| "sender gone before the stop reply".to_string())
    }
}

/// Why a side stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The plugin returned this `ncclResult_t` for a call.
    Request(i32),
    /// No progress for `--timeout` seconds.
    Stall,
    /// Connection setup, registration or the control link failed.
    Setup,
    /// Stopped because the other side failed (not counted as an error of its own).
    Aborted,
}

impl ErrorKind {
    /// Whether this counts in the `errors` total.
    pub fn counts(self) -> bool {
        self != ErrorKind::Aborted
    }

    pub fn word(self) -> String {
        match self {
            ErrorKind::Request(code) => format!("request:{code}"),
            ErrorKind::Stall => "stall".into(),
            ErrorKind::Setup => "setup".into(),
            ErrorKind::Aborted => "aborted".into(),
        }
    }

    pub fn from_word(w: &str) -> Option<ErrorKind> {
        match w {
            "stall" => Some(ErrorKind::Stall),
            "setup" => Some(ErrorKind::Setup),
            "aborted" => Some(ErrorKind::Aborted),
            _ => w
                .strip_prefix("request:")
                .and_then(|c| c.parse().ok())
                .map(ErrorKind::Request),
        }
    }
}

/// A side's failure: when (ns since that side's start), what, and its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideError {
    pub at_ns: u64,
    pub kind: ErrorKind,
    pub what: String,
}

impl SideError {
    /// A plugin call that returned `e`: the message names the call and the `ncclResult_t`.
    pub fn request(at_ns: u64, call: String, e: NcclError) -> Self {
        SideError {
            at_ns,
            kind: ErrorKind::Request(e.0),
            what: format!("{call}: {e}"),
        }
    }

    pub fn new(at_ns: u64, kind: ErrorKind, what: String) -> Self {
        SideError { at_ns, kind, what }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_handshake_over_channels() {
        let (mut s, mut r) = channel_link();
        assert_eq!(r.stop_request(), None);
        s.request_stop(17).unwrap();
        assert_eq!(r.stop_request(), Some(17));
        assert_eq!(s.stop_reply(), None);
        r.reply_stop(20).unwrap();
        assert_eq!(s.stop_reply(), Some(20));
        drop(r);
        assert!(s.request_stop(1).is_err());
    }

    #[test]
    fn error_kinds_round_trip_and_count() {
        for k in [
            ErrorKind::Request(6),
            ErrorKind::Request(-3),
            ErrorKind::Stall,
            ErrorKind::Setup,
            ErrorKind::Aborted,
        ] {
            assert_eq!(ErrorKind::from_word(&k.word()), Some(k));
        }
        assert_eq!(ErrorKind::from_word("request:x"), None);
        assert!(!ErrorKind::Aborted.counts() && ErrorKind::Stall.counts());
        let e = SideError::request(5, "test(recv op 3)".into(), NcclError(6));
        assert_eq!(e.what, "test(recv op 3): ncclRemoteError (6)");
        assert_eq!(e.kind, ErrorKind::Request(6));
    }
}
