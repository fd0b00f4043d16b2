#!/usr/bin/env python3
"""The course mode: exercises cut from the steps' own code, graded by the steps' tests.

  python3 tools/course/exercise.py list             every exercise: id, step, file, hint
  python3 tools/course/exercise.py start ID         blank exercise ID in its file, in place
  python3 tools/course/exercise.py reset ID         put the solution back
  python3 tools/course/exercise.py status           which exercises are started
  python3 tools/course/exercise.py check BUILD [ID...]
        (for CI) each exercise, blanked, must fail its step's CPU tests in BUILD, and
        pass them again with the solution back

An exercise is a marked region of a step's source (its CPU model, or code the model and
the kernel share):

  // exercise 03-rescale: <the hint, one line>
  // stub: <code that compiles in its place>      (any number of these)
  <the solution>
  // end exercise

`start` replaces the solution by the stubs and a TODO carrying the hint, and keeps the
original file under .exercises/ (ignored by git), so the exercise is always cut from the
code as it is: the two cannot drift apart. Then build and grade, on the CPU model without a
GPU, on the kernel too with one:

  cmake --build build && ctest --test-dir build -R step03

`reset` restores the file as it was before `start` (your edits go: copy them first).
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAVED = os.path.join(ROOT, ".exercises")
BEGIN = re.compile(r"^(\s*)// exercise (\d\d)-([\w-]+): (.*)$")
STUB = re.compile(r"^\s*// stub: (.*)$")
END = re.compile(r"^\s*// end exercise\s*$")
SOURCES = (".hpp", ".cpp", ".cu", ".cuh")


class Exercise:
    def __init__(self, path, line, indent, step, name, hint, stubs, length):
        self.path, self.line, self.indent = path, line, indent  # line: the marker's index
        self.id, self.step, self.hint, self.stubs, self.length = f"{step}-{name}", step, hint, stubs, length

    def rel(self):
        return os.path.relpath(self.path, ROOT)


def scan():
    """Every marked region under steps/, in file order; a malformed marker is an error."""
    found = []
    for top, _dirs, files in os.walk(os.path.join(ROOT, "steps")):
        for f in sorted(files):
            if not f.endswith(SOURCES):
                continue
            path = os.path.join(top, f)
            lines = open(path, encoding="utf-8").read().split("\n")
            i = 0
            while i < len(lines):
                m = BEGIN.match(lines[i])
                if not m:
                    i += 1
                    continue
                j, stubs = i + 1, []
                while j < len(lines) and STUB.match(lines[j]):
                    stubs.append(STUB.match(lines[j]).group(1))
                    j += 1
                k = j
                while k < len(lines) and not END.match(lines[k]) and not BEGIN.match(lines[k]):
                    k += 1
                if k == len(lines) or not END.match(lines[k]):
                    sys.exit(f"{os.path.relpath(path, ROOT)}:{i + 1}: exercise without '// end exercise'")
                found.append(Exercise(path, i, m.group(1), m.group(2), m.group(3), m.group(4), stubs, k - i + 1))
                i = k + 1
    ids = [e.id for e in found]
    for x in ids:
        if ids.count(x) > 1:
            sys.exit(f"exercise {x} is marked twice")
    return sorted(found, key=lambda e: e.id)


def find(ex_id):
    for e in scan():
        if e.id == ex_id:
            return e
    sys.exit(f"no exercise '{ex_id}' (python3 tools/course/exercise.py list)")


def saved_path(e):
    return os.path.join(SAVED, e.id, e.rel())


def blank(e):
    """The file with exercise e's solution replaced by its stubs and a TODO."""
    lines = open(e.path, encoding="utf-8").read().split("\n")
    cut = [f"{e.indent}// TODO(exercise {e.id}): {e.hint}"] + [f"{e.indent}{s}" for s in e.stubs]
    return "\n".join(lines[:e.line] + cut + lines[e.line + e.length:])


def start(ex_id):
    e = find(ex_id)
    keep = saved_path(e)
    if os.path.exists(keep):
        sys.exit(f"exercise {e.id} is started already ({e.rel()}); reset it first")
    for other in started():
        if other.rel() == e.rel():
            sys.exit(f"exercise {other.id} is started in the same file; reset it first")
    text = blank(e)  # (read before the file is opened for writing)
    os.makedirs(os.path.dirname(keep), exist_ok=True)
    shutil.copy2(e.path, keep)
    with open(e.path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"exercise {e.id} (step {e.step}): {e.hint}\n"
          f"  edit: {e.rel()} (the TODO)\n"
          f"  grade: cmake --build build && ctest --test-dir build -R step{e.step} --output-on-failure\n"
          f"  reset: python3 tools/course/exercise.py reset {e.id}")


def started():
    return scan_saved() if os.path.isdir(SAVED) else []


def scan_saved():
    """The exercises that `start` blanked: the saved originals hold their markers."""
    out = []
    for ex_id in sorted(os.listdir(SAVED)):
        for top, _dirs, files in os.walk(os.path.join(SAVED, ex_id)):
            for f in files:
                rel = os.path.relpath(os.path.join(top, f), os.path.join(SAVED, ex_id))
                e = Exercise(os.path.join(ROOT, rel), 0, "", ex_id[:2], ex_id[3:], "", [], 0)
                e.id = ex_id
                out.append(e)
    return out


def reset(ex_id):
    for e in started():
        if e.id == ex_id:
            shutil.copyfile(saved_path(e), e.path)  # (a new mtime, so that the build sees the change)
            shutil.rmtree(os.path.join(SAVED, e.id))
            print(f"exercise {e.id}: {e.rel()} restored")
            return
    sys.exit(f"exercise '{ex_id}' is not started")


def run(cmd, cwd=ROOT):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def check(build, ids):
    """Each exercise: blanked, its step's CPU tests must fail; restored, pass."""
    if started():
        sys.exit("exercises are started; reset them before a check")
    exercises = [find(i) for i in ids] if ids else scan()
    bad = 0
    for e in exercises:
        target, test = f"step{e.step}_tests", f"^step{e.step} cpu$"
        results = []
        for phase in ("blank", "solution"):
            if phase == "blank":
                start(e.id)
            try:
                b = run(["cmake", "--build", build, "--target", target])
                if b.returncode != 0:
                    results.append((phase, "does not build", b.stdout[-3000:]))
                    continue
                t = run(["ctest", "--test-dir", build, "-R", test, "--output-on-failure"])
                results.append((phase, "fails" if t.returncode != 0 else "passes", t.stdout[-1500:]))
            finally:
                if phase == "blank":
                    reset(e.id)
        ok = results[0][1] == "fails" and results[1][1] == "passes"
        bad += not ok
        print(f"{'ok  ' if ok else 'BAD '} {e.id}: blanked {results[0][1]}, solution {results[1][1]} "
              f"(ctest -R 'step{e.step} cpu')")
        if not ok:
            for phase, what, out in results:
                print(f"--- {phase}: {what}\n{out}")
    print(f"{len(exercises) - bad} passed, {bad} failed")
    return 1 if bad else 0


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd = args[0]
    if cmd == "list":
        for e in scan():
            print(f"{e.id:16} step {e.step}  {e.rel()}:{e.line + 1}\n{'':16} {e.hint}")
        return 0
    if cmd == "status":
        s = started()
        print("\n".join(f"{e.id}: started in {e.rel()}" for e in s) if s else "no exercise started")
        return 0
    if cmd == "start" and len(args) == 2:
        start(args[1])
        return 0
    if cmd == "reset" and len(args) == 2:
        reset(args[1])
        return 0
    if cmd == "check" and len(args) >= 2:
        return check(os.path.abspath(args[1]), args[2:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
