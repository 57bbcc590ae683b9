"""What this machine is, and which weights' format runs fastest on it: ``dtype="auto"``.

The fastest way to run a model differs between machines: bfloat16 halves the bytes a decode
step reads, but a CPU without bfloat16 dot products (AVX2 only, AVX-512 without BF16) converts
every weight on the fly, which can make a multi-token forward (prefill, verification) several
times the cost of a one-token step; oneDNN's packed weights (``quickdraft.models.packing``)
help where it computes in bfloat16 but not everywhere, and in float32 verify several tokens
for little more than one; where it does not compute in bfloat16, packed bfloat16 layers widen a
multi-token forward's weights to float32 block by block; int8 draft weights need a quantized
engine. Flags alone do not settle it, so on a CPU ``machine_config`` times one short probe (a
stack of linear layers larger than the caches, one, two, ``VERIFY_ROWS`` and ``PREFILL_ROWS``
rows at a time, each format in turn), picks with ``choose_config`` (a pure function of the flags and the timings) and
caches the result per machine, library version and ISA restriction in the quickdraft cache. It
logs one line: what was chosen and why.

To see what a machine with fewer instructions would choose, restrict the kernels before Python
starts (docs/hardware.md): ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2`` makes oneDNN, ATen and MKL run AVX2 code only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import torch

from quickdraft.kernels import bf16_rows_kernel, int4_kernel

logger = logging.getLogger(__name__)

# The /proc/cpuinfo flags that decide how fast each format runs (x86, then Arm).
ISA_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8",
    "asimd", "bf16", "i8mm", "sve", "sve2",
)
# Environment variables that restrict which instructions the kernels use (docs/hardware.md).
ISA_RESTRICTIONS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
# Rows of the probe's multi-row forward: one verification of K = 5 drafts.
VERIFY_ROWS = 6
# Rows of the probe's prefill forward. Formats are compared on a reference request of
# REFERENCE_PROMPT prompt tokens and REFERENCE_NEW new tokens (a question over a document):
# bfloat16 without native dot products decodes a token faster than float32 on AVX2 but fills a
# long prompt 2-4x slower, and the one-row step alone would not see it.
PREFILL_ROWS = 64
REFERENCE_PROMPT = 512
REFERENCE_NEW = 128
# A format whose reference request is within this share of the fastest counts as fast as it;
# among those, the one whose verification forward is cheapest wins (speculation verifies K + 1 rows).
STEP_TOLERANCE = 0.05
# Other processes using this many cores during the probe: its result is not cached.
BUSY_CORES = 0.5
# Bumped when the probe or the choice changes, so that cached choices are made again.
PROBE_VERSION = 6


@dataclass(frozen=True)
class Hardware:
    """The facts about this machine that decide how models run fastest.

    Attributes:
        cpu: the processor's model name.
        flags: which of ``ISA_FLAGS`` the processor lists.
        cores: logical CPUs; ``threads``: torch's intra-op threads.
        aten_capability: the vector ISA ATen's kernels use (``torch.backends.cpu.get_cpu_capability``:
            "AVX512", "AVX2", "DEFAULT", ...), after ``ATEN_CPU_CAPABILITY``.
        onednn_bf16: oneDNN computes in bfloat16 with native instructions (after
            ``ONEDNN_MAX_CPU_ISA``): packed bfloat16 weights are possible.
        onednn: torch runs oneDNN on this CPU: packed float32 weights are possible.
        int8_engine: a quantized engine (fbgemm, x86, qnnpack) runs dynamic int8 linear layers.
        int4_kernel: the compiled int4 kernel runs here (``quickdraft.kernels.int4_kernel``).
        restrictions: ``ISA_RESTRICTIONS`` set in the environment, as (name, value) pairs.
        gpu: the CUDA device's name, or ``None``; ``gpu_bf16``: it computes in bfloat16.
    """

    cpu: str
    flags: frozenset[str]
    cores: int
    threads: int
    aten_capability: str
    onednn_bf16: bool
    int8_engine: bool
    restrictions: tuple[tuple[str, str], ...] = ()
    onednn: bool = True
    gpu: str | None = None
    gpu_bf16: bool = False
    int4_kernel: bool = False

    @property
    def isa_level(self) -> str:
        """A short name for what the kernels can use: "amx", "avx512-bf16", "avx512", "avx2", "arm-bf16", "arm", "generic"."""
        if "asimd" in self.flags:
            return "arm-bf16" if "bf16" in self.flags and self.onednn_bf16 else "arm"
        if self.onednn_bf16:
            return "amx" if "amx_bf16" in self.flags and self._allows("AMX") else "avx512-bf16"
        if self.aten_capability.startswith("AVX512"):
            return "avx512"
        if self.aten_capability == "AVX2":
            return "avx2"
        return "generic"

    def _allows(self, isa: str) -> bool:
        """Whether ``ONEDNN_MAX_CPU_ISA`` leaves ``isa`` (a prefix of oneDNN's ISA names) usable."""
        limit = dict(self.restrictions).get("ONEDNN_MAX_CPU_ISA", "")
        return not limit or limit.upper().startswith(isa) or limit.upper() == "ALL"

    def describe(self) -> str:
        """One line: the processor, the flags that matter, cores and threads, the GPU."""
        flags = " ".join(sorted(self.flags)) or "none of note"
        restricted = "".join(f", {k}={v}" for k, v in self.restrictions)
        gpu = f", GPU {self.gpu}" if self.gpu else ""
        return (f"{self.cpu} ({self.isa_level}: {flags}{restricted}), {self.cores} cores, "
                f"{self.threads} torch threads{gpu}")

    def to_dict(self) -> dict:
        return {**asdict(self), "flags": sorted(self.flags), "restrictions": dict(self.restrictions),
                "isa_level": self.isa_level}


@dataclass(frozen=True)
class FormatTiming:
    """Seconds of the probe for one weights' format: one row (``step``), ``VERIFY_ROWS`` rows
    (``verify``), two rows (``verify_one``: one draft verified) and ``PREFILL_ROWS`` rows
    (``prefill``); ``None`` where not probed. Two rows tell the jump from one row to a matrix
    product (a third of a step more with packed float32 on AVX2), six the slope after it."""

    step: float
    verify: float
    verify_one: float | None = None
    prefill: float | None = None

    def request_seconds(self) -> float:
        """The reference request (``REFERENCE_PROMPT`` tokens in, ``REFERENCE_NEW`` out) in
        probe seconds: its prefill in ``PREFILL_ROWS``-row forwards, then one-row steps."""
        prefill = 0.0 if self.prefill is None else self.prefill * REFERENCE_PROMPT / PREFILL_ROWS
        return prefill + REFERENCE_NEW * self.step


@dataclass(frozen=True)
class MachineConfig:
    """How models are loaded on this machine by default.

    Attributes:
        dtype: the target's dtype ("float32" or "bfloat16").
        packed_dtypes: the dtypes whose models get packed weights on the CPU (where the probe
            timed packing faster than stock layers for that dtype: one may ask for either).
        draft_quantization: "int4" or "int8" (CPU, float32 activations), or "none".
        draft_dtype: the draft model's dtype ("float32" with int4 or int8 weights).
        reason: why, in a few words (logged and written into reports).
        probe: the timings the choice rests on, by format name (empty when flags decided).
    """

    dtype: str
    packed_dtypes: tuple[str, ...]
    draft_quantization: str
    draft_dtype: str
    reason: str
    probe: dict[str, FormatTiming] | None = None

    @property
    def pack_weights(self) -> bool:
        """Whether the target, in ``dtype``, gets packed weights."""
        return self.dtype in self.packed_dtypes

    def packs(self, dtype: torch.dtype) -> bool:
        """Whether a model in ``dtype`` gets packed weights by default."""
        return format_name(dtype, False) in self.packed_dtypes

    def describe(self) -> str:
        packed = " (packed)" if self.pack_weights else ""
        return f"target {self.dtype}{packed}, draft {draft_format(self.draft_quantization, self.draft_dtype)}: {self.reason}"

    def to_dict(self) -> dict:
        return {**asdict(self), "pack_weights": self.pack_weights}


def detect_hardware() -> Hardware:
    """This machine's ``Hardware``, as torch sees it now."""
    from quickdraft.models.packing import native_bfloat16  # models.loading imports this module

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return Hardware(
        cpu=cpu_model(),
        flags=_cpu_flags(),
        cores=os.cpu_count() or 1,
        threads=torch.get_num_threads(),
        aten_capability=torch.backends.cpu.get_cpu_capability(),
        onednn_bf16=native_bfloat16(torch.device("cpu")),
        int8_engine=any(e in torch.backends.quantized.supported_engines for e in ("fbgemm", "x86", "qnnpack")),
        restrictions=tuple((k, os.environ[k]) for k in ISA_RESTRICTIONS if os.environ.get(k)),
        onednn=torch.backends.mkldnn.is_available(),
        gpu=gpu,
        gpu_bf16=gpu is not None and torch.cuda.is_bf16_supported(),
        int4_kernel=int4_kernel() is not None,
    )


def cpu_model() -> str:
    """The processor's model name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> frozenset[str]:
    """Which of ``ISA_FLAGS`` the processor lists (``/proc/cpuinfo``; empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split()) & frozenset(ISA_FLAGS)
    except OSError:
        pass
    return frozenset()


def format_name(dtype: torch.dtype, packed: bool) -> str:
    """A weights' format as the probe and the bench name it: "float32", "bfloat16-packed", ..."""
    name = str(dtype).removeprefix("torch.")
    return f"{name}-packed" if packed else name


def cpu_formats(hardware: Hardware) -> tuple[str, ...]:
    """The target formats worth timing on this CPU: packed float32 needs oneDNN; packed bfloat16
    is oneDNN's layout where it computes in bfloat16, else widened products
    (``models.packing.WidenedLinear``), which need nothing but torch."""
    formats = ("float32", "bfloat16")
    formats += ("float32-packed",) if hardware.onednn else ()
    return formats + ("bfloat16-packed",)


def choose_config(hardware: Hardware, device: str, probe: dict[str, FormatTiming] | None = None) -> MachineConfig:
    """The loading defaults for ``device`` ("cpu" or "cuda") on ``hardware``: a pure function.

    On a GPU the flags decide: bfloat16 where it computes in it, else float32. On a CPU the
    probe decides: the format that runs the reference request fastest (its prefill and its
    one-row decode steps), where several are within ``STEP_TOLERANCE`` of it, the one of those
    whose ``VERIFY_ROWS``-row forward is cheapest. Without a probe, the flags guess: bfloat16 packed where oneDNN has
    native bfloat16, else float32 with stock layers. The draft gets int4 weights where the int4 kernel runs and
    oneDNN computes in bfloat16 (about a quarter of a bfloat16 draft's bytes, and closer to the float32 draft's
    predictions than int8; a draft reading a prompt widens them to bfloat16, which is fast only there), else int8
    weights where a quantized engine runs them (half the bytes of a bfloat16 draft step), else the target's format.
    """
    if device == "cuda":
        dtype = "bfloat16" if hardware.gpu_bf16 else "float32"
        why = "the GPU computes in bfloat16" if hardware.gpu_bf16 else "the GPU has no bfloat16"
        return MachineConfig(dtype, (), "none", dtype, why)
    if probe:
        chosen = _fastest(probe)
        # Packing is chosen for each dtype on its own, since one may ask for either.
        packed = tuple(d for d in ("float32", "bfloat16") if f"{d}-packed" in probe and _fastest(
            {n: t for n, t in probe.items() if n.split("-")[0] == d}) == f"{d}-packed")
        timings = ", ".join(f"{name} {_ms(t.step)}/{_ms(t.verify)}/{_ms(t.prefill)}" for name, t in probe.items())
        why = f"fastest in the probe (ms for one row/{VERIFY_ROWS} rows/{PREFILL_ROWS} rows: {timings})"
    else:
        chosen = "bfloat16-packed" if hardware.onednn_bf16 else "float32"
        packed = ("bfloat16",) if hardware.onednn_bf16 else ()
        why = ("oneDNN computes in bfloat16 natively" if hardware.onednn_bf16
               else "no native bfloat16 dot products")
    dtype = chosen.split("-")[0]
    # Without native bfloat16 an int4 draft reads a prompt in float32 products, half the speed of
    # int8's integer ones: at the AVX2 level a 256-token prompt took it 2.0 s, and the catch-ups
    # of first tries cost qa and rag 9-10% of a 64-token generation (docs/hardware.md).
    if hardware.int4_kernel and hardware.onednn_bf16:
        return MachineConfig(dtype, packed, "int4", "float32", why, probe)
    if hardware.int8_engine:
        return MachineConfig(dtype, packed, "int8", "float32", why, probe)
    return MachineConfig(dtype, packed, "none", dtype, why, probe)


def draft_format(quantization: str, dtype: str) -> str:
    """How a ``MachineConfig``'s draft runs, from its two fields: "int4 weights", "bfloat16"."""
    return dtype if quantization == "none" else f"{quantization} weights"


def _fastest(probe: dict[str, FormatTiming]) -> str:
    """The format with the fastest reference request; among those within ``STEP_TOLERANCE`` of
    it, the one with the cheapest ``VERIFY_ROWS``-row forward (ties: by name, for determinism)."""
    fastest = min(t.request_seconds() for t in probe.values())
    near = {name: t for name, t in probe.items() if t.request_seconds() <= fastest * (1 + STEP_TOLERANCE)}
    return min(near, key=lambda name: (near[name].verify, name))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


# ---------------------------------------------------------------------------------------------
# The probe


def _busy_ticks() -> tuple[int, int]:
    """(busy clock ticks of the whole machine, clock ticks used by this process) since boot."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    busy = user + nice + system + irq + softirq + steal  # steal: CPU taken by other guests
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return busy, int(own[11]) + int(own[12])  # utime + stime, every thread of this process


@contextmanager
def other_cpu() -> Iterator[dict]:
    """Measure the CPU other processes use during a block: ``{"cores": average}``
    (``None`` off Linux)."""
    figures: dict = {"cores": None}
    try:
        busy0, own0 = _busy_ticks()
    except (OSError, ValueError, IndexError):
        yield figures
        return
    start = time.perf_counter()
    yield figures
    elapsed = time.perf_counter() - start
    busy1, own1 = _busy_ticks()
    if elapsed > 0:
        figures["cores"] = max(0.0, (busy1 - busy0 - (own1 - own0)) / (os.sysconf("SC_CLK_TCK") * elapsed))




def probe_formats(formats: tuple[str, ...], megabytes: int = 1024, rounds: int = 7) -> dict[str, FormatTiming]:
    """Time a stack of decoder blocks' linear layers (``megabytes`` of float32 weights: more
    than the caches, so that a step reads memory as a model's does) in each format, one, two,
    ``VERIFY_ROWS`` and ``PREFILL_ROWS`` rows at a time. The formats take turns within each
    round, after a warm-up round, so that a busy spell of the machine hits each alike; the
    medians are returned, by format."""
    from quickdraft.models.packing import packed_layer

    width = 2048
    # (out, in) of one block: attention's q, k, v (grouped: an eighth of q), o, then the MLP's
    # gate, up and down. The small k and v products matter: a per-call cost weighs most there.
    block = [(width, width), (width // 8, width), (width // 8, width), (width, width),
             (4 * width, width), (4 * width, width), (width, 4 * width)]
    blocks = max(1, megabytes * 2**20 // (sum(o * i for o, i in block) * 4))
    generator = torch.Generator().manual_seed(0)
    base = [torch.randn(o, i, generator=generator) * 0.02 for _ in range(blocks) for o, i in block]
    layers: dict[str, list[torch.nn.Module]] = {}
    for name in formats:
        dtype = getattr(torch, name.split("-")[0])
        stock = [_linear(w.to(dtype)) for w in base]
        layers[name] = [packed_layer(layer) for layer in stock] if name.endswith("-packed") else stock

    def run(name: str, rows: int) -> float:
        dtype = getattr(torch, name.split("-")[0])
        inputs = {i: torch.randn(rows, i, generator=generator).to(dtype) for i in (width, 4 * width)}
        start = time.perf_counter()
        for layer in layers[name]:
            layer(inputs[layer.in_features])
        return time.perf_counter() - start

    rows = (1, VERIFY_ROWS, 2, PREFILL_ROWS)  # in FormatTiming's order
    samples: dict[tuple[str, int], list[float]] = {(n, r): [] for n in formats for r in rows}
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for key in samples:
                seconds = run(*key)
                if round_:  # the first round warms each kernel up
                    samples[key].append(seconds)
    return {n: FormatTiming(*(statistics.median(samples[n, r]) for r in rows)) for n in formats}


def _linear(weight: torch.Tensor) -> torch.nn.Linear:
    """A bias-free ``nn.Linear`` holding ``weight`` (``[out, in]``), not a copy of it."""
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    return layer


def _cache_file(hardware: Hardware) -> Path:
    from quickdraft.models.demo import cache_dir

    # Whether the few-row kernel runs changes widened bfloat16's timings.
    key = json.dumps([PROBE_VERSION, torch.__version__, hardware.cpu, sorted(hardware.flags), hardware.threads,
                      hardware.aten_capability, hardware.onednn_bf16, hardware.restrictions,
                      bf16_rows_kernel() is not None])
    return cache_dir() / "machine" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _write_cached(path: Path, hardware: Hardware, probe: dict[str, FormatTiming]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"hardware": hardware.to_dict(),
                                    "probe": {n: asdict(t) for n, t in probe.items()}}, indent=1))
    except OSError as error:  # a read-only cache costs a probe per process, nothing else
        logger.warning("Cannot cache the machine probe in %s: %s", path, error)


def _read_cached(path: Path) -> dict[str, FormatTiming] | None:
    try:
        data = json.loads(path.read_text())
        return {name: FormatTiming(**timing) for name, timing in data["probe"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


@cache
def machine_config(device: str = "cpu") -> MachineConfig:
    """The loading defaults on this machine for ``device``: on a CPU, probed once (about two
    seconds) and then read from the quickdraft cache. Logs one line with the choice and why."""
    hardware = detect_hardware()
    device = torch.device(device).type
    probe = None
    if device == "cpu":
        path = _cache_file(hardware)
        probe = _read_cached(path)
        if probe is None:
            with other_cpu() as others:
                probe = probe_formats(cpu_formats(hardware))
            if others["cores"] is not None and others["cores"] >= BUSY_CORES:
                # A busy spell skews the formats unevenly: use the result, but probe again next time.
                logger.warning("Other processes used %.1f cores during the machine probe: its choice is not "
                               "cached, and the next process probes again.", others["cores"])
            else:
                _write_cached(path, hardware, probe)
    config = choose_config(hardware, device, probe)
    logger.info("quickdraft on %s: %s", hardware.describe(), config.describe())
    return config
