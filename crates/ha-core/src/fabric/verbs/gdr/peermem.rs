//! The peer-memory check: whether the kernel's peer-memory client for NVIDIA GPUs
//! (`nvidia-peermem`, or the older out-of-tree `nv_peer_mem`) is loaded, so that `ibv_reg_mr`
//! of a GPU virtual address works (`NCCL_PTR_CUDA`).
//!
//! Exactly NCCL's test (`net_ib.cc`, `ncclIbGdrSupport`): any of three paths exists. OFED's
//! `ib_core` lists each registered peer-memory client under `/sys/kernel/mm/memory_peers/`
//! (`nv_mem`, and `nv_mem_nc` in nvidia-peermem's legacy mode); `/sys/module/nvidia_peermem/
//! version` exists whenever the module is loaded. The paths are taken relative to a root
//! directory so that tests run against a fake sysfs tree.

use std::path::{Path, PathBuf};

/// The paths NCCL checks, relative to the file-system root, in its order.
pub const PEERMEM_PATHS: [&str; 3] = [
    "sys/kernel/mm/memory_peers/nv_mem/version",
    "sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "sys/module/nvidia_peermem/version",
];

/// What the check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peermem {
    /// Loaded: the first path found (absolute, as seen under the root).
    Loaded(PathBuf),
    /// None of the paths exists.
    Absent,
}

impl Peermem {
    pub fn loaded(&self) -> bool {
        matches!(self, Peermem::Loaded(_))
    }
}

/// Check under `root` (`/` in production).
pub fn check(root: &Path) -> Peermem {
    PEERMEM_PATHS
        .iter()
        .map(|p| root.join(p))
        // `exists` follows symlinks and says false on any error, as `access(F_OK)` does.
        .find(|p| p.exists())
        .map_or(Peermem::Absent, Peermem::Loaded)
}

/// The three paths, for messages ("none of ... exists").
pub fn describe_paths() -> String {
    PEERMEM_PATHS
        .iter()
        .map(|p| format!("/{p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::tests::TempRoot;
    use super::*;

    #[test]
    fn absent_on_an_empty_tree() {
        let r = TempRoot::new("empty");
        assert_eq!(check(&r.0), Peermem::Absent);
        assert!(!check(&r.0).loaded());
    }

    #[test]
    fn each_of_nccls_three_paths_counts() {
        for p in PEERMEM_PATHS {
            let r = TempRoot::new("one");
            r.touch(p);
            assert_eq!(check(&r.0), Peermem::Loaded(r.0.join(p)), "{p}");
        }
    }

    #[test]
    fn first_path_wins_and_other_clients_do_not_count() {
        let r = TempRoot::new("many");
        r.touch("sys/kernel/mm/memory_peers/amdkfd/version");
        r.touch("sys/module/nvidia/version");
        assert_eq!(
            check(&r.0),
            Peermem::Absent,
            "other modules are not peermem"
        );
        r.touch(PEERMEM_PATHS[2]);
        r.touch(PEERMEM_PATHS[1]);
        assert_eq!(check(&r.0), Peermem::Loaded(r.0.join(PEERMEM_PATHS[1])));
    }

    #[test]
    fn a_directory_without_version_is_not_enough() {
        let r = TempRoot::new("dir");
        std::fs::create_dir_all(r.0.join("sys/kernel/mm/memory_peers/nv_mem")).unwrap();
        assert_eq!(check(&r.0), Peermem::Absent);
        assert!(describe_paths().starts_with("/sys/kernel/mm/memory_peers/nv_mem/version"));
    }
}
