"""The torch modules keep out of a run's private state: a checkpoint sees the run through one link.

If this fails, a module of ``launchhelm/torch`` other than ``_run.py`` reads or writes a
``TorchRun``'s private attributes again (``run._x``, ``self._run._x``), and the checkpointer's
narrow interface (``_link.RunLink``) is being worked around. Run this file with Python to list them.
"""

from __future__ import annotations

import ast
from pathlib import Path

TORCH = Path(__file__).resolve().parents[2] / "launchhelm" / "torch"
#: Where TorchRun lives (and _Link, the run's side of the interface): its own state, not a reach.
OWN = {"_run.py"}
#: Issue 39's bound. What is left: the DCP import publishing through a plain Run (two), and the
#: sharded reader's constructor, which takes a run's store.
MOST = 10


def _is_run(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "run"
    return isinstance(node, ast.Attribute) and node.attr == "_run" and isinstance(node.value, ast.Name)


def reaches() -> list[str]:
    """Every ``run._x`` / ``self._run._x`` in the torch modules but the run's own, as ``path:line: text``."""
    found = []
    for path in sorted(TORCH.rglob("*.py")):
        if path.relative_to(TORCH).as_posix() in OWN:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and _is_run(node.value)
            ):
                found.append(f"{path.relative_to(TORCH.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_the_counter_sees_a_reach() -> None:
    tree = ast.parse("def f(run, self):\n    run._step\n    self._run._rank\n    run.step\n    run.__class__\n")
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")]
    assert [ast.unparse(n) for n in hits if not n.attr.startswith("__") and _is_run(n.value)] == [
        "run._step",
        "self._run._rank",
    ]


def test_torch_modules_reach_into_a_run_at_most_ten_times() -> None:
    found = reaches()
    assert len(found) <= MOST, "\n".join(found)


if __name__ == "__main__":
    for line in reaches():
        print(line)
    print(f"total: {len(reaches())}")
