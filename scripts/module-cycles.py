#!/usr/bin/env python3
"""Import graph of one crate's modules, and its cycles.

Usage: scripts/module-cycles.py [--strict] [crate/src]   (default: crates/tower/src)

By default a module and its own submodules may use each other (a `mod.rs` holding what its
children share, the children re-exported from it: ordinary Rust); every other edge counts.
`--strict` counts those too (every crate passes it; .ci/run checks each with it).
Under `--strict` a parent's `pub use child::Item` is an edge parent → child (re-exporting is
fine), and a child's `super::Item` is an edge child → parent even when the parent only
re-exports `Item` from a sibling: the child names the sibling instead (`super::sibling::Item`).
What the script cannot see: a method call on a type whose `impl` block lives in another module
(a type's methods split across modules), and macros.

Every `crate::…`, `super::…`, `self::…` and `child::…` path in a module's code (not in comments, doc
comments, strings or `#[cfg(test)]` modules: a module's tests may use anything) is resolved to
the deepest module it names; `crate::Name` for a name the crate root re-exports (`pub use
module::Name`) counts as a use of `module`. A module declaring a child (`mod child;`) does not
depend on it by that alone.

Prints each module with the modules it uses, then the layers (a module's layer is one more than
the highest layer it uses), and exits 1 if there is a cycle, listing the modules in each.
"""

import os
import re
import sys


def strip_code(text):
    """Removes comments, string and char literals (keeping line structure roughly)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 8]) and not re.match(r"\w", text[i - 1:i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:i + 4])
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(code):
    """Removes `#[cfg(test)] mod name { … }` blocks."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code)
        if not m:
            return code
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        code = code[: m.start()] + code[i:]


def expand_use_trees(code):
    """`use a::{b, c::{d, e}}` → the paths a::b, a::c::d, a::c::e (as text to scan)."""
    paths = []

    def expand(prefix, tree):
        tree = tree.strip()
        if not tree:
            return
        m = re.match(r"^([\w:]*?)(::)?\{(.*)\}$", tree, re.S)
        if m and m.group(3) is not None and tree.endswith("}"):
            head = m.group(1)
            inner = m.group(3)
            base = prefix + head + ("::" if head else "")
            depth, part = 0, ""
            for ch in inner + ",":
                if ch == "," and depth == 0:
                    expand(base, part)
                    part = ""
                    continue
                depth += {"{": 1, "}": -1}.get(ch, 0)
                part += ch
            return
        name = re.split(r"\s+as\s+", tree)[0].strip()
        paths.append(prefix + name)

    for m in re.finditer(r"\buse\s+([^;]+);", code):
        expand("", m.group(1))
    return paths


def modules(src):
    """Module path (e.g. `export::batch`) → file, for every .rs file under src."""
    found = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel == ["lib"] or rel == ["main"]:
                name = "crate"
            else:
                if rel[-1] == "mod":
                    rel = rel[:-1]
                name = "crate::" + "::".join(rel)
            found[name] = os.path.join(root, f)
    return found


def root_reexports(code):
    """Names the crate root re-exports from a module: `pub use module::{A, B}`."""
    names = {}
    for m in re.finditer(r"\bpub\s+use\s+([^;]+);", code):
        for path in expand_use_trees("use " + m.group(1) + ";"):
            parts = path.split("::")
            if parts[0] in ("crate", "self"):
                parts = parts[1:]
            if len(parts) >= 2:
                names[parts[-1]] = "crate::" + parts[0]
    return names


def related(a, b):
    """Whether one module is the other's ancestor (`crate` is everyone's)."""
    a, b = a.split("::"), b.split("::")
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def main():
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return 0
    args = [a for a in sys.argv[1:] if a != "--strict"]
    strict = "--strict" in sys.argv[1:]
    src = args[0] if args else "crates/tower/src"
    if len(args) > 1 or args and args[0].startswith("-"):
        print(f"usage: scripts/module-cycles.py [--strict] [crate/src] (not {' '.join(args)})", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(src, "lib.rs")) and not os.path.isfile(os.path.join(src, "main.rs")):
        print(f"{src}: no lib.rs or main.rs there; give a crate's src directory", file=sys.stderr)
        return 2
    mods = modules(src)
    codes = {m: drop_test_modules(strip_code(open(f, encoding="utf-8").read())) for m, f in mods.items()}
    reexports = root_reexports(codes["crate"])
    graph = {m: set() for m in mods}
    for mod, code in codes.items():
        here = mod
        paths = expand_use_trees(code)
        paths += re.findall(r"(?<![\w:])(\w+(?:::\w+)+)", re.sub(r"\buse\s+[^;]+;", "", code))
        for path in paths:
            parts = path.split("::")
            if parts[0] == "crate":
                full = parts
            elif parts[0] == "super":
                # `super` of `a::b` (file a/b.rs or a/b/mod.rs) is `a`.
                base = mod.split("::")[:-1]
                rest = parts[1:]
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
                full = base + rest
            elif parts[0] == "self":
                full = here.split("::") + parts[1:]
            elif f"{here}::{parts[0]}" in mods:
                # A path starting with a child module's name (`use child::Item`).
                full = here.split("::") + parts
            else:
                continue
            target = None
            for k in range(len(full), 0, -1):
                cand = "::".join(full[:k])
                if cand in mods:
                    target = cand
                    # `crate::Name` re-exported by the root: the module defining it.
                    if cand == "crate" and len(full) > 1 and full[1] in reexports:
                        target = reexports[full[1]]
                    break
            if target and target != mod and (strict or not related(mod, target)):
                graph[mod].add(target)

    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
            sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = [sorted(c) for c in sccs if len(c) > 1]

    short = lambda m: m[len("crate::"):] if m.startswith("crate::") else m
    print(f"modules of {src} and the modules they use:")
    for m in sorted(graph):
        print(f"  {short(m)} -> {', '.join(sorted(short(t) for t in graph[m])) or '-'}")
    if cycles:
        print(f"\n{len(cycles)} import cycle(s):")
        for c in cycles:
            print("  " + ", ".join(short(m) for m in c))
        return 1
    layer = {}

    def depth(v):
        if v not in layer:
            layer[v] = 1 + max((depth(w) for w in graph[v]), default=-1)
        return layer[v]

    for v in graph:
        depth(v)
    print("\nlayers (a module uses only modules of lower layers):")
    for level in range(max(layer.values()) + 1):
        print(f"  {level}: {', '.join(sorted(short(m) for m in graph if layer[m] == level))}")
    print("\nno import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
