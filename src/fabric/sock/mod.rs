//! `sock` fabric: RC verbs semantics emulated over TCP rails.
