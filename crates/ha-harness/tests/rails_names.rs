//! scripts/netns/rails.sh names its namespaces uniquely per run: two runs on one host never
//! tear down each other's pair mid-drill (before, a fixed `ha-` prefix made the second `up`
//! remove the first run's namespaces), and commands other than `up` refuse to guess a pair.
//! Needs root and iproute2; skipped (saying why) otherwise.

use std::path::PathBuf;
use std::process::Command;

fn rails(prefix: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut c = Command::new("bash");
    c.arg(PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/netns/rails.sh"
    )))
    .args(args)
    .env_remove("HA_RAILS_PREFIX");
    if let Some(p) = prefix {
        c.env("HA_RAILS_PREFIX", p);
    }
    let o = c.output().expect("running rails.sh");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn namespaces() -> String {
    let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn two_runs_get_pairs_of_their_own() {
    let root = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&root.stdout).trim() != "0" {
        eprintln!("SKIPPED rails names: not root");
        return;
    }
    let prefix_of = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("export HA_RAILS_PREFIX="))
            .and_then(|l| l.split_whitespace().next())
            .map(String::from)
            .unwrap_or_else(|| panic!("no prefix printed:\n{out}"))
    };
    let (ok, out) = rails(None, &["up"]);
    assert!(ok, "{out}");
    let first = prefix_of(&out);
    let (ok, out) = rails(None, &["up"]);
    assert!(ok, "{out}");
    let second = prefix_of(&out);
    assert_ne!(first, second, "two runs got the same namespaces");
    let ns = namespaces();
    for p in [&first, &second] {
        for side in ["a", "b"] {
            assert!(
                ns.lines()
                    .any(|l| l.split_whitespace().next() == Some(&format!("{p}{side}"))),
                "{p}{side} missing (torn down by the other run?):\n{ns}"
            );
        }
    }
    let (ok, out) = rails(None, &["cut", "0", "near"]);
    assert!(!ok && out.contains("HA_RAILS_PREFIX is not set"), "{out}");
    assert!(rails(Some(&first), &["cut", "0", "near"]).0);
    for p in [&first, &second] {
        let (ok, out) = rails(Some(p), &["down"]);
        assert!(ok, "{out}");
    }
    let ns = namespaces();
    assert!(!ns.contains(&first) && !ns.contains(&second), "{ns}");
}
