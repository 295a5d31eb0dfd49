//! Memory registrations of the `sock` fabric: the per-PD key table, and pins that make a
//! deregistration wait for any placement (or send) in progress in that region.

use crate::fabric::counters::Held;
use crate::fabric::{Access, MemoryRegion, MrKeys};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// One registered range.
pub struct MrEntry {
    pub addr: usize,
    pub len: usize,
    pub access: Access,
    pub key: u32,
    pins: AtomicUsize,
    dead: AtomicBool,
    mx: Mutex<()>,
    cv: Condvar,
}

impl MrEntry {
    /// Whether `[addr, addr+len)` lies inside the region (`len > 0`).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let (start, end) = (self.addr as u64, self.addr as u64 + self.len as u64);
        match addr.checked_add(len) {
            Some(e) => len > 0 && addr >= start && e <= end,
            None => false,
        }
    }

    /// Keep the region registered until the pin drops; `None` once it is deregistered.
    pub fn pin(self: &Arc<Self>) -> Option<MrPin> {
        self.pins.fetch_add(1, SeqCst);
        let pin = MrPin(self.clone());
        if self.dead.load(SeqCst) {
            return None; // dropping `pin` unpins
        }
        Some(pin)
    }

    /// Being deregistered: whoever holds a pin while waiting on a peer should let go.
    pub fn dying(&self) -> bool {
        self.dead.load(SeqCst)
    }

    /// Mark dead and wait until no pin is held.
    fn kill(&self) {
        self.dead.store(true, SeqCst);
        let mut g = self.mx.lock();
        while self.pins.load(SeqCst) > 0 {
            self.cv.wait(&mut g);
        }
    }
}

/// A held pin (see [`MrEntry::pin`]).
pub struct MrPin(Arc<MrEntry>);

impl Drop for MrPin {
    fn drop(&mut self) {
        if self.0.pins.fetch_sub(1, SeqCst) == 1 && self.0.dead.load(SeqCst) {
            let _g = self.0.mx.lock();
            self.0.cv.notify_all();
        }
    }
}

/// Keys → registrations of one protection domain.
#[derive(Default)]
pub struct MrTable {
    map: RwLock<HashMap<u32, Arc<MrEntry>>>,
}

static NEXT_KEY: AtomicU32 = AtomicU32::new(1);

impl MrTable {
    pub fn get(&self, key: u32) -> Option<Arc<MrEntry>> {
        self.map.read().get(&key).cloned()
    }

    /// Register; the key is fresh, nonzero and not in this table.
    pub fn insert(&self, addr: usize, len: usize, access: Access) -> Arc<MrEntry> {
        let mut map = self.map.write();
        let key = loop {
            let k = NEXT_KEY.fetch_add(1, SeqCst);
            if k != 0 && !map.contains_key(&k) {
                break k;
            }
        };
        let e = Arc::new(MrEntry {
            addr,
            len,
            access,
            key,
            pins: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            mx: Mutex::new(()),
            cv: Condvar::new(),
        });
        map.insert(key, e.clone());
        e
    }

    fn remove(&self, key: u32) {
        self.map.write().remove(&key);
    }
}

/// The handle `reg_mr` returns; dropping it deregisters (after in-flight placements).
pub struct SockMr {
    pub(super) entry: Arc<MrEntry>,
    /// The key table to leave on drop.
    pub(super) table: Arc<MrTable>,
    pub(super) _held: Held,
}

impl MemoryRegion for SockMr {
    fn keys(&self) -> MrKeys {
        MrKeys {
            lkey: self.entry.key,
            rkey: self.entry.key,
        }
    }
    fn addr(&self) -> usize {
        self.entry.addr
    }
    fn len(&self) -> usize {
        self.entry.len
    }
}

impl Drop for SockMr {
    fn drop(&mut self) {
        self.table.remove(self.entry.key);
        self.entry.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fresh_and_pins_block_after_kill() {
        let t = MrTable::default();
        let a = t.insert(0x1000, 0x100, Access::ALL);
        let b = t.insert(0x1000, 0x100, Access::ALL);
        assert_ne!(a.key, 0);
        assert_ne!(a.key, b.key);
        assert!(a.contains(0x1000, 0x100));
        assert!(a.contains(0x10ff, 1));
        assert!(!a.contains(0x10ff, 2));
        assert!(!a.contains(0xfff, 1));
        assert!(!a.contains(0x1000, 0));
        assert!(!a.contains(u64::MAX, 2));
        let pin = a.pin().expect("live");
        let a2 = a.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let t2 = std::thread::spawn(move || {
            a2.kill();
            tx.send(()).unwrap();
        });
        // Killing waits for the pin.
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(50))
            .is_err());
        drop(pin);
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("kill finished");
        t2.join().unwrap();
        assert!(a.pin().is_none());
        t.remove(a.key);
        assert!(t.get(a.key).is_none());
        assert!(t.get(b.key).is_some());
    }
}
