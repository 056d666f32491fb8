"""Which users a batch runs over (``--users all|FILE|U1,U2``) and the history options that point
the single-user command at one of them."""

from __future__ import annotations

import json
from pathlib import Path

from memsteer_dspy.errors import InputError

BATCH_DIR = "_batch"  # the batch's own bookkeeping inside --out; a user may not be named so


def list_users(format: str, path: str | Path | None) -> list[str]:
    """Every user a history source holds: RHELM personas, LoCoMo sample ids, or for ``jsonl`` the
    sub-folders of ``path`` holding ``records.jsonl`` and its ``*.jsonl`` files (one user each)."""
    if format == "rhelm":
        from memsteer_dspy.loaders.rhelm import default_rhelm_root, list_personas

        root = Path(path) if path is not None else default_rhelm_root()
        if root is None:
            raise InputError(
                "RHELM data not found",
                field="--path",
                hint="pass --path <rhelm folder> or set MEMSTEER_RHELM_ROOT",
            )
        return list_personas(root)
    if path is None:
        raise InputError(f"--users all needs --path for format {format!r}", field="--path")
    path = Path(path)
    if format == "locomo":
        try:
            samples = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the LoCoMo file: {exc}", file=path) from None
        if not isinstance(samples, list):
            raise InputError("a LoCoMo file is a JSON list of samples", file=path)
        return [str(s.get("sample_id", i)) for i, s in enumerate(samples) if isinstance(s, dict)]
    if format == "jsonl":
        if not path.is_dir():
            raise InputError(
                "--users all with --format jsonl needs a folder of users",
                file=path,
                hint="one sub-folder per user holding records.jsonl (and qa.jsonl), or one <user>.jsonl file each",
            )
        if (path / "records.jsonl").exists():
            raise InputError(
                "this folder is one user's history, not a folder of users",
                file=path,
                hint="point --path at the folder above it, or pass --users with --format jsonl per user",
            )
        users = [
            p.name for p in sorted(path.iterdir()) if p.is_dir() and (p / "records.jsonl").exists()
        ]
        users += [p.stem for p in sorted(path.glob("*.jsonl")) if p.stem not in users]
        if not users:
            raise InputError(
                "no user histories in this folder",
                file=path,
                hint="one sub-folder per user holding records.jsonl, or one <user>.jsonl file each",
            )
        return users
    raise InputError(
        f"--users all is not supported for format {format!r}",
        field="--users",
        hint="pass the users as a file (one per line) or a comma-separated list",
    )


def resolve_users(spec: str, format: str, path: str | Path | None) -> list[str]:
    """``all`` (every user of the source), a file with one user per line (``#`` comments and
    blank lines skipped), or a comma-separated list. Duplicates are dropped, order kept."""
    spec = spec.strip()
    if spec == "all":
        users = list_users(format, path)
    elif Path(spec).is_file():
        lines = Path(spec).read_text(encoding="utf-8").splitlines()
        users = [ln.split("#", 1)[0].strip() for ln in lines]
    else:
        users = [u.strip() for u in spec.split(",")]
    users = list(dict.fromkeys(u for u in users if u))
    if not users:
        raise InputError(
            "no users to run",
            field="--users",
            hint="pass 'all', a file with one user per line, or U1,U2",
        )
    for u in users:
        if u == BATCH_DIR or "/" in u or "\\" in u or u in (".", ".."):
            raise InputError(
                f"user name {u!r} cannot name a folder",
                field="--users",
                hint=f"a user is a folder under --out: no path separators, not {BATCH_DIR!r}",
            )
    return users


def history_argv(
    format: str,
    path: str | Path | None,
    user: str,
    *,
    external: bool = True,
    on_error: str = "raise",
) -> list[str]:
    """The history options of the single-user command for ``user``."""
    argv = ["--format", format, "--user", user, "--on-error", on_error]
    if format == "jsonl" and path is not None:
        folder = Path(path)
        if folder.is_dir() and not (folder / "records.jsonl").exists():
            per_user = folder / user
            path = per_user if per_user.is_dir() else folder / f"{user}.jsonl"
    if path is not None:
        argv += ["--path", str(Path(path).resolve())]
    if format == "rhelm":
        argv.append("--external" if external else "--no-external")
    return argv
