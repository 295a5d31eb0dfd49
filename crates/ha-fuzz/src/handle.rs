//! Target `connect_handle`: the ≤128-byte handle NCCL ships from `listen` to `connect`.

use ha_proto::handle::{scratch, set_scratch, ConnectHandle, HANDLE_SIZE};

/// Decode arbitrary bytes as a handle; whatever decodes must re-encode to a handle that
/// decodes to the same value, and the scratch word must not disturb it.
pub fn connect_handle(data: &[u8]) {
    let Ok(h) = ConnectHandle::decode(data) else {
        return;
    };
    assert_ne!(h.addr.port(), 0, "port 0 accepted");
    let mut buf = [0u8; HANDLE_SIZE];
    h.encode(&mut buf);
    assert_eq!(
        ConnectHandle::decode(&buf),
        Ok(h),
        "re-encoded handle differs"
    );
    let v = data.len() as u64 ^ h.token;
    set_scratch(&mut buf, v);
    assert_eq!(scratch(&buf), v);
    assert_eq!(
        ConnectHandle::decode(&buf),
        Ok(h),
        "scratch disturbed the handle"
    );
}

pub(super) fn seeds() -> Vec<Vec<u8>> {
    ["127.0.0.1:45678", "[::1]:9", "10.1.2.3:1"]
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut b = [0u8; HANDLE_SIZE];
            ConnectHandle {
                flags: i as u16,
                token: 0x0123_4567_89ab_cdef ^ i as u64,
                addr: a.parse().expect("address"),
            }
            .encode(&mut b);
            b.to_vec()
        })
        .collect()
}
