"""Issue 44: the gate's cold starts are timed as users meet them where the hosting can (aws: from zero instances), and
labelled "copy restart" where it cannot (local); the gate report says which kind was measured."""

from __future__ import annotations

from shiplift.validation.cold_start import COPY_RESTART, FROM_ZERO_INSTANCES, cold_start_kind, stop_for_cold_start
from shiplift.validation.gate_report import COLD_START_LABELS, _release_section


class CopiesOnly:
    """A hosting that can only stop copies (the local backend's seam)."""

    def __init__(self):
        self.heard: list[tuple] = []

    def set_copies(self, endpoint, component, copies, *, progress):
        self.heard.append(("set_copies", endpoint, component, copies))


class GivesInstancesBack(CopiesOnly):
    """A hosting whose endpoint gives its instances back once no copy runs (aws's seam)."""

    def wait_for_zero_instances(self, endpoint, *, progress):
        self.heard.append(("wait_for_zero_instances", endpoint))


def test_a_hosting_that_can_wait_for_zero_instances_stops_the_copies_then_waits_for_them():
    hosting = GivesInstancesBack()
    assert stop_for_cold_start(hosting, "e", "c", progress=print) == FROM_ZERO_INSTANCES == cold_start_kind(hosting)
    assert hosting.heard == [("set_copies", "e", "c", 0),
                             ("wait_for_zero_instances", "e")], "copies first, then instances"


def test_a_hosting_that_only_stops_copies_measures_a_copy_restart():
    hosting = CopiesOnly()
    assert stop_for_cold_start(hosting, "e", "c", progress=print) == COPY_RESTART == cold_start_kind(hosting)
    assert hosting.heard == [("set_copies", "e", "c", 0)]


def section(**cold) -> str:
    starts = [{"seconds": 1.5, "attempts": 3, "error": None}]
    return _release_section({"extra": {"release": {"release_id": "r", "cold_start": {
        "starts": starts, "p95_s": 1.5, "max_p95_s": 600, **cold}}}})


def test_the_gate_report_says_which_kind_of_cold_start_was_measured():
    assert "cold starts, from zero instances (an instance, then a copy)" in section(kind=FROM_ZERO_INSTANCES)
    assert "cold starts, copy restart (a copy started again on a running instance" in section(kind=COPY_RESTART)
    assert COLD_START_LABELS[FROM_ZERO_INSTANCES] not in section(kind=COPY_RESTART)
    # a release recorded before the kind was: its starts were copy restarts on both backends (copies set to 0, invoked
    # at once)
    assert COLD_START_LABELS[COPY_RESTART] in section()
