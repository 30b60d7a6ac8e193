"""The ``pgmo`` command answers a contradictory or misdirected command with one line
naming the problem (exit status 2), and its messages name the files they are about."""

from __future__ import annotations

import pytest

from pgmo.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("pgmo: error: ") and err.count("\n") == 1, err
    return err


# -- pgmo cache ---------------------------------------------------------------------
def test_cache_list_with_clear_is_refused_and_clears_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PGMO_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "device" / "a.plan.json"
    entry.parent.mkdir()
    entry.write_text("{}")
    assert main(["cache", "list", "--clear"]) == 2
    assert "'list' and --clear contradict each other" in one_error_line(capsys)
    assert entry.exists()
    assert main(["cache", "clear", "--clear"]) == 0  # the same request twice is no conflict
    assert not entry.exists()


@pytest.mark.parametrize("action", [[], ["list"], ["clear"], ["--clear"]])
def test_a_cache_dir_that_is_a_file_is_named_as_not_a_folder(tmp_path, monkeypatch, capsys,
                                                            action):
    afile = tmp_path / "plans"
    afile.write_text("not a folder")
    monkeypatch.setenv("PGMO_CACHE_DIR", str(afile))
    assert main(["cache", *action]) == 2
    err = one_error_line(capsys)
    assert f"{afile} ($PGMO_CACHE_DIR) is not a folder" in err
    assert afile.read_text() == "not a folder"
