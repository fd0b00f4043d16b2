#!/usr/bin/env python3
"""Doxygen input filter for Markdown: GitHub's math ($...$, $$...$$) to Doxygen's
(\\f$...\\f$, \\f[...\\f]), so one set of notes renders on GitHub and in the HTML
docs alike. Code blocks and code spans are left alone.

  FILTER_PATTERNS = *.md="python3 tools/docs/md_math.py"
"""
import re
import sys

SPAN = re.compile(r"(`[^`]*`)|\$\$(.+?)\$\$|\$([^$\n]+?)\$")


def convert(line):
    def sub(m):
        if m.group(1):
            return m.group(1)
        if m.group(2) is not None:
            return r"\f[" + m.group(2) + r"\f]"
        return r"\f$" + m.group(3) + r"\f$"
    return SPAN.sub(sub, line)


def main():
    text = open(sys.argv[1], encoding="utf-8").read().split("\n")
    out, fence, display = [], False, False
    for line in text:
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = not fence
            out.append(line)
        elif fence:
            out.append(line)
        elif not display and stripped.startswith("$$") and stripped.endswith("$$") and len(stripped) > 4:
            out.append(r"\f[" + stripped[2:-2] + r"\f]")
        elif not display and stripped.startswith("$$"):  # a display formula over several lines
            display = True
            out.append(r"\f[" + stripped[2:])
        elif display:
            if stripped.endswith("$$"):
                display = False
                out.append(stripped[:-2] + r"\f]")
            else:
                out.append(line)
        else:
            out.append(convert(line))
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
