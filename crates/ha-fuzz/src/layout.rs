//! Target `data_layout`: the words a peer RDMA-writes into this side's memory (CTS FIFO
//! slots, completion records, control-mailbox messages) and the immediates and work-request
//! ids, read back from arbitrary contents.

use super::input::Input;
use ha_proto::data::layout::{
    ctrl_imm, ctrl_slot, cts_span, cts_word, data_imm, decode_wr_id, eager_imm, encode_cts,
    encode_record, fast_imm, is_eager, is_fast, read_cts, read_record, wr_id, CtrlMsg, SharedWords,
    CTRL_WORDS, CTS_BANKS, CTS_ENTRY_WORDS, CTS_FIFO_WORDS, CTS_SLOT_WORDS, FIFO_DEPTH,
    MAILBOX_SLOTS, MAX_RECVS, RECORD_WORDS, SEND_REGION_WORDS,
};

/// `[shift][imm u32][wr_id u64][words...]`: the words are stored from word `shift * 8`
/// on (wrapping) into a region the size of the sender's (CTS FIFO + mailbox), which is then
/// read as CTS slots, as completion records and as mailbox messages.
pub fn data_layout(data: &[u8]) {
    let mut inp = Input::new(data);
    let shift = inp.u8() as usize * 16;
    let imm = inp.u32();
    let id = inp.u64();
    let region = SharedWords::new(SEND_REGION_WORDS);
    let mut i = 0;
    while !inp.is_empty() && i < SEND_REGION_WORDS {
        region.store((shift + i) % SEND_REGION_WORDS, inp.u64());
        i += 1;
    }

    for bank in 0..CTS_BANKS {
        for slot in 0..FIFO_DEPTH {
            let base = cts_word(bank as u32, slot);
            let seq = region.load(base + CTS_SLOT_WORDS - 1);
            let stored = (region.load(base + CTS_SLOT_WORDS - 2) >> 32) as u32;
            let epoch = if stored as usize % CTS_BANKS == bank {
                stored
            } else {
                bank as u32
            };
            assert_eq!(
                read_cts(&region, epoch, slot, seq.wrapping_add(1)),
                Ok(None),
                "a slot without the sequence number was read as posted"
            );
            if stored != epoch {
                assert_eq!(
                    read_cts(&region, epoch, slot, seq),
                    Ok(None),
                    "a slot of another epoch was read as posted"
                );
                continue;
            }
            match read_cts(&region, epoch, slot, seq) {
                Ok(Some(entries)) => {
                    assert!((1..=MAX_RECVS).contains(&entries.len()));
                    let words = encode_cts(&entries, seq, epoch);
                    for (k, w) in words.iter().enumerate() {
                        let entry_word = k < CTS_SLOT_WORDS - 2 && k % CTS_ENTRY_WORDS != 3;
                        let used = cts_span(entries.len()).contains(&k);
                        if k >= CTS_SLOT_WORDS - 2 || (entry_word && used) {
                            assert_eq!(*w, region.load(base + k), "CTS word {k} not lossless");
                        }
                    }
                }
                Ok(None) => unreachable!("the slot holds its own sequence number and epoch"),
                Err(n) => assert!(n == 0 || n > MAX_RECVS as u64),
            }
        }
    }

    for slot in 0..SEND_REGION_WORDS / RECORD_WORDS {
        let r = read_record(&region, slot);
        let words = encode_record(&r);
        for (k, w) in words.iter().enumerate() {
            assert_eq!(
                *w,
                region.load(slot * RECORD_WORDS + k),
                "record not lossless"
            );
        }
    }

    let mailbox = CTS_FIFO_WORDS;
    for slot in 0..MAILBOX_SLOTS {
        let b = mailbox + slot * CTRL_WORDS;
        match CtrlMsg::read(&region, mailbox, slot) {
            Some(m) => {
                assert!(m.endpoint.len() <= 64);
                assert_eq!(m.endpoint.len() as u64, region.load(b + 3));
                let n = region.load(b + CTRL_WORDS - 1);
                let words = m.encode(n);
                let copy = SharedWords::new(CTRL_WORDS);
                for (k, w) in words.iter().enumerate() {
                    copy.store(k, *w);
                }
                assert_eq!(
                    CtrlMsg::read(&copy, 0, 0),
                    Some(m),
                    "control message not stable"
                );
            }
            None => {
                let kind = region.load(b) as u32;
                assert!(!(1..=4).contains(&kind) || region.load(b + 3) > 64);
            }
        }
    }

    match ctrl_slot(imm) {
        Some(s) => {
            assert!(s < MAILBOX_SLOTS);
            // Bits 27..=30 are unused (ignored on receipt, zero when sent).
            assert_eq!(ctrl_imm(s, (imm & 0x00ff_ffff) as u64), imm & !(0xf << 27));
        }
        // Both the fast and the eager bit: no data immediate has them (the receiver finds no
        // pending sequence number for it and counts a duplicate).
        None if imm & (3 << 29) == 3 << 29 => assert!(!is_fast(imm) && !is_eager(imm)),
        None => {
            let seq = u64::from(imm & 0x1fff_ffff);
            let again = if is_fast(imm) {
                fast_imm(seq)
            } else if is_eager(imm) {
                eager_imm(seq)
            } else {
                data_imm(seq)
            };
            assert_eq!(again, imm);
        }
    }
    let (kind, seq, index) = decode_wr_id(id);
    if let Some(k) = kind {
        assert_eq!(wr_id(k, seq, index), id, "work-request id not lossless");
    }
}

pub(super) fn seeds() -> Vec<Vec<u8>> {
    let mut v = vec![0u8];
    v.extend_from_slice(&ctrl_imm(3, 77).to_le_bytes());
    v.extend_from_slice(&wr_id(ha_proto::data::layout::WrKind::Record, 5, 1).to_le_bytes());
    let cts = encode_cts(
        &[ha_proto::data::layout::CtsEntry {
            addr: 0x1000,
            size: 64,
            rkey: 7,
            tag: -1,
        }],
        1,
        0,
    );
    for w in cts {
        v.extend_from_slice(&w.to_le_bytes());
    }
    let mut ctrl = vec![(CTS_FIFO_WORDS / 16) as u8];
    ctrl.extend_from_slice(&[0; 12]);
    let m = CtrlMsg {
        kind: ha_proto::data::layout::CtrlKind::Rearm,
        epoch: 2,
        a: 1,
        b: 0,
        endpoint: vec![0xab; 30],
    };
    for w in m.encode(9) {
        ctrl.extend_from_slice(&w.to_le_bytes());
    }
    vec![v, ctrl]
}
