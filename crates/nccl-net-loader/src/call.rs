//! The result of one call through a table entry: the plugin's `ncclResult_t`, or the entry
//! was NULL. Shared by the adapters, the property readers and [`crate::Plugin`].

use nccl_net_abi::common::NcclResult;

/// Why a call through an adapter did not return the plugin's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The table entry is NULL.
    Missing(&'static str),
    /// The call failed (the plugin's code, or one synthesised for an argument the version
    /// cannot carry, e.g. a size above `INT_MAX` for v8).
    Failed(NcclResult),
}

pub(crate) type Call<T> = Result<T, CallError>;

/// `Ok` for `ncclSuccess`, else the code.
pub(crate) fn rc(code: NcclResult) -> Call<()> {
    if code == nccl_net_abi::common::NCCL_SUCCESS {
        Ok(())
    } else {
        Err(CallError::Failed(code))
    }
}

/// The entry, or `Missing(name)`.
pub(crate) fn entry<F>(f: Option<F>, name: &'static str) -> Call<F> {
    f.ok_or(CallError::Missing(name))
}

/// The `ncclInvalidArgument` a conversion fails with.
pub(crate) fn invalid() -> CallError {
    CallError::Failed(nccl_net_abi::common::NCCL_INVALID_ARGUMENT)
}
