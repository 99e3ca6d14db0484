#!/usr/bin/env python3
"""Fails when a tracked text file cites a repository file or doc heading that does not exist.

usage: python3 scripts/check-doc-refs.py [--self-test]

Scans the files `git ls-files` lists with the extensions below (and
.ci/run) for:

- repository paths: `src/...`, `tests/...`, `benches/...`, `examples/...`,
  `scripts/...`, `python/...`, `docs/...`, `kernels/...`, `tools/...`,
  `fuzz/...`, `.ci/...` (also `../`-relative ones). A path is found when it
  exists from the repository root, from the citing file's folder or from any
  folder between the two. Globs (`docs/*.md`) must match something;
  templates (`src/device/<name>.rs`) need the folder before the placeholder.
  A path written after a commit (`848140d:scripts/pin-probe.py`, git's
  revision syntax) is a reference into history and is not checked;
- bare Markdown file names (`DESIGN.md`, `BENCHMARKS.md`): found from the
  root, the citing file's folder or a folder between;
- headings: `BENCHMARKS.md, "Heading"` or `README, "Heading"` (also
  across comment line breaks,
  and `..., "Second" and "Third"`), `FILE.md#anchor`, Markdown links
  `[text](path#anchor)` and `[text](#anchor)`. A quoted heading matches a
  heading of that file that it equals or begins (case and Markdown
  emphasis ignored); an anchor is GitHub's slug of a heading.

Prints every broken reference as `file:line: what`, and exits 1 if there is
any; exits 0 with a one-line summary otherwise. Exceptions are listed in
ALLOW below, each with its reason. `--self-test` runs the check on a small
repository with known broken references and exits 1 unless exactly those
are reported.
"""
import fnmatch
import os
import re
import subprocess
import sys

EXTS = (".rs", ".md", ".py", ".toml", ".sh", ".hip", ".h", ".c", ".cu", ".cpp")
EXTRA_FILES = (".ci/run",)
TOP_DIRS = ("src", "tests", "benches", "examples", "scripts", "python", "docs",
            "kernels", "tools", "fuzz", ".ci")

# (file, referenced text) -> why it is not a broken reference. Keep it short.
ALLOW = {
    # A file of the hip-runtime-sys crate (the bindings the script reads),
    # not of this repository.
    ("scripts/hip-api-facts.py", "src/bindings.rs"): "a path inside another crate",
    # The safetensors sdist's folders and test ids (its suite, run from a
    # temporary folder), and the small suite the plugin's tests make.
    ("python/compat/run-upstream-suite.sh", "tests/data/"): "the sdist's folder",
    ("python/tests/test_upstream_plugin.py", "tests/test_fake.py"): "a suite made in a temporary folder",
    ("python/tests/test_upstream_plugin.py", "tests/test_"): "test ids of the sdist's suite",
}

PATH_RE = re.compile(
    r"(?<![\w./-])((?:\.\./)+|\./)?((?:%s)/[\w./*<>{}-]*)" % "|".join(re.escape(d) for d in TOP_DIRS)
)
REV_RE = re.compile(r"[0-9a-f]{7,40}:$")
BARE_MD_RE = re.compile(r"(?<![\w./-])([A-Za-z][\w-]*\.md)\b")
HEADING_CITE_RE = re.compile(r"([\w./-]*\.md|\b[A-Z][A-Z_]{2,}),\s+\"([^\"]+)\"((?:(?:,|\s+and)\s+\"[^\"]+\")*)")
AND_RE = re.compile(r"\"([^\"]+)\"")
ANCHOR_RE = re.compile(r"(?<![\w/])([\w./-]*\.md)#([\w-]+)")
MD_LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
COMMENT_LEAD_RE = re.compile(r"^\s*(?://[/!]?|#!?|\*|--|;)?\s?")


class Tree:
    """The tracked files and their folders: what a clean clone has."""

    def __init__(self, root):
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True,
                             capture_output=True).stdout.decode()
        self.files = {f for f in out.split("\0") if f and os.path.isfile(os.path.join(root, f))}
        self.dirs = {""}
        for f in self.files:
            d = os.path.dirname(f)
            while d not in self.dirs:
                self.dirs.add(d)
                d = os.path.dirname(d)

    def scanned(self):
        # Not this script: its usage text and self-test cite missing files on purpose.
        return sorted(f for f in self.files if (f.endswith(EXTS) or f in EXTRA_FILES)
                      and f != "scripts/check-doc-refs.py")

    def exists(self, rel_path):
        """Whether a tracked file or folder is at `rel_path` (a glob matches one; a
        template's folder before its first placeholder exists)."""
        p = os.path.normpath(rel_path)
        if p.startswith(".."):
            return False
        if re.search(r"[<{]", p):
            head = re.split(r"[<{]", p, 1)[0]
            return os.path.dirname(head) in self.dirs
        if "*" in p:
            return any(fnmatch.fnmatchcase(f, p) for f in self.files)
        return p in self.files or p in self.dirs


def strip_md(text):
    return re.sub(r"[`*_]", "", text).strip()


def slug(heading):
    s = strip_md(heading).lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


class Headings:
    def __init__(self, root):
        self.root = root
        self.cache = {}

    def of(self, path):
        """Headings of a Markdown file (repository-relative path), outside code blocks."""
        if path not in self.cache:
            heads = []
            fence = False
            try:
                with open(os.path.join(self.root, path), encoding="utf-8") as f:
                    for line in f:
                        if line.lstrip().startswith("```"):
                            fence = not fence
                        elif not fence and re.match(r"#{1,6} ", line):
                            heads.append(line.lstrip("#").strip())
            except OSError:
                heads = None
            self.cache[path] = heads
        return self.cache[path]

    def anchors(self, path):
        heads = self.of(path)
        if heads is None:
            return None
        seen, out = {}, set()
        for h in heads:
            s = slug(h)
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
        return out


def candidates(src_file, rel):
    """Where `rel`, cited in `src_file`, may live: the root, the file's folder, folders between."""
    d = os.path.dirname(src_file)
    dirs = [d]
    while d:
        d = os.path.dirname(d)
        dirs.append(d)
    return [os.path.normpath(os.path.join(x, rel)) for x in dirs]


def resolve_md(tree, src_file, name):
    """The repository path of a cited Markdown file, or None."""
    if name.startswith(("../", "./")):
        p = os.path.normpath(os.path.join(os.path.dirname(src_file), name))
        return p if p in tree.files else None
    for c in candidates(src_file, name):
        if c in tree.files:
            return c
    return None


def flatten(text):
    """The text with line breaks (and comment leaders after them) turned into
    spaces, and a map from each offset of it back to a line number."""
    out, lines = [], []
    for n, line in enumerate(text.split("\n"), 1):
        body = line if n == 1 else COMMENT_LEAD_RE.sub("", line, 1)
        if n > 1:
            out.append(" ")
            lines.append(n)
        out.append(body)
        lines.extend([n] * len(body))
    return "".join(out), lines


def check_file(root, tree, f, heads, problems):
    try:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return 0
    refs = 0

    def bad(line, what, ref):
        if (f, ref) not in ALLOW:
            problems.append(f"{f}:{line}: {what}")

    for n, line in enumerate(text.split("\n"), 1):
        for m in PATH_RE.finditer(line):
            prefix, p = m.group(1) or "", m.group(2).rstrip(".,:;`'\")")
            before = line[: m.start()]
            if REV_RE.search(before):
                continue  # commit:path, a file in git history
            refs += 1
            if prefix.startswith(".."):
                rel = os.path.normpath(os.path.join(os.path.dirname(f), prefix + p))
                ok = tree.exists(rel)
            else:
                ok = any(tree.exists(c) for c in candidates(f, p))
            if not ok:
                bad(n, f"no such file or folder: {prefix}{p}", p)
        for m in BARE_MD_RE.finditer(line):
            if REV_RE.search(line[: m.start()]):
                continue
            refs += 1
            if resolve_md(tree, f, m.group(1)) is None:
                bad(n, f"no such Markdown file: {m.group(1)}", m.group(1))

    flat, line_of = flatten(text)
    for m in HEADING_CITE_RE.finditer(flat):
        name = m.group(1) if m.group(1).endswith(".md") else m.group(1) + ".md"
        md = resolve_md(tree, f, name)
        if md is None:
            continue  # reported above as a missing file
        cited = [m.group(2)] + AND_RE.findall(m.group(3) or "")
        known = [strip_md(h).lower() for h in heads.of(md) or []]
        for c in cited:
            refs += 1
            c_norm = re.sub(r"\s+", " ", strip_md(c)).lower()
            if not any(h == c_norm or h.startswith(c_norm) for h in known):
                bad(line_of[m.start()], f"no heading \"{c}\" in {md}", c)
    for m in ANCHOR_RE.finditer(flat):
        md = resolve_md(tree, f, m.group(1))
        if md is None:
            continue
        refs += 1
        if m.group(2) not in (heads.anchors(md) or set()):
            bad(line_of[m.start()], f"no anchor #{m.group(2)} in {md}", m.group(2))
    if f.endswith(".md"):
        for m in MD_LINK_RE.finditer(flat):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("crate"):
                continue  # a URL, or a rustdoc link
            path, _, anchor = target.partition("#")
            n = line_of[m.start()]
            refs += 1
            if not path:
                if anchor not in (heads.anchors(f) or set()):
                    bad(n, f"no anchor #{anchor} in {f}", anchor)
                continue
            if PATH_RE.fullmatch(path) or BARE_MD_RE.fullmatch(path):
                continue  # checked by the path and bare-name rules above
            rel = os.path.normpath(os.path.join(os.path.dirname(f), path))
            if not tree.exists(rel):
                bad(n, f"link to a missing file: {target}", target)
    return refs


def check_tree(root):
    """(broken references as "file:line: what", references checked, files scanned)."""
    heads = Headings(root)
    tree = Tree(root)
    problems, refs = [], 0
    files = tree.scanned()
    for f in files:
        refs += check_file(root, tree, f, heads, problems)
    return problems, refs, len(files)


SELF_TEST_FILES = {
    "README.md": "# Top\n\n## Contracts list\n\n[ok](docs/a.md) [bad](docs/missing.md)\n"
                 "[ok](#top) [bad](#nowhere) [ok](docs/a.md#the-a-section-2026)\n",
    "docs/a.md": "# The `A` section, 2026\n\n[up](../README.md) [bad](../GONE.md)\n"
                 "[bad](../README.md#gone)\n```\n# not a heading\n```\n",
    "src/lib.rs": "//! See README.md, \"Contracts\" and docs/a.md, \"The A\n"
                  "//! section\" (both found), README.md, \"not a heading\", \"Top\" and\n"
                  "//! \"Missing\"; README, \"Top\"; README, \"Gone\"; DESIGN.md; src/gone.rs; 848140d:src/gone.rs (history);\n"
                  "//! src/*.rs; src/<name>.rs; src/nope/<name>.rs; docs/*.txt; docs/a.md#bad-anchor\n"
                  "#[path = \"../tests/t.rs\"] mod t; // ../tests/none.rs\n",
    "tests/t.rs": "// src/lib.rs (from the root), ../src/lib.rs\n",
    "python/src/lib.rs": "// src/lib.rs exists as python/src/lib.rs and as the root's; src/only_root.rs\n",
}
SELF_TEST_EXPECTED = [
    "README.md:5: no such file or folder: docs/missing.md",
    "README.md:6: no anchor #nowhere in README.md",
    "docs/a.md:3: link to a missing file: ../GONE.md",
    "docs/a.md:4: no anchor #gone in README.md",
    "src/lib.rs:3: no such Markdown file: DESIGN.md",
    "src/lib.rs:3: no such file or folder: src/gone.rs",
    "src/lib.rs:2: no heading \"not a heading\" in README.md",
    "src/lib.rs:2: no heading \"Missing\" in README.md",
    "src/lib.rs:3: no heading \"Gone\" in README.md",
    "src/lib.rs:4: no anchor #bad-anchor in docs/a.md",
    "src/lib.rs:4: no such file or folder: src/nope/<name>.rs",
    "src/lib.rs:4: no such file or folder: docs/*.txt",
    "src/lib.rs:5: no such file or folder: ../tests/none.rs",
    "python/src/lib.rs:1: no such file or folder: src/only_root.rs",
]


def self_test():
    """Runs the check on a small repository with known broken references."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        for path, text in SELF_TEST_FILES.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "."], cwd=root, check=True)
        problems, refs, _ = check_tree(root)
    missing = [p for p in SELF_TEST_EXPECTED if p not in problems]
    extra = [p for p in problems if p not in SELF_TEST_EXPECTED]
    for p in missing:
        print(f"self-test: not reported: {p}")
    for p in extra:
        print(f"self-test: reported wrongly: {p}")
    if missing or extra:
        return 1
    print(f"check-doc-refs self-test: {len(problems)} broken of {refs} references found as expected")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                          capture_output=True, text=True).stdout.strip()
    problems, refs, files = check_tree(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check-doc-refs: {len(problems)} broken reference(s) in {files} files. "
              "Each line above is FILE:LINE: what was cited and not found. Fix the citation "
              "(the file moved: cite its new path; a heading changed: cite the new heading), "
              "cite a removed file at a commit (COMMIT:path), or add a genuine exception to "
              "ALLOW in scripts/check-doc-refs.py with its reason.")
        return 1
    print(f"check-doc-refs: {refs} references in {files} files, all found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
