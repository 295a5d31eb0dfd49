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
    /// The receive timeout expired; `idle` is the time since the last byte arrived and
    /// `mid_frame` whether a frame has been partly read. `Err` stops the reader.
    fn idle(&mut self, idle: Duration, mid_frame: bool) -> Result<(), Abort>;
    /// Whether payload placement may go on (checked between `recv`s into target memory).
    fn alive(&self) -> bool;
}

/// A buffered reader over one stream's descriptor (owned elsewhere).
pub struct FrameReader {
    fd: RawFd,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    last_rx: Instant,
    /// The last payload was large: read only what is needed for the next header, so the
    /// next large payload is not dragged through the buffer.
    lean: bool,
}

impl FrameReader {
    pub fn new(fd: RawFd) -> FrameReader {
        FrameReader {
            fd,
            buf: vec![0u8; BUF_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            last_rx: Instant::now(),
            lean: false,
        }
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
            // SAFETY: forwarded caller guarantee.
            match unsafe { net::recv_into(self.fd, dst, len) } {
                Ok(Recv::Data(n)) => {
                    self.last_rx = Instant::now();
                    return Ok(n);
                }
                Ok(Recv::Eof) => return Err(Abort::Eof),
                Ok(Recv::Idle) => w.idle(self.last_rx.elapsed(), mid_frame)?,
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
