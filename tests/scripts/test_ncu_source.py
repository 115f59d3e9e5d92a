"""scripts/ncu_source.py on source pages laid out as `ncu --page source --csv --print-source sass`
writes them (a kernel-name row, a header, one row per SASS instruction), with random samples: each
loop's share of the samples and its stall reasons' shares are the sums over its instructions, the
hottest instructions are listed first, and a file that is not such a page is refused in one line."""

import csv
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import ncu_source  # noqa: E402

REASONS = ("barrier", "wait", "selected", "mio", "long_sb")


def _page(path: Path, rng: random.Random) -> dict:
    """A kernel of 400 instructions, two loops (100..249 and 300..389) and random samples; returns
    the expected per-loop sample sums and per-reason sums."""
    header = ["Address", "Source", ncu_source.SAMPLES, "Warp Stall Sampling (Not-issued Samples)",
              "Instructions Executed"] + [f"stall_{r}" for r in REASONS] + [f"stall_{r} (Not Issued)" for r in REASONS]
    spans = {(100, 249): [0.0, {r: 0.0 for r in REASONS}], (300, 389): [0.0, {r: 0.0 for r in REASONS}]}
    rows, total = [], 0.0
    for i in range(400):
        addr = 0x7F00 + 16 * i
        text = f"FFMA R{i % 200}, R1, R2, R3"
        for lo, hi in spans:
            if i == hi:
                text = f"@P0 BRA 0x{0x7F00 + 16 * lo:x}"
        by_reason = {r: rng.randint(0, 30) for r in REASONS}
        samples = sum(by_reason.values())
        total += samples
        for (lo, hi), acc in spans.items():
            if lo <= i <= hi:
                acc[0] += samples
                for r, n in by_reason.items():
                    acc[1][r] += n
        executions = 5000 if 100 <= i <= 249 else 300 if 300 <= i <= 389 else 64
        rows.append([f"0x{addr:x}", text, samples, samples // 2, executions] + [by_reason[r] for r in REASONS]
                    + [by_reason[r] // 2 for r in REASONS])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "attn_fwd_fp8_gluon_kernel"])
        w.writerow(header)
        w.writerows(rows)
    return dict(total=total, spans=spans)


def test_loops_and_stalls_are_the_sums_of_their_instructions(tmp_path):
    rng = random.Random(3)
    page = tmp_path / "fwd-fp8-d128-n4096-causal.source.csv"
    want = _page(page, rng)
    out = tmp_path / "source.json"
    assert ncu_source.main([str(page), "--json", str(out), "--top", "5"]) == 0
    (s,) = json.loads(out.read_text())
    assert s["kernel"] == "attn_fwd_fp8_gluon_kernel" and s["samples"] == int(want["total"])
    assert [(one["first"], one["instructions"], one["executions"]) for one in s["loops"]] == \
        [("0x8540", 150, 5000), ("0x9040", 90, 300)][:1]          # loops of 100+ instructions only
    (lo, hi), (samples, reasons) = next(iter(want["spans"].items()))
    one = s["loops"][0]
    assert abs(one["samples_pct"] - round(100 * samples / want["total"], 1)) < 1e-9
    for reason, share in one["stalls_pct"].items():
        assert abs(share - round(100 * reasons[reason] / samples, 1)) < 1e-9
    assert list(one["stalls_pct"].values()) == sorted(one["stalls_pct"].values(), reverse=True)
    shares = [t["samples_pct"] for t in s["top"]]
    assert len(shares) == 5 and shares == sorted(shares, reverse=True)


def test_a_file_that_is_not_a_source_page_is_refused_in_one_line(tmp_path, capsys):
    raw = tmp_path / "raw.csv"
    raw.write_text('"ID","Kernel Name"\n"0","k"\n')
    assert ncu_source.main([str(raw)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ncu_source: ") and "not an ncu source page" in err and "\n" not in err
    missing = tmp_path / "absent.csv"
    assert ncu_source.main([str(missing)]) == 2
    assert capsys.readouterr().err.strip().startswith("ncu_source: ")
