//! Transport: handshake and data protocol as sans-IO state machines, and their drivers.
