#!/usr/bin/env python3
"""Print the module and package graph of src/ from its #include "..." lines.

A module is a file name without its extension, and a header X_int.h (the
private header of module X's files) belongs to module X: ld_lock.c,
ld_lock.h and ld_lock_int.h are the module ld_lock. An edge A -> B means
some file of A includes a header of B. A package is a folder of src/;
the files at the top of src/ (main and the server that wires the
packages) form the package "top".

The packages depend in one direction, given by the order in PACKAGES:
a package may include the headers of those after it, and of no package
before it. Each line of output is a module, its package and the modules
it uses, in name order:

    ld_lock (lock): ld_common ld_conf ld_dict ...

Then every include against the order is printed, and one cycle of the
module graph when it has one:

    against the order: ld_redis (redis) includes ld_session (front)
    cycle: ld_lock -> ld_session -> ld_lock

Exit status 0: the order holds and there is no cycle; 1: it does not;
2: bad usage, or a folder missing from PACKAGES.

Headers that are not in the tree (system headers, generated files that
do not exist yet) are left out. Python 3 standard library only.
"""

import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# From the top down; keep in step with src/local.am.
PACKAGES = ["top", "lock", "sem", "cache", "rate", "bloom", "lease", "front",
            "redis", "core"]
# Generated, or not C: not packages of the daemon.
NOT_PACKAGES = {"lua"}
# Packages of one rank: they may not include each other.
# bloom sits below cache, whose cache.get asks a filter first.
RANK = {"top": 0, "lock": 1, "sem": 1, "cache": 1,
        "rate": 1, "bloom": 2, "lease": 3, "front": 4,
        "redis": 5, "core": 6}


def module_of(name):
    mod = os.path.splitext(os.path.basename(name))[0]
    if mod.endswith("_int"):
        mod = mod[:-len("_int")]
    return mod


def source_files(srcdir):
    """(package, path) of every .c and .h file of the packages."""
    out = []
    for entry in sorted(os.listdir(srcdir)):
        path = os.path.join(srcdir, entry)
        if os.path.isfile(path) and entry.endswith((".c", ".h")):
            out.append(("top", path))
        elif (os.path.isdir(path) and entry not in NOT_PACKAGES
              and not entry.startswith(".")):
            if entry not in RANK:
                raise SystemExit("include-graph: src/%s is not in PACKAGES"
                                 % entry)
            for f in sorted(os.listdir(path)):
                if f.endswith((".c", ".h")):
                    out.append((entry, os.path.join(path, f)))
    return out


def read_graph(srcdir):
    files = source_files(srcdir)
    package = {}
    for pkg, path in files:
        package[module_of(path)] = pkg
    graph = {m: set() for m in package}
    for pkg, path in files:
        mod = module_of(path)
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = INCLUDE.match(line)
                if m is None:
                    continue
                dep = module_of(m.group(1))
                if dep != mod and dep in package:
                    graph[mod].add(dep)
    return graph, package


def against_order(graph, package):
    bad = []
    for mod in sorted(graph):
        for dep in sorted(graph[mod]):
            a, b = package[mod], package[dep]
            if a != b and RANK[a] >= RANK[b]:
                bad.append((mod, a, dep, b))
    return bad


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {m: WHITE for m in graph}
    for root in sorted(graph):
        if colour[root] != WHITE:
            continue
        # Iterative depth-first search: the path is the grey stack.
        path = [root]
        colour[root] = GREY
        todo = [iter(sorted(graph[root]))]
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                todo.pop()
            elif colour[nxt] == GREY:
                return path[path.index(nxt):] + [nxt]
            elif colour[nxt] == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                todo.append(iter(sorted(graph[nxt])))
    return None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description="Print the module graph of the #include lines of src/ "
        "and fail on an include against the package order or a cycle.")
    ap.add_argument("srcdir", nargs="?",
                    default=os.path.join(here, os.pardir, "src"),
                    help="the daemon's source folder (default: src/)")
    args = ap.parse_args()
    if not os.path.isdir(args.srcdir):
        ap.error("not a directory: " + args.srcdir)

    graph, package = read_graph(args.srcdir)
    for mod in sorted(graph):
        print("%s (%s):%s" % (mod, package[mod],
                              "".join(" " + d for d in sorted(graph[mod]))))
    status = 0
    for mod, a, dep, b in against_order(graph, package):
        print("against the order: %s (%s) includes %s (%s)" % (mod, a, dep, b))
        status = 1
    cycle = find_cycle(graph)
    if cycle is not None:
        print("cycle: " + " -> ".join(cycle))
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
