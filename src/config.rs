//! Configuration: one declarative table of every `HA_NCCL_*` knob.
