//! What the one-operation-per-message protocol relies on, on real verbs: staged writes go
//! inline (no local key read), and a WRITE_WITH_IMM's receive completion reports the whole
//! length of the write.

use crate::rig::*;
use ha_core::fabric::{Access, SendOp, SendWr, Sge, WcStatus};

/// The plugin's own staged writes (clear-to-sends, completion records, control messages) go
/// inline: the payload is copied at post time, so the device never reads it through the
/// local key. Proven with a local key that does not exist: inline, the write lands and
/// completes; not inline, the same request fails with a local error.
#[test]
fn staged_writes_go_inline_and_need_no_local_key() {
    let rig = rig_or_skip!("staged_writes_go_inline_and_need_no_local_key");
    let f = open(&data_cfg());
    let (x, y) = connect(&f, dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    // A clear-to-send slot's size (the largest staged write).
    let src = pattern(272, 9);
    let mut dst = vec![0u8; 272];
    let dmr = y.reg(&mut dst, Access::REMOTE_WRITE);
    y.qp.post_recv(500).unwrap();
    let bogus = SendWr {
        wr_id: 1,
        op: SendOp::WriteWithImm(0x5eed),
        local: Sge {
            addr: src.as_ptr() as usize,
            len: src.len(),
            lkey: 0x00de_adbe,
        },
        remote_addr: dst.as_ptr() as u64,
        rkey: dmr.keys().rkey,
        signaled: true,
        inline: true,
    };
    let before = ha_core::fabric::verbs::inline_sends();
    x.qp.post_send(&[bogus]).unwrap();
    assert_eq!(ha_core::fabric::verbs::inline_sends(), before + 1);
    let s = x.wait(1, SHORT);
    assert_eq!((s[0].wr_id, s[0].status), (1, WcStatus::Success), "{s:?}");
    let r = y.wait(1, SHORT);
    assert_eq!((r[0].wr_id, r[0].imm), (500, Some(0x5eed)));
    assert!(dst == src, "the inline payload landed");
    // The same request not inline: the device reads through the key, which does not exist.
    y.qp.post_recv(501).unwrap();
    x.qp.post_send(&[SendWr {
        wr_id: 2,
        inline: false,
        ..bogus
    }])
    .unwrap();
    assert_eq!(ha_core::fabric::verbs::inline_sends(), before + 1);
    let s = x.wait(1, SHORT);
    // A local error: rxe says LOC_QP_OP_ERR, other devices LOC_PROT_ERR.
    assert_eq!(s[0].wr_id, 2);
    assert!(
        matches!(s[0].status, WcStatus::LocProtErr | WcStatus::LocQpOpErr),
        "{s:?}"
    );
}

/// The receiver of a message takes its size from the receive completion's byte count (one
/// operation per message): for a WRITE_WITH_IMM of many packets it is the whole write.
#[test]
fn write_with_imm_reports_the_whole_length_of_a_multi_packet_write() {
    let rig = rig_or_skip!("write_with_imm_reports_the_whole_length_of_a_multi_packet_write");
    let f = open(&data_cfg());
    let (x, y) = connect(&f, dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    const LEN: usize = (1 << 20) + 123;
    let mut src = pattern(LEN, 5);
    let mut dst = vec![0u8; LEN];
    let smr = x.reg(&mut src, Access::LOCAL_WRITE);
    let dmr = y.reg(&mut dst, Access::REMOTE_WRITE);
    y.qp.post_recv(700).unwrap();
    let w = write(
        7,
        SendOp::WriteWithImm(0x4000_0007),
        &src,
        &*smr,
        dst.as_ptr() as u64,
        dmr.keys().rkey,
    );
    x.qp.post_send(&[w]).unwrap();
    let r = y.wait(1, SHORT);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].imm, r[0].byte_len as usize),
        (700, WcStatus::Success, Some(0x4000_0007), LEN)
    );
    assert!(dst == src);
    let s = x.wait(1, SHORT);
    assert_eq!((s[0].wr_id, s[0].status), (7, WcStatus::Success));
}
