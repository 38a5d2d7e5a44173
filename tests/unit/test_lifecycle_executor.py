"""The pod controller executes every step the lifecycle table can decide, each in a case of
its own (``PodController._execute``): a step added to ``lifecycle.Step`` without a case makes
this test fail (and mypy, through ``assert_never``). Shown by mutation: adding
``MUTANT = "mutant"`` to ``Step`` fails ``test_every_step_has_a_case_of_its_own`` with
``{'MUTANT'}`` missing, and mypy with "Literal[Step.MUTANT]"; expected "Never"."""

from __future__ import annotations

import ast
import inspect
import textwrap

from vk_provider.controllers.pods import PodController
from vk_provider.domain.lifecycle import TABLE, Step


def _cases() -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(PodController._execute)))
    (match,) = [node for node in ast.walk(tree) if isinstance(node, ast.Match)]
    names = []
    for case in match.cases:
        pattern = case.pattern
        if isinstance(pattern, ast.MatchValue) and isinstance(pattern.value, ast.Attribute):
            names.append(pattern.value.attr)
    return names


def test_every_step_has_a_case_of_its_own() -> None:
    cases = _cases()
    assert len(cases) == len(set(cases)), "a step with two cases"
    assert set(Step.__members__) - set(cases) == set()
    assert set(cases) - set(Step.__members__) == set()


def test_every_step_but_wait_and_retry_is_reachable_from_the_table() -> None:
    # WAIT and RETRY are decided outside the table (a hold, an unreachable provider).
    assert set(Step) - set(TABLE.values()) <= {Step.WAIT, Step.RETRY}
