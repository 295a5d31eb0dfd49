//! Timing analysis of a stream: completion times are nanoseconds since the stream's start
//! (the sender's clock; see [`super::clock`]). Computes the longest gaps between consecutive
//! completions, the longest stall, a throughput timeline, and, for externally recorded events
//! such as a link cut, how long traffic took to come back.

/// A gap between two consecutive completions (or, for a stall that never ended, between the
/// last completion and the end of the stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub from_ns: u64,
    pub to_ns: u64,
}

impl Gap {
    pub fn len_ns(&self) -> u64 {
        self.to_ns.saturating_sub(self.from_ns)
    }
}

/// The `k` longest gaps between consecutive completions of `times` (sorted ascending),
/// longest first; equal lengths in time order.
pub fn longest_gaps(times: &[u64], k: usize) -> Vec<Gap> {
    let mut gaps: Vec<Gap> = times
        .windows(2)
        .map(|w| Gap {
            from_ns: w[0],
            to_ns: w[1],
        })
        .collect();
    gaps.sort_by(|a, b| b.len_ns().cmp(&a.len_ns()).then(a.from_ns.cmp(&b.from_ns)));
    gaps.truncate(k);
    gaps
}

/// The longest stall: the longest gap between completions, or from the last completion to
/// `end_ns` when the stream ended with an error (the stall that ended it).
pub fn max_stall(times: &[u64], failed_at: Option<u64>) -> Option<Gap> {
    let mut best = longest_gaps(times, 1).first().copied();
    if let (Some(end), Some(&last)) = (failed_at, times.last()) {
        let tail = Gap {
            from_ns: last,
            to_ns: end.max(last),
        };
        if best.is_none_or(|b| tail.len_ns() > b.len_ns()) {
            best = Some(tail);
        }
    }
    best
}

/// Messages and bytes completed per `bin_ns` interval, from time 0 to the last completion.
pub fn bins(completions: &[(u64, u64, u64)], bin_ns: u64) -> Vec<(u64, u64)> {
    let bin_ns = bin_ns.max(1);
    let n = completions
        .iter()
        .map(|c| c.0 / bin_ns + 1)
        .max()
        .unwrap_or(0) as usize;
    let mut out = vec![(0u64, 0u64); n];
    for &(t, msgs, bytes) in completions {
        let b = &mut out[(t / bin_ns) as usize];
        b.0 += msgs;
        b.1 += bytes;
    }
    out
}

/// An event recorded by another process (a drill's link cut), in nanoseconds since the
/// stream's start (negative: before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at_ns: i64,
    pub label: String,
}

/// Parses an events file: one event per line, `<CLOCK_MONOTONIC ns> <label>`; blank lines and
/// lines starting with `#` are skipped. `start_ns` is the stream's start on the same clock.
pub fn parse_events(text: &str, start_ns: u64) -> Result<Vec<Event>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (ns, label) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let ns: u64 = ns
            .parse()
            .map_err(|_| format!("events line {}: '{ns}' is not a nanosecond time", i + 1))?;
        let at_ns = i64::try_from(i128::from(ns) - i128::from(start_ns))
            .map_err(|_| format!("events line {}: time out of range", i + 1))?;
        let label = label.trim();
        out.push(Event {
            at_ns,
            label: if label.is_empty() {
                "event".to_string()
            } else {
                label.to_string()
            },
        });
    }
    out.sort_by_key(|e| e.at_ns);
    Ok(out)
}

/// How traffic behaved after one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOutcome {
    pub event: Event,
    /// First completion at or after the event (any time later), relative to the event.
    pub first_after_ns: Option<u64>,
    /// The stall the event caused: the longest gap that ends after it (no later than the next
    /// event or the stream's end) and starts within its trickle window; a gap spanning the
    /// event counts; so does a stall still open at that limit (see [`analyse_events`]).
    pub stall: Option<Gap>,
    /// Whether `stall` ended with a completion.
    pub stall_closed: bool,
    /// The longest gap between completions in the second before the event (normal jitter).
    pub baseline_ns: u64,
    /// When traffic was back, relative to the event: the end of `stall` when it is longer
    /// than `baseline_ns`, else the first completion after the event (the cut caused no
    /// stall beyond the usual); `None` when traffic did not come back before the limit.
    pub back_ns: Option<u64>,
}

/// A stall caused by an event starts within this long after it (data already on its way
/// when a link is cut still completes for a moment first), or within twice the normal jitter
/// if that is longer.
pub const TRICKLE_NS: u64 = 100_000_000;

/// The normal jitter is the longest gap in this long before an event.
pub const BASELINE_NS: u64 = 1_000_000_000;

/// Analyses each event against the sorted completion times; `end_ns` is the stream's end,
/// `failed` whether an error ended it there. An event's stall is the longest gap that ends
/// after it and starts no later than its trickle window (see [`TRICKLE_NS`]); gaps that start
/// later are not its doing. When completions stopped within that window and did not resume
/// before the next event (or before a failing end), the open stall to that point is the
/// event's stall and traffic did not recover.
pub fn analyse_events(
    times: &[u64],
    events: &[Event],
    end_ns: u64,
    failed: bool,
) -> Vec<EventOutcome> {
    events
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            let at = u64::try_from(ev.at_ns.max(0)).unwrap_or(0);
            let limit = events
                .get(i + 1)
                .map_or(end_ns, |n| u64::try_from(n.at_ns.max(0)).unwrap_or(0))
                .max(at);
            let first = times.partition_point(|&t| t < at);
            let first_after_ns = times.get(first).map(|&t| t - at);
            let since = times[..first].partition_point(|&t| t + BASELINE_NS < at);
            let baseline_ns = times[since..first]
                .windows(2)
                .map(|w| w[1] - w[0])
                .max()
                .unwrap_or(0);
            let window_end = at + TRICKLE_NS.max(2 * baseline_ns);
            let mut stall: Option<Gap> = None;
            let mut j = first;
            while j < times.len() && times[j] <= limit {
                let g = Gap {
                    from_ns: if j == 0 { at } else { times[j - 1] },
                    to_ns: times[j],
                };
                if g.from_ns <= window_end && stall.is_none_or(|s| g.len_ns() > s.len_ns()) {
                    stall = Some(g);
                }
                j += 1;
            }
            // Completions that stopped inside the window and never resumed before the limit.
            let open = Gap {
                from_ns: if j == 0 { at } else { times[j - 1] },
                to_ns: limit,
            };
            let tail_counts = failed || i + 1 < events.len();
            let longest = stall.map_or(0, |s| s.len_ns()).max(baseline_ns);
            let closed = !(j == first
                || (tail_counts && open.from_ns <= window_end && open.len_ns() > longest));
            if !closed {
                stall = Some(open);
            }
            let back_ns = match stall {
                _ if !closed => None,
                Some(g) if g.len_ns() > baseline_ns => Some(g.to_ns.saturating_sub(at)),
                _ => first_after_ns,
            };
            EventOutcome {
                event: ev.clone(),
                first_after_ns,
                stall,
                stall_closed: closed,
                baseline_ns,
                back_ns,
            }
        })
        .collect()
}

/// Nanoseconds to milliseconds, for reports.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Signed nanoseconds to milliseconds.
pub fn ms_signed(ns: i64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn times(ms_list: &[u64]) -> Vec<u64> {
        ms_list.iter().map(|m| m * MS).collect()
    }

    #[test]
    fn gaps_longest_first() {
        let t = times(&[0, 1, 5, 6, 26, 27, 37]);
        let g = longest_gaps(&t, 3);
        assert_eq!(
            g.iter()
                .map(|g| (g.from_ns / MS, g.to_ns / MS))
                .collect::<Vec<_>>(),
            [(6, 26), (27, 37), (1, 5)]
        );
        assert_eq!(longest_gaps(&t, 100).len(), 6);
        assert!(longest_gaps(&[5], 3).is_empty());
        assert!(longest_gaps(&[], 3).is_empty());
        // Ties: earlier first.
        let g = longest_gaps(&times(&[0, 2, 4, 6]), 3);
        assert_eq!(
            g.iter().map(|g| g.from_ns / MS).collect::<Vec<_>>(),
            [0, 2, 4]
        );
    }

    #[test]
    fn stall_includes_the_tail_of_a_failed_stream() {
        let t = times(&[0, 1, 11, 12]);
        assert_eq!(max_stall(&t, None).unwrap().len_ns(), 10 * MS);
        let s = max_stall(&t, Some(500 * MS)).unwrap();
        assert_eq!((s.from_ns, s.to_ns), (12 * MS, 500 * MS));
        // A short tail does not replace a longer gap.
        assert_eq!(max_stall(&t, Some(14 * MS)).unwrap().len_ns(), 10 * MS);
        assert_eq!(max_stall(&[], Some(5)), None);
    }

    #[test]
    fn throughput_bins() {
        let c = [
            (0, 1, 10),
            (99 * MS, 2, 20),
            (100 * MS, 1, 5),
            (350 * MS, 1, 1),
        ];
        assert_eq!(bins(&c, 100 * MS), [(3, 30), (1, 5), (0, 0), (1, 1)]);
        assert!(bins(&[], 100 * MS).is_empty());
    }

    #[test]
    fn events_file() {
        let text = "# drill\n1000500000 cut rail0/near\n\n1002000000   restore rail0 \n999000000\n";
        let ev = parse_events(text, 1_000_000_000).unwrap();
        assert_eq!(
            ev,
            [
                Event {
                    at_ns: -1_000_000,
                    label: "event".into()
                },
                Event {
                    at_ns: 500_000,
                    label: "cut rail0/near".into()
                },
                Event {
                    at_ns: 2_000_000,
                    label: "restore rail0".into()
                },
            ]
        );
        assert!(parse_events("12x cut", 0).unwrap_err().contains("line 1"));
    }

    #[test]
    fn recovery_after_a_cut() {
        // Steady traffic, a cut at 50 ms, two late completions, a 300 ms stall, traffic again.
        let t = times(&[0, 10, 20, 30, 40, 51, 53, 353, 355, 360]);
        let ev = [Event {
            at_ns: (50 * MS) as i64,
            label: "cut".into(),
        }];
        let o = &analyse_events(&t, &ev, 400 * MS, false)[0];
        assert_eq!(o.first_after_ns, Some(MS));
        let s = o.stall.unwrap();
        assert_eq!((s.from_ns / MS, s.to_ns / MS), (53, 353));
        assert!(o.stall_closed);
        assert_eq!(o.baseline_ns, 10 * MS);
        assert_eq!(o.back_ns, Some(303 * MS));
    }

    #[test]
    fn a_cut_without_a_stall_is_back_at_the_first_completion() {
        // Gaps of 10 ms before the cut at 45 ms; after it nothing longer than that.
        let t = times(&[0, 10, 20, 30, 40, 47, 52, 60, 70, 78]);
        let ev = [Event {
            at_ns: (45 * MS) as i64,
            label: "cut rail1".into(),
        }];
        let o = &analyse_events(&t, &ev, 80 * MS, false)[0];
        assert_eq!(o.baseline_ns, 10 * MS);
        assert_eq!(o.stall.map(|s| s.len_ns()), Some(10 * MS));
        assert_eq!(o.back_ns, Some(2 * MS));
    }

    #[test]
    fn a_gap_spanning_the_cut_counts() {
        let t = times(&[0, 10, 20, 120, 121]);
        let ev = [Event {
            at_ns: (25 * MS) as i64,
            label: "cut".into(),
        }];
        let o = &analyse_events(&t, &ev, 200 * MS, false)[0];
        assert_eq!(o.first_after_ns, Some(95 * MS));
        assert_eq!(
            o.stall.map(|s| (s.from_ns / MS, s.to_ns / MS)),
            Some((20, 120))
        );
    }

    #[test]
    fn no_recovery_gives_an_open_stall() {
        let t = times(&[0, 10, 20]);
        let ev = [Event {
            at_ns: (25 * MS) as i64,
            label: "cut".into(),
        }];
        let o = &analyse_events(&t, &ev, 900 * MS, true)[0];
        assert_eq!(o.first_after_ns, None);
        assert_eq!(
            o.stall.map(|s| (s.from_ns / MS, s.to_ns / MS)),
            Some((20, 900))
        );
        assert!(!o.stall_closed);
    }

    #[test]
    fn stalls_are_bounded_by_the_next_event() {
        // cut at 25, restore at 500: traffic only resumes at 600 (after the restore).
        let t = times(&[0, 10, 20, 600, 601]);
        let ev = [
            Event {
                at_ns: (25 * MS) as i64,
                label: "cut".into(),
            },
            Event {
                at_ns: (500 * MS) as i64,
                label: "restore".into(),
            },
        ];
        let o = analyse_events(&t, &ev, 700 * MS, false);
        assert_eq!(o[0].first_after_ns, Some(575 * MS));
        assert_eq!(
            o[0].stall.map(|s| (s.from_ns / MS, s.to_ns / MS)),
            Some((20, 500))
        );
        assert!(!o[0].stall_closed);
        assert_eq!(o[1].first_after_ns, Some(100 * MS));
        assert_eq!(
            o[1].stall.map(|s| (s.from_ns / MS, s.to_ns / MS)),
            Some((20, 600))
        );
        assert!(o[1].stall_closed);
    }

    #[test]
    fn a_trickle_then_a_stall_until_the_error_is_no_recovery() {
        // Two completions just after the cut, then nothing until the error at 330 ms.
        let t = times(&[0, 10, 20, 22, 24]);
        let ev = [Event {
            at_ns: (21 * MS) as i64,
            label: "cut".into(),
        }];
        let o = &analyse_events(&t, &ev, 330 * MS, true)[0];
        assert_eq!(o.first_after_ns, Some(MS));
        assert_eq!(
            o.stall.map(|s| (s.from_ns / MS, s.to_ns / MS)),
            Some((24, 330))
        );
        assert!(!o.stall_closed);
        // The same completions in a stream that ended cleanly at 330 ms: the idle tail is not
        // a stall.
        let o = &analyse_events(&t, &ev, 330 * MS, false)[0];
        assert_eq!(
            o.stall.map(|s| (s.from_ns / MS, s.to_ns / MS)),
            Some((20, 22))
        );
        assert!(o.stall_closed);
    }

    #[test]
    fn a_later_stall_is_not_the_events_doing() {
        // Cut at 45 ms, traffic goes on at its usual pace, then an unrelated 200 ms stall.
        let mut ms_list = vec![
            0, 10, 20, 30, 40, 47, 52, 60, 70, 80, 90, 100, 110, 120, 130,
        ];
        ms_list.extend([140, 150, 160, 170, 180, 190, 200, 400, 410]);
        let t = times(&ms_list);
        let ev = [
            Event {
                at_ns: (45 * MS) as i64,
                label: "cut rail1".into(),
            },
            Event {
                at_ns: (420 * MS) as i64,
                label: "restore rail1".into(),
            },
        ];
        let o = analyse_events(&t, &ev, 500 * MS, false);
        assert_eq!(o[0].stall.map(|s| s.len_ns()), Some(10 * MS));
        assert!(o[0].stall_closed);
        assert_eq!(o[0].back_ns, Some(2 * MS));
    }

    #[test]
    fn a_short_idle_tail_before_the_next_event_is_not_a_stall() {
        let t = times(&[0, 10, 20, 30, 40, 47, 52, 60, 70, 71]);
        let ev = [
            Event {
                at_ns: (45 * MS) as i64,
                label: "cut".into(),
            },
            Event {
                at_ns: (72 * MS) as i64,
                label: "restore".into(),
            },
        ];
        let o = &analyse_events(&t, &ev, 100 * MS, false)[0];
        assert!(o.stall_closed);
        assert_eq!(o.back_ns, Some(2 * MS));
    }

    #[test]
    fn baseline_is_the_second_before_the_event() {
        // A 300 ms gap at the start (warm-up), then a steady 10 ms pace for 2 s.
        let mut ms_list = vec![0];
        ms_list.extend((300..=2300).step_by(10));
        let t = times(&ms_list);
        let ev = [Event {
            at_ns: (2305 * MS) as i64,
            label: "cut".into(),
        }];
        assert_eq!(
            analyse_events(&t, &ev, 2400 * MS, false)[0].baseline_ns,
            10 * MS
        );
    }

    #[test]
    fn events_before_any_completion() {
        let ev = [Event {
            at_ns: -5,
            label: "early".into(),
        }];
        let o = &analyse_events(&times(&[3]), &ev, 10 * MS, false)[0];
        assert_eq!(o.first_after_ns, Some(3 * MS));
        assert_eq!(o.stall.map(|s| (s.from_ns, s.to_ns)), Some((0, 3 * MS)));
    }
}
