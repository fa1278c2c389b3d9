#!/usr/bin/env python3
"""Which translation units include a project header, directly or through other headers.

Usage: scripts/header_reach.py [--root DIR] HEADER...   (HEADER as included: mixtrain/optim/muon.h)
Prints, per header, the number of .cpp/.cu files under src/, tests/ and bench/ that reach it
(what an edit to it recompiles, unity batching aside), split by top folder. Only the project's
own #include "..." lines are followed (include dirs src/ and tests/).
"""
import argparse
import collections
import os
import re

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("headers", nargs="+")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    search = [os.path.join(root, "src"), os.path.join(root, "tests"), root]

    def resolve(name, here):
        for base in [here] + search:
            path = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(path):
                return path
        return None

    edges = {}

    def includes(path):
        if path not in edges:
            with open(path, errors="replace") as f:
                text = f.read()
            found = (resolve(n, os.path.dirname(path)) for n in INCLUDE.findall(text))
            edges[path] = [p for p in found if p]
        return edges[path]

    units = []
    for top in ("src", "tests", "bench"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            units += [os.path.join(dirpath, f) for f in files if f.endswith((".cpp", ".cu"))]

    def reach(path):
        seen, stack = set(), [path]
        while stack:
            for dep in includes(stack.pop()):
                if dep not in seen:
                    seen.add(dep)
                    stack.append(dep)
        return seen

    closures = {u: reach(u) for u in units}
    for header in args.headers:
        target = os.path.normpath(os.path.join(root, "src", header))
        hit = [u for u in units if target in closures[u] or u == target]
        by_top = collections.Counter(os.path.relpath(u, root).split(os.sep)[0] for u in hit)
        print(f"{header}: {len(hit)} of {len(units)} units ({dict(sorted(by_top.items()))})")


if __name__ == "__main__":
    main()
