//! Buffered frame reader: headers and small payloads come out of a 64 KiB buffer (one `recv`
//! can carry many small frames); large payloads are received straight into their target
//! memory, never through the buffer.

use super::net::{self, Recv};
use super::wire::HEADER_LEN;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
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
    /// A tick: a blocking receive timed out, or a long wait did; `idle` is the time since the
    /// last byte arrived and `mid_frame` whether a frame has been partly read. `Err` stops the
    /// reader. Not called while the reader spins (at most its spin time, see
    /// [`FrameReader::new`]).
    fn idle(&mut self, idle: Duration, mid_frame: bool) -> Result<(), Abort>;
    /// Whether the reader may go on: checked between `recv`s into target memory and between
    /// polls.
    fn alive(&self) -> bool;
    /// Whether nothing needs this reader's timer now (nothing awaits an answer, no frame is
    /// half read): after [`QUIET_TICKS`] such ticks in a row the reader waits with its long
    /// tick ([`FrameReader::idle_tick`]) until the next byte, a kick, or a long tick at which
    /// it is no longer quiet. Default: never.
    fn quiet(&self) -> bool {
        false
    }
    /// The reader is about to wait with its long tick: arm whatever may cut that wait short,
    /// then confirm the watch is still quiet (checked after arming, so work that arrives
    /// meanwhile is either seen here or cuts the wait). `None`: not quiet after all;
    /// `Some(kick)`: wait, woken early also when `kick` (an eventfd) becomes readable.
    fn arm_long(&mut self) -> Option<Option<RawFd>> {
        self.quiet().then_some(None)
    }
    /// The long wait ended (bytes, a kick, or a tick that found something to watch).
    fn disarm_long(&mut self) {}
}

/// Ticks in a row with nothing to watch before a reader waits with its long tick.
pub const QUIET_TICKS: u32 = 4;

/// Long waits begun, and those a kick ended, by every reader of this process (for tests).
static LONG_WAITS: AtomicU64 = AtomicU64::new(0);
static KICKED: AtomicU64 = AtomicU64::new(0);

/// (long waits begun, long waits a kick ended) in this process so far.
#[cfg(test)]
pub fn long_wait_counts() -> (u64, u64) {
    (LONG_WAITS.load(Relaxed), KICKED.load(Relaxed))
}

/// A reader's long tick: after [`QUIET_TICKS`] quiet ticks of the stream's own receive timeout
/// it waits in `poll` for up to `long` (an idle connection then wakes its readers about once a
/// second instead of 8-20 times).
#[derive(Clone, Copy, Debug)]
struct Ticks {
    long: Duration,
    /// Quiet ticks in a row.
    quiet: u32,
    /// Waiting long, woken early also by this eventfd (if any).
    long_on: Option<Option<RawFd>>,
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
    /// The long wait in `poll` of a quiet reader (None: always the stream's own timeout).
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

    /// Wait up to `long` (in `poll`, not `recv`) once the watch has been [quiet](Watch::quiet)
    /// for [`QUIET_TICKS`] of the stream's own receive timeouts; back to those at the next
    /// byte, a kick, or a long tick that finds something to watch.
    pub fn idle_tick(mut self, long: Duration) -> FrameReader {
        self.ticks = Some(Ticks {
            long,
            quiet: 0,
            long_on: None,
        });
        self
    }

    /// Whether the reader waits with its long tick now.
    #[cfg(test)]
    pub fn on_long_tick(&self) -> bool {
        self.ticks.is_some_and(|t| t.long_on.is_some())
    }

    /// A receive timed out; `quiet`: nothing needed the timer.
    fn ticked(&mut self, quiet: bool, w: &mut dyn Watch) {
        let Some(t) = self.ticks.as_mut() else {
            return;
        };
        if !quiet {
            t.quiet = 0;
            return;
        }
        t.quiet = t.quiet.saturating_add(1);
        if t.quiet >= QUIET_TICKS {
            t.quiet = 0;
            t.long_on = w.arm_long();
            if t.long_on.is_some() {
                LONG_WAITS.fetch_add(1, Relaxed);
            }
        }
    }

    /// End the long wait.
    fn leave_long(&mut self, w: &mut dyn Watch) {
        if let Some(t) = self.ticks.as_mut() {
            if t.long_on.take().is_some() {
                w.disarm_long();
            }
            t.quiet = 0;
        }
    }

    /// The long wait, if it is on: `Ok(true)` when the stream is to be read now (bytes, its
    /// end, or a kick: a `recv` with the short timeout follows), `Ok(false)` after a long tick
    /// (the watch was told; the caller waits again).
    fn wait_long(&mut self, w: &mut dyn Watch) -> Result<bool, Abort> {
        let Some(Ticks {
            long,
            long_on: Some(kick),
            ..
        }) = self.ticks
        else {
            return Ok(true);
        };
        let ms = libc::c_int::try_from(long.as_millis()).unwrap_or(libc::c_int::MAX);
        let Ok((ready, kicked)) = net::poll_stream_or_kick(self.fd, kick, ms) else {
            // `poll` itself failed (ENOMEM): read with the stream's own timeout again; a
            // failing stream shows there.
            self.leave_long(w);
            return Ok(true);
        };
        if kicked {
            KICKED.fetch_add(1, Relaxed);
            if let Some(k) = kick {
                net::drain_kick(k);
            }
        }
        if ready || kicked {
            self.leave_long(w);
            return Ok(true);
        }
        w.idle(self.last_rx.elapsed(), false)?;
        if !w.quiet() {
            self.leave_long(w);
        }
        Ok(false)
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
            if !spinning && !self.wait_long(w)? {
                continue;
            }
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
                    if let Some(t) = self.ticks.as_mut() {
                        t.quiet = 0;
                    }
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
                    let quiet = !mid_frame && w.quiet();
                    self.ticked(quiet, w);
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
mod tests;
