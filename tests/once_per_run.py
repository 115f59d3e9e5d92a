"""Test data made once per pytest run, also under xdist: the first worker that asks makes it in the
run's shared temporary directory under a file lock; the others read what it made."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path


def made_once_per_run(tmp_path_factory, name: str, make) -> Path:
    """The directory `name` filled by make(directory), made once per run.

    Arguments:
        tmp_path_factory: pytest's session fixture.
        name: the directory's name (also its lock and done files').
        make: called with the (empty) directory to fill.
    Returns: the directory. Tests must not change it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.mktemp(name)
        make(root)
        return root
    shared = tmp_path_factory.getbasetemp().parent          # this run's, shared by its workers
    root, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)              # a worker that died half-way
            make(root)
            done.touch()
    return root
