//! Copies out of memory the plugin owns into host memory NCCL registered: the eager ring's
//! payloads into receive buffers (`sock`, whose memory is always the host's).

use ha_proto::data::layout::SharedWords;

/// Copy `len` bytes from byte `from` of `region` to address `to`, which must lie with its
/// `len` bytes inside the live host registration `[base, base + base_len)` (the receive's
/// buffer, checked against its registration at `irecv`). Both ranges are checked here; a
/// range outside is refused (`false`) and nothing is copied.
pub fn copy_to_registered(
    region: &SharedWords,
    from: usize,
    len: usize,
    to: usize,
    (base, base_len): (usize, usize),
) -> bool {
    let src_ok = from
        .checked_add(len)
        .is_some_and(|end| end <= region.len_bytes());
    let dst_ok = to >= base
        && to
            .checked_add(len)
            .zip(base.checked_add(base_len))
            .is_some_and(|(end, limit)| end <= limit);
    if !src_ok || !dst_ok {
        return false;
    }
    // SAFETY: the source lies inside `region` (checked above), memory this process owns and
    // keeps alive for the borrow; the writer of those bytes (the fabric placing a remote
    // write) finished before the completion that led here was polled. The destination lies
    // inside a host registration the caller holds (`MrHandle`, alive while the receive is),
    // checked above; NCCL does not touch a receive buffer before the receive completes, and
    // the two never overlap (the region is the plugin's own allocation).
    unsafe {
        std::ptr::copy_nonoverlapping((region.addr() + from) as *const u8, to as *mut u8, len);
    }
    true
}
