#!/usr/bin/env python3
"""Print the shape of the C in the given folders (default: src): function
lengths and comment density, the numbers a consolidation is judged by.

    scripts/code-stats.py [--list N] [DIR...]

Function lengths come from ctags (universal-ctags, as Debian ships it:
a function's first to last line, both counted). Comment density is the
comment lines (a line with any part of a comment) per non-blank line of
the .c files. Generated files (ld_lua.c) are left out. Python 3 standard
library only.
"""

import argparse
import os
import statistics
import subprocess
import sys


def c_files(dirs):
    out = []
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs[:] = sorted(s for s in subdirs if not s.startswith("."))
            for f in sorted(files):
                if f.endswith(".c") and f != "ld_lua.c":
                    out.append(os.path.join(root, f))
    return out


def function_lengths(files):
    res = subprocess.run(
        ["ctags", "-f", "-", "--languages=C", "--kinds-C=f",
         "--fields=+ne"] + files, capture_output=True, text=True, check=True)
    out = []
    for line in res.stdout.splitlines():
        cols = line.split("\t")
        fields = dict(c.split(":", 1) for c in cols[3:] if ":" in c)
        if "line" in fields and "end" in fields:
            n = int(fields["end"]) - int(fields["line"]) + 1
            out.append((n, cols[1], cols[0]))
    return sorted(out, reverse=True)


def comment_density(files):
    comment = nonblank = 0
    for path in files:
        in_block = False
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                s = line.strip()
                if not s:
                    continue
                nonblank += 1
                has = in_block
                i = 0
                in_str = None
                while i < len(s):
                    two = s[i:i + 2]
                    if in_block:
                        if two == "*/":
                            in_block = False
                            i += 2
                            continue
                    elif in_str is not None:
                        if s[i] == "\\":
                            i += 2
                            continue
                        if s[i] == in_str:
                            in_str = None
                    elif s[i] in "\"'":
                        in_str = s[i]
                    elif two == "/*":
                        in_block = has = True
                        i += 2
                        continue
                    elif two == "//":
                        has = True
                        break
                    i += 1
                comment += has
    return comment, nonblank


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", type=int, default=10,
                    help="how many of the longest functions to list")
    ap.add_argument("dirs", nargs="*", default=["src"])
    args = ap.parse_args()
    files = c_files(args.dirs)
    if not files:
        print("code-stats: no .c files", file=sys.stderr)
        return 2
    fns = function_lengths(files)
    lens = [n for n, _, _ in fns]
    c, nb = comment_density(files)
    print("files: %d .c, functions: %d, median length: %d"
          % (len(files), len(fns), statistics.median(lens)))
    print("over 50 lines: %d (%.1f%%), over 100: %d"
          % (sum(n > 50 for n in lens), 100.0 * sum(n > 50 for n in lens)
             / len(lens), sum(n > 100 for n in lens)))
    print("comment lines per non-blank line of .c: %.3f (%d / %d)"
          % (c / nb, c, nb))
    for n, path, name in fns[:args.list]:
        print("%5d  %s  %s" % (n, path, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
