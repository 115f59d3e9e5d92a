"""Shared app state: sidebar controls, URL query parameters, trace sources, caches, run lock.

The controls live in st.session_state under `ctl_*` keys; they are seeded once per session
from the URL (so a link reproduces a view) and written back to the URL on every run.
Traces come from one of four sources:

    gpu          live run of the instrumented kernel on this machine's CUDA GPU
    interpreter  live run in Triton's CPU interpreter (real tile visits, no hardware clocks)
    recorded     a bundled trace directory under data/traces/
    upload       a zip of a trace directory (manifest.json + parquet files)

Live runs are cached per settings (st.cache_resource: the same settings never run twice and
sessions share results) and serialised by one process-wide lock. Traces returned from the
caches are shared between sessions: treat them as read-only.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import streamlit as st

import kernels  # noqa: F401  (first: picks the interpreter before triton loads)
from app import data_sources
from app.data_sources import Recording
from instrumentation import Trace, TraceFormatError
from kernels import INTERPRETER_MAX_TILES, SCHEDULES, SUPPORTED_HEAD_DIMS, backend, parse_mask
from kernels.masks import MASK_KINDS

PAGES = {"schedule": "Tile schedule", "block_skip": "Block-skip map",
         "online_softmax": "Online softmax", "memory": "Memory and traffic"}
BLOCK_SIZES = (16, 32, 64, 128, 256)
DTYPES = ("fp16", "bf16", "fp32")
SOURCES = {"gpu": "live GPU", "interpreter": "live interpreter (CPU)",
           "recorded": "recorded trace (data/)", "upload": "uploaded trace (.zip)"}
DEFAULTS = {"seq_len": 512, "mask": "causal", "head_dim": 64, "block_m": 64, "block_n": 64,
            "dtype": "fp16", "batch": 1, "heads": 1, "schedule": "natural"}
INT_KEYS = ("seq_len", "head_dim", "block_m", "block_n", "batch", "heads")
MAX_SEQ_LEN = 1 << 20
MAX_GRID_TILES = 2048 * 2048       # (N/block_m) x (N/block_n) tiles a page may draw
INTERPRETER_S_PER_TILE = 0.007     # measured on 2 CPUs: N=1024 causal 64x64 (136 tiles) ~ 1 s
MAX_UPLOAD_BYTES = 512 << 20       # uncompressed size of an uploaded trace


@dataclass(frozen=True)
class Settings:
    """Everything a view depends on; `query()` is its URL form."""

    source: str
    seq_len: int
    mask: str
    head_dim: int
    block_m: int
    block_n: int
    dtype: str
    batch: int = 1
    heads: int = 1
    schedule: str = "natural"
    trace: str = ""
    present: bool = False

    @property
    def live(self) -> bool:
        return self.source in ("gpu", "interpreter")

    def kernel(self) -> dict:
        return {k: getattr(self, k) for k in DEFAULTS}

    def query(self) -> dict[str, str]:
        q = {"source": self.source, **{k: str(v) for k, v in self.kernel().items()}}
        if self.source == "recorded" and self.trace:
            q["trace"] = self.trace
        if self.present:
            q["present"] = "1"
        return q

    def problems(self) -> list[str]:
        """Why these settings cannot run (empty when they can), each with what to do."""
        out = []
        if not isinstance(self.seq_len, int) or self.seq_len <= 0:
            out.append(f"Sequence length N = {self.seq_len} is not valid: N must be a positive "
                       "whole number (try 512).")
        elif self.seq_len > MAX_SEQ_LEN:
            out.append(f"N = {self.seq_len} is larger than this app handles ({MAX_SEQ_LEN}); "
                       "pick a smaller N.")
        else:
            try:
                parse_mask(self.mask, self.seq_len)
            except ValueError as exc:
                out.append(f"The mask {self.mask!r} does not work here: {exc}")
            grid = -(-self.seq_len // self.block_m) * -(-self.seq_len // self.block_n)
            if grid > MAX_GRID_TILES:
                out.append(f"N={self.seq_len} with blocks {self.block_m}×{self.block_n} makes "
                           f"{grid:,} tiles, more than the {MAX_GRID_TILES:,} a page can draw: "
                           "raise the block sizes or lower N.")
        for name, value in (("batch B", self.batch), ("heads H", self.heads)):
            if not isinstance(value, int) or value < 1:
                out.append(f"{name} = {value} is not valid: use 1 or more.")
        return out


# -- recordings on disk (cached on the directory's mtime) ---------------------------------------

@st.cache_data(show_spinner=False, max_entries=8)
def _discover(root: str, stamp: float) -> list[Recording]:
    return data_sources.discover_traces(Path(root))


def recordings() -> list[Recording]:
    root = data_sources.data_dir()
    traces = root / "traces"
    stamp = traces.stat().st_mtime if traces.is_dir() else 0.0
    return _discover(str(root), stamp)


def recording_named(name: str) -> Recording | None:
    return next((r for r in recordings() if r.name == name), None)


@st.cache_resource(show_spinner="Loading the recording…", max_entries=16)
def _load_trace(path: str, mtime: float) -> Trace:
    trace = Trace.load(path)
    trace.meta["source"] = "recorded"   # it was live when recorded; here it is a recording
    return trace


def load_recording(rec: Recording) -> Trace:
    """The recording's trace (cached on path + manifest mtime). Raises TraceFormatError."""
    return _load_trace(rec.path, rec.mtime)


# -- uploads ------------------------------------------------------------------------------------

@st.cache_resource(show_spinner=False, max_entries=8)
def _load_upload(digest: str, _data: bytes) -> Trace:
    return trace_from_zip(_data)


def trace_from_zip(data: bytes) -> Trace:
    """A trace from a zip of a trace directory; TraceFormatError with a reason if it is not one."""
    import io

    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise TraceFormatError("the upload is not a zip file: zip a trace directory "
                               "(manifest.json + *.parquet) and upload that") from None
    with zf, tempfile.TemporaryDirectory(prefix="tilescope-upload-") as tmp:
        infos = zf.infolist()
        if sum(i.file_size for i in infos) > MAX_UPLOAD_BYTES:
            raise TraceFormatError("the zip unpacks to more than 512 MB; that is not a trace")
        manifests = sorted((i.filename for i in infos if i.filename.endswith("manifest.json")),
                           key=lambda n: n.count("/"))
        if not manifests:
            raise TraceFormatError("the zip holds no manifest.json: zip a whole trace directory "
                                   "(as written by Trace.save or `python -m instrumentation.record`)")
        root = Path(tmp).resolve()
        for info in infos:
            target = (root / info.filename).resolve()
            if root not in target.parents and target != root:
                raise TraceFormatError(f"the zip has an unsafe path {info.filename!r}")
        try:
            zf.extractall(root)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise TraceFormatError(f"the zip is damaged ({exc}); zip the trace directory again") from None
        trace = Trace.load(root / manifests[0])
    trace.meta["source"] = "uploaded"
    return trace


# -- live runs ----------------------------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def run_lock() -> threading.Lock:
    """One lock per process: live kernel runs (GPU or interpreter) never overlap."""
    return threading.Lock()


class RunError(Exception):
    """A live run that cannot happen or failed; the message says what to do."""

    def __init__(self, message: str, nearest: Recording | None = None):
        super().__init__(message)
        self.nearest = nearest


def live_source() -> str:
    return "gpu" if backend() == "cuda" else "interpreter"


def computed_tiles(s: Settings) -> int:
    bmap = parse_mask(s.mask, s.seq_len).block_map(s.seq_len, s.block_m, s.block_n)
    return int((bmap != 0).sum()) * s.batch * s.heads


@st.cache_resource(show_spinner=False, max_entries=48)
def _run_live(key: tuple, source: str) -> tuple[Trace, float]:
    from instrumentation import make_inputs, record   # torch and triton load with the first live run

    s = dict(key)
    with run_lock():
        started = time.perf_counter()
        device = "cuda" if source == "gpu" else "cpu"
        q, k, v = make_inputs(s["batch"], s["heads"], s["seq_len"], s["head_dim"], s["dtype"],
                              seed=0, device=device)
        try:
            _, trace = record(q, k, v, mask=s["mask"], block_m=s["block_m"], block_n=s["block_n"],
                              schedule=s["schedule"],
                              meta_extra={"input_seed": 0, "inputs": "instrumentation.make_inputs"})
        finally:
            del q, k, v
        return trace, time.perf_counter() - started


def run_live(s: Settings) -> tuple[Trace, float, bool]:
    """(trace, seconds the run took, whether it ran now) for live settings; raises RunError."""
    problems = s.problems()
    if problems:
        raise RunError(" ".join(problems))
    if s.source != live_source():
        raise RunError(f"the source {SOURCES.get(s.source, s.source)!r} is not available on this "
                       f"machine; pick {SOURCES[live_source()]!r} or a recording.")
    tiles = computed_tiles(s)
    if s.source == "interpreter" and tiles > INTERPRETER_MAX_TILES:
        recs = recordings()
        near = data_sources.nearest(recs, s.kernel(), gpu_only=any(r.is_gpu for r in recs))
        raise RunError(
            f"N={s.seq_len}, mask {s.mask}, blocks {s.block_m}×{s.block_n}, B×H={s.batch}×{s.heads} "
            f"needs {tiles:,} computed tiles; the CPU interpreter stops at {INTERPRETER_MAX_TILES:,} "
            "(it would take minutes). Lower N, B or H, raise the block sizes, or open a bundled "
            "GPU recording.", nearest=near)
    key = tuple(sorted(s.kernel().items()))
    what = "on the GPU" if s.source == "gpu" else \
        f"in the Triton CPU interpreter (~{max(1, round(tiles * INTERPRETER_S_PER_TILE))} s)"
    started = time.perf_counter()
    try:
        with st.spinner(f"Running the kernel {what}: N={s.seq_len}, {s.mask}, "
                        f"{s.block_m}×{s.block_n}, {tiles:,} tiles…", show_time=True):
            trace, took = _run_live(key, s.source)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    except Exception as exc:  # OOM and driver errors: say so, keep the app alive
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise RunError(f"The GPU ran out of memory for B×H={s.batch}×{s.heads}, N={s.seq_len}, "
                           f"D={s.head_dim}: lower N, B or H.") from None
        raise RunError(f"The kernel run failed: {type(exc).__name__}: {exc}") from None
    return trace, took, time.perf_counter() - started > 0.5 * took


# -- the trace a page shows ---------------------------------------------------------------------

@dataclass
class Source:
    """The trace behind the current view and how it was obtained."""

    trace: Trace
    origin: str                 # 'live GPU', 'live interpreter', 'recording NAME', 'upload NAME'
    recording: Recording | None = None
    run_s: float | None = None
    fresh: bool = False
    key: str = ""               # identifies the trace for caches of things derived from it


def current_source(s: Settings) -> Source:
    """Resolve the settings' source to a trace; raises RunError with a message on failure."""
    if s.live:
        trace, took, fresh = run_live(s)
        return Source(trace, SOURCES[s.source], run_s=took, fresh=fresh,
                      key=f"live:{s.source}:{sorted(s.kernel().items())}")
    if s.source == "recorded":
        rec = recording_named(s.trace)
        if rec is None:
            raise RunError("No bundled recording is selected: data/traces/ has none yet. "
                           f"Switch the source to {SOURCES[live_source()]!r}.")
        try:
            return Source(load_recording(rec), f"recording {rec.name}", recording=rec,
                          key=f"rec:{rec.path}:{rec.mtime}")
        except TraceFormatError as exc:
            raise RunError(f"The recording {rec.name} cannot be read: {exc}") from None
    upload = st.session_state.get("ctl_upload")
    if upload is None:
        raise RunError("Upload a trace: a .zip of a trace directory (manifest.json + parquet "
                       "files, as written by `python -m instrumentation.record --out DIR`).")
    trace = uploaded_trace(upload)
    return Source(trace, f"upload {upload.name}", key=f"upload:{upload_digest(upload)}")


def upload_digest(upload) -> str:
    return hashlib.sha256(upload.getvalue()).hexdigest()


def uploaded_trace(upload) -> Trace:
    try:
        return _load_upload(upload_digest(upload), upload.getvalue())
    except TraceFormatError as exc:
        raise RunError(f"The uploaded file {upload.name!r} is not a usable trace: {exc}") from None


def variant(s: Settings, schedule: str) -> Settings:
    return replace(s, schedule=schedule)


# -- URL <-> session ----------------------------------------------------------------------------

def _mask_to_controls(text: str, n: int) -> dict:
    spec = parse_mask(text)
    out = {"ctl_mask_kind": spec.kind}
    if spec.kind == "sliding_window":
        out["ctl_window"] = int(spec.param)
    elif spec.kind == "prefix_lm":
        out["ctl_prefix"] = int(spec.param)
    elif spec.kind == "document":
        out["ctl_docs"] = ",".join(str(x) for x in spec.param)
    return out


def default_settings() -> tuple[dict, str, str]:
    """(kernel settings, source, recording name) a fresh session opens with."""
    if live_source() == "gpu":
        return dict(DEFAULTS), "gpu", ""
    rec = data_sources.default_recording(recordings(), DEFAULTS)
    if rec is not None:
        return {**DEFAULTS, **rec.settings()}, "recorded", rec.name
    return dict(DEFAULTS), "interpreter", ""


def init_session() -> None:
    """Seed the controls from the URL once per session; remember what the URL got wrong."""
    ss = st.session_state
    if ss.get("_initialised"):
        return
    qp = st.query_params.to_dict()
    values, source, trace = default_settings()
    if qp.get("source") in ("gpu", "interpreter"):
        values, trace = dict(DEFAULTS), ""     # a live link starts from the plain defaults
    errors = []
    if "source" in qp:
        want = qp["source"]
        if want not in SOURCES:
            errors.append(f"source={want!r} in the link is not one of {', '.join(SOURCES)}.")
        elif want in ("gpu", "interpreter") and want != live_source():
            errors.append(f"The link asks for {SOURCES[want]!r}, which this machine does not have; "
                          f"using {SOURCES[live_source()]!r}.")
            source = live_source()
        else:
            source = want
    for key in INT_KEYS:
        if key in qp:
            try:
                values[key] = int(qp[key])
            except ValueError:
                errors.append(f"{key}={qp[key]!r} in the link is not a whole number; using {values[key]}.")
    for key, allowed in (("head_dim", SUPPORTED_HEAD_DIMS), ("block_m", BLOCK_SIZES),
                         ("block_n", BLOCK_SIZES)):
        if values[key] not in allowed:
            errors.append(f"{key}={values[key]} is not supported (use one of "
                          f"{', '.join(map(str, allowed))}); using {DEFAULTS[key]}.")
            values[key] = DEFAULTS[key]
    for key, allowed in (("dtype", DTYPES), ("schedule", SCHEDULES)):
        if key in qp:
            if qp[key] in allowed:
                values[key] = qp[key]
            else:
                errors.append(f"{key}={qp[key]!r} is not one of {', '.join(allowed)}; using {values[key]}.")
    if "mask" in qp:
        try:
            parse_mask(qp["mask"])
            values["mask"] = qp["mask"]
        except ValueError as exc:
            errors.append(f"mask={qp['mask']!r} in the link does not parse: {exc}. Using {values['mask']}.")
    if source == "recorded":
        recs = recordings()
        rec = recording_named(qp.get("trace", "")) if qp.get("trace") else None
        if qp.get("trace") and rec is None:
            errors.append(f"The link names the recording {qp['trace']!r}, which is not bundled here.")
        if rec is None and recs:
            wanted = {k: values[k] for k in DEFAULTS if k in qp} or values
            rec = data_sources.nearest(recs, wanted)
        if rec is None:
            errors.append("The link asks for a recorded trace, but data/traces/ has none here; "
                          "running live instead.")
            source = live_source()
        else:
            trace = rec.name
    ss["ctl_source"] = source
    ss["ctl_trace"] = trace
    for key in ("seq_len", "head_dim", "block_m", "block_n", "dtype", "batch", "heads", "schedule"):
        ss[f"ctl_{key}"] = values[key]
    ss.update(_mask_to_controls(values["mask"], values["seq_len"]))
    ss["ctl_present"] = qp.get("present", "0") in ("1", "true", "yes")
    ss["_url_errors"] = errors
    ss["_default_page"] = qp.get("page") if qp.get("page") in PAGES else "schedule"
    if "page" in qp and qp["page"] not in PAGES:
        errors.append(f"page={qp['page']!r} is not a page here ({', '.join(PAGES)}).")
    ss["_initialised"] = True


def write_query(s: Settings, page: str) -> None:
    want = {"page": page, **s.query()}
    if st.query_params.to_dict() != want:
        st.query_params.from_dict(want)


def show_url_errors() -> None:
    for msg in st.session_state.pop("_url_errors", []) or []:
        st.error(f"The link's settings: {msg}")


# -- sidebar ------------------------------------------------------------------------------------

def _sync_controls(settings: dict) -> None:
    ss = st.session_state
    for key in ("seq_len", "head_dim", "block_m", "block_n", "dtype", "batch", "heads", "schedule"):
        ss[f"ctl_{key}"] = settings[key]
    try:
        ss.update(_mask_to_controls(settings["mask"], settings["seq_len"]))
    except ValueError:
        pass


def _default_docs(n: int) -> str:
    n = max(int(n), 3)
    a, b = n // 4, n // 2
    return f"{a},{b},{n - a - b}"


def mask_from_controls() -> str:
    ss = st.session_state
    kind = ss.get("ctl_mask_kind", "causal")
    if kind == "sliding_window":
        return f"sliding_window:{int(ss.get('ctl_window', 128))}"
    if kind == "prefix_lm":
        return f"prefix_lm:{int(ss.get('ctl_prefix', 128))}"
    if kind == "document":
        return "document:" + str(ss.get("ctl_docs", "")).replace(" ", "")
    return kind


def scale_docs_to_n() -> None:
    """Button callback: rescale the document lengths so they sum to N."""
    ss = st.session_state
    n = int(ss.get("ctl_seq_len", 0))
    try:
        lengths = [int(x) for x in str(ss.get("ctl_docs", "")).split(",") if x.strip()]
    except ValueError:
        lengths = []
    if n <= 0:
        return
    if not lengths or any(x <= 0 for x in lengths) or n < len(lengths):
        ss["ctl_docs"] = _default_docs(n)
        return
    total = sum(lengths)
    scaled = [max(1, math.floor(x * n / total)) for x in lengths]
    scaled[-1] += n - sum(scaled)
    ss["ctl_docs"] = ",".join(map(str, scaled)) if scaled[-1] > 0 else _default_docs(n)


def open_recording(name: str) -> None:
    """Button callback: switch the view to a bundled recording."""
    st.session_state["ctl_source"] = "recorded"
    st.session_state["ctl_trace"] = name


def _source_changed() -> None:
    """Going live from a recording keeps N, mask, D, blocks and dtype; in the interpreter, B and H
    drop to 1 so the first run takes seconds, not minutes (the user can raise them again)."""
    ss = st.session_state
    if ss.get("ctl_source") == "interpreter" and (ss.get("ctl_batch", 1), ss.get("ctl_heads", 1)) != (1, 1):
        ss["_source_note"] = (f"B×H set from {ss.get('ctl_batch')}×{ss.get('ctl_heads')} to 1×1 for the "
                              "CPU interpreter, so a run takes seconds; raise them below if you like.")
        ss["ctl_batch"], ss["ctl_heads"] = 1, 1


def sidebar() -> Settings:
    """Render the shared controls; return the settings they describe."""
    ss = st.session_state
    recs = recordings()
    sources = [live_source(), "recorded", "upload"]
    if ss.get("ctl_source") not in sources:
        ss["ctl_source"] = live_source()
    with st.sidebar:
        st.radio("Source", sources, format_func=SOURCES.get, key="ctl_source", on_change=_source_changed,
                 help="Live runs execute the instrumented Triton kernel now; recordings come "
                      "from real GPUs (data/traces/) or from a zip you upload.")
        note = ss.pop("_source_note", None)
        if note:
            st.info(note, icon=":material/info:")
        source = ss["ctl_source"]
        locked = source in ("recorded", "upload")
        if source == "recorded":
            names = [r.name for r in recs]
            if not names:
                st.warning("No bundled recordings: data/traces/ is empty on this machine.")
            else:
                if ss.get("ctl_trace") not in names:
                    ss["ctl_trace"] = (data_sources.default_recording(recs, DEFAULTS) or recs[0]).name
                st.selectbox("Recording", names, key="ctl_trace",
                             format_func=lambda n: recording_named(n).label)
                _sync_controls(recording_named(ss["ctl_trace"]).settings())
        elif source == "upload":
            up = st.file_uploader("Trace (.zip of a trace directory)", type=["zip"], key="ctl_upload",
                                  help="manifest.json + parquet files, as written by Trace.save")
            st.caption("A link cannot carry an uploaded file: share the zip with the link.")
            if up is not None:
                try:
                    trace = uploaded_trace(up)
                    _sync_controls({**DEFAULTS, **Recording(up.name, "", 0, trace.meta).settings()})
                except RunError:
                    pass  # the page says why
        if locked:
            st.caption("The settings below are the recording's. Switch the source to "
                       f"{SOURCES[live_source()]!r} to change them.")
        st.number_input("Sequence length N", step=64, key="ctl_seq_len", disabled=locked)
        st.selectbox("Mask", MASK_KINDS, key="ctl_mask_kind", disabled=locked)
        kind = ss["ctl_mask_kind"]
        n = ss["ctl_seq_len"]
        if kind == "sliding_window":
            ss.setdefault("ctl_window", max(1, int(n) // 4) if isinstance(n, int) and n > 0 else 128)
            st.number_input("Window W (keys i-W < j <= i)", min_value=1, step=16, key="ctl_window",
                            disabled=locked)
        elif kind == "prefix_lm":
            ss.setdefault("ctl_prefix", max(0, int(n) // 4) if isinstance(n, int) and n > 0 else 128)
            st.number_input("Prefix length P", min_value=0, step=16, key="ctl_prefix", disabled=locked)
        elif kind == "document":
            ss.setdefault("ctl_docs", _default_docs(n if isinstance(n, int) and n > 0 else 512))
            st.text_input("Document lengths (sum to N)", key="ctl_docs", disabled=locked,
                          help="comma-separated, e.g. 128,256,128 for N=512")
        st.selectbox("Head dim D", SUPPORTED_HEAD_DIMS, key="ctl_head_dim", disabled=locked)
        c1, c2 = st.columns(2)
        c1.selectbox("block_m", BLOCK_SIZES, key="ctl_block_m", disabled=locked)
        c2.selectbox("block_n", BLOCK_SIZES, key="ctl_block_n", disabled=locked)
        st.selectbox("dtype", DTYPES, key="ctl_dtype", disabled=locked)
        c1, c2 = st.columns(2)
        c1.number_input("batch B", step=1, key="ctl_batch", disabled=locked)
        c2.number_input("heads H", step=1, key="ctl_heads", disabled=locked)
        st.selectbox("Schedule", SCHEDULES, key="ctl_schedule", disabled=locked,
                     help="natural: programs in launch order; longest_first: query blocks with "
                          "most tiles first; persistent: one program per SM pulls work items")
        st.toggle("Presentation mode", key="ctl_present",
                  help="larger fonts, light background, no clutter: for talks and screenshots")
    return Settings(source=source, seq_len=int(ss["ctl_seq_len"]), mask=mask_from_controls(),
                    head_dim=int(ss["ctl_head_dim"]), block_m=int(ss["ctl_block_m"]),
                    block_n=int(ss["ctl_block_n"]), dtype=ss["ctl_dtype"], batch=int(ss["ctl_batch"]),
                    heads=int(ss["ctl_heads"]), schedule=ss["ctl_schedule"],
                    trace=ss.get("ctl_trace", "") if source == "recorded" else "",
                    present=bool(ss.get("ctl_present")))


def settings() -> Settings:
    """The settings main.py resolved for this run (every page calls this first).

    app/pages/ sits next to main.py, so Streamlit starts in its old pages-directory mode until
    main.py's st.navigation switches it off; in that mode a page file can run without main.py
    (the very first run of a server opened on a page URL, and every AppTest rerun). Then the
    shared controls were never drawn: switch the mode off and rerun through main.py.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory or "_settings" not in st.session_state:
        PagesManager.uses_pages_directory = False
        st.rerun()
    return st.session_state["_settings"]


def as_dict(s: Settings) -> dict:
    return asdict(s)
