"""The module graph is the one CMakeLists.txt declares: every `#include "mixtrain/<module>/..."`
in src/mixtrain/<m>/ names <m> itself or a module <m> depends on (transitively) through its
`mixtrain_module(<m> <deps>...)` line. The modules share one include directory, so only this
test keeps a header include from reaching up the layering (the linker would not notice one that
needs no symbol).

Usage: python3 module_layering_test.py <source dir>. Exit 1 listing every violation."""
import pathlib
import re
import sys


def declared_graph(cmake_text):
    graph = {}
    for name, deps in re.findall(r"^mixtrain_module\((\w+)([^)]*)\)", cmake_text, re.M):
        graph[name] = [d[len("mixtrain_"):] for d in deps.split() if d.startswith("mixtrain_")]
    return graph


def closure(graph, module):
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(graph.get(m, []))
    return seen


def main():
    root = pathlib.Path(sys.argv[1])
    graph = declared_graph((root / "CMakeLists.txt").read_text())
    if len(graph) < 5:
        print(f"found only {len(graph)} mixtrain_module lines in CMakeLists.txt")
        return 1
    include = re.compile(r'^\s*#\s*include\s+"mixtrain/(\w+)/', re.M)
    violations, checked = [], 0
    for module in sorted(graph):
        allowed = closure(graph, module)
        for path in sorted((root / "src" / "mixtrain" / module).rglob("*")):
            if path.suffix not in (".h", ".cpp"):
                continue
            for target in include.findall(path.read_text()):
                checked += 1
                if target not in allowed:
                    violations.append(f"{path.relative_to(root)}: includes mixtrain/{target}/, "
                                      f"but {module} depends only on {sorted(allowed - {module})}")
    for v in violations:
        print(v)
    print(f"{checked} project includes checked in {len(graph)} modules, {len(violations)} "
          "against the declared graph")
    return 1 if violations or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
