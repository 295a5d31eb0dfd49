//! Fuzz targets: plain functions over `&[u8]` that feed untrusted bytes to every decoder a
//! peer can reach (connect handle, OOB handshake, data-protocol words, the `sock` fabric's
//! frames) and assert the decoders' contracts. A target panics only when a contract is
//! broken (a decoder panicked, or accepted something it must refuse); garbage must come back
//! as a typed error. The `fuzz/` cargo-fuzz crate calls them under libFuzzer, and
//! `tests/fuzz_targets.rs` runs them over the seed corpus and pseudo-random inputs on stable.

mod data;
mod handle;
mod handshake;
mod input;
mod layout;
#[cfg(test)]
mod regressions;
mod sock;

pub use data::{recv_side, send_side};
pub use handle::connect_handle;
pub use handshake::{handshake_acceptor, handshake_connector};
pub use input::Input;
pub use layout::data_layout;
pub use sock::{sock_header, sock_stream};

/// A fuzz target.
pub type Target = fn(&[u8]);

/// Every target by name (the names of the `fuzz/fuzz_targets/*.rs` binaries).
pub const TARGETS: &[(&str, Target)] = &[
    ("connect_handle", connect_handle),
    ("handshake_acceptor", handshake_acceptor),
    ("handshake_connector", handshake_connector),
    ("data_layout", data_layout),
    ("recv_side", recv_side),
    ("send_side", send_side),
    ("sock_header", sock_header),
    ("sock_stream", sock_stream),
];

/// Valid (or nearly valid) inputs for `target`, to start a corpus from.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "connect_handle" => handle::seeds(),
        "handshake_acceptor" => handshake::acceptor_seeds(),
        "handshake_connector" => handshake::connector_seeds(),
        "data_layout" => layout::seeds(),
        "recv_side" => data::recv_seeds(),
        "send_side" => data::send_seeds(),
        "sock_header" => sock::header_seeds(),
        "sock_stream" => sock::stream_seeds(),
        _ => Vec::new(),
    }
}
