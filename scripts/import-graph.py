#!/usr/bin/env python3
"""List the crate's module-level import edges that run upward, and its import cycles.

Reads every `crate::a::b` and `super::a` path in `src/**/*.rs` (in `use` lines and inline
paths, comments and doc comments skipped), maps it to the module file it names
and builds a file-level graph. Prints:

* the edges from a module to one that imports it back through the layers,
  i.e. the edges inside strongly connected components (the cycles), grouped
  by component, and the top-level modules each component spans;
* `--edges A B`: every file of module A that names module B.

Usage: python3 scripts/import-graph.py [--json] [--edges A B] [--graph] [--check]

`--graph` prints the module map that ARCHITECTURE.md shows between its
markers; `--check` also fails when that copy is stale.
Exit status 0, or with --check 1 when an edge runs upward through the
layers or up `device`'s inner layers (DEVICE_LAYERS), a leaf of LEAVES
names a module of the crate, or an import cycle spans more than MAX_CYCLE
files (CI runs it so).
"""
import json
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
# `$crate::` paths (in exported macros) name the public path a user
# crate sees, not an edge inside this one.
PATH = re.compile(r"(?<![$\w])crate::((?:[a-z_][a-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*)")
SUPER = re.compile(r"\b(?:super::)+(?:[a-z_][a-z0-9_]*::)*(?:([A-Za-z_][A-Za-z0-9_]*)|\{([^}]*)\})", re.S)
GROUP = re.compile(r"(?<![$\w])crate::((?:[a-z_][a-z0-9_]*::)*)\{([^}]*)\}", re.S)


def module_files():
    files = {}
    for dirpath, _, names in os.walk(ROOT):
        for n in names:
            if not n.endswith(".rs"):
                continue
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, ROOT)[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts == ["lib"]:
                parts = []
            files[tuple(parts)] = os.path.relpath(full, os.path.join(ROOT, ".."))
    return files


def strip_comments(text):
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("//"):
            continue
        i = line.find("//")
        out.append(line if i < 0 else line[:i])
    return "\n".join(out)


def resolve(files, segs):
    # the longest prefix of segs that is a module file
    for k in range(len(segs), 0, -1):
        if tuple(segs[:k]) in files:
            return tuple(segs[:k])
    return None


def graph():
    files = module_files()
    edges = defaultdict(set)
    for mod, path in files.items():
        with open(os.path.join(ROOT, "..", path), encoding="utf-8") as f:
            text = strip_comments(f.read())
        targets = []
        for m in GROUP.finditer(text):
            prefix = [s for s in m.group(1).split("::") if s]
            for item in m.group(2).split(","):
                item = item.strip().split(" as ")[0].strip()
                if item:
                    targets.append(prefix + [s for s in item.split("::") if s and s != "self"])
        for m in PATH.finditer(text):
            targets.append(m.group(1).split("::"))
        # `super::` paths, resolved against this module's parent
        for m in SUPER.finditer(text):
            segs = list(mod)
            rest = m.group(0).split("::")
            while rest and rest[0] == "super":
                segs = segs[:-1]
                rest = rest[1:]
            if m.group(2):
                for item in m.group(2).split(","):
                    item = item.strip().split(" as ")[0].strip()
                    if item:
                        targets.append(segs + [x for x in rest[:-1] if x] + [x for x in item.split("::") if x and x != "self"])
            else:
                targets.append(segs + [x for x in rest if x])
        for segs in targets:
            t = resolve(files, segs)
            if t is None or t == mod or not t:
                continue
            # a file naming its own ancestor module's items is not an edge upward
            # in the sense meant here only when the ancestor is the crate root
            edges[mod].add(t)
    return files, edges


def sccs(nodes, edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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

    for v in nodes:
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


# The layers, bottom to top, as lib.rs and ARCHITECTURE.md give them: a
# module may name modules of its own layer or below.
LAYERS = [
    ["error", "dtype", "par", "alloc", "guide"],
    ["convert", "conv3d"],
    ["fallback"],
    ["safetensors"],
    ["device"],
    ["verify"],
    ["transfer", "conv3d_chain", "moves"],
    ["dlpack", "diagnostics"],
]


# Leaf files that hold data the error's variants carry, each in the module
# it belongs to: they sit in the bottom layer (the error names them) and
# must name nothing of the crate (checked).
LEAVES = [
    ("convert", "fingerprint", "value"),
    ("device", "fault_kind"),
    ("device", "visible"),
]


def layer(m):
    if tuple(m) in LEAVES:
        return 0
    top = m[0] if m else "crate"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return len(LAYERS)  # the crate root


# Inside `device`, bottom to top (ARCHITECTURE.md, "Layer order"):
# plain data, the raw interface the backends implement, the runtimes, the
# safe types, the factory that names every runtime, and `raw`'s mod.rs (the
# public face of the raw interface: its traits in raw/backend.rs and
# raw/wrap.rs, the rest re-exported; named by no file of the crate). A file
# of `device` may name files of its own inner layer or below.
DEVICE_LAYERS = [
    ["visible", "fault_kind", "info", "options", "dynlib", "hostmem", "kernel_cache"],
    ["raw::backend", "raw::op_table", "raw::wrap", "raw::conv3d", "kernels"],
    ["runtime::host", "runtime::gpu", "runtime::cuda", "runtime::hip", "runtime::vendor",
     "runtime", "faults"],
    ["buffer", "stream", "pinned", "device_handle", "conv3d_stream", "ops"],
    ["open"],
    ["raw"],
]

# The largest import cycle (strongly connected group of files) --check allows.
MAX_CYCLE = 4


def device_key(m):
    """The name DEVICE_LAYERS gives file `m` of `device`: its first two
    segments below `device` when DEVICE_LAYERS names them (a folder
    such as `runtime/` whose files sit in different inner layers), else
    its first."""
    two = "::".join(m[1:3])
    if len(m) >= 3 and any(two in names for names in DEVICE_LAYERS):
        return two
    return m[1]


def device_layer(m):
    k = device_key(m)
    for i, names in enumerate(DEVICE_LAYERS):
        if k in names:
            return i
    return None


def device_problems(files, edges):
    """Edges inside `device` that run up its inner layers, and files of
    `device` that have no inner layer."""
    out = []
    for m in sorted(files):
        if len(m) < 2 or m[0] != "device":
            continue
        lm = device_layer(m)
        if lm is None:
            out.append((name(m), "(no layer in DEVICE_LAYERS)"))
            continue
        for t in sorted(edges.get(m, ())):
            if len(t) >= 2 and t[0] == "device" and device_key(t) != device_key(m):
                lt = device_layer(t)
                if lt is not None and lt > lm:
                    out.append((name(m), name(t)))
    return out


def upward_edges(files, edges):
    out = []
    for m in sorted(files):
        for t in sorted(edges.get(m, ())):
            if m and t and m[0] != t[0] and layer(t) > layer(m):
                out.append((name(m), name(t)))
    for leaf in LEAVES:
        for t in sorted(edges.get(leaf, ())):
            out.append((name(leaf), name(t)))
    return out


def name(m):
    return "::".join(m) or "crate"


GRAPH_BEGIN = "<!-- import-graph.py --graph: begin (generated; CI checks it) -->"
GRAPH_END = "<!-- import-graph.py --graph: end -->"


def module_graph(files, edges):
    """The map ARCHITECTURE.md shows: each layer's modules and the modules
    below that they name, then device's inner layers the same way."""
    top = defaultdict(set)
    for m, ts in edges.items():
        for t in ts:
            if m and t and m[0] != t[0]:
                top[m[0]].add(t[0])
    lines = ["```", "crate layers, top first (a module names only modules of its layer or below):"]
    for i in range(len(LAYERS) - 1, -1, -1):
        for mod in LAYERS[i]:
            if not any(f and f[0] == mod for f in files):
                continue
            below = sorted(top.get(mod, ()))
            lines.append(f"  {i} {mod:<13} -> {', '.join(below) if below else '(nothing)'}")
    inner = defaultdict(set)
    for m, ts in edges.items():
        if len(m) >= 2 and m[0] == "device":
            for t in ts:
                if len(t) >= 2 and t[0] == "device" and device_key(t) != device_key(m):
                    inner[device_key(m)].add(device_key(t))
    lines.append("device's inner layers, top first:")
    for i in range(len(DEVICE_LAYERS) - 1, -1, -1):
        for mod in DEVICE_LAYERS[i]:
            if not any(len(f) >= 2 and f[0] == "device" and device_key(f) == mod for f in files):
                continue
            below = sorted(inner.get(mod, ()))
            lines.append(f"  {i} {mod:<13} -> {', '.join(below) if below else '(nothing)'}")
    comps = sccs(sorted(files), edges)
    lines.append(f"{len(files)} files, {sum(len(v) for v in edges.values())} import edges, "
                 f"largest import cycle {max((len(c) for c in comps), default=0)} files")
    lines.append("```")
    return "\n".join(lines)


def architecture_graph_problem(files, edges):
    """None when ARCHITECTURE.md holds the graph as generated, else why not."""
    path = os.path.join(ROOT, "..", "ARCHITECTURE.md")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        return f"ARCHITECTURE.md: {e}"
    if GRAPH_BEGIN not in text or GRAPH_END not in text:
        return "ARCHITECTURE.md has no generated module graph (its markers)"
    shown = text.split(GRAPH_BEGIN, 1)[1].split(GRAPH_END, 1)[0].strip()
    if shown != module_graph(files, edges).strip():
        return ("ARCHITECTURE.md's module graph is not the current one: "
                "run python3 scripts/import-graph.py --graph and paste it between the markers")
    return None


def main():
    files, edges = graph()
    if "--graph" in sys.argv:
        print(module_graph(files, edges))
        return
    if "--edges" in sys.argv:
        i = sys.argv.index("--edges")
        a, b = sys.argv[i + 1], sys.argv[i + 2]
        for m in sorted(files):
            if name(m).startswith(a):
                for t in sorted(edges.get(m, ())):
                    if name(t).startswith(b):
                        print(f"{files[m]} -> {name(t)}")
        return
    comps = sccs(sorted(files), edges)
    # top-level edges inside cycles
    top = defaultdict(set)
    for c in comps:
        cs = set(c)
        for v in c:
            for w in edges.get(v, ()):
                if w in cs and v[:1] != w[:1]:
                    top[v[0] if v else "crate"].add(w[0] if w else "crate")
    report = {
        "files": len(files),
        "edges": sum(len(v) for v in edges.values()),
        "cycles": [sorted(name(m) for m in c) for c in comps],
        "top_level_edges_in_cycles": {k: sorted(v) for k, v in sorted(top.items())},
        "upward_edges": upward_edges(files, edges),
        "device_upward_edges": device_problems(files, edges),
    }
    if "--json" in sys.argv:
        print(json.dumps(report, indent=1))
        return
    print(f"{report['files']} module files, {report['edges']} file-level import edges")
    print(f"{len(comps)} import cycle(s) (strongly connected groups of files):")
    for c in report["cycles"]:
        print(f"  {len(c)} files: " + ", ".join(c))
    print("top-level module edges inside those cycles (A -> B: a file of A names B):")
    for k, v in report["top_level_edges_in_cycles"].items():
        print(f"  {k} -> {', '.join(v)}")
    up = upward_edges(files, edges)
    print(f"{len(up)} edge(s) running upward through the layers (a file naming a module of a higher layer):")
    for a, b in up:
        print(f"  {a} -> {b}")
    dev = device_problems(files, edges)
    print(f"{len(dev)} edge(s) running up device's inner layers (DEVICE_LAYERS):")
    for a, b in dev:
        print(f"  {a} -> {b}")
    big = [c for c in report["cycles"] if len(c) > MAX_CYCLE]
    print(f"largest import cycle: {max((len(c) for c in report['cycles']), default=0)} files "
          f"(at most {MAX_CYCLE} allowed)")
    stale = architecture_graph_problem(files, edges)
    if stale:
        print(stale)
    if "--check" in sys.argv and (up or dev or big or stale):
        sys.exit(1)


if __name__ == "__main__":
    main()
