//! `verbs` fabric: real InfiniBand / RoCE through ibverbs-sys.
