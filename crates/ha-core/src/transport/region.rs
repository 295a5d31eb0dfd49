//! Memory the connection owns and registers on every path's device: its remotely written
//! region (CTS FIFO or completion records, plus the control mailbox) and its staging buffers
//! (sources of the records, clear-to-sends and control messages it writes to the peer).

use crate::fabric::{Access, MemoryRegion, MrKeys, Result as FabricResult};
use ha_proto::data::layout::SharedWords;

pub struct Region {
    // Registrations go before the memory they cover.
    mrs: Vec<Option<Box<dyn MemoryRegion>>>,
    pub words: SharedWords,
}

impl Region {
    pub fn new(words: usize) -> Region {
        Region {
            mrs: Vec::new(),
            words: SharedWords::new(words),
        }
    }

    /// Register on path `index`'s device (`pd`), once per index.
    pub fn register(
        &mut self,
        index: usize,
        pd: &dyn crate::fabric::ProtectionDomain,
        access: Access,
    ) -> FabricResult<()> {
        while self.mrs.len() <= index {
            self.mrs.push(None);
        }
        if self.mrs[index].is_none() {
            self.mrs[index] = Some(pd.reg_mr(self.words.addr(), self.words.len_bytes(), access)?);
        }
        Ok(())
    }

    /// Keys on path `index` (registered first).
    pub fn keys(&self, index: usize) -> MrKeys {
        self.mrs[index].as_ref().expect("registered").keys()
    }

    pub fn addr(&self) -> usize {
        self.words.addr()
    }

    pub fn len_bytes(&self) -> usize {
        self.words.len_bytes()
    }
}
