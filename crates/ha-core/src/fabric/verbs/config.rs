//! Knobs of the verbs fabric: the plugin's own QP timeout / retry count and GPUDirect mode
//! (from `HA_NCCL_*` through `crate::config`), and NCCL's `NCCL_IB_HCA`, `NCCL_IB_GID_INDEX`, `NCCL_IB_TC`,
//! `NCCL_IB_SL`, which the fabric reads itself so NCCL users' settings keep working.

use super::super::{FabricError, Result};
use super::gdr::GdrMode;
use super::hca_filter::HcaFilter;

/// Configuration of [`super::open`]. The `Option` fields left `None` are read from NCCL's
/// environment variables at open time; `Some` overrides the environment.
#[derive(Clone, Debug)]
pub struct VerbsConfig {
    /// Local ACK timeout exponent: 4.096 µs × 2^`qp_timeout` (0..=31).
    pub qp_timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR` (0..=7; rxe treats 7 as infinite).
    pub qp_retry_cnt: u8,
    /// `NCCL_IB_HCA` filter; `Some("")` selects every device.
    pub ib_hca: Option<String>,
    /// `NCCL_IB_GID_INDEX`; `Some(-1)` = automatic selection.
    pub gid_index: Option<i32>,
    /// `NCCL_IB_TC` (traffic class, 0..=255; -1 = 0).
    pub traffic_class: Option<i32>,
    /// `NCCL_IB_SL` (service level, 0..=15; -1 = 0).
    pub service_level: Option<i32>,
    /// `HA_NCCL_GDR`: GPUDirect RDMA detection (`auto`), off, or required.
    pub gdr: GdrMode,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            qp_timeout: 14,
            qp_retry_cnt: 7,
            ib_hca: None,
            gid_index: None,
            traffic_class: None,
            service_level: None,
            gdr: GdrMode::Auto,
        }
    }
}

/// The configuration after validation and environment lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub qp_timeout: u8,
    pub qp_retry_cnt: u8,
    pub hca: HcaFilter,
    pub gid_index: Option<u32>,
    pub traffic_class: u8,
    pub service_level: u8,
    pub gdr: GdrMode,
}

fn int_var(name: &str, cfg: Option<i32>, env: &dyn Fn(&str) -> Option<String>) -> Result<i32> {
    if let Some(v) = cfg {
        return Ok(v);
    }
    match env(name) {
        None => Ok(-1),
        Some(s) if s.trim().is_empty() => Ok(-1),
        Some(s) => s
            .trim()
            .parse::<i32>()
            .map_err(|_| FabricError::InvalidArgument(format!("{name}={s:?} is not an integer"))),
    }
}

fn ranged(name: &str, v: i32, max: i32) -> Result<Option<u32>> {
    match v {
        -1 => Ok(None),
        0.. if v <= max => Ok(Some(v as u32)),
        _ => Err(FabricError::InvalidArgument(format!(
            "{name}={v} out of range (-1 or 0..={max})"
        ))),
    }
}

impl VerbsConfig {
    /// Validate and fill the `None` fields from `env` (`std::env::var` in production).
    pub fn resolve(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved> {
        if self.qp_timeout > 31 {
            return Err(FabricError::InvalidArgument(format!(
                "QP timeout {} out of range 0..=31",
                self.qp_timeout
            )));
        }
        if self.qp_retry_cnt > 7 {
            return Err(FabricError::InvalidArgument(format!(
                "QP retry count {} out of range 0..=7",
                self.qp_retry_cnt
            )));
        }
        let hca = match &self.ib_hca {
            Some(s) => s.clone(),
            None => env("NCCL_IB_HCA").unwrap_or_default(),
        };
        let gid = int_var("NCCL_IB_GID_INDEX", self.gid_index, env)?;
        let tc = int_var("NCCL_IB_TC", self.traffic_class, env)?;
        let sl = int_var("NCCL_IB_SL", self.service_level, env)?;
        Ok(Resolved {
            qp_timeout: self.qp_timeout,
            qp_retry_cnt: self.qp_retry_cnt,
            hca: HcaFilter::parse(&hca)?,
            gid_index: ranged("NCCL_IB_GID_INDEX", gid, 255)?,
            traffic_class: ranged("NCCL_IB_TC", tc, 255)?.unwrap_or(0) as u8,
            service_level: ranged("NCCL_IB_SL", sl, 15)?.unwrap_or(0) as u8,
            gdr: self.gdr,
        })
    }
}

/// The process environment as a lookup function.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn defaults_without_environment() {
        let r = VerbsConfig::default().resolve(&env_of(&[])).unwrap();
        assert_eq!(r.qp_timeout, 14);
        assert_eq!(r.qp_retry_cnt, 7);
        assert_eq!(r.hca, HcaFilter::default());
        assert_eq!(r.gid_index, None);
        assert_eq!((r.traffic_class, r.service_level), (0, 0));
    }

    #[test]
    fn reads_nccl_environment() {
        let env = env_of(&[
            ("NCCL_IB_HCA", "^=mlx5_1"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_TC", " 106 "),
            ("NCCL_IB_SL", "5"),
        ]);
        let r = VerbsConfig::default().resolve(&env).unwrap();
        assert!(r.hca.exclude && r.hca.exact);
        assert_eq!(r.gid_index, Some(3));
        assert_eq!((r.traffic_class, r.service_level), (106, 5));
        // -1 means "default", as in NCCL.
        let env = env_of(&[("NCCL_IB_GID_INDEX", "-1"), ("NCCL_IB_TC", "-1")]);
        let r = VerbsConfig::default().resolve(&env).unwrap();
        assert_eq!((r.gid_index, r.traffic_class), (None, 0));
    }

    #[test]
    fn explicit_fields_override_environment() {
        let env = env_of(&[("NCCL_IB_HCA", "mlx5"), ("NCCL_IB_GID_INDEX", "3")]);
        let cfg = VerbsConfig {
            ib_hca: Some(String::new()),
            gid_index: Some(-1),
            ..Default::default()
        };
        let r = cfg.resolve(&env).unwrap();
        assert!(r.hca.entries.is_empty());
        assert_eq!(r.gid_index, None);
    }

    #[test]
    fn rejects_bad_values() {
        let bad_env = [
            ("NCCL_IB_GID_INDEX", "x"),
            ("NCCL_IB_GID_INDEX", "256"),
            ("NCCL_IB_GID_INDEX", "-2"),
            ("NCCL_IB_TC", "300"),
            ("NCCL_IB_SL", "16"),
            ("NCCL_IB_HCA", "mlx5_0:p"),
        ];
        for (k, v) in bad_env {
            let r = VerbsConfig::default().resolve(&env_of(&[(k, v)]));
            assert!(matches!(r, Err(FabricError::InvalidArgument(_))), "{k}={v}");
        }
        for cfg in [
            VerbsConfig {
                qp_timeout: 32,
                ..Default::default()
            },
            VerbsConfig {
                qp_retry_cnt: 8,
                ..Default::default()
            },
        ] {
            assert!(matches!(
                cfg.resolve(&env_of(&[])),
                Err(FabricError::InvalidArgument(_))
            ));
        }
    }
}
