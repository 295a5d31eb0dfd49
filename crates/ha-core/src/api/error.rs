//! API errors: a code NCCL understands plus a message for its log.

use crate::transport::Error as ConnError;
use ha_proto::data::ErrorClass;

/// `ncclResult_t` values this plugin returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    Success = 0,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: Code,
    pub msg: String,
}

impl ApiError {
    pub fn new(code: Code, msg: impl Into<String>) -> Self {
        ApiError {
            code,
            msg: msg.into(),
        }
    }
    pub fn arg(msg: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, msg)
    }
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::new(Code::InvalidUsage, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(Code::InternalError, msg)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.msg, self.code)
    }
}

impl From<ErrorClass> for Code {
    fn from(c: ErrorClass) -> Code {
        match c {
            ErrorClass::Argument => Code::InvalidArgument,
            ErrorClass::Usage => Code::InvalidUsage,
            ErrorClass::Remote => Code::RemoteError,
            ErrorClass::System => Code::SystemError,
        }
    }
}

impl From<ConnError> for ApiError {
    fn from(e: ConnError) -> Self {
        ApiError::new(e.class().into(), e.to_string())
    }
}

impl From<ha_proto::data::ProtoError> for ApiError {
    fn from(e: ha_proto::data::ProtoError) -> Self {
        ConnError::from(e).into()
    }
}

impl From<crate::fabric::FabricError> for ApiError {
    fn from(e: crate::fabric::FabricError) -> Self {
        ConnError::from(e).into()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
