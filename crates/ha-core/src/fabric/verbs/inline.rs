//! How much inline data a queue pair asks its device for. Devices differ in what they grant
//! and do not say it in `ibv_query_device`: `ibv_create_qp` fails for a request above the
//! device's limit. The plugin's own staged writes are small (a clear-to-send for one receive
//! is 48 bytes, a control message 128, a completion record 80), so a device that refuses the
//! first request is asked for less, down to none, instead of straight to none.

/// Inline payload sizes asked for, in order, until the device accepts one (the queue pair
/// then reports what it granted, at least that much).
pub const INLINE_LADDER: [u32; 5] = [512, 256, 128, 64, 0];

/// Runs `create(max_inline)` down [`INLINE_LADDER`] until it gives a queue pair; `None` when
/// even no inline data was refused.
pub fn create_with_inline<T>(mut create: impl FnMut(u32) -> Option<T>) -> Option<T> {
    INLINE_LADDER.iter().find_map(|&want| create(want))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `ibv_create_qp` that refuses more inline data than `limit`, recording each ask.
    fn device(limit: u32, asked: &mut Vec<u32>) -> impl FnMut(u32) -> Option<&'static str> + '_ {
        move |want| {
            asked.push(want);
            (want <= limit).then_some("qp")
        }
    }

    #[test]
    fn a_device_gets_the_largest_inline_size_it_accepts() {
        let mut asked = Vec::new();
        assert_eq!(create_with_inline(device(512, &mut asked)), Some("qp"));
        assert_eq!(asked, [512], "one call when the first ask is granted");

        let mut asked = Vec::new();
        assert_eq!(create_with_inline(device(220, &mut asked)), Some("qp"));
        assert_eq!(asked, [512, 256, 128], "granted at the third ask");

        let mut asked = Vec::new();
        assert_eq!(create_with_inline(device(63, &mut asked)), Some("qp"));
        assert_eq!(asked, INLINE_LADDER, "granted only without inline data");
    }

    #[test]
    fn a_device_that_refuses_every_queue_pair_gets_none_after_the_whole_ladder() {
        let mut asked = 0;
        let r: Option<u8> = create_with_inline(|_| {
            asked += 1;
            None
        });
        assert_eq!(r, None);
        assert_eq!(asked, INLINE_LADDER.len());
    }

    #[test]
    fn a_one_receive_clear_to_send_fits_the_smallest_nonzero_ask() {
        use ha_proto::data::layout::cts_span;
        let smallest = INLINE_LADDER.iter().rev().find(|&&w| w > 0).copied();
        assert_eq!(smallest, Some(64));
        assert!(cts_span(1).len() * 8 <= 64);
    }
}
