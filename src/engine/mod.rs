//! Engine: the background progress thread, per-connection completion inboxes, MR cache.
