//! Out-of-band TCP used by the connection handshake: non-blocking listener and streams.
