//! Errors of connection drivers, with the class the API maps to an `ncclResult_t`.

use crate::fabric::FabricError;
use ha_proto::data::{ErrorClass, ProtoError};
use ha_proto::handshake::HandshakeError;
use ha_proto::wire::WireError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    #[error("handshake with {peer}: {source}")]
    Handshake {
        peer: String,
        #[source]
        source: HandshakeError,
    },
    #[error("bad connect handle: {0}")]
    Handle(#[source] WireError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "handshake with {0} did not finish within HA_NCCL_HANDSHAKE_TIMEOUT_MS (the peer did \
         not answer; its log says why, for instance that it ran out of file descriptors)"
    )]
    Timeout(String),
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// An I/O error in `context`; one of running out of descriptors also names the open-file
    /// limit and how to raise it.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        let mut context = context.into();
        if crate::fabric::fd_limit::is_exhausted(&source) {
            context = format!("{context} ({})", crate::fabric::fd_limit::exhausted_note());
        }
        Error::Io { context, source }
    }

    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Proto(e) => e.class(),
            Error::Fabric(FabricError::InvalidArgument(_)) => ErrorClass::Argument,
            Error::Fabric(FabricError::BadPeerAddress(_)) => ErrorClass::Remote,
            Error::Fabric(_) => ErrorClass::System,
            Error::Handshake { .. } | Error::Timeout(_) => ErrorClass::Remote,
            Error::Handle(_) => ErrorClass::Argument,
            // Out of descriptors is this process's trouble, not the peer's.
            Error::Io { source, .. } if crate::fabric::fd_limit::is_exhausted(source) => {
                ErrorClass::System
            }
            Error::Io { .. } => ErrorClass::Remote,
            Error::Usage(_) => ErrorClass::Usage,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
