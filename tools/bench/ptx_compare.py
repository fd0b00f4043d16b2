#!/usr/bin/env python3
"""The kernels of two PTX folders (tools/bench/ptx_of.sh) compared, modulo mangled names,
block labels and line information: for each kernel of NEW, the kernels of BASE whose PTX is
identical, or DIFFERENT.
  python3 tools/bench/ptx_compare.py BASE_DIR NEW_DIR"""
import hashlib, re, subprocess, sys, glob, os

def entries(objdir):
    out = {}
    for o in sorted(glob.glob(os.path.join(objdir, "*.ptx"))):
        ptx = open(o).read()
        # split on .entry / .func
        blocks = re.split(r"\n(?=(?:\.visible |\.weak |)\.(?:entry|func) )", ptx)
        for b in blocks[1:]:
            m = re.match(r"(?:\.visible |\.weak |)\.(entry|func) (?:\([^)]*\) )?(\S+?)\(", b)
            if not m: continue
            name = m.group(2)
            body = b.replace(name, "NAME")
            body = re.sub(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}", "ANON", body)  # the anonymous namespace's hash
            body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)  # block labels carry the function's index
            body = re.sub(r"\$L__(func_begin|func_end|tmp)\d+", r"$L__\1", body)
            lines = []
            for ln in body.split("\n"):
                s = ln.strip()
                if s.startswith(".loc") or s.startswith(".file") or s.startswith("//") or not s: continue
                lines.append(s)
            # cut at the end of the function (first line '}' at column 0 of the block)
            text = "\n".join(lines)
            dem = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
            out[dem] = (os.path.basename(o), hashlib.sha1(text.encode()).hexdigest(), text)
    return out

def trim(text):  # drop anything after the function's closing brace (global decls of the next)
    depth = 0; keep = []
    for ln in text.split("\n"):
        keep.append(ln)
        depth += ln.count("{") - ln.count("}")
        if ln == "}" and depth == 0: break
    return "\n".join(keep)

base, new = entries(sys.argv[1]), entries(sys.argv[2])
bh = {}
for k, (o, h, t) in base.items():
    bh.setdefault(hashlib.sha1(trim(t).encode()).hexdigest(), []).append(k)
same = diff = 0
for k, (o, h, t) in sorted(new.items()):
    hh = hashlib.sha1(trim(t).encode()).hexdigest()
    m = bh.get(hh)
    if m: same += 1; print(f"IDENTICAL  {k}\n           = {' | '.join(m)}")
    else: diff += 1; print(f"DIFFERENT  {k}   ({o})")
print(f"{same} identical, {diff} without an identical baseline kernel")
