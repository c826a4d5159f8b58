#!/usr/bin/env python3
"""Per-kernel SASS comparison of two builds of the selkv library (for "no behaviour change" edits).

    cmake -S <tree> -B <dir> -G Ninja -DSELKV_BUILD_TORCH=OFF -DSELKV_BUILD_TESTS=OFF \\
        -DSELKV_BUILD_CLI=OFF && cmake --build <dir> -j2 --target selkv    # for both trees
    scripts/sass_diff.py <base build dir> <new build dir> [--cuobjdump PATH]

For every CUDA object of the selkv target present in both builds, the kernels' instruction text
(addresses and encodings dropped) is compared. Kernels are paired by name, and kernels whose
mangled name changed (a template parameter renamed or retyped) by identical instruction text, so
a renaming refactor still reads as identical (kernels in anonymous namespaces show up as renamed
when the two trees sit at different paths: the namespace's name hashes the source path). Exit
status 1 if any object differs.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import re
import subprocess
import sys

# Instruction lines: "/*<address of any width>*/  <text> ;  /* <encoding> */".
_INSN = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;?\s*/\*")
_FUNC = re.compile(r"^\s*Function : (\S+)")
_ARCH = re.compile(r"arch = (sm_\w+)")


def kernels(cuobjdump: str, obj: str) -> dict[tuple[str, str], list[str]]:
    out = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
    res: dict[tuple[str, str], list[str]] = {}
    cur = None
    arch = ""
    for line in out.splitlines():
        m = _ARCH.search(line)
        if m:
            arch = m.group(1)
        m = _FUNC.match(line)
        if m:
            cur = (arch, m.group(1))
            res[cur] = []
            continue
        m = _INSN.match(line)
        if cur is not None and m:
            res[cur].append(m.group(1))
    return res


def objects(build: str) -> dict[str, str]:
    root = os.path.join(build, "CMakeFiles", "selkv.dir")
    found = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".cu.o"):
                path = os.path.join(d, f)
                found[os.path.relpath(path, root)] = path
    return found


def digest(lines: list[str]) -> str:
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--cuobjdump", default=os.environ.get("CUOBJDUMP", "cuobjdump"))
    args = ap.parse_args()
    ob, on = objects(args.base), objects(args.new)
    bad = 0
    for rel in sorted(set(ob) | set(on)):
        if rel not in ob or rel not in on:
            print(f"ONLY IN {'base' if rel in ob else 'new'}: {rel}")
            bad += 1
            continue
        kb, kn = kernels(args.cuobjdump, ob[rel]), kernels(args.cuobjdump, on[rel])
        unmatched_b = {k: digest(v) for k, v in kb.items() if kn.get(k) != v}
        unmatched_n = {k: digest(v) for k, v in kn.items() if kb.get(k) != v}
        # Renamed kernels: pair the leftovers by identical instruction text.
        left_n = collections.Counter(unmatched_n.values())
        renamed, differ = [], []
        for k, h in unmatched_b.items():
            if left_n[h] > 0:
                left_n[h] -= 1
                renamed.append(k)
            else:
                differ.append(k)
        extra = sum(left_n.values())
        insns = sum(len(v) for v in kb.values())
        ok = not differ and extra == 0
        bad += 0 if ok else 1
        note = f", {len(renamed)} renamed" if renamed else ""
        print(f"{'same' if ok else 'DIFF'} {rel}: {len(kb)} kernels, {insns} instructions{note}")
        for arch, name in differ:
            print(f"    differs: {arch} {name}")
        if extra:
            print(f"    {extra} kernel(s) of the new build without an identical base kernel")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
