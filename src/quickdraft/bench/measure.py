"""Measuring instruments for the benchmark: forward timings, peak memory, the environment.

Forward timings come from hooks on the models' ``forward``, so they are taken the same way for
quickdraft's loop and for transformers' ``generate``: every forward of a watched model is
recorded as ``(model label, positions fed, seconds)``.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from quickdraft.hardware import cpu_model, detect_hardware, machine_config, other_cpu

_PROC_STATUS = Path("/proc/self/status")
_PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


class ForwardTimer:
    """Records the wall time of every forward of the watched modules while active.

    Usage::

        timer = ForwardTimer({"target": target.module, "draft": draft.module})
        with timer.recording() as calls:
            decoder.generate(...)
        # calls: [("target", 38, 0.91), ("draft", 1, 0.10), ...]

    A label may watch several modules, e.g. a model and its decoder (quickdraft's draft runs the
    decoder alone when it computes only part of the output layer): a call nested in another
    call of the same label is not recorded again, so each forward counts once, outermost. On
    CUDA the device is synchronised around each forward so that the time is the forward's, not
    its launch's.
    """

    def __init__(self, modules: dict[str, torch.nn.Module | list[torch.nn.Module]]) -> None:
        self.modules = {label: m if isinstance(m, list) else [m] for label, m in modules.items()}
        self._calls: list[tuple[str, int, float]] | None = None

    def _positions(self, args: tuple, kwargs: dict) -> int:
        tensor = kwargs.get("input_ids")
        if tensor is None:
            tensor = kwargs.get("inputs_embeds")
        if tensor is None and args:
            tensor = args[0]
        return int(tensor.shape[1]) if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2 else 0

    @contextmanager
    def recording(self) -> Iterator[list[tuple[str, int, float]]]:
        calls: list[tuple[str, int, float]] = []
        handles = []
        for label, modules in self.modules.items():
            started: list[tuple[int, float]] = []  # one entry per open call of this label, outermost first
            cuda = next(modules[0].parameters()).device.type == "cuda"

            def before(mod, args, kwargs, started=started, cuda=cuda):
                if cuda and not started:
                    torch.cuda.synchronize()
                started.append((self._positions(args, kwargs), time.perf_counter()))

            def after(mod, args, kwargs, output, started=started, label=label, cuda=cuda):
                positions, start = started.pop()
                if started:  # nested in a call of the same label: the outer call counts it
                    return
                if cuda:
                    torch.cuda.synchronize()
                calls.append((label, positions, time.perf_counter() - start))

            for module in modules:
                handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
                handles.append(module.register_forward_hook(after, with_kwargs=True))
        try:
            yield calls
        finally:
            for handle in handles:
                handle.remove()


def _status_kib(field: str) -> int | None:
    try:
        for line in _PROC_STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int | None:
    """Resident memory of this process now (``VmRSS``), or ``None`` off Linux."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes() -> int | None:
    """Peak resident memory (``VmHWM``) since the process started or ``reset_peak_rss``."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux: write 5 to clear_refs); False if not possible."""
    try:
        _PROC_CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


@contextmanager
def peak_memory(device: torch.device) -> Iterator[dict]:
    """Measure peak memory over a block: ``{"rss_before", "peak_rss", "cuda_peak"}`` in bytes.

    ``peak_rss`` is the process's peak resident set during the block when the kernel lets the
    peak be reset, else since the start of the process (``peak_rss_reset`` says which).
    """
    figures: dict = {"rss_before": rss_bytes(), "peak_rss_reset": reset_peak_rss(), "cuda_peak": None}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    yield figures
    figures["peak_rss"] = peak_rss_bytes()
    if device.type == "cuda":
        figures["cuda_peak"] = torch.cuda.max_memory_allocated(device)


def load_average() -> float | None:
    """The 1-minute load average (how busy the machine is), or ``None``."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _git_commit() -> str | None:
    """The commit of the quickdraft checkout this runs from (``+dirty`` with local changes)."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def environment(device: torch.device) -> dict:
    """What the figures depend on: hardware, threads, library versions, commit, date."""
    import transformers

    import quickdraft

    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "quickdraft": quickdraft.__version__,
        "git_commit": _git_commit(),
        "device": str(device),
        "memory_total_bytes": None,
        "load_average_1min": load_average(),
    }
    try:
        env["memory_total_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    if device.type == "cuda":
        env["cuda_device"] = torch.cuda.get_device_name(device)
    env["hardware"] = detect_hardware().to_dict()
    env["machine_config"] = machine_config(device.type).to_dict()
    return env


def other_cpu_load(interval: float = 0.5) -> float | None:
    """Cores' worth of CPU that other processes use over the next ``interval`` seconds."""
    with other_cpu() as figures:
        time.sleep(interval)
    return figures["cores"]


def wait_for_quiet(max_seconds: float, threshold: float = 0.3, poll: float = 5.0) -> float:
    """Wait until other processes use less than ``threshold`` cores, at most ``max_seconds``;
    return the seconds waited. On a shared machine this keeps timed runs out of other people's
    busy spells instead of timing the contention."""
    waited = 0.0
    while waited < max_seconds:
        load = other_cpu_load()
        if load is None or load < threshold:
            break
        time.sleep(poll)
        waited += poll
    return waited
