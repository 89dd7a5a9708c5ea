#!/usr/bin/env python3
"""Print the module graph of src/ from its #include "..." lines.

A module is a file name without its extension: ld_lock.c and ld_lock.h
are the module ld_lock, and an edge A -> B means some file of A includes
B's header. Each line of output is a module and the modules it uses, in
name order:

    ld_lock: ld_common ld_conf ld_dict ...

Then, when the graph has cycles (A uses B, and B, perhaps through
others, uses A), one of them is printed and the exit status is 1:

    cycle: ld_lock -> ld_session -> ld_lock

Exit status 0: no cycle; 1: a cycle; 2: bad usage.

Headers that are not in the directory (system headers, generated files
that do not exist yet) are left out. Python 3 standard library only.
"""

import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(name):
    return os.path.splitext(os.path.basename(name))[0]


def read_graph(srcdir):
    files = sorted(
        f for f in os.listdir(srcdir)
        if f.endswith((".c", ".h")) and os.path.isfile(os.path.join(srcdir, f))
    )
    present = {module_of(f) for f in files}
    graph = {m: set() for m in present}
    for f in files:
        mod = module_of(f)
        with open(os.path.join(srcdir, f), encoding="utf-8",
                  errors="replace") as fh:
            for line in fh:
                m = INCLUDE.match(line)
                if m is None:
                    continue
                dep = module_of(m.group(1))
                if dep != mod and dep in present:
                    graph[mod].add(dep)
    return graph


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
        description="Print the module graph of the #include lines of a "
        "directory and fail on a cycle.")
    ap.add_argument("srcdir", nargs="?",
                    default=os.path.join(here, os.pardir, "src"),
                    help="directory of .c and .h files (default: src/)")
    args = ap.parse_args()
    if not os.path.isdir(args.srcdir):
        ap.error("not a directory: " + args.srcdir)

    graph = read_graph(args.srcdir)
    for mod in sorted(graph):
        print(mod + ":" + "".join(" " + d for d in sorted(graph[mod])))
    cycle = find_cycle(graph)
    if cycle is not None:
        print("cycle: " + " -> ".join(cycle))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
