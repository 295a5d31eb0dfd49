//! The drills' network: two namespaces joined by two veth rails and an out-of-band link,
//! built with iproute2 and removed when dropped.

use std::process::Command;

pub fn netns_available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (network namespaces)".into());
    }
    let ok = Command::new("ip")
        .args(["netns", "add", "hatprobe"])
        .status()
        .map_err(|e| format!("iproute2 `ip` not runnable: {e}"))?;
    if !ok.success() {
        return Err("`ip netns add` failed".into());
    }
    let _ = Command::new("ip")
        .args(["netns", "del", "hatprobe"])
        .status();
    Ok(())
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces, rails r0/r1 and the OOB link; removed on drop.
pub struct Topo {
    pub a: String,
    pub b: String,
}

impl Topo {
    pub fn up(tag: &str) -> Result<Topo, String> {
        let t = Topo {
            a: format!("ha{tag}a"),
            b: format!("ha{tag}b"),
        };
        let _ = Command::new("ip").args(["netns", "del", &t.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &t.b]).output();
        ip(&["netns", "add", &t.a])?;
        ip(&["netns", "add", &t.b])?;
        for (ns, _) in [(&t.a, 1), (&t.b, 2)] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        for (name, net) in [("r0", 0), ("r1", 1), ("oo", 9)] {
            let (ea, eb) = (format!("{name}a"), format!("{name}b"));
            ip(&[
                "-n", &t.a, "link", "add", &ea, "type", "veth", "peer", "name", &eb, "netns", &t.b,
            ])?;
            ip(&[
                "-n",
                &t.a,
                "addr",
                "add",
                &format!("10.88.{net}.1/24"),
                "dev",
                &ea,
            ])?;
            ip(&[
                "-n",
                &t.b,
                "addr",
                "add",
                &format!("10.88.{net}.2/24"),
                "dev",
                &eb,
            ])?;
            ip(&["-n", &t.a, "link", "set", &ea, "up"])?;
            ip(&["-n", &t.b, "link", "set", &eb, "up"])?;
        }
        Ok(t)
    }

    /// Set rail `r` (0/1) down or up at the near (a) or far (b) end.
    pub fn link(&self, r: usize, far: bool, up: bool) -> Result<(), String> {
        let (ns, dev) = if far {
            (&self.b, format!("r{r}b"))
        } else {
            (&self.a, format!("r{r}a"))
        };
        ip(&[
            "-n",
            ns,
            "link",
            "set",
            &dev,
            if up { "up" } else { "down" },
        ])
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}
