//! Which payloads may travel inside their work request (verbs `IBV_SEND_INLINE`, where the NIC
//! skips the DMA read of a small payload): host memory the CPU can read at post time, never
//! GPU memory.

use super::*;
use crate::transport::mr::MemKind;
use std::sync::atomic::Ordering;

/// A message in one operation (or an eager one) from a host buffer is marked inline (the
/// fabric decides by size); from GPU memory it never is. Every byte arrives either way.
#[test]
fn host_payloads_are_marked_inline_and_gpu_ones_never() {
    let _l = TEST_LOCK.read();
    for (kind, inline) in [(MemKind::Host, true), (MemKind::Cuda, false)] {
        let mut p = Pair::new(cfg());
        let mut flow = Flow::with_send_kind(&p, 8, 4096, kind);
        flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
        let fast = p.ctl.fast_writes.load(Ordering::Relaxed);
        let eager = p.ctl.eager_writes.load(Ordering::Relaxed);
        let marked =
            p.ctl.fast_inline.load(Ordering::Relaxed) + p.ctl.eager_inline.load(Ordering::Relaxed);
        assert!(
            fast + eager >= 200,
            "{kind:?}: {fast} messages in one operation, {eager} eager"
        );
        assert_eq!(marked, if inline { fast + eager } else { 0 }, "{kind:?}");
    }
}
