//! How one side finished one check case (sent to the other side over the control socket).

/// How one side finished one case.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pass,
    /// Wrong data or sizes; the connection is still usable.
    Fail(String),
    /// The plugin returned an error or stopped progressing: later cases cannot run.
    Fatal(String),
}
