"""Reading a results folder: the CSVs the benches write, the device files, and the few ways of folding rounds of
one-process runs (ab.py) into one figure a shape. Standard library only."""
import csv
import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import compare07  # noqa: E402  (step 07's rows of a run: compare07.table)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
WORD = {"fwd": "forward", "bwd": "backward"}


def load(folder, name):
    """The rows of folder/name as dicts; [] where there is no such file."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def text(folder, name):
    with open(os.path.join(folder, name)) as f:
        return f.read()


def rel(path):
    return os.path.relpath(path, ROOT)


def device_words(path):
    """A run's device file (nvidia-smi's line, nvcc's, then PyTorch's) in words: "GPU, driver …, CUDA …", then torch's
    and cuDNN's versions where the third line gives both ("torch X cudnn N"), or that line as it is where it names
    torch alone. A fourth line (the commit measured) is never shown."""
    dev = open(path).read().splitlines()
    name, driver = [x.strip() for x in dev[0].split(",")][:2]
    cuda = re.search(r"cuda_(\d+\.\d+)", dev[1]) if len(dev) > 1 else None
    words = f"{name}, driver {driver}, CUDA {cuda.group(1) if cuda else '?'}"
    third = dev[2] if len(dev) > 2 else ""
    torch = re.search(r"torch (\S+) cudnn (\d+)", third)
    if torch:
        v = int(torch.group(2))
        return words + f", torch {torch.group(1)}, cuDNN {v // 10000}.{v // 100 % 100}.{v % 100}"
    return words + (", " + third if third.startswith("torch") else "")


class Data:
    """A results folder (absolute path) with the files most tables read."""

    def __init__(self, folder):
        self.folder = os.path.abspath(folder)
        self.bench = load(self.folder, "bench.csv")
        self.peers = load(self.folder, "peers.csv")
        self.maxn = load(self.folder, "maxn.csv")
        self.traffic = load(self.folder, "traffic.csv")
        self.device = device_words(os.path.join(self.folder, "device.txt"))

    def path(self, *parts):
        return os.path.join(self.folder, *parts)

    def device_of(self, *parts):
        """The device file at parts (relative to the folder) in words; the folder's own where there is none."""
        path = self.path(*parts)
        return device_words(path) if os.path.exists(path) else self.device

    @staticmethod
    def find(rows, **kw):
        for r in rows:
            if all(str(r[k]) == str(v) for k, v in kw.items()) and r["status"] == "ok":
                return r
        return None


# ---- formats ----------------------------------------------------------------------------
def fmt_ms(x):
    return f"{float(x):.3g}" if x else "—"


def fmt_bytes(b):
    b = float(b)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def bold(x):
    """A ratio to two places, in bold where it rounds below 1.0 (the tables' rule)."""
    return f"**{x:.2f}**" if round(x, 2) < 1 else f"{x:.2f}"


def bold3(x):
    """A ratio to three places, in bold below 1.000 (where two places would round 0.995 up to 1.00)."""
    if x >= 1:
        return f"{x:.3f}"
    return f"**{x:.4f}**" if round(x, 3) >= 1 else f"**{x:.3f}**"


def span(xs):
    """lowest–highest of ratios, the lowest in bold where it rounds below 1.0; "—" where there are none."""
    return f"{bold(min(xs))}–{max(xs):.2f}" if xs else "—"


def yes(causal):
    return "yes" if str(causal) in ("1", "True") else "no"


# ---- step 07: ab.py's runs -----------------------------------------------------------------
def ab_medians(path, key=None, field="tflops"):
    """{key: the median of the rounds' `field`} of one ab.py CSV. The key by default (tokens, d, causal, N, who),
    or key(row) + (who,); who: a step's id (07, 07h9, 07b5, …) or PyTorch's backend (cudnn, flash)."""
    got = {}
    for r in load(os.path.dirname(path), os.path.basename(path)):
        if r["status"] == "ok":
            who = r["step"] if r["impl"] == "fa" else r["impl"].replace("torch-", "")
            k = key(r) if key else (int(r["H"]) * int(r["N"]), int(r["d"]), r["causal"] == "1", int(r["N"]))
            got.setdefault(k + (who,), []).append(float(r[field]))
    return {k: statistics.median(v) for k, v in got.items()}


AB07 = {"fwd": "ab/ab07.csv", "bwd": "ab/ab07bwd.csv"}  # the production kernels' run of every shape


def production07(D, direction):
    """{(tokens, d, causal, N): {who: TFLOP/s}} of step 07's production kernels and the peers in the same run
    (who: step07, step06, cudnn, flash): ab.py's run of every shape."""
    return compare07.table(D.path(AB07[direction]), direction)


def rounds(path):
    """How many rounds an ab.py CSV's shapes took."""
    return 1 + max(int(r["round"]) for r in load(os.path.dirname(path), os.path.basename(path)))


# ---- step 08: decoding ------------------------------------------------------------------------
PEERS08 = ("flash", "cudnn", "efficient", "math")


def shape_who08(r):
    """A decoding CSV row's shape (H, H_kv, N, N_kv, causal) and who it measures ('08', '06', …, 'cudnn', …)."""
    return (tuple(int(r[k]) for k in ("H", "H_kv", "N", "N_kv", "causal")),
            r["step"] if r["impl"] == "fa" else r["impl"].replace("torch-", ""))


def decode08(folder):
    """{shape: {who: row}} and the copy bandwidth of one step 08 run of fa_bench and peers_decode.py."""
    rows, copy = {}, []
    for name in ("bench08.csv", "bench08_gqa.csv", "peers08.csv", "peers08_gqa.csv"):
        for r in load(folder, name):
            if r["impl"] == "copy":
                copy.append(float(r["gbps"]))
            elif r["status"] == "ok":
                key, who = shape_who08(r)
                rows.setdefault(key, {})[who] = r
    return rows, (sum(copy) / len(copy) if copy else 0.0)


def decode08_ab(folder):
    """{shape: {who: {"ms", "gbps"}}} of one ab.py decoding run (folder/ab08*.csv): the medians of its rounds."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(folder, "ab08*.csv"))):
        for r in load(folder, os.path.basename(path)):
            if r["status"] == "ok":
                key, who = shape_who08(r)
                c = rows.setdefault(key, {}).setdefault(who, {"ms": [], "gbps": []})
                c["ms"].append(float(r["ms"]))
                c["gbps"].append(float(r["gbps"]))
    med = statistics.median
    return {k: {w: {"ms": med(c["ms"]), "gbps": med(c["gbps"])} for w, c in r.items()} for k, r in rows.items()}


def best_peer(cells):
    """PyTorch's fastest backend at a shape: (name, ms)."""
    got = [(float(cells[p]["ms"]), p) for p in PEERS08 if p in cells]
    return min(got)[1], min(got)[0]


def vs_peers08(cells, who="08"):
    """who × PyTorch's best at a shape's cells: its fastest backend's time ÷ who's."""
    return best_peer(cells)[1] / float(cells[who]["ms"])


def order08(key):
    """The decoding tables' order: one K/V head per query head first, then by causal, B·H, N_q, N_kv."""
    H, Hkv, N, Nk, c = key
    return H != Hkv, c, H, N, Nk
