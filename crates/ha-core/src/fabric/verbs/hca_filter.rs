//! `NCCL_IB_HCA` device filter, with NCCL's syntax: a comma-separated list of
//! `name[:port]` entries; a leading `^` excludes the listed devices instead of selecting them;
//! a leading `=` (after any `^`) makes names match exactly instead of as prefixes. An entry
//! without a port matches every port of the device.
//!
//! Examples: `mlx5` (every mlx5 device), `=mlx5_0:1,mlx5_1:1`, `^mlx5_2`, `^=mlx5_1:2`.

use super::super::{FabricError, Result};

/// One parsed entry: a device name (or prefix) and an optional port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    pub name: String,
    pub port: Option<u8>,
}

/// A parsed `NCCL_IB_HCA` value.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HcaFilter {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// Parse a filter. An empty (or whitespace-only) value selects everything.
    pub fn parse(spec: &str) -> Result<HcaFilter> {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let mut entries = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let port = p.trim().parse::<u8>().map_err(|_| {
                        FabricError::InvalidArgument(format!(
                            "NCCL_IB_HCA={spec:?}: bad port {p:?} in {item:?}"
                        ))
                    })?;
                    (n.trim(), Some(port))
                }
                None => (item, None),
            };
            if name.is_empty() {
                return Err(FabricError::InvalidArgument(format!(
                    "NCCL_IB_HCA={spec:?}: entry {item:?} has no device name"
                )));
            }
            entries.push(HcaEntry {
                name: name.to_string(),
                port,
            });
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    /// Whether port `port` of device `dev` passes the filter. An empty list passes everything
    /// (also with `^`: an empty exclusion list excludes nothing).
    pub fn accepts(&self, dev: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self.entries.iter().any(|e| {
            let name_ok = if self.exact {
                dev == e.name
            } else {
                dev.starts_with(e.name.as_str())
            };
            name_ok && e.port.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> HcaFilter {
        HcaFilter::parse(s).unwrap()
    }

    #[test]
    fn empty_accepts_everything() {
        for s in ["", "  ", "^", "=", "^="] {
            assert!(f(s).accepts("mlx5_0", 1), "{s:?}");
            assert!(f(s).accepts("rxe0a", 2), "{s:?}");
        }
    }

    #[test]
    fn prefix_list_selects() {
        let h = f("mlx5_0,rxe1");
        assert!(h.accepts("mlx5_0", 1));
        assert!(h.accepts("mlx5_0", 2));
        assert!(h.accepts("mlx5_01", 1), "prefix match");
        assert!(h.accepts("rxe1a", 1));
        assert!(!h.accepts("mlx5_1", 1));
        assert!(!h.accepts("rxe0a", 1));
    }

    #[test]
    fn exact_match() {
        let h = f("=mlx5_0,rxe1a");
        assert!(h.accepts("mlx5_0", 1));
        assert!(!h.accepts("mlx5_01", 1));
        assert!(h.accepts("rxe1a", 1));
        assert!(!h.accepts("rxe1", 1));
        assert!(!h.accepts("rxe1b", 1));
    }

    #[test]
    fn ports() {
        let h = f("mlx5_0:1,mlx5_1");
        assert!(h.accepts("mlx5_0", 1));
        assert!(!h.accepts("mlx5_0", 2));
        assert!(h.accepts("mlx5_1", 2));
        let e = f(" mlx5_0 : 2 ");
        assert_eq!(
            e.entries,
            vec![HcaEntry {
                name: "mlx5_0".into(),
                port: Some(2)
            }]
        );
    }

    #[test]
    fn exclusion() {
        let h = f("^mlx5_1,rxe0:1");
        assert!(h.exclude && !h.exact);
        assert!(h.accepts("mlx5_0", 1));
        assert!(!h.accepts("mlx5_1", 1));
        assert!(!h.accepts("mlx5_10", 1), "prefix exclusion");
        assert!(!h.accepts("rxe0a", 1));
        assert!(h.accepts("rxe0a", 2));
        assert!(h.accepts("rxe1a", 1));
    }

    #[test]
    fn exact_exclusion() {
        let h = f("^=mlx5_1:2");
        assert!(h.exclude && h.exact);
        assert!(!h.accepts("mlx5_1", 2));
        assert!(h.accepts("mlx5_1", 1));
        assert!(h.accepts("mlx5_10", 2));
    }

    #[test]
    fn rejects_garbage() {
        for s in ["mlx5_0:x", "mlx5_0:256", ":1", "a,:2", "mlx5_0:"] {
            assert!(
                matches!(HcaFilter::parse(s), Err(FabricError::InvalidArgument(_))),
                "{s:?}"
            );
        }
    }

    #[test]
    fn empty_items_are_skipped() {
        let h = f("mlx5_0,,mlx5_1,");
        assert_eq!(h.entries.len(), 2);
    }
}
