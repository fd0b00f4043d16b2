#!/usr/bin/env python3
"""The course mode: exercises cut from the steps' own code, graded by the steps' tests.

  python3 tools/course/exercise.py list             every exercise: id, step, file, hint
  python3 tools/course/exercise.py start ID         blank exercise ID in its file, in place
  python3 tools/course/exercise.py reset ID         put the solution back
  python3 tools/course/exercise.py status           which exercises are started
  python3 tools/course/exercise.py check BUILD [ID...]
        (for CI) each exercise, blanked, must fail its step's CPU tests in BUILD, and
        pass them again with the solution back

An exercise is a marked region of a step's source (its CPU model, code the model and the
kernel share, or a step's tests):

  // exercise 03-rescale: <the hint, one line>
  // stub: <code that compiles in its place>      (any number of these)
  <the solution>
  // end exercise

`start` replaces the solution by the stubs and a TODO carrying the hint, and keeps the
original file under .exercises/ID/ (ignored by git) with its SHA-256, so the exercise is
always cut from the code as it is: the two cannot drift apart. Then build and grade the
one step, on its CPU model, without a GPU (the first configure once, then about a
minute a try on two cores):

  cmake --preset cpu
  cmake --build --preset cpu --target step03_tests
  ctest --preset cpu -R "step03 cpu" --output-on-failure

`reset` puts the original back. Your file as it was is kept as .exercises/ID.attempt
whenever you had changed it (it says so, and says so louder if you changed it outside
the exercise). If the saved original is gone or damaged, `reset` takes the solution
from git (HEAD) instead, and says so. Every file is written whole or not at all
(a temporary, flushed, then renamed), so an interrupted `start` or `reset` loses
nothing: run it again. Errors: one line, exit status 2.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAVED = os.path.join(ROOT, ".exercises")
SCANNED = ("steps", "tests")
BEGIN = re.compile(r"^(\s*)// exercise (\d\d)-([\w-]+): (.*)$")
STUB = re.compile(r"^\s*// stub: (.*)$")
END = re.compile(r"^\s*// end exercise\s*$")
TODO = re.compile(r"^\s*// TODO\(exercise (\d\d-[\w-]+)\): ")
SOURCES = (".hpp", ".cpp", ".cu", ".cuh")
PARTIAL = re.compile(r"^\.exercise\.[\w-]+\.partial$")  # this tool's temporaries (*.partial: git ignores them)


def die(msg):
    print(f"exercise.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


class Exercise:
    def __init__(self, path, line, indent, step, name, hint, stubs, length):
        self.path, self.line, self.indent = path, line, indent  # line: the marker's index
        self.id, self.step, self.hint, self.stubs, self.length = f"{step}-{name}", step, hint, stubs, length

    def rel(self):
        return os.path.relpath(self.path, ROOT)


def sources():
    for top in SCANNED:
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(SOURCES):
                    yield os.path.join(d, f)


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def scan():
    """Every marked region under steps/ and tests/, by id; a malformed marker is an error."""
    found = []
    for path in sources():
        lines = read_text(path).split("\n")
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
                die(f"{os.path.relpath(path, ROOT)}:{i + 1}: exercise without '// end exercise'")
            found.append(Exercise(path, i, m.group(1), m.group(2), m.group(3), m.group(4), stubs, k - i + 1))
            i = k + 1
    ids = [e.id for e in found]
    for x in ids:
        if ids.count(x) > 1:
            die(f"exercise {x} is marked twice")
    return sorted(found, key=lambda e: e.id)


def blanked_in_sources(ex_id):
    """The file whose TODO says exercise ex_id is blanked in it, or None."""
    for path in sources():
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = TODO.match(line)
                if m and m.group(1) == ex_id:
                    return path
    return None


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def fsync_dir(d):
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, data, mode=None):
    """`data` (bytes) as `path`, whole or not at all: a temporary beside it, flushed, renamed."""
    d = os.path.dirname(path)
    for name in os.listdir(d):  # what an interrupted run of this tool left here
        if PARTIAL.match(name):
            try:
                os.unlink(os.path.join(d, name))
            except OSError:
                pass
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".exercise.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)


class HeldSignals:
    """Ctrl-C (and SIGTERM, SIGHUP) wait while a few renames make a change whole."""

    SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

    def __enter__(self):
        self.before = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self.before)


# ---- what `start` saves: .exercises/ID/original and .exercises/ID/meta.json ---------------
# meta.json is written last: without it the exercise is not started (an interrupted start
# left at most a partial directory, which the next start or reset removes).

def saved_dir(ex_id):
    return os.path.join(SAVED, ex_id)


def meta_of(ex_id):
    """The saved record of a started exercise, or None (not started, or the record is gone)."""
    try:
        with open(os.path.join(saved_dir(ex_id), "meta.json"), encoding="utf-8") as f:
            m = json.load(f)
        if m.get("id") == ex_id and isinstance(m.get("file"), str):
            return m
    except (OSError, ValueError):
        pass
    return None


def saved_original(meta):
    """The saved original's bytes if they are the whole original (its SHA-256 matches), else None."""
    try:
        with open(os.path.join(saved_dir(meta["id"]), "original"), "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data if sha256(data) == meta.get("sha256") else None


def started():
    """(id, file relative to ROOT) of every started exercise: recorded, or blanked in a source."""
    out = {}
    if os.path.isdir(SAVED):
        for ex_id in sorted(os.listdir(SAVED)):
            m = meta_of(ex_id) if os.path.isdir(saved_dir(ex_id)) else None
            if m:
                out[ex_id] = m["file"]
    for path in sources():
        with open(path, encoding="utf-8") as f:
            for line in f:
                t = TODO.match(line)
                if t and t.group(1) not in out:
                    out[t.group(1)] = os.path.relpath(path, ROOT)
    return sorted(out.items())


def gpu_build():
    """build/ when it is a CUDA build (its CMakeCache names a CUDA compiler), else None."""
    try:
        with open(os.path.join(ROOT, "build", "CMakeCache.txt"), encoding="utf-8", errors="replace") as f:
            return "build" if re.search(r"^CMAKE_CUDA_COMPILER:\w+=\S", f.read(), re.M) else None
    except OSError:
        return None


def commands(e):
    step = e.step
    lines = []
    if not os.path.exists(os.path.join(ROOT, "build-cpu", "CMakeCache.txt")):
        lines.append("  once:  cmake --preset cpu      (a CPU-only build in build-cpu/, no GPU needed)")
    lines += [f"  build: cmake --build --preset cpu --target step{step}_tests",
              f"  grade: ctest --preset cpu -R \"step{step} cpu\" --output-on-failure"]
    gpu = gpu_build()
    if gpu:
        lines.append(f"  or on the GPU too: cmake --build {gpu} --target step{step}_tests && "
                     f"ctest --test-dir {gpu} -R \"step{step}\" --output-on-failure")
    return "\n".join(lines)


def blank(e, text):
    """`text` (exercise e's file) with its solution replaced by its stubs and a TODO."""
    lines = text.split("\n")
    cut = [f"{e.indent}// TODO(exercise {e.id}): {e.hint}"] + [f"{e.indent}{s}" for s in e.stubs]
    return "\n".join(lines[:e.line] + cut + lines[e.line + e.length:]), len(cut)


def start(ex_id, quiet=False):
    meta = meta_of(ex_id)
    if meta:
        path = os.path.join(ROOT, meta["file"])
        original = saved_original(meta)
        if original is None or not os.path.exists(path) or open(path, "rb").read() != original:
            print(f"exercise {ex_id} is already started ({meta['file']}): nothing changed. "
                  f"`reset {ex_id}` puts the solution back.")
            return 0
        # The original is saved but the file is still the original: a start interrupted
        # before it blanked the file. Blank it now.
    else:
        where = blanked_in_sources(ex_id)
        if where:
            print(f"exercise {ex_id} is already started ({os.path.relpath(where, ROOT)}), but its saved original "
                  f"is gone: `reset {ex_id}` restores the solution from git.")
            return 0
    found = [e for e in scan() if e.id == ex_id]
    if not found:
        die(f"no exercise '{ex_id}' (python3 tools/course/exercise.py list)")
    e = found[0]
    for other, rel in started():
        if other != e.id and rel == e.rel():
            die(f"exercise {other} is started in the same file ({rel}); reset it first")
    data = open(e.path, "rb").read()
    text = data.decode("utf-8")
    blanked, cut = blank(e, text)
    if not meta:
        keep = saved_dir(e.id)
        shutil.rmtree(keep, ignore_errors=True)  # a partial directory from an interrupted start
        os.makedirs(keep)
        write_atomic(os.path.join(keep, "original"), data)
        record = {"id": e.id, "file": e.rel(), "sha256": sha256(data), "line": e.line, "length": e.length,
                  "cut": cut, "blanked_sha256": sha256(blanked.encode("utf-8"))}
        write_atomic(os.path.join(keep, "meta.json"), (json.dumps(record, indent=1) + "\n").encode("utf-8"))
    write_atomic(e.path, blanked.encode("utf-8"), os.stat(e.path).st_mode & 0o7777)
    if not quiet:
        print(f"exercise {e.id} (step {e.step}): {e.hint}\n"
              f"  edit:  {e.rel()} (the TODO)\n{commands(e)}\n"
              f"  reset: python3 tools/course/exercise.py reset {e.id}")
    return 0


def outside_changed(meta, original, current):
    """True if `current` differs from the blanked file outside the exercise's region."""
    o = original.decode("utf-8", errors="replace").split("\n")
    c = current.decode("utf-8", errors="replace").split("\n")
    before, after = o[:meta["line"]], o[meta["line"] + meta["length"]:]
    return not (len(c) >= len(before) + len(after) and c[:len(before)] == before and
                c[len(c) - len(after):] == after)


def keep_attempt(ex_id, data):
    """Saves the student's file as .exercises/ID.attempt (or .attempt.2, …); returns its path."""
    os.makedirs(SAVED, exist_ok=True)
    path, n = os.path.join(SAVED, f"{ex_id}.attempt"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(SAVED, f"{ex_id}.attempt.{n}")
    write_atomic(path, data)
    return os.path.relpath(path, ROOT)


def from_git(rel):
    """The file `rel` as committed at HEAD (bytes), or None with the reason."""
    try:
        r = subprocess.run(["git", "-C", ROOT, "show", f"HEAD:{rel}"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    except OSError as e:
        return None, f"git cannot run ({e.strerror})"
    if r.returncode != 0:
        return None, r.stderr.decode("utf-8", errors="replace").strip().split("\n")[0]
    return r.stdout, None


def reset(ex_id, quiet=False):
    meta = meta_of(ex_id)
    rel = meta["file"] if meta else None
    if rel is None:
        where = blanked_in_sources(ex_id)
        if where is None:
            if os.path.isdir(saved_dir(ex_id)):  # an interrupted start: the file was never blanked
                shutil.rmtree(saved_dir(ex_id))
            die(f"exercise '{ex_id}' is not started")
        rel = os.path.relpath(where, ROOT)
    path = os.path.join(ROOT, rel)
    original = saved_original(meta) if meta else None
    how = "restored"
    if original is None:
        original, why = from_git(rel)
        if original is None:
            die(f"the saved original of {rel} is {'damaged' if meta else 'gone'} and git cannot give it back "
                f"({why}); {rel} is left as it is")
        how = (f"restored from git (HEAD), because its saved original in .exercises/ was "
               f"{'damaged (not the file saved at start)' if meta else 'gone'}")
    current = open(path, "rb").read() if os.path.exists(path) else b""
    note = ""
    if current and current != original:
        changed = (meta is None or sha256(current) != meta.get("blanked_sha256"))
        if changed:
            outside = meta is None or outside_changed(meta, original, current)
            kept = keep_attempt(ex_id, current)
            note = (f"\n  you had changed {rel} outside the exercise since start: your whole file is kept as {kept}"
                    if outside and meta else f"\n  your attempt is kept as {kept}")
    with HeldSignals():
        write_atomic(path, original, os.stat(path).st_mode & 0o7777 if os.path.exists(path) else None)
        shutil.rmtree(saved_dir(ex_id), ignore_errors=True)
    if not quiet:
        print(f"exercise {ex_id}: {rel} {how}{note}")
    return 0


def run(cmd, cwd=ROOT):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def check(build, ids):
    """Each exercise: blanked, its step's CPU tests must fail; restored, pass."""
    if started():
        die("exercises are started; reset them before a check")
    everything = scan()
    for i in ids:
        if i not in [e.id for e in everything]:
            die(f"no exercise '{i}' (python3 tools/course/exercise.py list)")
    exercises = [e for e in everything if not ids or e.id in ids]
    bad = 0
    for e in exercises:
        target, test = f"step{e.step}_tests", f"^step{e.step} cpu$"
        results = []
        for phase in ("blank", "solution"):
            if phase == "blank":
                start(e.id, quiet=True)
            try:
                b = run(["cmake", "--build", build, "--target", target])
                if b.returncode != 0:
                    results.append((phase, "does not build", b.stdout[-3000:]))
                    continue
                t = run(["ctest", "--test-dir", build, "-R", test, "--output-on-failure"])
                results.append((phase, "fails" if t.returncode != 0 else "passes", t.stdout[-1500:]))
            finally:
                if phase == "blank":
                    reset(e.id, quiet=True)
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
        print("\n".join(f"{i}: started in {rel}" + ("" if meta_of(i) else " (its saved original is gone: "
                                                    "reset restores the solution from git)")
                        for i, rel in s) if s else "no exercise started")
        return 0
    if cmd == "start" and len(args) == 2:
        return start(args[1])
    if cmd == "reset" and len(args) == 2:
        return reset(args[1])
    if cmd == "check" and len(args) >= 2:
        return check(os.path.abspath(args[1]), args[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
