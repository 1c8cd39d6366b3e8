#!/usr/bin/env python3
"""Fails on a production function over 100 lines or a source file over 900 lines of code.

A long function holds several steps without names; a long file holds several concerns (the
style note: split early). This reads every module a crate in crates/ compiles (from
`src/lib.rs` and `src/main.rs`, following `mod` declarations), outside test-only code
(`#[cfg(test)]` items and the files they declare: tests, benches and examples are not read).

* a function's length is its lines from the one naming it (`fn name`) to its closing brace,
  blank lines and comments included: what a reader scrolls through;
* a file's size is its lines of code: lines with something left once comments, doc comments
  and test-only items are blanked.

usage: scripts/check_sizes.py [--fn-max N] [--file-max N] [CRATE_DIR...]
       (default: every crates/*, 100 and 900)
Exit status 1 if any function or file is over its bound.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# The comment and test stripping is the import check's: one reading of a Rust file.
from check_imports import IDENT, MOD_DECL, child_file, match_brace, strip_code, strip_tests

FN = re.compile(rf"\bfn\s+({IDENT})")
IMPL = re.compile(r"\bimpl\b")


@dataclass
class Long:
    file: Path
    line: int
    name: str
    lines: int


def body_span(code: str, at: int) -> tuple[int, int] | None:
    """The offsets of the body of the function whose name ends at `at`: its opening brace and
    just past its closing one; None for a declaration without a body (`fn f();`)."""
    depth = 0
    for k in range(at, len(code)):
        ch = code[k]
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            # `->` is not a closing angle bracket.
            if not (ch == ">" and k > 0 and code[k - 1] == "-"):
                depth -= 1
        elif ch == ";" and depth <= 0:
            return None
        elif ch == "{" and depth <= 0:
            return k, match_brace(code, k)
    return None


def owner(code: str, at: int) -> str:
    """The type of the `impl` block around offset `at`, or "" at module level."""
    best, best_start = "", -1
    for m in IMPL.finditer(code, 0, at):
        brace = code.find("{", m.end())
        if brace < 0 or brace > at or match_brace(code, brace) <= at or m.start() < best_start:
            continue
        head = " ".join(code[m.end() : brace].split())
        # `impl<T> Trait for Type<T> where ...` names Type; `impl Type` names Type.
        head = re.sub(r"^<.*?>\s*", "", head).split(" where ")[0]
        head = head.split(" for ")[-1]
        best, best_start = re.sub(r"<.*", "", head).strip(), m.start()
    return best


def scan(
    file: Path, children: Path, fn_max: int, longs: list[Long], sizes: dict[Path, int]
) -> None:
    src = file.read_text(encoding="utf-8")
    code, test_mods = strip_tests(strip_code(src))
    sizes[file] = sum(1 for line in code.splitlines() if line.strip())
    for m in FN.finditer(code):
        span = body_span(code, m.end())
        if span is None:
            continue
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, span[1] - 1) + 1
        if last - first + 1 > fn_max:
            ty = owner(code, m.start())
            name = f"{ty}::{m.group(1)}" if ty else m.group(1)
            longs.append(Long(file, first, name, last - first + 1))
    for d in MOD_DECL.finditer(code):
        name = d.group(1)
        if d.group(2) == ";" and name not in test_mods and (f := child_file(children, name)):
            scan(f, children / name, fn_max, longs, sizes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("crates", nargs="*", type=Path)
    ap.add_argument("--fn-max", type=int, default=100, help="most lines in a function")
    ap.add_argument("--file-max", type=int, default=900, help="most lines of code in a file")
    a = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent

    def rel(p: Path) -> Path:
        return p.relative_to(repo) if p.is_relative_to(repo) else p

    dirs = a.crates or sorted(p for p in (repo / "crates").iterdir() if (p / "src").is_dir())
    longs: list[Long] = []
    sizes: dict[Path, int] = {}
    for d in dirs:
        for root in (d / "src" / "lib.rs", d / "src" / "main.rs"):
            if root.is_file():
                # Inline modules' out-of-line children: `mod a { mod b; }` is rare enough in
                # this tree that only declarations at a file's top level are followed.
                scan(root.resolve(), root.parent.resolve(), a.fn_max, longs, sizes)
    for f in longs:
        print(f"{rel(f.file)}:{f.line}: fn {f.name} is {f.lines} lines (most {a.fn_max})")
    big = sorted((p, n) for p, n in sizes.items() if n > a.file_max)
    for p, n in big:
        print(f"{rel(p)}: {n} lines of code outside tests (most {a.file_max})")
    if longs or big:
        print(
            f"{len(longs)} function(s) over {a.fn_max} lines, {len(big)} file(s) over "
            f"{a.file_max} lines of code: split them into named steps or modules"
        )
        return 1
    print(
        f"no function over {a.fn_max} lines and no file over {a.file_max} lines of code "
        f"in {len(sizes)} file(s) of {len(dirs)} crate(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
