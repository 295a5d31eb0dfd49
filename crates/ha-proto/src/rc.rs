//! The RC verbs vocabulary the protocol core reads: work completions, their status and
//! opcode. Values mirror `ibv_wc_status`; fabrics (`ha-core`'s `verbs` and `sock`) produce
//! these, the data and failover machines (`crate::data`) consume them.

/// Completion status, mirroring `ibv_wc_status` (values are the verbs ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    /// Any other verbs status, by number.
    Other(u32),
}

impl WcStatus {
    /// The `ibv_wc_status` number.
    pub fn code(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::Other(n) => n,
        }
    }

    pub fn from_code(code: u32) -> WcStatus {
        match code {
            0 => WcStatus::Success,
            1 => WcStatus::LocLenErr,
            2 => WcStatus::LocQpOpErr,
            4 => WcStatus::LocProtErr,
            5 => WcStatus::WrFlushErr,
            9 => WcStatus::RemInvReqErr,
            10 => WcStatus::RemAccessErr,
            11 => WcStatus::RemOpErr,
            12 => WcStatus::RetryExcErr,
            13 => WcStatus::RnrRetryExcErr,
            n => WcStatus::Other(n),
        }
    }

    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

/// What a completion completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    RdmaWrite,
    RdmaRead,
    /// A receive consumed by a peer's WRITE_WITH_IMM.
    RecvRdmaWithImm,
    /// Unknown (error completions carry no reliable opcode).
    Unknown,
}

/// One work completion. After an error only `wr_id`, `qp_num` and `status` are meaningful.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub qp_num: u32,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
}
