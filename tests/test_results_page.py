"""docs/results pages: the header every measured page starts with, the table, and the early path check."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from analysis import results_page
from analysis.results_page import check_page, command, render_page, table, write_page
from common.errors import OutputError

WHEN = dt.datetime(2026, 12, 1, 16, 5, 59, tzinfo=dt.UTC)


def test_page_header_names_the_command_the_date_and_the_machine():
    argv = [str(results_page.ROOT / "experiments" / "bench_sim.py"), "--markdown", "docs/results/bench_sim.md"]
    text = render_page("Simulator speed", "\nbody line\n\n", argv=argv, when=WHEN, machine_line="a box, 2 cores")
    assert text == (
        "# Simulator speed\n"
        "\n"
        "- Command: `python experiments/bench_sim.py --markdown docs/results/bench_sim.md`\n"
        "- Date: 2026-12-01 16:05 UTC\n"
        "- Machine: a box, 2 cores\n"
        "\n"
        "Written by the command above; run it again to refresh this page (edits by hand are overwritten).\n"
        "\n"
        "body line\n"
    )


def test_date_is_utc_whatever_the_zone_given():
    plus_two = WHEN.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert "- Date: 2026-12-01 16:05 UTC\n" in render_page("t", "b", argv=["x.py"], when=plus_two, machine_line="m")


def test_command_quotes_arguments_and_keeps_a_script_outside_the_repository():
    assert command(["/elsewhere/x.py", "--note", "two words"]) == "python /elsewhere/x.py --note 'two words'"


def test_machine_line_names_cores_python_torch_and_simpy():
    line = results_page.machine()
    assert f"{os.cpu_count()} logical cores" in line
    assert "Python 3." in line and ", torch " in line and ", simpy " in line


def test_table_right_aligns_all_but_the_first_column_by_default():
    assert table(["a", "b"], [["x", 1], ["y", 2.5]]) == "| a | b |\n|---|---:|\n| x | 1 |\n| y | 2.5 |"
    assert table(["a", "b"], [["x", 1]], right=[False, False]) == "| a | b |\n|---|---|\n| x | 1 |"


def test_table_refuses_a_row_of_the_wrong_width():
    with pytest.raises(ValueError, match="every row needs 2 cells, as the header has"):
        table(["a", "b"], [["x"]])


def test_check_page_refuses_another_suffix_and_a_directory(tmp_path):
    with pytest.raises(OutputError, match=r"--markdown '.*page.txt': use a name ending in \.md"):
        check_page(tmp_path / "page.txt")
    (tmp_path / "d.md").mkdir()
    with pytest.raises(OutputError, match=r"is a directory; give a file name ending in \.md"):
        check_page(tmp_path / "d.md")


def test_write_page_writes_the_whole_page_and_makes_its_folder(tmp_path):
    path = write_page(tmp_path / "results" / "x.md", "X", "| a |", argv=["x.py"])
    text = path.read_text()
    assert text.startswith("# X\n\n- Command: `python x.py`\n- Date: ")
    assert text.endswith("\n\n| a |\n")
    assert [p.name for p in path.parent.iterdir()] == ["x.md"]
