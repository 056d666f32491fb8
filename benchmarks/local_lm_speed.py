"""Speed of the embedded LM (local/qwen2.5-coder-1.5b): assembly, load, one structured call, builds.

Usage::

    python benchmarks/local_lm_speed.py                     # ~1k-token prompt, llama.cpp's threads
    python benchmarks/local_lm_speed.py --records 300       # a ~6k-token prompt (n_ctx 8192)
    python benchmarks/local_lm_speed.py --n-threads 2 --cold  # also time a cold assembly
    python benchmarks/local_lm_speed.py --builds installed,plain-avx2   # compare llama.cpp builds

``--builds`` measures raw prompt processing (a ~1,500-token prompt) and generation (64 tokens) of the
same model under several llama-cpp-python builds in one run, each in its own child process,
alternating builds over ``--repeats`` rounds, and prints tokens/s, the best of the rounds, and each
build's ratio to the first: ``installed`` is the build in this environment (its CMAKE_ARGS as
recorded by ``make install``), ``plain-avx2`` the portable AVX2 build without AVX-512 or AMX,
``chosen`` the flags ``memsteer_dspy/lm/buildflags.py`` picks for this CPU, ``native`` llama.cpp's
default ``-march=native`` build (never on a CPU with AMX: it crashes there). A build that is not
installed is built once into the wheel cache (about 5 minutes each on 2 cores) and put on the
child's ``PYTHONPATH``. The CPU's model and features are printed with the numbers.

Prints the model assembly + verification time (``--cold`` assembles into a temporary cache, as on a
first install, then deletes it; otherwise the cached file is checked through its stamp), the model
load time, and for one typed call through ``dspy.Predict`` + ``JSONAdapter`` (grammar-constrained,
DSPy cache off): prompt and completion tokens, wall time, and llama.cpp's prompt-evaluation and
generation tokens/s. Writes nothing outside the temporary cache.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dspy  # noqa: E402

from memsteer_dspy.lm import DEFAULT_LM, LMSpec, build_lm, buildflags  # noqa: E402
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


BUILD_ARGS = {
    "plain-avx2": lambda: buildflags.PLAIN_AVX2_ARGS,
    "chosen": lambda: buildflags.cmake_args(),
    "native": lambda: "-DGGML_NATIVE=ON",
}


def _site_for(build: str) -> tuple[str | None, str]:
    """(a PYTHONPATH holding that build's llama_cpp, or None for the installed one; its CMAKE_ARGS)."""
    if build == "installed":
        record = buildflags.installed_build_record() or {}
        return None, record.get("cmake_args", "(not recorded: installed outside make install)")
    args = BUILD_ARGS[build]()
    if build == "native" and any(f.startswith("amx") for f in buildflags.reported_features()):
        raise SystemExit("refusing to run a native build on a CPU with AMX: it segfaults there")
    wheel = buildflags.ensure_wheel(sys.executable, args)
    site = wheel.parent / "site"
    if not (site / "llama_cpp").is_dir():
        tmp = wheel.parent / f"site.{os.getpid()}.tmp"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(tmp),
                str(wheel),
            ],
            check=True,
        )
        os.replace(tmp, site)
    return str(site), args


def _long_prompt(tokens: int) -> str:
    records, question = synthetic_records(max(1, tokens // 22))
    return f"{records}\nQuestion: {question}\nAnswer:"


def measure_child(
    model_path: str, prompt_tokens: int, gen_tokens: int, n_threads: int | None
) -> None:
    """Child mode: load, time one prompt evaluation and one generation, print JSON."""
    import llama_cpp

    llama = llama_cpp.Llama(
        model_path=model_path,
        n_ctx=4096,
        n_batch=512,
        n_threads=n_threads or os.cpu_count(),
        verbose=False,
    )
    tokens = llama.tokenize(_long_prompt(prompt_tokens).encode())
    llama_cpp.llama_perf_context_reset(llama.ctx)
    llama.create_completion(tokens, max_tokens=gen_tokens, temperature=0.0)
    perf = llama_cpp.llama_perf_context(llama.ctx)
    info = llama_cpp.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    print(
        json.dumps(
            {
                "prompt_tokens": int(perf.n_p_eval),
                "prompt_tps": perf.n_p_eval / (perf.t_p_eval_ms / 1000),
                "gen_tokens": int(perf.n_eval),
                "gen_tps": perf.n_eval / (perf.t_eval_ms / 1000) if perf.t_eval_ms else 0.0,
                "module": llama_cpp.__file__,
                "system_info": info.strip(),
            }
        )
    )


def compare_builds(builds: list[str], args: argparse.Namespace) -> None:
    path = ensure_embedded_model(DEFAULT_LM.split("/", 1)[1])
    print(f"cpu: {buildflags.cpu_model_name()} ({os.cpu_count()} cores)")
    print(f"cpu features: {' '.join(buildflags.reported_features())}")
    sites = {b: _site_for(b) for b in builds}
    runs: dict[str, list[dict]] = {b: [] for b in builds}
    for _ in range(args.repeats):
        for build in builds:  # alternate, so drift in the machine's load hits every build alike
            site, _flags = sites[build]
            env = dict(os.environ)
            if site:
                env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
            cmd = [
                sys.executable,
                __file__,
                "--measure-child",
                str(path),
                "--prompt-tokens",
                str(args.prompt_tokens),
                "--gen-tokens",
                str(args.gen_tokens),
            ] + (["--n-threads", str(args.n_threads)] if args.n_threads else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise SystemExit(
                    f"build {build} failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}"
                )
            runs[build].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = builds[0]
    best = {
        b: (max(r["prompt_tps"] for r in rs), max(r["gen_tps"] for r in rs))
        for b, rs in runs.items()
    }
    print(
        f"\nprompt processing of a {runs[base][0]['prompt_tokens']}-token prompt and generation of "
        f"{runs[base][0]['gen_tokens']} tokens, best of {args.repeats} alternating rounds:"
    )
    print(
        f"{'build':12s} {'pp tok/s':>9s} {'tg tok/s':>9s} {'pp ratio':>9s} {'tg ratio':>9s}  CMAKE_ARGS"
    )
    for build in builds:
        pp, tg = best[build]
        print(
            f"{build:12s} {pp:9.1f} {tg:9.1f} {pp / best[base][0]:9.2f} {tg / best[base][1]:9.2f}  "
            f"{sites[build][1]}"
        )
    for build in builds:
        print(f"  {build}: llama.cpp reports {runs[build][0]['system_info']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records", type=int, default=50, help="records in the prompt (~20 tok each)"
    )
    parser.add_argument("--n-threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--cold", action="store_true", help="also time a cold assembly")
    parser.add_argument(
        "--builds",
        default=None,
        help="compare llama.cpp builds: comma-separated from installed, chosen, plain-avx2, native",
    )
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds per build")
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--measure-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_child:
        measure_child(args.measure_child, args.prompt_tokens, args.gen_tokens, args.n_threads)
        return
    if args.builds:
        compare_builds([b.strip() for b in args.builds.split(",") if b.strip()], args)
        return
    record = buildflags.installed_build_record() or {}
    print(
        f"cpu: {buildflags.cpu_model_name()}; features: {' '.join(buildflags.reported_features())}"
    )
    print(f"llama-cpp-python build flags: {record.get('cmake_args', '(not recorded)')}")

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
