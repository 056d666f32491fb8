"""experiments/design_probe.py: variants scored on the selecting items only, paired with Base-BM25."""

from __future__ import annotations

import json

import pytest
from script_helpers import argv, load_script, rhelm_args


def test_a_variant_is_a_named_json_patch():
    probe = load_script("experiments/design_probe.py")
    assert probe.parse_variant('x={"context": {"show_ids": false}}') == (
        "x",
        {"context": {"show_ids": False}},
    )
    with pytest.raises(SystemExit, match="expected NAME="):
        probe.parse_variant("no-patch")


def test_probe_scores_variants_on_train_and_validation_only(rhelm_root, tmp_path, capsys):
    """One persona, two variants: Base-BM25 against itself is a zero difference, a header-less
    context delivers at least as much (same ranking, fewer tokens per record), and the items
    scored are exactly the persona's official train + validation split — never its test items."""
    from memsteer_dspy.loaders.rhelm import load_rhelm
    from memsteer_dspy.optimize import split_official

    probe = load_script("experiments/design_probe.py")
    out = tmp_path / "rows.json"
    rc = probe.main(
        [
            *argv("--persona Elena_Morales"),
            *rhelm_args(rhelm_root, tmp_path),
            *argv("--variant same={}"),
            *argv("--variant {}", 'bare={"context": {"show_ids": false, "show_author": false}}'),
            *argv("--json {}", out),
        ]
    )
    assert rc == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())}
    train, val = split_official(
        load_rhelm(rhelm_root, "Elena_Morales", external=True).qa_items, seed=0
    )
    assert {r["n"] for r in rows.values()} == {len(train) + len(val)}
    assert rows["same"]["diff"] == {"recall_at_10": 0.0, "delivered_recall": 0.0}
    assert rows["bare"]["recall_at_10"] == rows["base-bm25"]["recall_at_10"]
    assert rows["bare"]["delivered_recall"] >= rows["base-bm25"]["delivered_recall"]
    assert "bare" in capsys.readouterr().out
