"""Hostile model runs (app.sources.model_run, instrumentation.recording.model_run) uploaded as a zip
and exported with `python -m app.export --run`: markup in the meta, calls claiming N = 1e8 or
contradicting their trace, 20,000 calls naming one trace, unknown keys, a corrupt deflate stream,
a null layer / NaN time / no calls, 160,000 entries, and a call link with a superscript digit.
Each is refused in one line that says what to do, or answered right, within the suite's limits
(1.5 GiB peak, 10 s of CPU) in a child under RLIMIT_AS 2 GiB (the thirteen uploads share one,
harness.run_cases, each with its own temporary directory). The zips are built here."""

from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from .harness import UPLOAD_STANDIN, refused_cheaply, run_snippet, run_uploads

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "data" / "runs" / "qwen2.5-7b-4l-sliding"      # 12 calls, 2.3 MB
LLAMA = ROOT / "data" / "runs" / "llama-3-8b-4l"             # 68 calls
UPLOAD = UPLOAD_STANDIN + """
from app.sources.model_run import uploaded_run
from app.sources.errors import RunError

try:
    run = uploaded_run(Upload(open({path!r}, "rb").read()))
    from app.figures.model_run import call_table, layer_figure, run_provenance
    table = call_table(run)
    layer_figure(table, run_provenance(run, "hostile.zip", uploaded=True))
    print("ACCEPTED", len(table), int(table.tiles.sum()), sorted(set(table.layer_label))[-1])
except RunError as exc:
    print(exc)
"""
EXPORT = """
import contextlib, io
from app.export.cli import main
for path in {paths!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["--run", path, "--format", "html", "--out", path + ".html"])
    lines = err.getvalue().strip().splitlines()
    print("EXPORT", rc, len(lines), lines[-1] if lines else "")
"""


def _manifest(run: Path = QWEN) -> dict:
    return json.loads((run / "model_run.json").read_text())


def _zip(doc: dict, run: Path = QWEN, edit_trace=None, method=zipfile.ZIP_STORED) -> bytes:
    """The run directory zipped under r/, its model_run.json replaced by `doc` and each trace
    manifest passed through edit_trace(name, meta)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("r/model_run.json", json.dumps(doc))
        for p in sorted((run / "calls").rglob("*")):
            if not p.is_file():
                continue
            name = str(p.relative_to(run))
            if edit_trace and p.name == "manifest.json":
                m = json.loads(p.read_text())
                edit_trace(str(p.parent.relative_to(run)), m["meta"])
                zf.writestr("r/" + name, json.dumps(m))
            else:
                zf.write(p, "r/" + name)
    return buf.getvalue()


UPLOADS = {}       # case: () -> the zip's bytes; every case is uploaded once, all in one child


def upload_case(name):
    """Register a zip builder under `name` (the module fixture `uploads` uploads them all)."""
    def register(build):
        UPLOADS[name] = build
        return build
    return register


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """Every zip of UPLOADS uploaded once, all in one child (harness.run_uploads), each with a
    temporary directory of its own: {case: (Result, that directory)}."""
    return run_uploads("import app.sources.model_run, app.sources.errors, app.figures.model_run", UPLOADS,
                       UPLOAD, tmp_path_factory)


def _upload(uploads, name: str, *words: str) -> str:
    """The one line case `name`'s upload printed, after the checks every upload passes."""
    res, tmp_path = uploads[name]
    line = refused_cheaply(res, *words)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert len(res.stdout.strip().splitlines()) == 1, res.stdout
    assert str(tmp_path) not in line and "tilescope-upload-" not in line, line
    assert not list(tmp_path.glob("tilescope-upload-*")), "the unpacked files stayed behind"
    return line


# -- row 4: markup in the meta --------------------------------------------------------------------

MARKUP = {"model": '<a href="https://example.com">LlamaForCausalLM</a>',
          "environment.device_name": '<span style="font-size:60px;color:red">H100</span>'}


def _markup_zip(field):
    doc = _manifest()
    where = doc["meta"]
    *parents, key = field.split(".")
    for p in parents:
        where = where[p]
    where[key] = MARKUP[field]
    return _zip(doc)


for _field in MARKUP:
    upload_case(f"markup {_field}")(lambda field=_field: _markup_zip(field))


@pytest.mark.parametrize("field", sorted(MARKUP))
def test_markup_in_the_meta_is_refused_on_upload(uploads, field):
    line = _upload(uploads, f"markup {field}", "not a usable model run", "markup", field.split(".")[-1])
    assert "<" not in line.split("markup")[0]


def test_an_uploaded_file_name_with_markup_stays_text():
    from app.figures.model_run import run_provenance
    from instrumentation.recording.model_run import ModelRun

    run = ModelRun.load(QWEN, traces=False)
    text = run_provenance(run, '<a href="https://example.com">x</a>.zip', uploaded=True)
    assert "<" not in text and ">" not in text


# -- rows 8, 9, 21: calls that contradict their trace -----------------------------------------------

@upload_case("n 1e8")
def _n_1e8():
    doc = _manifest()
    doc["calls"][0].update(n_q=10**8, n_k=10**8)
    return _zip(doc)


def test_a_call_claiming_n_1e8_is_refused(uploads):
    _upload(uploads, "n 1e8", "call 0 contradicts its trace", "n_q 100000000", "Capture")


@upload_case("twenty calls 2e7")
def _twenty_calls_2e7():
    doc = _manifest(LLAMA)
    for c in doc["calls"][:20]:
        c.update(n_q=2 * 10**7, n_k=2 * 10**7)

    def edit(name, meta):
        if int(name.split("/")[1]) < 20:
            meta["shape"].update(N=2 * 10**7, N_q=2 * 10**7, N_k=2 * 10**7)
    return _zip(doc, LLAMA, edit)


def test_twenty_calls_claiming_n_2e7_with_their_traces_are_refused(uploads):
    """The calls and their trace manifests both say N = 2e7: the trace meta's bound refuses it
    before a table or an estimate is made."""
    _upload(uploads, "twenty calls 2e7", "trace calls/00000's meta is invalid", "shape.N")


@upload_case("contradicts")
def _contradicts():
    doc = _manifest()
    doc["calls"][3].update(n_q=4096, n_k=4096, heads=doc["calls"][3]["heads"] * 2)
    return _zip(doc)


def test_a_call_whose_shape_contradicts_its_trace_is_refused_not_drawn(uploads):
    """The issue's case: a call saying 4096 x 4096 over a 512-row trace (the page drew 11,904
    tiles for a trace of 504). The trace is what the kernel ran, so the run is refused at load,
    upload and export alike, naming the call and both values."""
    line = _upload(uploads, "contradicts", "call 3 contradicts its trace calls/00003", "n_q 4096 (its trace ran")
    assert "heads" in line


# -- row 10: many calls, one trace ----------------------------------------------------------------

def _calls_naming_one_trace(n):
    doc = _manifest()
    doc["calls"] = [{**doc["calls"][0], "index": i} for i in range(n)]
    return _zip(doc)


upload_case("20000 calls")(lambda: _calls_naming_one_trace(20_000))
upload_case("1000 calls")(lambda: _calls_naming_one_trace(1000))


def test_twenty_thousand_calls_naming_one_trace_are_refused(uploads):
    _upload(uploads, "20000 calls", "20,000 calls", "1,024")


def test_a_thousand_calls_naming_one_trace_are_refused_on_upload(uploads):
    _upload(uploads, "1000 calls", "calls 0 and 1 both name the trace 'calls/00000'")


# -- rows 11, 12, 13: malformed calls and zips -----------------------------------------------------

def _unknown_key_zip(key):
    doc = _manifest()
    doc["calls"][2][key] = 1
    return _zip(doc)


for _key in ("foo", "kv_cache_bytes"):
    upload_case(f"key {_key}")(lambda key=_key: _unknown_key_zip(key))


@pytest.mark.parametrize("key", ["foo", "kv_cache_bytes"])
def test_an_unknown_key_in_a_call_is_refused(uploads, key):
    _upload(uploads, f"key {key}", "calls[2]", f"'{key}' was unexpected")


@upload_case("corrupt deflate")
def _corrupt_deflate():
    data = bytearray(_zip(_manifest(), method=zipfile.ZIP_DEFLATED))
    at = data.find(b"r/model_run.json") + len(b"r/model_run.json")
    for i in range(at + 4, at + 60):
        data[i] ^= 0xA5
    return bytes(data)


def test_a_corrupt_deflate_stream_is_refused(uploads):
    _upload(uploads, "corrupt deflate", "damaged", "model_run.json")


@upload_case("no layer")
def _no_layer():
    doc = _manifest()
    doc["calls"][0]["layer"] = None
    return _zip(doc)


def test_a_call_without_a_layer_is_drawn_under_its_own_label(uploads):
    """layer null (a module without layer_idx) is allowed by the format: drawn, not a ValueError."""
    line = _upload(uploads, "no layer", "ACCEPTED 12")
    assert line.endswith("no layer · global") or "no layer" in line, line


def _nan_or_no_calls_zip(case):
    doc = _manifest()
    if case == "nan time":
        doc["calls"][1]["kernel_ms"] = float("nan")
    else:
        doc["calls"] = []
    return _zip(doc)


for _case in ("nan time", "no calls"):
    upload_case(_case)(lambda case=_case: _nan_or_no_calls_zip(case))


@pytest.mark.parametrize("case,words", [("nan time", ("kernel_ms nan", "finite")),
                                        ("no calls", ("holds no calls", "hf.capture"))])
def test_nan_times_and_no_calls_are_refused(uploads, case, words):
    _upload(uploads, case, *words)


# -- row 14: entries ------------------------------------------------------------------------------

def _many_entries(n: int) -> bytes:
    """A stored zip of n empty files (written directly: zipfile takes seconds for 160k)."""
    local, central, offset = [], [], 0
    for i in range(n):
        name = f"r/calls/{i:06d}/x".encode()
        head = struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name
        central.append(struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0,
                                   len(name), 0, 0, 0, 0, 0, offset) + name)
        local.append(head)
        offset += len(head)
    cd = b"".join(central)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), len(cd), offset, 0)
    return b"".join(local) + cd + end


upload_case("160k entries")(lambda: _many_entries(160_000))


def test_a_zip_of_160k_entries_is_refused_before_it_is_parsed(uploads):
    assert (uploads["160k entries"][1] / "hostile.zip").stat().st_size > 15_000_000
    _upload(uploads, "160k entries", "65,535 entries", "10,256")


# -- row 15: a call link with a superscript digit ---------------------------------------------------

def test_a_call_link_with_a_superscript_digit_is_refused_in_one_line():
    res = run_snippet("""
        from app.sources.model_run import call_problem, call_recording
        for name in ("run:llama-3-8b-4l:²", "run:llama-3-8b-4l:1²", "run:llama-3-8b-4l:٣"):
            assert call_recording(name) is None
            print(call_problem(name))
    """)
    line = refused_cheaply(res, "is not a whole number", "calls 0–67")
    assert len(res.stdout.strip().splitlines()) == 3 and "Traceback" not in res.stderr
    assert all("not a whole number" in x for x in res.stdout.splitlines()), res.stdout
    assert "'٣'" in line


# -- app.export --run: the same runs as directories ------------------------------------------------

def _edited(edit):
    doc = _manifest()
    edit(doc)
    return doc


EXPORTED = {   # case: (the edit of model_run.json, words of the one error line)
    "markup": (lambda d: d["meta"].update(model=MARKUP["model"]), "markup"),
    "contradicts": (lambda d: d["calls"][3].update(n_q=4096, n_k=4096), "call 3 contradicts its trace"),
    "one trace": (lambda d: d.update(calls=[{**d["calls"][0], "index": i} for i in range(20_000)]),
                  "calls 0 and 1 both name the trace"),
    "unknown key": (lambda d: d["calls"][2].update(kv_cache_bytes=1), "'kv_cache_bytes' was unexpected"),
    "nan time": (lambda d: d["calls"][1].update(kernel_ms=float("nan")), "kernel_ms nan"),
    "no calls": (lambda d: d.update(calls=[]), "holds no calls"),
}


def test_export_of_each_hostile_run_directory_is_one_error_line(tmp_path):
    """`python -m app.export --run DIR --format html` on each run above as a directory: exit 2,
    one 'error:' line naming the problem, no HTML written (all six within one child's limits)."""
    paths = []
    for i, (case, (edit, _)) in enumerate(EXPORTED.items()):
        where = tmp_path / f"run{i}"
        shutil.copytree(QWEN, where, ignore=shutil.ignore_patterns("*.parquet"))   # the manifests suffice
        (where / "model_run.json").write_text(json.dumps(_edited(edit)))
        paths.append(str(where))
    res = run_snippet(EXPORT.format(paths=paths))
    refused_cheaply(res, "EXPORT 2 1 error:")
    lines = res.stdout.strip().splitlines()
    assert len(lines) == len(EXPORTED), res.stdout
    for (case, (_, words)), line in zip(EXPORTED.items(), lines):
        assert line.startswith("EXPORT 2 1 error:") and words in line, (case, line)
    assert not list(tmp_path.glob("*.html"))
