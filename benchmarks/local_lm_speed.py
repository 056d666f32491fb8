"""Speed of the embedded LM (local/qwen2.5-coder-1.5b): assembly, load, and one structured call.

Usage::

    python benchmarks/local_lm_speed.py                     # ~1k-token prompt, llama.cpp's threads
    python benchmarks/local_lm_speed.py --records 300       # a ~6k-token prompt (n_ctx 8192)
    python benchmarks/local_lm_speed.py --n-threads 2 --cold  # also time a cold assembly

Prints the model assembly + verification time (``--cold`` assembles into a temporary cache, as on a
first install, then deletes it; otherwise the cached file is checked through its stamp), the model
load time, and for one typed call through ``dspy.Predict`` + ``JSONAdapter`` (grammar-constrained,
DSPy cache off): prompt and completion tokens, wall time, and llama.cpp's prompt-evaluation and
generation tokens/s. Writes nothing outside the temporary cache.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dspy  # noqa: E402

from memsteer_dspy.lm import DEFAULT_LM, LMSpec, build_lm  # noqa: E402
from memsteer_dspy.lm.model_files import EMBEDDED_MODELS, ensure_embedded_model  # noqa: E402


class FindPlace(dspy.Signature):
    """Answer the question using only the records. Cite the record ids you used."""

    records: str = dspy.InputField()
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()
    cited_record_ids: list[str] = dspy.OutputField()
    confidence: float = dspy.OutputField()


def synthetic_records(n: int, seed: int = 0) -> tuple[str, str]:
    """``n`` short dated records (about 20 tokens each) and a question one of them answers."""
    rng = random.Random(seed)
    people = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana"]
    places = ["the library", "Cafe Lune", "the harbour office", "room 4B", "the north lab"]
    topics = ["the budget", "a grant draft", "the move", "hiring", "the audit", "a demo"]
    lines = []
    for i in range(n):
        lines.append(
            f"[r{i}] 2024-03-{1 + i % 28:02d}: met {rng.choice(people)} at {rng.choice(places)} "
            f"to discuss {rng.choice(topics)}."
        )
    target = rng.randrange(n)
    lines[target] = f"[r{target}] 2024-04-02: met Ines at the glass pavilion to discuss the lease."
    return "\n".join(lines), "Where did I meet Ines to discuss the lease?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records", type=int, default=50, help="records in the prompt (~20 tok each)"
    )
    parser.add_argument("--n-threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--cold", action="store_true", help="also time a cold assembly")
    args = parser.parse_args()

    name = DEFAULT_LM.split("/", 1)[1]
    model = EMBEDDED_MODELS[name]
    if args.cold:
        tmp = Path(tempfile.mkdtemp(prefix="memsteer-model-"))
        start = time.perf_counter()
        ensure_embedded_model(name, tmp)
        cold = time.perf_counter() - start
        shutil.rmtree(tmp)
        print(f"cold assembly + sha256 verify of {model.size / 1e9:.2f} GB: {cold:.2f} s")
    start = time.perf_counter()
    path = ensure_embedded_model(name)
    print(f"cached model check (stamp):            {(time.perf_counter() - start) * 1000:.1f} ms")

    spec = LMSpec(model=DEFAULT_LM, n_ctx=args.n_ctx, n_threads=args.n_threads, max_tokens=256)
    lm = build_lm(spec, role="answerer").copy(cache=False)
    engine = lm.engine
    start = time.perf_counter()
    shared = engine.model()
    print(f"model load ({path.name}):  {time.perf_counter() - start:.2f} s")
    print(f"threads: n_threads={shared.llama.n_threads} (cpu_count={os.cpu_count()})")

    records, question = synthetic_records(args.records)
    start = time.perf_counter()
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = dspy.Predict(FindPlace)(records=records, question=question)
    wall = time.perf_counter() - start
    usage = lm.meter.by_role()["answerer"]
    t = engine.last_timings
    print(
        f"one structured call: {usage['prompt_tokens']} prompt + {usage['completion_tokens']} "
        f"completion tokens in {wall:.2f} s"
    )
    print(
        f"  prompt evaluation: {t.prompt_tokens} tok in {t.prompt_ms / 1000:.2f} s = "
        f"{t.prompt_tokens_per_s:.1f} tok/s"
    )
    print(
        f"  generation:        {t.generated_tokens} tok in {t.generation_ms / 1000:.2f} s = "
        f"{t.generation_tokens_per_s:.1f} tok/s"
    )
    print(
        f"  output: answer={out.answer!r} cited={out.cited_record_ids} confidence={out.confidence}"
    )


if __name__ == "__main__":
    main()
