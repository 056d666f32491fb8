"""One demo run: :func:`run_demo` checks the output folder, runs the stages and saves the result.

Also the progress lines and bars it prints, and the files it writes (``demo.json``,
``results.md``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memsteer_dspy.demo.results import (
    RESULTS_FILE,
    SETTINGS_FILE,
    DemoResult,
    StageReport,
    _lm_summary,
    heldout_comparison,
)
from memsteer_dspy.demo.settings import DemoSettings, accuracy_subset, demo_settings
from memsteer_dspy.demo.stages import _evaluate, _optimize, _slug, _steering, _supervision
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.runfolder import RunFolder, run_key, write_atomic


class _Progress:
    """Stage lines and progress bars: to stderr (True), to a function (lines only), or nowhere."""

    def __init__(self, progress: bool | Callable[[str], None]):
        self.fn = progress if callable(progress) else None
        self.bars = progress is True

    def __call__(self, line: str) -> None:
        if self.fn is not None:
            self.fn(line)
        elif self.bars:
            print(line, file=sys.stderr, flush=True)

    def bar(self, total: int, desc: str, initial: int = 0):
        if not self.bars:
            return None
        from tqdm import tqdm

        return tqdm(
            total=total, initial=initial, desc=desc, unit="QA", dynamic_ncols=True, file=sys.stderr
        )


def _check_folder(out: Path, identity: dict[str, Any], *, restart: bool = False) -> RunFolder:
    """The demo's same-run check, through the run-folder layer: a folder holding a demo with
    other settings (size, LMs, history) is a RunMismatchError naming them; ``restart`` empties it.
    The returned folder holds the writer lock until it is closed."""
    return RunFolder.open(
        out, run_key("demo", options=identity), restart=restart, legacy_files=(SETTINGS_FILE,)
    )


def run_demo(
    out_dir: str | Path,
    lm_config: Any,
    *,
    size: str = "small",
    settings: DemoSettings | None = None,
    cache_dir: str | Path | None = None,
    tracking_uri: str | None = None,
    tracking: bool = True,
    progress: bool | Callable[[str], None] = True,
    restart: bool = False,
    steering: bool | str | Path = True,
) -> DemoResult:
    """Run (or resume) the demo into ``out_dir`` and return its result (also in ``demo.json``).

    Args:
        out_dir: the demo's folder; a rerun with the same settings and LMs resumes it.
        lm_config: an :class:`~memsteer_dspy.lm.LMConfig` (role → LM; the embedded model by default).
        size: ``"small"`` (sized for a 2-core CPU with the embedded model; 12 min measured on
            an AVX2-only one) or ``"full"``.
        settings: explicit :class:`DemoSettings` instead of a named size (tests, custom runs).
        cache_dir: where stores and indexes are kept (default ``out_dir/indexes``).
        tracking_uri: MLflow tracking URI (default ``$MLFLOW_TRACKING_URI``, else
            ``sqlite:///<out_dir>/mlflow.db``).
        tracking: False writes only the local files.
        progress: True prints stage lines and progress bars to stderr; a function receives the
            stage lines instead; False is silent.
        restart: empty ``out_dir`` first instead of resuming (a folder holding a demo with other
            settings is otherwise a :class:`~memsteer_dspy.runfolder.RunMismatchError`).
        steering: score the steering panel on the accepted and the hand-written items (a
            diagnosis, LM-free; True: the package's panel, a path: that panel, False: skip).
    """
    from memsteer_dspy.demo_data import load_demo
    from memsteer_dspy.tracking import Tracker

    t_start = time.perf_counter()
    settings, resolved = (settings or demo_settings(size)).resolve(lm_config)
    out = Path(out_dir).expanduser()
    say = _Progress(progress)
    loaded = load_demo()
    history = loaded.history
    described = lm_config.describe()
    identity = {**settings.identity(), "lm": described, "history_fingerprint": history.fingerprint}
    folder = _check_folder(out, identity, restart=restart)  # held (one writer) until the demo ends
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else out / "indexes"
    if tracking:
        tracker = Tracker.for_history(out, history.user_id, history.fingerprint, uri=tracking_uri)
    else:
        tracker = Tracker.disabled()
    result = DemoResult(
        out_dir=str(out.resolve()),
        settings=settings,
        sized_down=settings.sized_down(),
        user=history.user_id,
        records=len(history),
        lm=described,
    )
    _save(out, identity, result)
    d0 = MemoryDesign.base_bm25()
    d0 = d0.model_copy(
        update={"context": d0.context.model_copy(update={"budget_tokens": settings.context_budget})}
    )
    say(
        f"MemSteer demo ({settings.size}) on {history.user_id}: {len(history)} records, "
        f"{len(loaded.qa_items)} hand-written QA items; LM {_lm_summary(described)}; output {out}"
    )
    for line in result.sized_down:
        say(f"  sized down: {line}")
    say(f"  MemSteer-Opt {resolved.line()}")

    # 1. supervision ----------------------------------------------------------------------------
    train, val = _supervision(history, lm_config, out / "supervision", settings, say, result)
    _save(out, identity, result)
    if (train or val) and steering is not False:  # does it steer? a diagnosis: nothing reads it
        panel = None if steering is True else Path(steering)
        _steering(history, loaded.qa_items, out / "supervision", d0, panel, cache, say, result)
        _save(out, identity, result)

    # 2. optimization ---------------------------------------------------------------------------
    best = _optimize(
        history,
        train,
        val,
        d0,
        lm_config,
        out / "optimize",
        settings,
        resolved,
        tracker,
        cache,
        say,
        result,
    )
    _save(out, identity, result)

    # 3. evaluation on the hand-written set -----------------------------------------------------
    items = list(loaded.qa_items)
    answered = accuracy_subset(items, settings.accuracy_items)
    designs = [("Base-BM25", d0), ("MemSteer-Opt", best)]
    for i, (label, design) in enumerate(designs):
        if i and design.key() == d0.key():
            row = result.rows[0].model_copy(
                update={
                    "label": label,
                    "same_as": "Base-BM25",
                    "lm_calls": 0,
                    "cache_hits": 0,
                    "tokens": 0,
                    "seconds": 0.0,
                }
            )
            result.rows.append(row)
            result.stages.append(
                StageReport(
                    name=f"eval {label}",
                    status="skipped",
                    detail="no revision was accepted: the best design is Base-BM25",
                )
            )
            say(f"[{3 + i}/4] evaluation of {label}: skipped, {result.stages[-1].detail}")
            continue
        _evaluate(
            label,
            design,
            history,
            items,
            answered,
            lm_config,
            out / "eval" / _slug(label),
            settings,
            tracker,
            cache,
            say,
            result,
            step=3 + i,
        )
        _save(out, identity, result)

    if len(result.rows) == 2:
        result.heldout = heldout_comparison(result.rows[0], result.rows[1], settings.objective)
    result.tracking_uri = tracker.uri if tracker.active else None
    result.mlflow_ui = tracker.ui_command() if tracker.active else None
    result.tracking_failure = tracker.failure
    result.lm_usage = lm_config.usage_by_role()
    result.seconds = round(time.perf_counter() - t_start, 1)
    _save(out, identity, result)
    write_atomic(out / RESULTS_FILE, _results_md(result))
    folder.close()
    return result


def _save(out: Path, identity: dict[str, Any], result: DemoResult) -> None:
    payload = {"identity": identity, "result": result.model_dump(mode="json")}
    write_atomic(out / SETTINGS_FILE, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def _results_md(result: DemoResult) -> str:
    return f"# MemSteer demo ({result.settings.size})\n\n{result.render()}\n"
