//! The message schedule both sides of a stream derive from the run's seed: a sequence of
//! operations, each one `irecv` at the receiver (a single message, or a multi-receive group of
//! 2..=`multi_max` tagged messages) and one `isend` per message at the sender, posted in a
//! shuffled tag order for groups. Messages carry a global sequence number (`seq`, counted
//! over all operations) that keys their content (see [`super::message`]).
//!
//! Sizes are mixed: a few empty and tiny messages, the rest log-uniform up to `max_size`
//! (which is itself drawn now and then). A group's parts share `max_size` between them, so an
//! operation never holds more than `max_size` bytes of payload.

/// Share of operations that are multi-receive groups: one in `GROUP_EVERY`.
const GROUP_EVERY: u64 = 6;
/// First tag of a group's parts (part `j` has `GROUP_TAG + 7 * j`).
const GROUP_TAG: i32 = 0x100;
/// Tags of single messages cycle through `SINGLE_TAG..SINGLE_TAG + 61`.
const SINGLE_TAG: i32 = 0x4000;
/// Sequence numbers travel as `u32` in message headers.
pub const MAX_SEQ: u64 = u32::MAX as u64;

/// One message of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub seq: u64,
    pub size: usize,
    pub tag: i32,
}

/// One receive operation and the sends that match it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Position in the schedule (0, 1, 2, ...).
    pub index: u64,
    /// In receive order; part `j` has sequence number `parts[0].seq + j`.
    pub parts: Vec<Part>,
    /// The order in which the sender posts the parts (indices into `parts`).
    pub send_order: Vec<usize>,
}

impl Op {
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.size).sum()
    }
}

/// splitmix64: small, fast, and the same on both sides.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x6A09_E667_F3BC_C908)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// A message size in `0..=max`: 3 % empty, 7 % 1..=16 bytes, 1 % exactly `max`, the rest
/// log-uniform in 17..=max.
pub fn draw_size(rng: &mut Rng, max: usize) -> usize {
    let max64 = max as u64;
    let r = rng.below(100);
    if r < 3 || max == 0 {
        return 0;
    }
    if r < 10 || max64 <= 16 {
        return rng.between(1, max64.min(16)) as usize;
    }
    if r < 11 {
        return max;
    }
    let (lo, hi) = (17u64, max64);
    let (le, he) = (lo.ilog2(), hi.ilog2());
    let e = rng.between(u64::from(le), u64::from(he)) as u32;
    let a = lo.max(1u64 << e);
    let b = hi.min((1u64 << (e + 1)) - 1);
    rng.between(a, b) as usize
}

/// The schedule: an endless (or `total`-message) sequence of operations.
#[derive(Debug, Clone)]
pub struct Schedule {
    rng: Rng,
    max_size: usize,
    multi_max: usize,
    /// Messages left when the stream has a fixed length.
    remaining: Option<u64>,
    next_index: u64,
    next_seq: u64,
}

impl Schedule {
    /// `total`: the number of messages (`None`: until stopped). `multi_max` <= 1 means no
    /// groups.
    pub fn new(seed: u64, max_size: usize, multi_max: usize, total: Option<u64>) -> Self {
        Schedule {
            rng: Rng::new(seed),
            max_size,
            multi_max,
            remaining: total,
            next_index: 0,
            next_seq: 0,
        }
    }

    /// Operations handed out so far.
    pub fn ops(&self) -> u64 {
        self.next_index
    }

    /// Messages handed out so far (= the next sequence number).
    pub fn messages(&self) -> u64 {
        self.next_seq
    }

    /// The next operation, or `None` at the end of a fixed-length stream (or after `MAX_SEQ`
    /// messages).
    pub fn next_op(&mut self) -> Option<Op> {
        let left = self
            .remaining
            .unwrap_or(u64::MAX)
            .min(MAX_SEQ - self.next_seq);
        if left == 0 {
            return None;
        }
        let rng = &mut self.rng;
        let group = self.multi_max >= 2 && left >= 2 && rng.below(GROUP_EVERY) == 0;
        let index = self.next_index;
        let (parts, send_order) = if group {
            let n = (rng.between(2, self.multi_max as u64)).min(left) as usize;
            let cap = self.max_size / n;
            let parts: Vec<Part> = (0..n)
                .map(|j| Part {
                    seq: self.next_seq + j as u64,
                    size: draw_size(rng, cap),
                    tag: GROUP_TAG + 7 * j as i32,
                })
                .collect();
            let order = shuffled(n, rng);
            (parts, order)
        } else {
            let part = Part {
                seq: self.next_seq,
                size: draw_size(rng, self.max_size),
                tag: SINGLE_TAG + (index % 61) as i32,
            };
            (vec![part], vec![0])
        };
        let n = parts.len() as u64;
        self.next_seq += n;
        self.next_index += 1;
        if let Some(r) = &mut self.remaining {
            *r -= n;
        }
        Some(Op {
            index,
            parts,
            send_order,
        })
    }
}

/// A permutation of `0..n` (Fisher-Yates), never the identity when `n` >= 2 (a group is
/// always sent out of its receive order).
fn shuffled(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    if n >= 2 && v.iter().enumerate().all(|(i, &x)| i == x) {
        v.swap(0, n - 1);
    }
    v
}

/// Byte offsets of the parts of an operation laid out one after another in a slot, each
/// followed by `gap` bytes and aligned to 8.
pub fn layout(parts: &[Part], gap: usize) -> Vec<usize> {
    let mut off = 0;
    parts
        .iter()
        .map(|p| {
            let at = off;
            off = (off + p.size + gap).next_multiple_of(8);
            at
        })
        .collect()
}

/// Slot size that holds any operation of the schedule with the given per-part `gap`.
pub fn slot_len(max_size: usize, multi_max: usize, gap: usize) -> usize {
    (max_size + multi_max.max(1) * (gap + 8)).max(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(s: &mut Schedule, n: usize) -> Vec<Op> {
        (0..n).map_while(|_| s.next_op()).collect()
    }

    #[test]
    fn both_sides_see_the_same_schedule() {
        let a = take(&mut Schedule::new(7, 1 << 20, 8, None), 500);
        let b = take(&mut Schedule::new(7, 1 << 20, 8, None), 500);
        assert_eq!(a, b);
        let c = take(&mut Schedule::new(8, 1 << 20, 8, None), 500);
        assert_ne!(a, c);
    }

    #[test]
    fn sequence_numbers_are_consecutive_and_sizes_bounded() {
        let max = 4 << 20;
        let mut s = Schedule::new(1, max, 8, None);
        let ops = take(&mut s, 3000);
        let mut next = 0;
        let (mut groups, mut zeros, mut tiny, mut at_max) = (0, 0, 0, 0);
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(op.index, i as u64);
            let n = op.parts.len();
            assert!((1..=8).contains(&n));
            for p in &op.parts {
                assert_eq!(p.seq, next);
                next += 1;
                assert!(p.size <= max / n);
                zeros += usize::from(p.size == 0);
                tiny += usize::from((1..8).contains(&p.size));
                at_max += usize::from(p.size == max);
            }
            assert!(op.bytes() <= max);
            let mut order = op.send_order.clone();
            order.sort_unstable();
            assert_eq!(order, (0..n).collect::<Vec<_>>());
            if n > 1 {
                groups += 1;
                assert_ne!(op.send_order, (0..n).collect::<Vec<_>>());
                let mut tags: Vec<i32> = op.parts.iter().map(|p| p.tag).collect();
                tags.sort_unstable();
                tags.dedup();
                assert_eq!(tags.len(), n, "distinct tags in a group");
            }
        }
        assert_eq!(s.messages(), next);
        assert_eq!(s.ops(), 3000);
        // The mix: groups, empty, tiny and max-size messages all occur.
        assert!((300..700).contains(&groups), "groups {groups}");
        assert!(
            zeros > 30 && tiny > 30 && at_max > 5,
            "{zeros} {tiny} {at_max}"
        );
    }

    #[test]
    fn fixed_length_ends_at_exactly_total_messages() {
        for total in [1, 2, 3, 17, 1000] {
            let mut s = Schedule::new(total, 64 << 10, 8, Some(total));
            let ops = take(&mut s, usize::MAX >> 1);
            let msgs: usize = ops.iter().map(|o| o.parts.len()).sum();
            assert_eq!(msgs as u64, total);
            assert_eq!(s.next_op(), None);
        }
    }

    #[test]
    fn no_groups_when_multi_max_is_one() {
        let ops = take(&mut Schedule::new(3, 4096, 1, None), 500);
        assert!(ops.iter().all(|o| o.parts.len() == 1));
    }

    #[test]
    fn sizes_cover_the_range() {
        let mut rng = Rng::new(5);
        let sizes: Vec<usize> = (0..20_000).map(|_| draw_size(&mut rng, 4 << 20)).collect();
        assert!(sizes.iter().all(|&s| s <= 4 << 20));
        for (lo, hi) in [
            (17, 1 << 10),
            (1 << 10, 1 << 16),
            (1 << 16, 1 << 20),
            (1 << 20, 4 << 20),
        ] {
            assert!(
                sizes.iter().any(|&s| s >= lo && s < hi),
                "no size in {lo}..{hi}"
            );
        }
        let mut rng = Rng::new(5);
        assert!((0..100).all(|_| draw_size(&mut rng, 0) == 0));
        assert!((0..100).all(|_| draw_size(&mut rng, 5) <= 5));
    }

    #[test]
    fn layout_fits_the_slot() {
        let mut s = Schedule::new(11, 1 << 16, 8, None);
        for op in take(&mut s, 2000) {
            let offs = layout(&op.parts, 64);
            for (w, (p, &o)) in op.parts.iter().zip(&offs).enumerate() {
                assert_eq!(o % 8, 0);
                if let Some(&next) = offs.get(w + 1) {
                    assert!(o + p.size + 64 <= next);
                }
                assert!(o + p.size + 64 <= slot_len(1 << 16, 8, 64));
            }
        }
    }
}
