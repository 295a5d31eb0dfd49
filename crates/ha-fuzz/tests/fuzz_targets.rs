//! The short, stable variant of the fuzzing (`fuzz/`, `scripts/fuzz.sh`): every target over
//! its seeds (generated and committed under `fuzz/seeds/<target>/`) and over a few thousand
//! deterministic pseudo-random inputs, mutated from the seeds or plain random bytes. A
//! target panics when a decoder breaks its contract, which fails the test.

use ha_fuzz::{seeds, TARGETS};
use std::path::PathBuf;

/// Pseudo-random inputs per target.
const RANDOM_INPUTS: usize = 3000;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Committed seed files of `target`.
fn committed(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("seed file"))
        .collect()
}

/// One mutation of `base`: bit flips, byte overwrites, truncation, splicing or fresh bytes.
fn mutate(rng: &mut XorShift, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    match rng.below(6) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                if !v.is_empty() {
                    let i = rng.below(v.len());
                    v[i] ^= 1 << rng.below(8);
                }
            }
        }
        1 => {
            for _ in 0..1 + rng.below(8) {
                if !v.is_empty() {
                    let i = rng.below(v.len());
                    v[i] = rng.next() as u8;
                }
            }
        }
        2 => v.truncate(rng.below(v.len() + 1)),
        3 => {
            let cut = rng.below(v.len() + 1);
            v.truncate(cut);
            let from = rng.below(other.len() + 1);
            v.extend_from_slice(&other[from..]);
        }
        4 => {
            let i = rng.below(v.len() + 1);
            let extra: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
            v.splice(i..i, extra);
        }
        _ => v = (0..rng.below(512)).map(|_| rng.next() as u8).collect(),
    }
    v
}

#[test]
fn every_target_has_committed_seeds() {
    for (name, _) in TARGETS {
        assert!(!committed(name).is_empty(), "no seeds for {name}");
        assert!(!seeds(name).is_empty(), "no generated seeds for {name}");
    }
}

#[test]
fn targets_survive_seeds_and_random_inputs() {
    for (i, (name, target)) in TARGETS.iter().enumerate() {
        let mut corpus = seeds(name);
        corpus.extend(committed(name));
        for input in &corpus {
            target(input);
        }
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ i as u64);
        for _ in 0..RANDOM_INPUTS {
            let a = &corpus[rng.below(corpus.len())];
            let b = &corpus[rng.below(corpus.len())];
            let input = mutate(&mut rng, a, b);
            target(&input);
        }
    }
}

/// Rewrites the committed seed files from the generators (run by hand after changing a
/// message format: `cargo test -p ha-fuzz --test fuzz_targets -- --ignored`).
#[test]
#[ignore]
fn regenerate_seed_files() {
    for (name, _) in TARGETS {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/seeds")
            .join(name);
        std::fs::create_dir_all(&dir).expect("seed dir");
        for (k, s) in seeds(name).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{k:02}")), s).expect("write seed");
        }
    }
}
