"""docs/signatures.md is generated from the signatures and must be fresh."""

from script_helpers import ROOT, load_script


def load_generator():
    return load_script("docs/generate_signatures.py")


def test_signatures_doc_is_fresh():
    gen = load_generator()
    assert (ROOT / "docs" / "signatures.md").read_text(encoding="utf-8") == gen.render(), (
        "docs/signatures.md is stale: run `python docs/generate_signatures.py` and commit it"
    )


def test_doc_lists_every_signature_with_its_typed_fields():
    gen = load_generator()
    text = gen.render()
    n = 0
    for module, classes in gen.signature_classes():
        for sig in classes:
            n += 1
            section = text.split(f"### {sig.__name__}\n", 1)[1].split("\n### ", 1)[0]
            assert f"from {module.__name__} import {sig.__name__}" in section
            assert sig.instructions.splitlines()[0] in section
            for name, info in {**sig.input_fields, **sig.output_fields}.items():
                assert f"| `{name}` | `{gen.cell(gen.type_name(info.annotation))}` |" in section, (
                    sig.__name__,
                    name,
                )
    assert (
        n >= 10
    )  # every role: planner, question writer, auditor, blind reader, answerer, judge, ...
    assert (
        "`list[FactCheck]`" in text and "`FactCheck`" in text
    )  # pydantic models used by fields are documented
    assert gen.type_name(list[str]) == "list[str]" and gen.type_name(str | None) == "str | None"
