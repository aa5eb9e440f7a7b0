#!/usr/bin/env python3
"""Module dependency graph of one Rust crate, and its import cycles.

    scripts/module-graph.py crates/collector [--depth N] [--edges] [--tests]

Reads every `.rs` file under `<crate>/src`, maps it to its module path (`src/a/b.rs` and
`src/a/b/mod.rs` are `a::b`; `src/lib.rs`, `src/main.rs` and `src/bin/*` are the root), and
collects the paths it names through `crate::…` and `super::…` (in `use` items, groups such as
`use crate::{a, b::c}` included, and in expressions and types). Modules are cut to their first
`--depth` segments (default 1: top-level modules; 2 also sees cycles between the submodules of
one module; relative paths such as `child::Item` are not followed). An edge `a -> b` means code in `a` names something in `b`. `#[cfg(test)] mod tests`
blocks and `tests.rs` files are left out unless `--tests` is given, since a test module that
reaches back into its parent's siblings is no architectural cycle.

Prints the strongly connected components with more than one module (the cycles) and exits 1
if there is any; `--edges` prints the whole graph too.
"""

import argparse
import os
import re
import sys

PATH_RE = re.compile(r"\b(crate|super)((?:::(?:\w+|\{))+)")


def module_of(src, path):
    rel = os.path.relpath(path, src)
    parts = rel[:-3].split(os.sep)  # strip .rs
    if parts[0] == "bin" or parts in (["lib"], ["main"]):
        return []
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def strip_tests(text):
    """Removes `#[cfg(test)] mod x { ... }` blocks (brace matching, good enough for rustfmt'd code)."""
    out = []
    i = 0
    pat = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while True:
        m = pat.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i:m.start()])
        depth = 0
        j = m.end() - 1
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        i = j + 1
    return "".join(out)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def expand_group(text, start):
    """The `a, b::c, d::{e, f}` inside the brace group starting at `start` (an index of `{`)."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : j]
    return ""


def first_segments(group):
    """Top-level items of a use group: the first path segment of each."""
    items, depth, cur = [], 0, ""
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    segs = []
    for it in items:
        it = it.strip()
        if not it:
            continue
        m = re.match(r"(\w+)(?:::(.*))?$", it, flags=re.S)
        if not m:
            continue
        head, rest = m.group(1), (m.group(2) or "")
        if rest.startswith("{"):
            for s in first_segments(expand_group(rest, 0)):
                segs.append([head] + s)
        elif rest:
            segs.append([head] + [p for p in re.findall(r"\w+", rest.split("::{")[0])][:1])
        else:
            segs.append([head])
    return [s if isinstance(s, list) else [s] for s in segs]


def targets(text, here):
    """Module paths (lists) that `text`, in module `here`, names through crate:: or super::."""
    found = []
    for m in PATH_RE.finditer(text):
        parts = m.group(0).split("::")
        if parts[0] == "crate":
            base, parts = [], parts[1:]
        else:
            ups = 0
            while parts and parts[0] == "super":
                ups += 1
                parts = parts[1:]
            base = list(here[: max(0, len(here) - ups)])
        if parts and parts[-1] == "{":
            for sub in first_segments(expand_group(text, m.end() - 1)):
                found.append(base + parts[:-1] + sub)
        else:
            found.append(base + parts)
    return found


def resolve(path, modules):
    """The longest prefix of `path` that is a module of the crate."""
    best = []
    for i in range(1, len(path) + 1):
        if tuple(path[:i]) in modules:
            best = path[:i]
    return best


def tarjan(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("crate", help="path of the crate (the folder holding Cargo.toml)")
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--edges", action="store_true")
    ap.add_argument("--tests", action="store_true")
    ap.add_argument(
        "--strict",
        action="store_true",
        help="also count a submodule naming its ancestor's items (hidden by default: a child "
        "module using its parent's private items is ordinary Rust)",
    )
    a = ap.parse_args()
    src = os.path.join(a.crate, "src")
    files = []
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                files.append(os.path.join(root, n))
    modules = {tuple(module_of(src, f)) for f in files}
    graph = {}
    for f in sorted(files):
        here = module_of(src, f)
        if not a.tests and (os.path.basename(f) == "tests.rs" or "bin" in os.path.relpath(f, src).split(os.sep)[:1]):
            continue
        with open(f, encoding="utf-8") as fh:
            text = strip_comments(fh.read())
        if not a.tests:
            text = strip_tests(text)
        node = tuple(here[: a.depth])
        if not node:
            continue
        graph.setdefault(node, set())
        for t in targets(text, here):
            r = tuple(resolve(t, modules)[: a.depth])
            if r and r != node and (a.strict or node[: len(r)] != r):
                # Naming an ancestor module (e.g. `super::Item` from a child) is no edge
                # between siblings; naming a descendant of one's own is filtered likewise.
                graph[node].add(r)
    if a.strict:
        # A module depends on the children it declares (named by relative paths, which the
        # scan above does not follow): with these edges a child naming its parent is a cycle.
        for m in modules:
            child = tuple(m[: a.depth])
            if len(child) > 1 and child in graph:
                graph.setdefault(child[:-1], set()).add(child)
    if a.edges:
        for v in sorted(graph):
            for w in sorted(graph[v]):
                print(f"{'::'.join(v)} -> {'::'.join(w)}")
    cycles = [c for c in tarjan(graph) if len(c) > 1]
    name = os.path.basename(os.path.abspath(a.crate))
    if not cycles:
        print(f"{name}: {len(graph)} modules at depth {a.depth}, no import cycle")
        return 0
    for c in cycles:
        print(f"{name}: cycle among " + ", ".join(sorted("::".join(m) for m in c)))
    return 1


if __name__ == "__main__":
    sys.exit(main())
