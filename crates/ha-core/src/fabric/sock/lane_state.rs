//! State the lanes of a `sock` queue pair share with it (`lanes.rs` runs them): the frames
//! queued for each lane, what each inbound lane has placed, and how a lane failed.

use super::mr::MrEntry;
use super::wire::{HEADER_LEN, MAX_LANES};
use std::collections::VecDeque;
use std::sync::Arc;

const LANES: usize = MAX_LANES as usize - 1;

/// One lane frame to write: its header and payload (inside `mr`).
pub struct LaneJob {
    pub hdr: [u8; HEADER_LEN],
    pub ptr: usize,
    pub len: usize,
    pub mr: Arc<MrEntry>,
}

/// How a lane let the main responder down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaneFail {
    /// A frame named memory it may not write: refuse the WRITE (NAK, remote access).
    Access,
    /// The stream ended or broke: hang up, as for a request stalled mid-way.
    Broken,
    /// Malformed traffic: the queue pair goes to ERR.
    Garbage(String),
}

/// The lanes' shared state (`QpShared::lanes`; condition variables `lane_jobs_cv` for the
/// senders, `lanes_cv` for what the placing threads did).
#[derive(Default)]
pub struct LaneState {
    /// Requester: frames queued per lane.
    pub jobs: Vec<VecDeque<LaneJob>>,
    /// Responder: per lane, the ordinal of the last frame placed.
    pub placed: [u32; LANES],
    /// Responder: lanes attached (bit `lane - 1`).
    pub attached: u8,
    /// Responder: the first lane failure.
    pub failed: Option<LaneFail>,
}
