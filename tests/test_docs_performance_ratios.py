"""The speed ratios docs/performance.md quotes match the benchmark files it cites.

Only text that names its file is checked: a table whose nearest paragraph above cites one
data/benchmarks/*.json file (attention tables: "cuDNN / ours", "Flex / ours"; the backward
table: "ours / cuDNN", "Flex / ours"), the per-device table that names one file per head dim,
and sentences "(`file.json`): cuDNN / ours full a / b / c and causal d / e / f". A ratio is a speed
ratio, the other's median time over ours (the backward's "ours / cuDNN" too: our speed over
cuDNN's), and must equal the file's to the two decimals quoted.
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
DATA = ROOT / "data" / "benchmarks"
OTHERS = {"cuDNN": "sdpa_cudnn", "Flex": "flex"}
FILE = re.compile(r"`([\w.-]*\.json)`")
RATIO = re.compile(r"\d+\.\d\d")
SIZES = {"4k": 4096, "8k": 8192, "16k": 16384, "32k": 32768}


def _close(quoted: str, value: float) -> bool:
    return abs(float(quoted) - value) <= 0.005 + 1e-9


def _times(name):
    """(impl, mask_spec, seq_len, head_dim, batch, heads, kv_heads) -> median ms of a file's ok records."""
    records = json.loads((DATA / name).read_text())["records"]
    # a mask as the doc writes it: its spec ("sliding_window:1024"), or its kind where the spec
    # carries generated numbers (document:<lengths>)
    return {(r["impl"], r["mask"] if r["mask"] == "document" else r.get("mask_spec", r["mask"]), r["seq_len"], r["head_dim"], r["batch"], r["heads"],
             r.get("kv_heads") or r["heads"]): r["ms"] for r in records if r.get("status") == "ok"}


def _attention(name, mask, n):
    """other -> other's time / ours for one mask and N of an attention-benchmark file."""
    times = {(impl, m, sl): ms for (impl, m, sl, *_), ms in _times(name).items()}
    ours = times[("tilescope", mask, n)]
    return {label: times[(impl, mask, n)] / ours for label, impl in OTHERS.items() if (impl, mask, n) in times}


def _tables():
    """(paragraph above, header cells, rows of cells) for every table of the doc."""
    lines = DOC.read_text().splitlines()
    paragraph, in_code, i = [], False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append([c.strip() for c in re.split(r"(?<!\\)\|", lines[i])[1:-1]])
                i += 1
            yield " ".join(paragraph), block[0], block[2:]
            paragraph = []
            continue
        elif not in_code and line.strip():
            paragraph = paragraph + [line] if lines[i - 1].strip() else [line]
        i += 1


def _cited(paragraph):
    """The data/benchmarks files a paragraph names (`-d64-r3.json` after `a-d128-r3.json`: a-d64-r3.json)."""
    names, prefix = [], ""
    for name in FILE.findall(paragraph):
        if name.startswith("-"):
            name = prefix + name
        else:
            prefix = name.split("-d")[0]
        names.append(name)
    return [name for name in names if (DATA / name).is_file()]


def _checks():
    """(where, quoted, value) for every ratio the doc quotes with its file named."""
    text = DOC.read_text()
    for paragraph, header, rows in _tables():
        files = _cited(paragraph)
        ratio_cols = {j: h for j, h in enumerate(header) if h in ("cuDNN / ours", "Flex / ours", "ours / cuDNN")}
        if len(files) == 1 and "mask" in header and ratio_cols:          # attention tables
            n_col = header.index("N") if "N" in header else None
            n_all = re.search(r"N = (\d+)", paragraph)
            for row in rows:
                n = int(row[n_col]) if n_col is not None else int(n_all.group(1))
                ratios = _attention(files[0], row[header.index("mask")], n)
                for j, h in ratio_cols.items():
                    if RATIO.search(row[j]):
                        yield f"{files[0]} {row[0]} {n} {h}", RATIO.search(row[j]).group(), ratios[h.split(" /")[0]]
        elif len(files) == 1 and "case" in header and ratio_cols:        # the backward table
            times = _times(files[0])
            for row in rows:
                case = re.fullmatch(r"B(\d+) H(\d+)(?:/(\d+))? D(\d+) N(\d+k) (\w+)(?: \(GQA\))?", row[0])
                if case is None:        # a row from another file (a footnote)
                    continue
                b, h, hkv, d, n, mask = case.groups()
                key = (mask, SIZES[n], int(d), int(b), int(h), int(hkv or h))
                for j, name in ratio_cols.items():
                    ours, other = times[("tilescope", *key)], times[(OTHERS[name.replace(" / ours", "").replace("ours / ", "")], *key)]
                    # both speed ratios: "ours / cuDNN" is our speed over cuDNN's, "Flex / ours" Flex's time over ours
                    yield f"{files[0]} {row[0]} {name}", row[j], other / ours
        elif "D" in header and len(files) > 1:                           # one file per device and head dim
            devices = {j: "nvidia-" + h.lower().replace(" ", "-") for j, h in enumerate(header)
                       if h.startswith(("H100", "H200"))}
            for row in rows:
                for j, device in devices.items():
                    name, = [f for f in files if re.fullmatch(rf"{device}-d{row[0]}(-.*)?\.json", f)]
                    for quoted, n in zip(RATIO.findall(row[j]), (4096, 8192, 16384)):
                        yield f"{name} {row[1]} {n}", quoted, _attention(name, row[1], n)["cuDNN"]
    sentence = re.compile(r"\(`([\w.-]+\.json)`\): cuDNN / ours full ([\d.x /\s]+?) and\s+causal ([\d.x /\s]+?) at")
    for name, full, causal in sentence.findall(text):
        for mask, quoted_all in (("full", full), ("causal", causal)):
            for quoted, n in zip(RATIO.findall(quoted_all), (4096, 8192, 16384)):
                yield f"{name} {mask} {n}", quoted, _attention(name, mask, n)["cuDNN"]


def test_the_doc_quotes_ratios_of_each_kind():
    checks = list(_checks())
    kinds = {where.split()[0] for where, *_ in checks}
    assert {"nvidia-h100-80gb-hbm3.json", "nvidia-h200-causal-ws.json", "nvidia-h200.json",
            "backward-nvidia-h200.json", "nvidia-h200-d256.json", "nvidia-h200-d64.json"} <= kinds, kinds
    assert len(checks) > 60


def test_quoted_ratios_match_their_files():
    wrong = [f"{where}: quoted {quoted}, file {value:.4f}" for where, quoted, value in _checks()
             if not _close(quoted, value)]
    assert not wrong, "ratios in docs/performance.md that their files do not give:\n" + "\n".join(wrong)


@pytest.mark.parametrize("quoted, value, ok", [("0.89", 0.8949, True), ("0.89", 0.8851, True), ("0.89", 0.8849, False)])
def test_two_decimal_rounding(quoted, value, ok):
    assert _close(quoted, value) is ok
