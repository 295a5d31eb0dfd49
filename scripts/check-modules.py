#!/usr/bin/env python3
"""Checks the shape of the workspace's Rust code (CI runs it from scripts/test.sh):

1. no import circles: inside each crate, the `use` edges between sibling modules of one folder
   (`crate::a::b`, `super::x`, `self::y` resolved to modules) must form no cycle, and
2. no source file longer than LIMIT lines, except the ones listed in ALLOWED (tables).

Prints every circle (the modules on it) and every long file; exits 1 if there is one.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LIMIT = 600
# Files that are one table (long by nature, not by mixing responsibilities).
ALLOWED = {
    "crates/ha-core/src/config.rs",  # the declarative table of every HA_NCCL_* knob
    "crates/nccl-net-ha/tests/abi_misuse.rs",  # the ABI misuse table (one row per case)
    "crates/nccl-net-abi/tests/c_layout.rs",  # one layout row per C struct field
}

USE_STMT_RE = re.compile(r"\buse\s+([^;]+);")
PATH_RE = re.compile(r"\b((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def expand(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (`as` renames dropped)."""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0].strip()]
    prefix, body = tree[:i], tree[i + 1 : tree.rfind("}")]
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    out = []
    for it in items:
        if it.strip():
            for e in expand(it):
                out.append(prefix + e if e != "self" else prefix.rstrip(":"))
    return out


def module_of(src_dir, path):
    rel = os.path.relpath(path, src_dir)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def resolve(mod, p):
    parts = p.split("::")
    if parts[0] == "crate":
        cur = []
        parts = parts[1:]
    else:
        # `super` of a file module is its folder; of a mod.rs module, the folder above.
        cur = list(mod)
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                cur = cur[:-1]
            parts = parts[1:]
    return tuple(cur + parts)


def crate_graph(src_dir):
    files = {}
    for d, _, fs in os.walk(src_dir):
        for f in fs:
            if f.endswith(".rs"):
                p = os.path.join(d, f)
                files[module_of(src_dir, p)] = p
    mods = set(files)
    edges = {}
    for mod, path in files.items():
        text = open(path, encoding="utf-8").read()
        # Leave out test modules: `#[cfg(test)] mod tests { ... }` at the end of a file.
        cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
        if cut:
            text = text[: cut.start()]
        # Comments name modules without depending on them.
        text = re.sub(r"//[^\n]*", "", text)
        targets = set()
        paths = [m.group(1) for m in PATH_RE.finditer(text)]
        for m in USE_STMT_RE.finditer(text):
            paths += [q for q in expand(m.group(1)) if q.split("::")[0] in ("crate", "super", "self")]
        for q in paths:
            full = resolve(mod, q)
            # The longest prefix that is a module.
            while full and full not in mods:
                full = full[:-1]
            if full:
                targets.add(full)
        edges[mod] = targets
    return mods, edges


def sibling_cycles(mods, edges):
    """Cycles among the children of each folder (an edge a->b counts between the children
    of their common parent that contain them)."""
    out = []
    parents = {m[:-1] for m in mods if m}
    for parent in parents:
        kids = sorted({m[len(parent)] for m in mods if len(m) > len(parent) and m[: len(parent)] == parent})
        g = {k: set() for k in kids}
        for a, ts in edges.items():
            if len(a) <= len(parent) or a[: len(parent)] != parent:
                continue
            for b in ts:
                if len(b) <= len(parent) or b[: len(parent)] != parent:
                    continue
                ka, kb = a[len(parent)], b[len(parent)]
                if ka != kb:
                    g[ka].add(kb)
        # Tarjan's strongly connected components.
        index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

        def strong(v):
            index[v] = low[v] = n[0]
            n[0] += 1
            stack.append(v)
            on.add(v)
            for w in g[v]:
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

        for k in kids:
            if k not in index:
                strong(k)
        for c in comps:
            out.append(("/".join(parent) or "(crate root)", c))
    return out


def main():
    bad = 0
    crates = os.path.join(ROOT, "crates")
    for c in sorted(os.listdir(crates)):
        src = os.path.join(crates, c, "src")
        if not os.path.isdir(src):
            continue
        mods, edges = crate_graph(src)
        for parent, comp in sibling_cycles(mods, edges):
            print(f"import circle in {c}: {parent}/{{{', '.join(comp)}}}")
            bad += 1
    for d, _, fs in os.walk(crates):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, ROOT)
            n = sum(1 for _ in open(p, encoding="utf-8"))
            if n > LIMIT and rel not in ALLOWED:
                print(f"{rel}: {n} lines (over {LIMIT}; split it by responsibility)")
                bad += 1
    if bad:
        sys.exit(1)
    print("modules: no import circles, no file over", LIMIT, "lines")


if __name__ == "__main__":
    main()
