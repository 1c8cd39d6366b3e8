"""scripts/lib/docsection.py: a table written between its markers, the rest of the document kept."""

import pytest

import docsection


def test_section_replaces_what_stands_between_the_markers():
    doc = "# T\n<!-- x:begin -->\nold\n<!-- x:end -->\ntail\n"
    assert docsection.section(doc, "x", "new\n") == "# T\n<!-- x:begin -->\nnew\n<!-- x:end -->\ntail\n"


def test_section_appends_the_markers_when_missing():
    assert docsection.section("# T\n", "x", "new\n") == "# T\n\n<!-- x:begin -->\nnew\n<!-- x:end -->\n"


def test_between_strips_the_body_and_keeps_the_markers():
    doc = "a\n<!-- b -->\nold\n<!-- /b -->\nz\n"
    assert docsection.between(doc, "<!-- b -->", "<!-- /b -->", "\n_Run x_\n\n| t |\n\n") == (
        "a\n<!-- b -->\n_Run x_\n\n| t |\n<!-- /b -->\nz\n"
    )


def test_between_without_markers_fails_or_appends():
    with pytest.raises(ValueError):
        docsection.between("a\n", "<!-- b -->", "<!-- /b -->", "t")
    assert docsection.between("a\n", "<!-- b -->", "<!-- /b -->", "t\n", append=True) == "a\n\n<!-- b -->\nt\n<!-- /b -->\n"


def test_main_writes_the_file(tmp_path):
    doc, sec = tmp_path / "d.md", tmp_path / "s.md"
    doc.write_text("<!-- x:begin -->\n<!-- x:end -->\n")
    sec.write_text("| a |\n")
    docsection.main(["section", str(doc), "x", str(sec)])
    assert doc.read_text() == "<!-- x:begin -->\n| a |\n<!-- x:end -->\n"
    new = tmp_path / "new.md"
    docsection.main(["between", str(new), "<b>", "</b>", str(sec), "--append"])
    assert new.read_text() == "\n<b>\n| a |\n</b>\n"
