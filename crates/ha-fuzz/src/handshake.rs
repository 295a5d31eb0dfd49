//! Targets `handshake_acceptor` and `handshake_connector`: the sans-IO OOB handshake
//! machines fed arbitrary bytes in arbitrary chunks, optionally after a valid first message
//! so the later states are reached too.

use super::input::Input;
use ha_proto::handshake::{
    decode_hello, encode_hello, Acceptor, Connector, HandshakeError, Params, PathParams, MAX_FRAME,
    MAX_PATHS,
};

const TOKEN: u64 = 0x5eed_70ce_0000_0001;

fn sample(tag: u8, paths: usize) -> Params {
    Params {
        flags: tag as u16,
        paths: (0..paths)
            .map(|i| PathParams {
                endpoint: vec![tag ^ i as u8; 20 + i],
                rkey: 0x100 + i as u32,
                dev: i as u16,
            })
            .collect(),
        addr: 0x7f00_0000_1000 + tag as u64,
        len: 4096,
    }
}

/// Checks that hold for any parameters a machine hands out.
fn check_params(p: &Params) {
    assert!(
        (1..=MAX_PATHS).contains(&p.paths.len()),
        "{} paths accepted",
        p.paths.len()
    );
    // Canonical encoding: what was accepted re-encodes and decodes to the same value.
    let framed = encode_hello(TOKEN, p);
    assert!(
        framed.len() <= 4 + MAX_FRAME,
        "accepted params do not fit a frame"
    );
    assert_eq!(decode_hello(&framed[5..]), Ok((TOKEN, p.clone())));
}

/// The Accept frame an acceptor sends for `local` (built through the machine itself).
fn accept_frame(local: &Params) -> Vec<u8> {
    let mut a = Acceptor::new(TOKEN);
    a.receive(&encode_hello(TOKEN, &sample(9, 1)))
        .expect("valid hello")
        .expect("params");
    a.local_accept(local);
    a.transmit().to_vec()
}

/// Chunk size from one byte: 0 → everything at once.
fn chunk(b: u8) -> usize {
    if b == 0 {
        usize::MAX
    } else {
        b as usize
    }
}

/// `[mode][chunk][bytes...]`: mode bit 0 prepends a valid Hello carrying our token, bit 1
/// answers any Hello with an Accept, bit 2 uses a wrong expected token.
pub fn handshake_acceptor(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let step = chunk(inp.u8());
    let rest = inp.rest();
    if let Ok((token, p)) = decode_hello(rest) {
        // A bare body that decodes is canonical: it re-encodes to the same bytes.
        assert_eq!(
            &encode_hello(token, &p)[5..],
            rest,
            "non-canonical Hello body"
        );
        check_params(&p);
    }
    let mut stream = Vec::new();
    if mode & 1 != 0 {
        stream.extend_from_slice(&encode_hello(TOKEN, &sample(1, 2)));
    }
    stream.extend_from_slice(rest);
    let expected = if mode & 4 != 0 { !TOKEN } else { TOKEN };
    let mut a = Acceptor::new(expected);
    let mut hellos = 0;
    let mut feed = |a: &mut Acceptor, bytes: &[u8]| -> Result<(), HandshakeError> {
        if let Some(p) = a.receive(bytes)? {
            hellos += 1;
            assert_eq!(hellos, 1, "a second Hello was accepted");
            check_params(&p);
            if mode & 2 != 0 {
                a.local_accept(&sample(2, 2));
                let n = a.transmit().len();
                assert!(n > 5, "no Accept queued");
                a.advance_tx(n);
            }
        }
        Ok(())
    };
    let mut result = Ok(());
    for part in stream.chunks(step.min(stream.len().max(1))) {
        result = feed(&mut a, part);
        if result.is_err() {
            break;
        }
    }
    // One frame per call: drain what is buffered.
    for _ in 0..8 {
        if result.is_err() {
            break;
        }
        result = feed(&mut a, &[]);
    }
    if mode & 5 == 5 {
        // The first frame is a Hello with a token other than the expected one.
        assert_eq!(hellos, 0, "Hello with a wrong token accepted");
        assert_eq!(result, Err(HandshakeError::BadToken));
    }
    if a.is_done() {
        assert_eq!(hellos, 1, "done without a Hello");
        assert!(mode & 2 != 0, "done without answering");
    }
    if let Err(e) = result {
        // Typed and printable.
        assert!(!e.to_string().is_empty());
    }
}

/// `[mode][chunk][bytes...]`: mode bit 0 prepends a valid Accept.
pub fn handshake_connector(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let step = chunk(inp.u8());
    let mut stream = Vec::new();
    if mode & 1 != 0 {
        stream.extend_from_slice(&accept_frame(&sample(3, 2)));
    }
    stream.extend_from_slice(inp.rest());
    let mut c = Connector::new(TOKEN, &sample(4, 2));
    let hello = c.transmit().len();
    c.advance_tx(hello);
    let mut accepts = 0;
    let mut feed = |c: &mut Connector, bytes: &[u8]| -> Result<(), HandshakeError> {
        if let Some(p) = c.receive(bytes)? {
            accepts += 1;
            assert_eq!(accepts, 1, "a second Accept was accepted");
            check_params(&p);
            c.local_ready();
            let n = c.transmit().len();
            assert_eq!(n, 5, "Ready is one empty frame");
            c.advance_tx(n);
            assert!(c.is_done());
        }
        Ok(())
    };
    let mut result = Ok(());
    for part in stream.chunks(step.min(stream.len().max(1))) {
        result = feed(&mut c, part);
        if result.is_err() {
            break;
        }
    }
    for _ in 0..8 {
        if result.is_err() {
            break;
        }
        result = feed(&mut c, &[]);
    }
    if c.is_done() {
        assert_eq!(accepts, 1, "done without an Accept");
    }
}

pub(super) fn acceptor_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (mode, step) in [(0u8, 0u8), (2, 1), (2, 7), (6, 0)] {
        let mut v = vec![mode, step];
        v.extend_from_slice(&encode_hello(TOKEN, &sample(5, 2)));
        v.extend_from_slice(&[1, 0, 0, 0, 3]); // Ready
        out.push(v);
    }
    // A bare Hello body (exercises the canonical-encoding check).
    let mut v = vec![0u8, 0];
    v.extend_from_slice(&encode_hello(TOKEN, &sample(6, 1))[5..]);
    out.push(v);
    // Hello already given; then junk.
    out.push(vec![3, 0, 1, 0, 0, 0, 3]);
    out
}

pub(super) fn connector_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for step in [0u8, 1, 5] {
        let mut v = vec![0u8, step];
        v.extend_from_slice(&accept_frame(&sample(7, 2)));
        out.push(v);
    }
    out.push(vec![1, 0, 1, 0, 0, 0, 2]);
    out
}
