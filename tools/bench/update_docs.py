#!/usr/bin/env python3
"""Rewrites the measured tables in README.md and notes/*.md from a results folder, so that no figure in them is typed
by hand. Standard library only.

  python3 tools/bench/update_docs.py [DATA [FILE...]]

DATA defaults to notes/results/h200; FILE to README.md, notes/*.md and notes/lab/*.md. A table lives between two
markers in a Markdown file:

  <!-- fa:table NAME -->  ...generated...  <!-- /fa:table -->

NAME is one of the tables in tools/bench/docs/tables.py. An unknown NAME, a marker left open, a marker in the lab
(whose tables are frozen text), a missing data file, or a commit hash in what a table would show is an error: one
line naming the file and the table, exit status 2, and no file written. Files without markers are left as they are.
"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from docs.data import ROOT, Data, rel  # noqa: E402
from docs.tables import TABLES  # noqa: E402

OPEN = re.compile(r"<!-- fa:table (\S+) -->")
MARK = re.compile(r"(<!-- fa:table (\S+) -->\n)(.*?)(<!-- /fa:table -->)", re.S)
HASH = re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z])")


class Refused(Exception):
    pass


def render(D, path, name):
    """The lines of table `name` for the file at `path` (links made relative to notes/ for the notes)."""
    if name not in TABLES:
        raise Refused(f"unknown table '{name}'")
    try:
        body = TABLES[name](D)
    except (OSError, KeyError, ValueError, IndexError, ZeroDivisionError) as e:
        raise Refused(f"table '{name}': {type(e).__name__}: {e}") from None
    bad = [m.group(0) for line in body for m in HASH.finditer(line)]
    if bad:
        raise Refused(f"table '{name}' would show a commit hash ({bad[0]})")
    if os.path.dirname(path) == os.path.join(ROOT, "notes"):
        body = [re.sub(r"\]\(notes/", "](", line) for line in body]
    return "\n".join(body) + "\n"


def update(D, path):
    """The file's text with its tables regenerated."""
    text = open(path).read()
    names = OPEN.findall(text)
    if names and os.path.dirname(path) == os.path.join(ROOT, "notes", "lab"):
        raise Refused(f"table '{names[0]}': the lab's tables are frozen text, not markers")
    if len(names) != len(MARK.findall(text)):
        raise Refused("a marker without its <!-- /fa:table -->")
    return MARK.sub(lambda m: m.group(1) + render(D, path, m.group(2)) + m.group(4), text)


def main(argv):
    data = argv[0] if argv else os.path.join(ROOT, "notes", "results", "h200")
    files = [os.path.abspath(f) for f in argv[1:]] or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "notes", "*.md")) + glob.glob(os.path.join(ROOT, "notes", "lab", "*.md")))
    if not os.path.isfile(os.path.join(data, "device.txt")):
        print(f"update_docs: {data}: not a results folder (no device.txt)", file=sys.stderr)
        return 2
    D = Data(data)
    new = {}
    for path in files:
        try:
            if not os.path.isfile(path):
                raise Refused("no such file")
            new[path] = update(D, path)
        except Refused as e:
            print(f"update_docs: {rel(path)}: {e}", file=sys.stderr)
            return 2
    for path, text in new.items():  # written only once every file has rendered
        if open(path).read() != text:
            open(path, "w").write(text)
            print("updated", rel(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
