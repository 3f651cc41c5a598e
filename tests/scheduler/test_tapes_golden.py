"""The tapes and plans of every preset are byte-identical to the recorded ones
(``tests/golden_tapes.py`` wrote them): a refactor of the scheduler must not change what runs."""

import json

import pytest

from tests import golden_tapes


@pytest.fixture(scope="module")
def golden():
    return json.loads(golden_tapes.PATH.read_text())


def test_golden_covers_the_matrix(golden):
    assert sorted(golden) == sorted(golden_tapes.key(*c) for c in golden_tapes.configurations())


@pytest.mark.slow
@pytest.mark.parametrize("name", golden_tapes.PRESET_NAMES)
def test_tapes_match_golden(golden, name):
    changed = [golden_tapes.key(*c) for c in golden_tapes.configurations() if c[0] == name
               and golden_tapes.digest(*c) != golden[golden_tapes.key(*c)]]
    assert not changed, f"{len(changed)} tape(s) differ from tests/data/tapes_golden.json, e.g. {changed[:3]}"
