//! Inputs that broke a target once, kept as tests next to what they exercise.

use super::send_side;
use ha_proto::data::layout::{encode_cts, CtsEntry, SharedWords, SEND_REGION_WORDS};
use ha_proto::data::send::{SendArgs, SendSide};
use ha_proto::data::ProtoError;
use ha_proto::rc::WcStatus;

/// `send_side`: a switch whose new path cannot register a replayed send returned an error
/// but left the sender unfailed, so the driver (which only stops on the error, expecting
/// the machine to say why) kept the connection half-switched.
#[test]
fn switch_with_unregistrable_send_fails_the_connection() {
    // CTS for seq 1 (one 64-byte entry, tag 0); isend 32 bytes tag 0; switch with
    // delivered 0 and the key of entry 0 refused.
    send_side(&[0, 0, 0, 4, 5, 0, 2, 2, 0, 5, 1, 1]);

    let fifo = SharedWords::new(SEND_REGION_WORDS);
    let cts = encode_cts(
        &[CtsEntry {
            addr: 0x1000,
            size: 64,
            rkey: 5,
            tag: 0,
        }],
        1,
        0,
    );
    fifo.land_cts(ha_proto::data::layout::cts_word(0, 1), &cts);
    // The receiver's re-post of the open receive for the switch (epoch 1).
    let reposted = encode_cts(
        &[CtsEntry {
            addr: 0x1000,
            size: 64,
            rkey: 6,
            tag: 0,
        }],
        1,
        1,
    );
    fifo.land_cts(ha_proto::data::layout::cts_word(1, 1), &reposted);
    let mut m = SendSide::new();
    let a = SendArgs {
        addr: 0x7000,
        size: 32,
        tag: 0,
        lkey: 9,
    };
    let (id, batch) = m.isend(&fifo, a).unwrap().unwrap();
    assert!(batch.is_some());
    let e = m.apply_switch(&fifo, 0, |_, _, _, _| None).unwrap_err();
    let want = ProtoError::Failed {
        status: WcStatus::LocProtErr,
        what: "registering a replayed send on the new path",
    };
    assert_eq!(e, want);
    assert_eq!(m.failure(), Some(&want));
    assert_eq!(m.test(id), Err(want.clone()));
    assert_eq!(m.isend(&fifo, a), Err(want));
}
