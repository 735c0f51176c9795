"""`make bench BENCH_ARGS="--sections 5,9,10"`: which sections a run measures, and bad choices refused with the fix."""

from __future__ import annotations

import pytest

from bench.run import SECTIONS, chosen_sections


def test_no_arguments_measure_every_section_and_a_list_measures_those():
    assert chosen_sections([]) == set(range(1, 11))
    assert chosen_sections(["--sections", "5,9,10"]) == {5, 9, 10}
    assert [first for first, *_ in SECTIONS] == sorted(first for first, *_ in SECTIONS)  # measured in order


@pytest.mark.parametrize(("argv", "says"), [
    (["--sections", "11"], "is not a comma-separated list of sections 1-10"),
    (["--sections", "5,x"], "is not a comma-separated list"),
    (["--sections", ""], "is not a comma-separated list"),
    (["--section", "5"], "unexpected arguments"),
    (["5"], "e.g. --sections 5,9,10"),
])
def test_a_bad_choice_names_the_fix(argv, says):
    with pytest.raises(SystemExit, match=says):
        chosen_sections(argv)
