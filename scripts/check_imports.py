#!/usr/bin/env python3
"""Fails on an import circle between the top-level modules of any crate in crates/.

Each crate's modules depend one way (docs/architecture.md: the layer rule); a circle, say
`port` naming `switch` while `switch` names `port`, means a type lives in the wrong module.
This reads every path a module names inside its crate (`use crate::...`, `use super::...`,
and paths such as `crate::egress::Egress` in code), outside comments, strings and test-only
code (`#[cfg(test)]` items and the files they declare), folds each onto the top-level
modules at both ends, and reports every strongly connected set of two or more, with the
lines that make each edge.

usage: scripts/check_imports.py [--graph] [CRATE_DIR...]   (default: every crates/*)
Exit status 1 if any crate has a circle not in KNOWN, or a circle in KNOWN is gone (then
delete its entry).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

# Circles that exist and have an issue to remove them: (crate dir/root file, modules).
# Reported, not failed on; each entry goes when its circle does.
KNOWN: set[tuple[str, tuple[str, ...]]] = set()


def blank(text: str, start: int, end: int) -> str:
    """Replaces text[start:end] with spaces, keeping newlines (offsets and lines hold)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def strip_code(src: str) -> str:
    """The source with comments, strings and character literals blanked out."""
    out = list(src)
    i, n = 0, len(src)

    def wipe(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif m := re.compile(r'b?r(#*)"').match(src, i):
            if i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_"):
                i += 1
                continue
            close = '"' + m.group(1)
            j = src.find(close, m.end())
            j = n if j < 0 else j + len(close)
            wipe(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            if src.startswith("\\", i + 1):
                j = src.find("'", i + 2)
                j = n if j < 0 else j + 1
            elif i + 2 < n and src[i + 2] == "'":
                j = i + 3
            else:  # a lifetime or a label
                i += 1
                continue
            wipe(i, j)
            i = j
        else:
            i += 1
    return "".join(out)


def match_brace(text: str, open_at: int) -> int:
    """Offset just past the brace closing the one at `open_at`."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


def item_end(text: str, at: int) -> int:
    """End of the item starting at `at`: its `;`, or the brace closing its body."""
    semi = text.find(";", at)
    brace = text.find("{", at)
    if brace < 0 or (0 <= semi < brace):
        return len(text) if semi < 0 else semi + 1
    return match_brace(text, brace)


CFG_TEST = re.compile(r"#\[cfg\(test\)\]")
ATTRS = re.compile(r"\s*(?:#\[[^\]]*\]\s*)*")
MOD_DECL = re.compile(rf"\b(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*([;{{])")


@dataclass
class Ref:
    target: str
    file: Path
    line: int
    text: str


@dataclass
class Crate:
    root: Path
    top: list[str] = field(default_factory=list)
    refs: dict[str, list[Ref]] = field(default_factory=dict)


def strip_tests(code: str) -> tuple[str, set[str]]:
    """Blanks every `#[cfg(test)]` item; returns the code and the test modules it declared
    out of line (their files are not read)."""
    test_mods: set[str] = set()
    while m := CFG_TEST.search(code):
        at = ATTRS.match(code, m.end()).end()
        d = MOD_DECL.match(code, at)
        if d and d.group(2) == ";":
            test_mods.add(d.group(1))
        code = blank(code, m.start(), item_end(code, at))
    return code, test_mods


def child_file(dir_: Path, name: str) -> Path | None:
    for p in (dir_ / f"{name}.rs", dir_ / name / "mod.rs"):
        if p.is_file():
            return p
    return None


def path_heads(code: str, at: int, base: list[str]) -> list[list[str]]:
    """The absolute module paths named at `at` (just past `crate::` or a run of `super::`),
    each as far as its first component under `base`: one, or one per element of a group."""
    m = re.compile(rf"\s*({IDENT})").match(code, at)
    if m:
        return [base + [m.group(1)]]
    m = re.compile(r"\s*\{").match(code, at)
    if not m:
        return []
    end = match_brace(code, m.end() - 1)
    inner, depth, heads, start = code[m.end() : end - 1], 0, [], 0
    for k, ch in enumerate(inner + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            e = re.match(rf"\s*({IDENT})", inner[start:k])
            if e and e.group(1) != "self":
                heads.append(base + [e.group(1)])
            elif e:
                heads.append(list(base))
            start = k + 1
    return heads


PATH_START = re.compile(r"(?<![A-Za-z0-9_$:])(crate\s*::|(?:super\s*::\s*)+)")


def scan(crate: Crate, file: Path, modpath: list[str], children: Path) -> None:
    src = file.read_text(encoding="utf-8")
    code, test_mods = strip_tests(strip_code(src))
    lines = src.splitlines()
    # Inline modules (not test ones: those are blank now): (start, end, their path).
    inline: list[tuple[int, int, list[str]]] = []
    for d in MOD_DECL.finditer(code):
        name = d.group(1)
        if d.group(2) == "{":
            inline.append((d.end(), match_brace(code, d.end() - 1), name))
        elif name not in test_mods and (f := child_file(children, name)):
            sub = children / name
            if not modpath:
                crate.top.append(name)
            scan(crate, f, modpath + [name], sub)
    for m in PATH_START.finditer(code):
        here = list(modpath)
        for s, e, name in inline:
            if s <= m.start() < e:
                here.append(name)
        if m.group(1).startswith("crate"):
            base: list[str] = []
        else:
            ups = m.group(1).count("super")
            if ups > len(here):
                continue
            base = here[: len(here) - ups]
        if not here:
            continue  # the crate root may name anything
        line = code.count("\n", 0, m.start()) + 1
        for p in path_heads(code, m.end(), base):
            if p and p[0] != here[0]:
                crate.refs.setdefault(here[0], []).append(
                    Ref(p[0], file, line, lines[line - 1].strip())
                )


def circles(crate: Crate) -> list[list[str]]:
    """Strongly connected sets of two or more top-level modules (Tarjan)."""
    edges = {
        a: sorted({r.target for r in rs if r.target in crate.top})
        for a, rs in crate.refs.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, []):
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(crate.top):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("crates", nargs="*", type=Path)
    ap.add_argument("--graph", action="store_true", help="print each crate's module edges")
    a = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    dirs = a.crates or sorted(p for p in (repo / "crates").iterdir() if (p / "src").is_dir())
    failed = 0
    for d in dirs:
        for root in (d / "src" / "lib.rs", d / "src" / "main.rs"):
            if not root.is_file():
                continue
            crate = Crate(root)
            scan(crate, root, [], root.parent)
            name = f"{d.name}/{root.name}"
            if a.graph:
                for m in sorted(crate.refs):
                    ts = sorted({r.target for r in crate.refs[m] if r.target in crate.top})
                    print(f"{name}: {m} -> {', '.join(ts)}")
            found = circles(crate)
            for key in sorted(k for k in KNOWN if k[0] == name):
                if list(key[1]) not in found:
                    failed += 1
                    print(f"{name}: the known circle {', '.join(key[1])} is gone: delete it from KNOWN")
            for comp in found:
                if (name, tuple(comp)) in KNOWN:
                    print(f"{name}: known import circle between {', '.join(comp)} (see KNOWN)")
                    continue
                failed += 1
                print(f"{name}: import circle between modules {', '.join(comp)}:")
                for m in comp:
                    for r in crate.refs.get(m, []):
                        if r.target in comp:
                            rel = r.file.relative_to(repo) if r.file.is_relative_to(repo) else r.file
                            print(f"  {m} -> {r.target}  {rel}:{r.line}: {r.text}")
    if failed:
        print(f"{failed} import check failure(s): move what both name down to a module below both")
        return 1
    known = sum(1 for k in KNOWN if any(k[0].startswith(f"{d.name}/") for d in dirs))
    print(f"no new import circle between the modules of {len(dirs)} crate(s) ({known} known)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
