//! The frame reader over real loopback sockets: polling after `spin_a_while`, blocking inside
//! a frame, and the long tick of a quiet reader (entered after `QUIET_TICKS` quiet ticks, left
//! at the next byte, at a kick, or at a long tick that finds something to watch).

use super::*;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;

/// Records when the reader first went idle (a blocking `recv` timed out) and tells the
/// writer side, which sends only then.
struct FirstIdle {
    t0: Instant,
    at: Option<Duration>,
    mid_frame: Option<bool>,
    tell: mpsc::Sender<()>,
}

impl Watch for FirstIdle {
    fn idle(&mut self, _idle: Duration, mid_frame: bool) -> Result<(), Abort> {
        if self.at.is_none() {
            self.at = Some(self.t0.elapsed());
            self.mid_frame = Some(mid_frame);
            let _ = self.tell.send(());
        }
        Ok(())
    }
    fn alive(&self) -> bool {
        true
    }
}

/// A connected pair: (reader side with a 2 ms receive timeout, writer side).
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (r, _) = l.accept().unwrap();
    net::tune_stream(&r, Duration::from_millis(2)).unwrap();
    (r, w)
}

/// Runs `read` on a reader of `r` while a thread writes `first` at once and `later` once
/// the reader went idle; returns the watch.
fn drive(
    r: &TcpStream,
    mut w: TcpStream,
    spin: Duration,
    arm: impl FnOnce(&mut FrameReader),
    first: Vec<u8>,
    later: Vec<u8>,
    read: impl FnOnce(&mut FrameReader, &mut FirstIdle),
) -> FirstIdle {
    let (tell, idle) = mpsc::channel();
    let writer = std::thread::spawn(move || {
        w.write_all(&first).unwrap();
        idle.recv().unwrap();
        w.write_all(&later).unwrap();
        w
    });
    let mut rd = FrameReader::new(r.as_raw_fd(), spin);
    // Before arming: the spin cannot have started before `t0`.
    let t0 = Instant::now();
    arm(&mut rd);
    let mut watch = FirstIdle {
        t0,
        at: None,
        mid_frame: None,
        tell,
    };
    read(&mut rd, &mut watch);
    drop(writer.join().unwrap());
    watch
}

#[test]
fn an_armed_reader_polls_for_its_spin_time_then_blocks_and_still_reads() {
    let (r, w) = pair();
    let spin = Duration::from_millis(60);
    let frame: Vec<u8> = (0..HEADER_LEN as u8).collect();
    let watch = drive(
        &r,
        w,
        spin,
        FrameReader::spin_a_while,
        vec![],
        frame.clone(),
        |rd, w| {
            assert_eq!(rd.next_header(w).unwrap().to_vec(), frame);
        },
    );
    // Blocking reads time out every 2 ms; while polling there is no timeout at all.
    let at = watch.at.expect("the reader went idle once its spin ended");
    assert!(at >= spin, "idle after {at:?}, inside the {spin:?} spin");
    assert_eq!(watch.mid_frame, Some(false));
}

#[test]
fn a_stopped_or_unarmed_reader_blocks_at_once() {
    let spin = Duration::from_secs(2);
    let frame: Vec<u8> = (0..HEADER_LEN as u8).rev().collect();
    for stop in [true, false] {
        let (r, w) = pair();
        let arm = |rd: &mut FrameReader| {
            if stop {
                rd.spin_a_while();
                rd.stop_spinning();
            }
        };
        let watch = drive(&r, w, spin, arm, vec![], frame.clone(), |rd, w| {
            assert_eq!(rd.next_header(w).unwrap().to_vec(), frame);
        });
        let at = watch.at.expect("went idle");
        assert!(at < spin / 2, "stop={stop}: idle only after {at:?}");
    }
}

/// Never alive; a blocking wait fails the read instead of waiting on.
struct Stopped;

impl Watch for Stopped {
    fn idle(&mut self, _idle: Duration, _mid_frame: bool) -> Result<(), Abort> {
        Err(Abort::Expired)
    }
    fn alive(&self) -> bool {
        false
    }
}

#[test]
fn a_polling_reader_stops_for_a_dead_owner() {
    let (r, _w) = pair();
    let mut rd = FrameReader::new(r.as_raw_fd(), Duration::from_secs(2));
    rd.spin_a_while();
    // Polling asks `alive` between polls (Stop); had it blocked instead, the receive
    // timeout would have ended it (Expired).
    assert!(matches!(rd.next_header(&mut Stopped), Err(Abort::Stop)));
}

#[test]
fn an_armed_reader_blocks_inside_a_frame() {
    let (r, w) = pair();
    let spin = Duration::from_secs(2);
    let mut first: Vec<u8> = vec![7; HEADER_LEN];
    first.extend_from_slice(&[1, 2, 3]);
    let watch = drive(
        &r,
        w,
        spin,
        FrameReader::spin_a_while,
        first,
        vec![4, 5, 6, 7, 8],
        |rd, w| {
            assert_eq!(rd.next_header(w).unwrap(), [7; HEADER_LEN]);
            let mut payload = [0u8; 8];
            // SAFETY: `payload` is 8 writable bytes.
            unsafe { rd.read_payload(payload.as_mut_ptr(), payload.len(), w) }.unwrap();
            assert_eq!(payload, [1, 2, 3, 4, 5, 6, 7, 8]);
        },
    );
    assert_eq!(watch.mid_frame, Some(true), "idle only inside the frame");
    let at = watch.at.expect("went idle");
    assert!(at < spin / 2, "polled inside a frame for {at:?}");
}

/// A watch that is quiet (or not) as told, counts its arms and disarms, hands out `kick` when
/// armed, and at its `stop_at`-th tick (`idle` call) tells the test thread to act.
struct TickLog {
    quiet: bool,
    kick: Option<RawFd>,
    ticks: Vec<Instant>,
    arms: usize,
    disarms: usize,
    stop_at: usize,
    /// Told at the `stop_at`-th tick, and again at the first arm.
    tell: mpsc::Sender<&'static str>,
}

impl Watch for TickLog {
    fn idle(&mut self, _idle: Duration, _mid_frame: bool) -> Result<(), Abort> {
        self.ticks.push(Instant::now());
        if self.ticks.len() == self.stop_at {
            let _ = self.tell.send("tick");
        }
        Ok(())
    }
    fn alive(&self) -> bool {
        true
    }
    fn quiet(&self) -> bool {
        self.quiet
    }
    fn arm_long(&mut self) -> Option<Option<RawFd>> {
        self.arms += 1;
        if self.arms == 1 {
            let _ = self.tell.send("armed");
        }
        self.quiet.then_some(self.kick)
    }
    fn disarm_long(&mut self) {
        self.disarms += 1;
    }
}

/// A reader (stream timeout 2 ms, long tick `long`) that has read `first` bytes of a header
/// waits while the test thread runs `act` on each message of the watch ("armed", "tick"),
/// given the writer end; `act` returns true once it wrote the rest of the header.
fn tick_through(
    quiet: bool,
    kick: Option<&net::KickFd>,
    first: usize,
    stop_at: usize,
    long: Duration,
    mut act: impl FnMut(&str, &mut TcpStream, &[u8]) -> bool + Send + 'static,
) -> (TickLog, bool) {
    let (r, mut w) = pair();
    let frame: Vec<u8> = (0..HEADER_LEN as u8).collect();
    w.write_all(&frame[..first]).unwrap();
    let (tell, heard) = mpsc::channel::<&'static str>();
    let rest = frame[first..].to_vec();
    let actor = std::thread::spawn(move || {
        for what in heard.iter() {
            if act(what, &mut w, &rest) {
                break;
            }
        }
        w
    });
    let mut rd = FrameReader::new(r.as_raw_fd(), Duration::ZERO).idle_tick(long);
    let mut log = TickLog {
        quiet,
        kick: kick.map(net::KickFd::raw),
        ticks: vec![],
        arms: 0,
        disarms: 0,
        stop_at,
        tell,
    };
    assert_eq!(rd.next_header(&mut log).unwrap().to_vec(), frame);
    let long_on = rd.on_long_tick();
    drop(log.tell.clone());
    let (tx, _) = mpsc::channel();
    log.tell = tx; // the actor's channel closes: it ends
    drop(actor.join().unwrap());
    (log, long_on)
}

#[test]
fn a_quiet_reader_waits_with_its_long_tick_until_the_next_byte() {
    // Shared: the idle-link test (exclusive) counts long waits process-wide.
    let _l = crate::fabric::sock::test_lock::TEST_LOCK.read();
    let long = Duration::from_millis(300);
    let q = QUIET_TICKS as usize;
    // The rest of the header goes out at the tick after the first long one.
    let (log, long_on) = tick_through(true, None, 0, q + 1, long, |what, w, rest| {
        what == "tick" && w.write_all(rest).map(|()| true).unwrap()
    });
    // Armed once (a quiet long tick stays long), disarmed by the header's bytes; a writer
    // slower than the long tick adds long ticks, not arms.
    assert_eq!(log.arms, 1, "armed once, after {q} quiet ticks");
    assert_eq!(log.disarms, 1, "disarmed by the header's bytes");
    assert!(!long_on);
    assert!(log.ticks.len() > q, "{} ticks", log.ticks.len());
    // Tick Q+1 came from the long wait: at least `long` after tick Q (poll never fires early;
    // 10 ms of slack for clocks).
    let gap = log.ticks[q] - log.ticks[q - 1];
    assert!(
        gap + Duration::from_millis(10) >= long,
        "the long tick lasted {gap:?}"
    );
}

#[test]
fn a_kick_ends_the_long_wait_at_once() {
    // Shared: the idle-link test (exclusive) counts long waits process-wide.
    let _l = crate::fabric::sock::test_lock::TEST_LOCK.read();
    // A long tick the test would notice: with the kick, the reader is back on its short
    // ticks at once (the header is written at the next short tick after the kick).
    let long = Duration::from_secs(30);
    let kick = std::sync::Arc::new(net::KickFd::new().unwrap());
    let k2 = kick.clone();
    let q = QUIET_TICKS as usize;
    let t0 = Instant::now();
    let (log, long_on) =
        tick_through(
            true,
            Some(&kick),
            0,
            q + 1,
            long,
            move |what, w, rest| match what {
                "armed" => {
                    k2.kick();
                    false
                }
                _ => w.write_all(rest).map(|()| true).unwrap(),
            },
        );
    let took = t0.elapsed();
    assert!(
        took < long / 2,
        "the kick did not end the long wait: {took:?}"
    );
    // Without the kick the reader would wait out the 30 s tick. A writer slow to answer the
    // tick after the kick may let the reader arm again; every long wait ended (the last by
    // the header's bytes).
    assert!(log.arms >= 1);
    assert_eq!(log.disarms, log.arms);
    assert!(!long_on);
    assert!(log.ticks.len() > q, "{} ticks", log.ticks.len());
}

#[test]
fn a_reader_with_something_to_watch_or_inside_a_frame_never_waits_long() {
    // Shared: the idle-link test (exclusive) counts long waits process-wide.
    let _l = crate::fabric::sock::test_lock::TEST_LOCK.read();
    let long = Duration::from_secs(30);
    let n = 3 * QUIET_TICKS as usize;
    // Not quiet (an ACK awaited), between frames; then quiet but with half a header read.
    for (quiet, first) in [(false, 0), (true, 5)] {
        let (log, long_on) = tick_through(quiet, None, first, n, long, |what, w, rest| {
            what == "tick" && w.write_all(rest).map(|()| true).unwrap()
        });
        assert!(log.ticks.len() >= n, "quiet={quiet} first={first}");
        assert_eq!(log.arms, 0, "quiet={quiet} first={first}");
        assert!(!long_on);
    }
}
