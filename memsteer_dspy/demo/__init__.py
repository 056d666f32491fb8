"""``memsteer demo``: the whole MemSteer method once, on the demo history shipped in the package.

The demo is the README's first command. On the embedded local LM (or any LM given with ``--lm``) it
runs the paper's pipeline end to end for one user, Nora Whitfield (``memsteer_dspy.demo_data``):

1. **supervision** — MemSteer turns her unlabeled history into verified QA–evidence supervision
   (:func:`~memsteer_dspy.supervision.run.generate_supervision`), split into train and validation;
2. **optimization** — MemSteer-Opt revises the memory design from Base-BM25 with evidence-guided
   feedback, accepting a revision only when it scores strictly better on validation
   (:class:`~memsteer_dspy.optimize.loop.MemSteerOpt`), tracked in MLflow;
3. **evaluation** — Base-BM25 and the best design are scored on the demo's hand-written QA set
   (never used for optimization): accuracy, QS, R@10, LM calls, tokens and wall time, side by side.

The answer-context budget is the same for both designs (the paper holds it fixed). Every stage
writes to its own subfolder of ``out_dir`` and resumes there, so a rerun reuses finished work:

=========================  ==========================================================================
``supervision/``           ``generate`` output: train.jsonl, val.jsonl, rejected.jsonl, summary.json
``optimize/``              ``optimize`` output: best_design.json, trajectory.jsonl, summary.md, ...
``eval/<design>/recall/``  R@k on every hand-written item (retrieval only)
``eval/<design>/answer/``  accuracy and QS on the answered items (answerer + judge)
``eval/<design>/cost.json`` LM calls, tokens and seconds spent evaluating that design
``indexes/``               built stores and indexes, shared by every design
``mlflow.db``              the MLflow store (``mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db``)
``demo.json``              the settings and the result; ``results.md`` the table
=========================  ==========================================================================

Two sizes: ``small`` (the default) is sized for a 2-core CPU with the embedded 1.5B model
(measured on an AVX2-only 2-core AMD EPYC: 12 min, nearly all of it generating supervision; the README
has every timing) by generating a handful of items, optimizing for delivered recall for a few
iterations (no answering during optimization; stopped early once the best design is at the
maximum on validation) and comparing the designs on R@10 and delivered recall over every
hand-written item with a smaller (fixed) context, answering none unless ``--accuracy-items N``
asks; ``full`` runs the paper-sized version. :meth:`DemoSettings.sized_down` says what
a size changes relative to ``full``, and the demo prints it.

The package's modules: :mod:`~.settings` (the sizes), :mod:`~.results` (what a run reports and
how it is printed), :mod:`~.stages` (supervision, steering, optimization, evaluation) and
:mod:`~.run` (:func:`run_demo`).
"""

from __future__ import annotations

from memsteer_dspy.demo.results import RESULTS_FILE as RESULTS_FILE
from memsteer_dspy.demo.results import SETTINGS_FILE as SETTINGS_FILE
from memsteer_dspy.demo.results import DemoResult, DesignRow, StageReport
from memsteer_dspy.demo.results import heldout_comparison as heldout_comparison
from memsteer_dspy.demo.run import run_demo
from memsteer_dspy.demo.settings import SIZES, DemoSettings, accuracy_subset, demo_settings
from memsteer_dspy.demo.settings import SizeName as SizeName
from memsteer_dspy.demo.stages import USAGE_KEYS as USAGE_KEYS

__all__ = [
    "SIZES",
    "DemoResult",
    "DemoSettings",
    "DesignRow",
    "StageReport",
    "accuracy_subset",
    "demo_settings",
    "run_demo",
]
