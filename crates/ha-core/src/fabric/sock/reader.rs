//! Buffered frame reader: headers and small payloads come out of a 64 KiB buffer (one `recv`
//! can carry many small frames); large payloads are received straight into their target
//! memory, never through the buffer.

use super::net::{self, Recv};
use super::wire::HEADER_LEN;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

const BUF_BYTES: usize = 64 << 10;
/// Payload remainders at least this big are received directly into the target.
const DIRECT_MIN: usize = 8 << 10;

/// Why a read loop stopped.
#[derive(Debug)]
pub enum Abort {
    /// The peer closed the stream.
    Eof,
    /// The stream failed.
    Io(io::Error),
    /// The owner asked to stop (queue pair in error or dropped).
    Stop,
    /// A timer of the owner's [`Watch`] expired (retry timer, stalled frame).
    Expired,
}

/// Hooks a reader calls while it waits.
pub trait Watch {
    /// A blocking receive timed out; `idle` is the time since the last byte arrived and
    /// `mid_frame` whether a frame has been partly read. `Err` stops the reader. Not called
    /// while the reader polls (at most its spin time, see [`FrameReader::new`]).
    fn idle(&mut self, idle: Duration, mid_frame: bool) -> Result<(), Abort>;
    /// Whether the reader may go on: checked between `recv`s into target memory and between
    /// polls.
    fn alive(&self) -> bool;
    /// Whether nothing needs this reader's timer now (nothing awaits an answer, no frame is
    /// half read): after [`QUIET_TICKS`] such ticks in a row the reader waits with its long
    /// idle tick ([`FrameReader::idle_tick`]) until the next byte arrives. Default: never.
    fn quiet(&self) -> bool {
        false
    }
}

/// Ticks in a row with nothing to watch before a reader switches to its long idle tick.
pub const QUIET_TICKS: u32 = 4;

/// A reader's receive timeouts: `short` while something is watched, `long` once nothing has
/// been for [`QUIET_TICKS`] ticks (an idle connection then wakes its readers about once a
/// second instead of 8-20 times).
#[derive(Clone, Copy, Debug)]
struct Ticks {
    short: Duration,
    long: Duration,
    /// Quiet ticks in a row.
    quiet: u32,
    /// The stream's timeout is `long` now.
    long_on: bool,
}

/// A buffered reader over one stream's descriptor (owned elsewhere).
pub struct FrameReader {
    fd: RawFd,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    last_rx: Instant,
    /// How long a read polls without blocking after [`FrameReader::spin_a_while`] (zero:
    /// never).
    spin: Duration,
    /// Until when reads poll instead of blocking.
    spin_until: Option<Instant>,
    /// The last payload was large: read only what is needed for the next header, so the
    /// next large payload is not dragged through the buffer.
    lean: bool,
    /// Switching between a short and a long receive timeout (None: the stream's own, always).
    ticks: Option<Ticks>,
}

impl FrameReader {
    /// A reader of `fd`; for `spin` after each [`FrameReader::spin_a_while`] it polls the
    /// stream instead of blocking in `recv` (so a message that follows soon is read by a
    /// running thread, with no wake-up), otherwise it blocks with the stream's receive timeout.
    pub fn new(fd: RawFd, spin: Duration) -> FrameReader {
        FrameReader {
            fd,
            buf: vec![0u8; BUF_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            last_rx: Instant::now(),
            spin,
            spin_until: None,
            lean: false,
            ticks: None,
        }
    }

    /// Let the stream's receive timeout (which must be `short` now) grow to `long` while the
    /// watch says it is [quiet](Watch::quiet), and shrink back at the next byte or the first
    /// tick that is not quiet.
    pub fn idle_tick(mut self, short: Duration, long: Duration) -> FrameReader {
        if long > short {
            self.ticks = Some(Ticks {
                short,
                long,
                quiet: 0,
                long_on: false,
            });
        }
        self
    }

    /// Whether the stream waits with its long idle tick now.
    #[cfg(test)]
    pub fn on_long_tick(&self) -> bool {
        self.ticks.is_some_and(|t| t.long_on)
    }

    /// Bytes arrived: back to the short tick if the long one was on.
    fn woke(&mut self) {
        if let Some(t) = self.ticks.as_mut() {
            t.quiet = 0;
            if t.long_on && net::set_recv_timeout(self.fd, t.short).is_ok() {
                t.long_on = false;
            }
        }
    }

    /// A receive timed out; `quiet`: nothing needed the timer.
    fn ticked(&mut self, quiet: bool) {
        let Some(t) = self.ticks.as_mut() else {
            return;
        };
        if !quiet {
            t.quiet = 0;
            if t.long_on && net::set_recv_timeout(self.fd, t.short).is_ok() {
                t.long_on = false;
            }
            return;
        }
        t.quiet = t.quiet.saturating_add(1);
        if !t.long_on && t.quiet >= QUIET_TICKS && net::set_recv_timeout(self.fd, t.long).is_ok() {
            t.long_on = true;
        }
    }

    /// Poll instead of blocking for the configured spin time from now (no-op when it is zero).
    pub fn spin_a_while(&mut self) {
        if !self.spin.is_zero() {
            self.spin_until = Some(Instant::now() + self.spin);
        }
    }

    /// Whether a read now polls; forgets an expired spin (no clock read per read after it).
    fn polling(&mut self) -> bool {
        match self.spin_until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                self.spin_until = None;
                false
            }
            None => false,
        }
    }

    /// Block again at the next read (a large frame keeps the stream busy by itself).
    pub fn stop_spinning(&mut self) {
        self.spin_until = None;
    }

    /// Bytes buffered and not consumed.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Whether a whole header is already buffered (so the next read will not block).
    pub fn header_ready(&self) -> bool {
        self.buffered() >= HEADER_LEN
    }

    /// One `recv` into `dst`; `Ok(n)` with n > 0, or an abort.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    unsafe fn recv_some(
        &mut self,
        dst: *mut u8,
        len: usize,
        w: &mut dyn Watch,
        mid_frame: bool,
    ) -> Result<usize, Abort> {
        loop {
            // Only between frames: inside one, the rest is on its way and a poll would only
            // contend for the socket with the kernel delivering it.
            let spinning = !mid_frame && self.polling();
            // SAFETY: forwarded caller guarantee.
            let got = unsafe {
                if spinning {
                    net::recv_now(self.fd, dst, len)
                } else {
                    net::recv_into(self.fd, dst, len)
                }
            };
            match got {
                Ok(Recv::Data(n)) => {
                    self.last_rx = Instant::now();
                    self.woke();
                    return Ok(n);
                }
                Ok(Recv::Eof) => return Err(Abort::Eof),
                Ok(Recv::Idle) if spinning => {
                    if !w.alive() {
                        return Err(Abort::Stop);
                    }
                    std::thread::yield_now();
                }
                Ok(Recv::Idle) => {
                    w.idle(self.last_rx.elapsed(), mid_frame)?;
                    self.ticked(!mid_frame && w.quiet());
                }
                Err(e) => return Err(Abort::Io(e)),
            }
        }
    }

    /// Make at least `need` (≤ buffer size) bytes available in the buffer.
    fn fill(&mut self, need: usize, w: &mut dyn Watch, mid_frame: bool) -> Result<(), Abort> {
        debug_assert!(need <= self.buf.len());
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.buf.len() - self.start < need {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < need {
            let want = if self.lean {
                need - (self.end - self.start)
            } else {
                self.buf.len() - self.end
            };
            let mid = mid_frame || self.end > self.start;
            // SAFETY: `end + want <= buf.len()`, inside our own buffer.
            let dst = unsafe { self.buf.as_mut_ptr().add(self.end) };
            // SAFETY: `dst..dst+want` is inside our own buffer.
            let n = unsafe { self.recv_some(dst, want, w, mid)? };
            self.end += n;
        }
        Ok(())
    }

    /// The next frame header's bytes.
    pub fn next_header(&mut self, w: &mut dyn Watch) -> Result<[u8; HEADER_LEN], Abort> {
        self.fill(HEADER_LEN, w, false)?;
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        self.start += HEADER_LEN;
        // Frames without a large payload: read greedily again until one shows up.
        self.lean = false;
        Ok(h)
    }

    /// Receive the next `len` payload bytes into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes (the caller holds what keeps the target
    /// memory alive, i.e. a registration pin and the queue pair's placement lock).
    pub unsafe fn read_payload(
        &mut self,
        dst: *mut u8,
        len: usize,
        w: &mut dyn Watch,
    ) -> Result<(), Abort> {
        let mut done = 0;
        let take = self.buffered().min(len);
        if take > 0 {
            // SAFETY: source is inside our buffer, destination inside the caller's range;
            // they cannot overlap (the caller's memory is not our private buffer).
            unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.start), dst, take) };
            self.start += take;
            done = take;
        }
        let lean = len >= DIRECT_MIN;
        while done < len {
            if !w.alive() {
                return Err(Abort::Stop);
            }
            let rest = len - done;
            if rest >= DIRECT_MIN {
                // SAFETY: `dst + done .. dst + len` is inside the caller's range.
                done += unsafe { self.recv_some(dst.add(done), rest, w, true)? };
            } else {
                self.fill(rest, w, true)?;
                // SAFETY: as above; `rest` bytes are buffered.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.buf.as_ptr().add(self.start),
                        dst.add(done),
                        rest,
                    )
                };
                self.start += rest;
                done = len;
            }
        }
        self.lean = lean;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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

    /// Records the stream's receive timeout at every tick; the `stop_at`-th tick tells the
    /// writer to send the rest.
    struct TickLog<'a> {
        r: &'a TcpStream,
        quiet: bool,
        seen: Vec<(Instant, Duration)>,
        stop_at: usize,
        tell: Option<mpsc::Sender<()>>,
    }

    impl Watch for TickLog<'_> {
        fn idle(&mut self, _idle: Duration, _mid_frame: bool) -> Result<(), Abort> {
            let t = self.r.read_timeout().unwrap().expect("a receive timeout");
            self.seen.push((Instant::now(), t));
            if self.seen.len() == self.stop_at {
                let _ = self.tell.take().expect("told once").send(());
            }
            Ok(())
        }
        fn alive(&self) -> bool {
            true
        }
        fn quiet(&self) -> bool {
            self.quiet
        }
    }

    /// A reader of `r` (short tick 2 ms, long `long`) that reads `first`, then waits through
    /// `ticks` ticks, then reads the rest of a header; returns the ticks seen, whether the long
    /// tick is on at the end, and the stream's timeout at the end and at the start (the kernel
    /// rounds timeouts to its clock ticks: 2 ms reads back as 4 ms at HZ=250).
    fn tick_through(
        quiet: bool,
        first: usize,
        ticks: usize,
        long: Duration,
    ) -> (TickLog<'static>, bool, Duration, Duration) {
        let (r, mut w) = pair();
        let r: &'static TcpStream = Box::leak(Box::new(r));
        let short = r.read_timeout().unwrap().unwrap();
        let frame: Vec<u8> = (0..HEADER_LEN as u8).collect();
        let (tell, go) = mpsc::channel();
        let rest = frame[first..].to_vec();
        w.write_all(&frame[..first]).unwrap();
        let writer = std::thread::spawn(move || {
            go.recv().unwrap();
            w.write_all(&rest).unwrap();
            w
        });
        let mut rd = FrameReader::new(r.as_raw_fd(), Duration::ZERO)
            .idle_tick(Duration::from_millis(2), long);
        let mut log = TickLog {
            r,
            quiet,
            seen: vec![],
            stop_at: ticks,
            tell: Some(tell),
        };
        assert_eq!(rd.next_header(&mut log).unwrap().to_vec(), frame);
        drop(writer.join().unwrap());
        let after = r.read_timeout().unwrap().unwrap();
        (log, rd.on_long_tick(), after, short)
    }

    #[test]
    fn a_quiet_reader_waits_with_its_long_tick_until_the_next_byte() {
        let long = Duration::from_millis(300);
        let q = QUIET_TICKS as usize;
        let (log, long_on, after, short) = tick_through(true, 0, q + 1, long);
        // `idle` runs before the tick is counted: ticks 1..=Q waited with the short timeout,
        // the Q+1-th with the long one, and for at least that long.
        let timeouts: Vec<Duration> = log.seen.iter().map(|s| s.1).collect();
        let mut want = vec![short; q];
        want.push(long);
        assert_eq!(timeouts, want);
        let gap = log.seen[q].0 - log.seen[q - 1].0;
        assert!(gap >= long, "the long tick lasted {gap:?}");
        // The header's bytes brought the short tick back.
        assert!(!long_on);
        assert_eq!(after, short);
    }

    #[test]
    fn a_reader_with_something_to_watch_or_inside_a_frame_keeps_its_short_tick() {
        let long = Duration::from_millis(300);
        let n = 3 * QUIET_TICKS as usize;
        // Not quiet (an ACK awaited), between frames; then quiet but half a header read.
        for (quiet, first) in [(false, 0), (true, 5)] {
            let (log, long_on, after, short) = tick_through(quiet, first, n, long);
            assert_eq!(log.seen.len(), n, "quiet={quiet} first={first}");
            assert!(
                log.seen.iter().all(|s| s.1 == short),
                "quiet={quiet} first={first}: {:?}",
                log.seen
            );
            assert!(!long_on);
            assert_eq!(after, short);
        }
    }
}
