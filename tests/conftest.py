import os

# The Triton interpreter must be chosen before any @triton.jit module (or triton) is imported.
# Without CUDA every kernel runs in the interpreter; on a GPU machine the suite runs compiled.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"

import pytest  # noqa: E402
import torch  # noqa: E402

ON_GPU = os.environ["TRITON_INTERPRET"] in ("0", "") and torch.cuda.is_available()


def _patch_the_interpreters_language_once_per_launch() -> None:
    """Triton's interpreter swaps triton.language's builtins for interpreted ones when a launch
    starts (GridExecutor, restored when it ends) and again at every call of a @triton.jit helper
    inside it (InterpretedFunction: an inspect.getmembers walk of tl, tl.tensor and tl.math, a
    quarter of a small kernel test's CPU). Inside a launch the second swap finds those modules
    already swapped (their builtins are its wrappers, and the tensor / core patches are rebuilt
    alike), so it is skipped there for modules this launch has swapped: the same language, the
    same results. A helper that sees a module the launch has not swapped (tl.core under another
    name) is patched as before; outside a launch, or with another interpreter (these names or
    that call missing), nothing changes. Per thread, as the interpreter's own state is."""
    import inspect
    import threading

    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp

        device_call = inspect.getsource(interp.InterpretedFunction.__call__)
        launch = interp.GridExecutor.__call__
        original = interp._patch_lang
    except (ImportError, AttributeError, OSError, TypeError):
        return
    if "_patch_lang(self.fn)" not in device_call or getattr(original, "once_per_launch", False):
        return
    local = threading.local()

    def patch_lang(fn):
        swapped = getattr(local, "swapped", None)
        langs = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if swapped is None:
            return original(fn)
        if langs and langs <= swapped:
            return interp._LangPatchScope()          # nothing to restore: the launch restores its own
        scope = original(fn)
        swapped |= langs
        return scope

    def launched(self, *args, **kwargs):
        outer = getattr(local, "swapped", None)
        local.swapped = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            local.swapped = outer

    patch_lang.once_per_launch = True
    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launched


if not ON_GPU and os.environ["TRITON_INTERPRET"] not in ("0", ""):
    _patch_the_interpreters_language_once_per_launch()


@pytest.fixture(scope="session")
def device():
    """Where kernel tests put their tensors: CUDA when compiled, CPU in the interpreter."""
    return torch.device("cuda" if ON_GPU else "cpu")


# Under `-n 4` or more on the 2-CPU CI machine, the browser files go to two browser workers from
# the start while the others run everything else at a lower CPU priority: a browser test mostly
# waits (for Chromium to lay out and draw, for the app's server), so the CPU-bound tests fill its
# waits, and the niced workers leave the CPUs to Chromium and the app server whenever those want
# them (a loaded browser test draws as late as on an idle machine, not 2-3x later).
BROWSER_FILE = "test_browser"      # every browser test's file name starts with this (checked below)


def browser_workers(count: int) -> tuple[str, ...]:
    """The xdist workers that take the browser files first: two of four or more, one of three, none
    of fewer (then every worker takes the browser files after the others, as with `-n 2`)."""
    return tuple(f"gw{i}" for i in range(2 if count >= 4 else 1 if count == 3 else 0))


def _is_browser_scope(scope: str) -> bool:
    return scope.rsplit("/", 1)[-1].startswith(BROWSER_FILE)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `-n N` the suite is dealt out by file (xdist's loadfile), in the collection order
    below: a file's module-scoped fixtures (recordings made in the interpreter, most of them) are
    then built by one worker, not by every worker that runs one of its tests. With fewer than three
    workers the browser files stay last on every worker; with more, browser_workers take them
    first (and nothing else: Playwright's sync API holds a running asyncio loop in a worker that
    has used it), the others take the other files, then any browser file still waiting. An
    explicit other --dist keeps xdist's own scheduler."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByRole(LoadFileScheduling):
        roles = None            # whether the suite has browser files: decided at the first assignment

        def _assign_work_unit(self, node):
            if self.roles is None:
                self.roles = any(_is_browser_scope(s) for s in self.workqueue)
            if not self.roles:
                return super()._assign_work_unit(node)
            browser = node.gateway.id in browser_workers(self.numnodes)
            scope = next((s for s in self.workqueue if _is_browser_scope(s) == browser), None)
            if scope is None and not browser:
                scope = next(iter(self.workqueue))          # a browser file nobody has taken yet
            if scope is None:
                # a browser worker takes no other file: told now that it is done, it runs the last
                # test it holds (a worker keeps one back until it knows what comes next)
                node.shutdown()
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False          # keep the collection order (browser files last)
    return ByRole(config, log)


def _lower_the_priority_of_a_cpu_worker(items) -> None:
    """A worker that is not a browser worker (under `-n 3` or more) runs at nice 10 when the suite
    runs browser tests: Chromium and the app server (started by the browser workers, at the normal
    priority) get the CPUs first."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker or worker in browser_workers(count) or not browser_workers(count):
        return
    if any("browser" in item.keywords and not item.get_closest_marker("skip") for item in items):
        try:
            os.nice(10)
        except OSError:
            pass


def pytest_collection_modifyitems(config, items):
    # Browser tests last (tests/app/conftest.py): they share one Chromium whose Playwright sync API
    # holds a running asyncio loop until the session ends. The ones that want a server no session
    # has used yet go first among them (their file first), so the shared server is theirs at no
    # extra start; then the browser files with the most tests, so that under xdist (dealt out by
    # file) the last file a worker takes is a short one.
    browser_files: dict = {}
    for item in items:
        if "browser" in item.keywords:
            if not item.path.name.startswith(BROWSER_FILE):
                raise pytest.UsageError(f"{item.nodeid}: a browser test goes in a file named {BROWSER_FILE}*.py "
                                        "(the xdist scheduler above deals those to the browser workers)")
            fresh = "fresh_app_server" in getattr(item, "fixturenames", ())
            n_tests, has_fresh = browser_files.get(item.path, (0, False))
            browser_files[item.path] = (n_tests + 1, has_fresh or fresh)

    def order(item):
        if "browser" not in item.keywords:
            return (0,)
        n_tests, has_fresh = browser_files[item.path]
        fresh = "fresh_app_server" in getattr(item, "fixturenames", ())
        return (1, not has_fresh, -n_tests, str(item.path), not fresh)

    items.sort(key=order)          # stable: file order within each group
    from app.browser import missing_reason

    # no Chrome / Chromium (app.browser: BROWSER_PATH, else PATH): browser tests skip with the reason
    no_browser = missing_reason("the browser tests drive Chrome or Chromium")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (run on the lent GPU)"))
        elif "browser" in item.keywords and no_browser:
            item.add_marker(pytest.mark.skip(reason=no_browser))
    _lower_the_priority_of_a_cpu_worker(items)


# -- one small causal problem under the three schedules, shared by the modules that draw them -----

SCHEDULES = ("natural", "longest_first", "persistent")


@pytest.fixture(scope="session")
def causal_schedules(tmp_path_factory) -> dict:
    """{schedule: saved trace directory}: one causal problem (B=2, H=2, N=256, D=32, fp16, seed 1,
    32x32 blocks, tile detail for heads 0 and 3) recorded in the interpreter with each schedule,
    once per run: under xdist the first worker that asks records them into the run's shared
    temporary directory (a file lock), the others read those. Tests must not change them (load
    a Trace from a directory: instrumentation.trace.Trace.load)."""
    from tests.once_per_run import made_once_per_run

    root = made_once_per_run(tmp_path_factory, "causal_schedules", _record_causal_schedules)
    return {s: root / s for s in SCHEDULES}


def _record_causal_schedules(root) -> None:
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(2, 2, 256, 32, "fp16", seed=1)
    for s in SCHEDULES:
        record(q, k, v, mask="causal", block_m=32, block_n=32, schedule=s, trace_head=[0, 3])[1].save(root / s)
