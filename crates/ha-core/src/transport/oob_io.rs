//! Moves handshake bytes between a sans-IO handshake machine and a non-blocking OOB stream.

use super::error::{Error, Result};
use crate::fabric::oob::{OobStream, ReadOutcome};

/// Write as much of `tx` as the socket takes now; returns the bytes written.
pub fn write_some(stream: &mut OobStream, tx: &[u8], peer: &str) -> Result<usize> {
    let mut done = 0;
    while done < tx.len() {
        let n = stream
            .try_write(&tx[done..])
            .map_err(|e| Error::io(format!("handshake write to {peer}"), e))?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

/// Read whatever is available now (bounded); an EOF before the handshake ends is an error.
pub fn read_some(stream: &mut OobStream, peer: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < 64 * 1024 {
        match stream
            .try_read(&mut buf)
            .map_err(|e| Error::io(format!("handshake read from {peer}"), e))?
        {
            ReadOutcome::Data(n) => out.extend_from_slice(&buf[..n]),
            ReadOutcome::WouldBlock => break,
            ReadOutcome::Eof => {
                if out.is_empty() {
                    return Err(Error::io(
                        format!("handshake with {peer}"),
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "peer closed the connection",
                        ),
                    ));
                }
                break;
            }
        }
    }
    Ok(out)
}
